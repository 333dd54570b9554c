/*-------------------------------------------------------------------------
 *
 * ratelimit.c
 *	  The admission rate limit: earmark.rate_limit admissions a minute per
 *	  account, as GCRA (the generic cell rate algorithm), with its state in
 *	  shared memory.
 *
 *	  Why shared memory: the state is one timestamp per account (the
 *	  theoretical arrival time, TAT).  Kept in a row, every admission of an
 *	  account would update that row, one more serial point on a hot
 *	  account.  In shared memory it costs a spinlock held for a few
 *	  instructions.  A rate limit may forget: after a restart every account
 *	  has its full burst again.  A limit may not, and limits never live
 *	  here.  On Citus each account's calls run on its node, so the node's
 *	  memory is the account's.
 *
 *	  The table: sets of EM_RATE_WAYS entries (a set-associative cache),
 *	  each set under its own spinlock.  An account hashes (with its
 *	  database) to a set.  An entry whose TAT is not ahead of now means
 *	  the same as no entry (the full burst), so a new account takes such an
 *	  entry, or an empty one; when none is free it takes the entry that is
 *	  least ahead, whose account then forgets part of its debt.
 *
 *	  Locks: one set's spinlock, never held across anything but a scan of
 *	  its EM_RATE_WAYS entries.  Without shared_preload_libraries there is
 *	  no table and the rate limit is off (CREATE EXTENSION warns).
 *
 *	  An admission counted here is not taken back when its transaction
 *	  rolls back (only when its hold found its key taken): a rolled-back
 *	  admission counts against the rate.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "ratelimit.h"
#include "settings.h"

#define EM_RATE_WAYS	8

typedef struct EmRateEntry
{
	uint64		key;			/* 0: empty */
	TimestampTz tat;
} EmRateEntry;

typedef struct EmRateSet
{
	slock_t		lock;
	EmRateEntry entry[EM_RATE_WAYS];
} EmRateSet;

typedef struct EmRateShared
{
	int			nsets;
	EmRateSet	sets[FLEXIBLE_ARRAY_MEMBER];
} EmRateShared;

static EmRateShared *rate_shared = NULL;

static int
rate_nsets(void)
{
	return Max(earmark_rate_accounts / EM_RATE_WAYS, 1);
}

Size
em_rate_shmem_size(void)
{
	return add_size(offsetof(EmRateShared, sets),
					mul_size(rate_nsets(), sizeof(EmRateSet)));
}

/* in the shmem_startup_hook, under AddinShmemInitLock */
void
em_rate_shmem_init(void)
{
	bool		found;
	int			i;

	rate_shared = ShmemInitStruct("earmark rate limit", em_rate_shmem_size(), &found);
	if (found)
		return;
	rate_shared->nsets = rate_nsets();
	for (i = 0; i < rate_shared->nsets; i++)
	{
		SpinLockInit(&rate_shared->sets[i].lock);
		memset(rate_shared->sets[i].entry, 0, sizeof(rate_shared->sets[i].entry));
	}
}

/* the account's key: its name and database, never 0 (0 marks empty) */
static uint64
rate_key(text *account)
{
	uint64		h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(account),
										VARSIZE_ANY_EXHDR(account),
										(uint64) MyDatabaseId);

	return h == 0 ? 1 : h;
}

/*
 * GCRA: an admission at now conforms when the TAT (at least now: an idle
 * account banks no burst beyond the tolerance) is at most tolerance ahead;
 * then the TAT moves on by one emission interval.  Returns the new TAT, or
 * 0 when the admission does not conform.
 */
TimestampTz
em_gcra(TimestampTz tat, TimestampTz now, int64 step, int64 tolerance)
{
	TimestampTz start = Max(tat, now);

	if (start > now + tolerance)
		return 0;
	return start + step;
}

/* the account's entry in its set, or the one it takes; the set is locked */
static EmRateEntry *
rate_entry(EmRateSet *set, uint64 key, TimestampTz now, bool *found)
{
	EmRateEntry *victim = NULL;
	int			i;

	for (i = 0; i < EM_RATE_WAYS; i++)
	{
		EmRateEntry *e = &set->entry[i];

		if (e->key == key)
		{
			*found = true;
			return e;
		}
		/* an empty entry first, else the one least ahead of the clock */
		if (victim == NULL ||
			(victim->key != 0 && (e->key == 0 || e->tat < victim->tat)))
			victim = e;
	}
	*found = false;
	victim->key = key;
	victim->tat = now;
	return victim;
}

/* the clock the rate limit reads; tests may shift it (superuser only) */
static TimestampTz
rate_now(TimestampTz now)
{
	return now + (int64) earmark_debug_rate_clock_shift_s * USECS_PER_SEC;
}

/* true when one more admission of the account conforms (and is counted) */
bool
em_rate_conforms(text *account, TimestampTz now)
{
	int64		step;
	uint64		key;
	EmRateSet  *set;
	EmRateEntry *e;
	TimestampTz next;
	bool		found;

	if (earmark_rate_limit <= 0 || rate_shared == NULL)
		return true;
	step = USECS_PER_MINUTE / earmark_rate_limit;
	now = rate_now(now);
	key = rate_key(account);
	set = &rate_shared->sets[key % (uint64) rate_shared->nsets];
	SpinLockAcquire(&set->lock);
	e = rate_entry(set, key, now, &found);
	next = em_gcra(e->tat, now, step, USECS_PER_MINUTE - step);
	if (next != 0)
		e->tat = next;
	SpinLockRelease(&set->lock);
	return next != 0;
}

/*
 * Give back the admission em_rate_conforms counted, when the hold then
 * found its key taken by a concurrent reserve: a repeat of a key never
 * counts.
 */
void
em_rate_give_back(text *account)
{
	uint64		key;
	EmRateSet  *set;
	int			i;

	if (earmark_rate_limit <= 0 || rate_shared == NULL)
		return;
	key = rate_key(account);
	set = &rate_shared->sets[key % (uint64) rate_shared->nsets];
	SpinLockAcquire(&set->lock);
	for (i = 0; i < EM_RATE_WAYS; i++)
	{
		if (set->entry[i].key == key)
			set->entry[i].tat -= USECS_PER_MINUTE / earmark_rate_limit;
	}
	SpinLockRelease(&set->lock);
}
