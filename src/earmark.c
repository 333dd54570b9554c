/*-------------------------------------------------------------------------
 *
 * earmark.c
 *	  Module entry point: _PG_init defines the settings (settings.c) and,
 *	  when earmark is in shared_preload_libraries, asks for its shared
 *	  memory, registers the launcher (launcher.c) and installs the planner
 *	  hook that fences Citus's function call delegation (delegation.c).
 *
 *	  Shared memory: four areas, asked for and made here, owned by the
 *	  files that use them: the cooldowns (cooldown.c), the admission rate
 *	  limit (ratelimit.c), automatic escrow's contention counts
 *	  (contention.c) and the launcher's slots (launcher.c).  They are
 *	  made under AddinShmemInitLock, the one lock this file takes.
 *	  Loaded without preloading, there is none of them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "contention.h"
#include "cooldown.h"
#include "delegation.h"
#include "launcher.h"
#include "leasefloor.h"
#include "ratelimit.h"
#include "settings.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
em_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	em_cooldown_shmem_request();
	RequestAddinShmemSpace(MAXALIGN(em_rate_shmem_size()));
	RequestAddinShmemSpace(MAXALIGN(em_contention_shmem_size()));
	RequestAddinShmemSpace(MAXALIGN(em_floor_shmem_size()));
	RequestAddinShmemSpace(MAXALIGN(em_launcher_shmem_size()));
}

static void
em_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	em_cooldown_shmem_init();
	em_rate_shmem_init();
	em_contention_shmem_init();
	em_floor_shmem_init();
	em_launcher_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

void
_PG_init(void)
{
	em_define_settings();

	if (process_shared_preload_libraries_in_progress)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = em_shmem_request;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = em_shmem_startup;
		em_register_launcher();
		em_install_delegation_fence();
	}
}
