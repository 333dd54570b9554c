/*-------------------------------------------------------------------------
 *
 * cooldown.c
 *	  Cooldowns every backend sees: one small area in shared memory
 *	  (EmShared), requested when earmark is in shared_preload_libraries:
 *	  a table of "the last time anyone did X" for a few keys, seen by
 *	  every backend and surviving the rollback of the transaction that
 *	  did X.  The key set's refetch cooldown (intake.c) keeps its last
 *	  fetch here.
 *
 *	  Locks: the area's spinlock, held for a scan of EM_COOLDOWN_SLOTS
 *	  entries and nothing else.  Loaded without preloading, there is no
 *	  area and em_cooldown_take says so.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/shmem.h"
#include "storage/spin.h"

#include "cooldown.h"

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

Size
em_cooldown_shmem_size(void)
{
	return sizeof(EmShared);
}

/* make the area, or find it made; the caller holds AddinShmemInitLock */
void
em_cooldown_shmem_init(void)
{
	bool		found;

	em_shared = ShmemInitStruct("earmark", sizeof(EmShared), &found);
	if (!found)
	{
		memset(em_shared, 0, sizeof(EmShared));
		SpinLockInit(&em_shared->mutex);
	}
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
