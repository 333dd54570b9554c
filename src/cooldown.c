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
 *	  the set that has the key).  EM_SHARED_COPIES copies are kept, one
 *	  for each cooldown slot (about 530 kB in all): the newest of each name
 *	  (a key set's URL, told by the whole string, not by its hash), up to
 *	  EM_SHARED_DATA_MAX bytes each (a key set is a few kB); a new name
 *	  takes the least recent copy.
 *
 *	  Locks: the area's spinlock, held for a scan of EM_COOLDOWN_SLOTS
 *	  entries and nothing else; the copies' LWLock (the tranche
 *	  "earmark cooldown"), held for a scan of EM_SHARED_COPIES names and a
 *	  copy in or out, nothing else.
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

/* a copy for each cooldown: every URL the table remembers keeps its set */
#define EM_SHARED_COPIES	EM_COOLDOWN_SLOTS
#define EM_SHARED_NAME_MAX	1024
#define EM_SHARED_DATA_MAX	(32 * 1024)
#define EM_COOLDOWN_TRANCHE	"earmark cooldown"

/* what a taker got, for every backend */
typedef struct EmSharedCopy
{
	char		name[EM_SHARED_NAME_MAX];	/* NUL-terminated */
	TimestampTz at;				/* 0: free */
	Size		len;
	char		data[EM_SHARED_DATA_MAX];
} EmSharedCopy;

typedef struct EmShared
{
	slock_t		mutex;
	EmCooldown	cooldown[EM_COOLDOWN_SLOTS];
	LWLock	   *copy_lock;		/* over copies */
	EmSharedCopy copies[EM_SHARED_COPIES];
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
		em_shared->copy_lock = &(GetNamedLWLockTranche(EM_COOLDOWN_TRANCHE))->lock;
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

/* the copy of name, or NULL; the caller holds copy_lock */
static EmSharedCopy *
find_copy(const char *name)
{
	int			i;

	for (i = 0; i < EM_SHARED_COPIES; i++)
	{
		EmSharedCopy *c = &em_shared->copies[i];

		if (c->at != 0 && strcmp(c->name, name) == 0)
			return c;
	}
	return NULL;
}

/*
 * Share what the taker of name got at time at (len bytes), for every
 * backend: kept unless a copy of the same name from later is there; not
 * kept when larger than EM_SHARED_DATA_MAX, for a name of
 * EM_SHARED_NAME_MAX bytes or more, or without preloading.
 */
void
em_cooldown_share(const char *name, TimestampTz at, const void *data, Size len)
{
	EmSharedCopy *c;
	int			i;

	if (em_shared == NULL || len > EM_SHARED_DATA_MAX ||
		strlen(name) >= EM_SHARED_NAME_MAX)
		return;
	LWLockAcquire(em_shared->copy_lock, LW_EXCLUSIVE);
	c = find_copy(name);
	if (c == NULL)
	{
		/* a free copy, or the least recent */
		c = &em_shared->copies[0];
		for (i = 1; i < EM_SHARED_COPIES; i++)
			if (em_shared->copies[i].at < c->at)
				c = &em_shared->copies[i];
		c->at = 0;
	}
	if (c->at <= at)
	{
		strlcpy(c->name, name, EM_SHARED_NAME_MAX);
		memcpy(c->data, data, len);
		c->len = len;
		c->at = at;
	}
	LWLockRelease(em_shared->copy_lock);
}

/*
 * A palloc'd copy of what was shared for name, when it is from after the
 * time given (*at says when); else, or when memory runs out, NULL.
 */
void *
em_cooldown_shared(const char *name, TimestampTz after, TimestampTz *at)
{
	EmSharedCopy *c;
	char	   *copy = NULL;

	if (em_shared == NULL)
		return NULL;
	LWLockAcquire(em_shared->copy_lock, LW_SHARED);
	c = find_copy(name);
	if (c != NULL && c->at > after)
	{
		/* no error may be raised here: the lock is held */
		copy = palloc_extended(c->len, MCXT_ALLOC_NO_OOM);
		if (copy != NULL)
		{
			memcpy(copy, c->data, c->len);
			*at = c->at;
		}
	}
	LWLockRelease(em_shared->copy_lock);
	return copy;
}
