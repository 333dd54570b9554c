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
 *	  What the taker got, shared: a cooldown must not hide the result of
 *	  the work it stands for.  A delivery that fetched the key set and then
 *	  failed rolls its stored copy back; without a copy here, a forged
 *	  token sent once a cooldown would keep a genuine token with a new key
 *	  refused (every other backend waits out the cooldown and never sees
 *	  the set that has the key).  One copy is kept, the newest of one key,
 *	  up to EM_SHARED_DATA_MAX bytes (a key set is a few kB).
 *
 *	  Locks: the area's spinlock, held for a scan of EM_COOLDOWN_SLOTS
 *	  entries and nothing else; the shared copy's LWLock (the tranche
 *	  "earmark cooldown"), held for a copy in or out and nothing else.
 *	  Loaded without preloading, there is no area, em_cooldown_take says
 *	  so and nothing is shared.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "cooldown.h"

#define EM_COOLDOWN_SLOTS	16

typedef struct EmCooldown
{
	uint64		key;			/* e.g. a hash of the key set's URL */
	TimestampTz last;			/* the last time it was taken; 0: free */
} EmCooldown;

#define EM_SHARED_DATA_MAX	(32 * 1024)
#define EM_COOLDOWN_TRANCHE	"earmark cooldown"

typedef struct EmShared
{
	slock_t		mutex;
	EmCooldown	cooldown[EM_COOLDOWN_SLOTS];
	/* the shared copy, under data_lock */
	LWLock	   *data_lock;
	uint64		data_key;
	TimestampTz data_at;		/* 0: none */
	Size		data_len;
	char		data[EM_SHARED_DATA_MAX];
} EmShared;

static EmShared *em_shared = NULL;

/* in the shmem_request_hook: the area and the shared copy's lock */
void
em_cooldown_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(EmShared)));
	RequestNamedLWLockTranche(EM_COOLDOWN_TRANCHE, 1);
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
		em_shared->data_lock = &(GetNamedLWLockTranche(EM_COOLDOWN_TRANCHE))->lock;
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

/*
 * Share what the taker of key got at time at (len bytes), for every
 * backend: kept unless a copy of the same key from later is there; not
 * kept when larger than EM_SHARED_DATA_MAX or without preloading.
 */
void
em_cooldown_share(uint64 key, TimestampTz at, const void *data, Size len)
{
	if (em_shared == NULL || len > EM_SHARED_DATA_MAX)
		return;
	LWLockAcquire(em_shared->data_lock, LW_EXCLUSIVE);
	if (em_shared->data_key != key || em_shared->data_at <= at)
	{
		memcpy(em_shared->data, data, len);
		em_shared->data_len = len;
		em_shared->data_key = key;
		em_shared->data_at = at;
	}
	LWLockRelease(em_shared->data_lock);
}

/*
 * A palloc'd copy of what was shared for key, when it is from after the
 * time given (*at says when); else, or when memory runs out, NULL.
 */
void *
em_cooldown_shared(uint64 key, TimestampTz after, TimestampTz *at)
{
	char	   *copy = NULL;

	if (em_shared == NULL)
		return NULL;
	LWLockAcquire(em_shared->data_lock, LW_SHARED);
	if (em_shared->data_at != 0 && em_shared->data_key == key &&
		em_shared->data_at > after)
	{
		/* no error may be raised here: the lock is held */
		copy = palloc_extended(em_shared->data_len, MCXT_ALLOC_NO_OOM);
		if (copy != NULL)
		{
			memcpy(copy, em_shared->data, em_shared->data_len);
			*at = em_shared->data_at;
		}
	}
	LWLockRelease(em_shared->data_lock);
	return copy;
}
