/*-------------------------------------------------------------------------
 *
 * earmark.c
 *	  Module entry point: the GUCs, the background worker's registration,
 *	  and the small helpers every other file uses (the SPI statement cache,
 *	  argument checks, returning a row).
 *
 *	  The GUCs are plain per-backend variables; earmark.database is fixed
 *	  at server start because the worker connects to it once.
 *
 *	  Shared state: one small area in shared memory (EmShared), requested
 *	  when earmark is in shared_preload_libraries: a table of cooldowns,
 *	  "the last time anyone did X" for a few keys, seen by every backend
 *	  and surviving the rollback of the transaction that did X.  The key
 *	  set's refetch cooldown (intake.c) keeps its last fetch here.  Locks:
 *	  the area's spinlock, held for a scan of EM_COOLDOWN_SLOTS entries and
 *	  nothing else.  Loaded without preloading, there is no area and
 *	  em_cooldown_take says so.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "earmark.h"
#include "launcher.h"
#include "ratelimit.h"
#include "provider.h"
#include "sigverify.h"
#include "settings.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/* ---------------------------------------------------------------------
 * Shared memory: cooldowns every backend sees
 * ---------------------------------------------------------------------
 */
#define EM_COOLDOWN_SLOTS	16

typedef struct EmCooldown
{
	uint64		key;			/* e.g. a hash of the key set's URL */
	TimestampTz last;			/* the last time it was taken; 0: free */
} EmCooldown;

typedef struct EmShared
{
	slock_t		mutex;
	EmCooldown	cooldown[EM_COOLDOWN_SLOTS];
} EmShared;

static EmShared *em_shared = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
em_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(EmShared)));
	RequestAddinShmemSpace(MAXALIGN(em_rate_shmem_size()));
	RequestAddinShmemSpace(MAXALIGN(em_launcher_shmem_size()));
}

static void
em_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	em_shared = ShmemInitStruct("earmark", sizeof(EmShared), &found);
	if (!found)
	{
		memset(em_shared, 0, sizeof(EmShared));
		SpinLockInit(&em_shared->mutex);
	}
	em_rate_shmem_init();
	em_launcher_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Take the cooldown of key at now, unless it was taken less than
 * cooldown_us ago.  Returns EM_COOLDOWN_TAKEN (the caller may go ahead;
 * the next taker waits from now), EM_COOLDOWN_WAIT (*last says when it was
 * last taken) or EM_COOLDOWN_NO_SHMEM (earmark is not preloaded, so no
 * backend can know what another did).  The check and the taking are one
 * step under the spinlock: of many backends asking at once, one gets it.
 * A full table gives up its least recent entry.
 */
EmCooldownResult
em_cooldown_take(uint64 key, TimestampTz now, int64 cooldown_us,
				 TimestampTz *last)
{
	EmCooldown *slot = NULL;
	EmCooldownResult result = EM_COOLDOWN_TAKEN;
	int			i;

	if (em_shared == NULL)
		return EM_COOLDOWN_NO_SHMEM;
	SpinLockAcquire(&em_shared->mutex);
	for (i = 0; i < EM_COOLDOWN_SLOTS; i++)
	{
		EmCooldown *c = &em_shared->cooldown[i];

		if (c->last != 0 && c->key == key)
		{
			slot = c;
			break;
		}
		if (slot == NULL || c->last < slot->last)
			slot = c;			/* free, or the least recent so far */
	}
	if (slot->last != 0 && slot->key == key &&
		now - slot->last < cooldown_us)
	{
		*last = slot->last;
		result = EM_COOLDOWN_WAIT;
	}
	else
	{
		slot->key = key;
		slot->last = now;
	}
	SpinLockRelease(&em_shared->mutex);
	return result;
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
	}
}
