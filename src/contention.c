/*-------------------------------------------------------------------------
 *
 * contention.c
 *	  Automatic escrow's detector: how many reserves are on one budget's
 *	  slow path at once, and whether the budget was seen with escrow slots,
 *	  in shared memory.
 *
 *	  A budget is contended when reserves queue on its row: reserve's slow
 *	  path (lock_cycle in gate.c) counts itself in before it asks for the
 *	  budget row's lock and out when the reserve returns, so that the
 *	  reserve that holds the row reads how many are waiting behind it.
 *	  When that count (itself included) reaches earmark.auto_escrow_contenders,
 *	  it gives the budget earmark.auto_escrow_slots slots (gate.c,
 *	  escrow.c).
 *
 *	  Why a counter in shared memory: the alternatives cost the
 *	  uncontended path.  A conditional lock (FOR UPDATE NOWAIT) needs a
 *	  subtransaction to catch its error, and SKIP LOCKED followed by a
 *	  waiting lock needs a second statement whenever the row is busy, also
 *	  for two reserves that merely met once; pg_locks is a scan of the lock
 *	  table.  Counting here is one spinlock of a set, held for a scan of
 *	  EM_HOT_WAYS entries, on entry and exit of the slow path, and says how
 *	  many queue, not only that someone does: with 10,000 accounts two
 *	  reserves meet on a budget now and then, three almost never, so only
 *	  budgets that are really hot get slots.
 *
 *	  The escrowed flag: a reserve tries escrow's fast path only when it
 *	  knows the budget has slots (an account's own number or
 *	  earmark.escrow_slots, else this flag), so that budgets without slots
 *	  pay no fast-path statement.  The slow path sets the flag to what it
 *	  found under the budget row's lock, every time: a flag lost to
 *	  eviction, a restart or a rolled-back grant costs one slow path (or
 *	  one fast-path statement that finds no slot), never correctness.  The
 *	  limit is never decided here: the slots are rows, cut under the budget
 *	  row's lock (escrow.c).
 *
 *	  The table: EM_HOT_SETS sets of EM_HOT_WAYS entries (set-associative,
 *	  as ratelimit.c's), keyed by a hash of database, account and feature;
 *	  each set under its own spinlock, never held across anything but a
 *	  scan of its entries.  A budget takes an empty entry, else one with no
 *	  reserve inside, an unflagged one first.  An entry with reserves
 *	  inside is never taken, so the count out always finds the entry of
 *	  the count in; when a set is full of such entries the budget is not
 *	  counted (and so not found contended).  A backend is inside at most one
 *	  budget's slow path at a time; it remembers which, and counts itself
 *	  out on error (gate.c's PG_CATCH) and at exit (a FATAL while waiting
 *	  for the lock skips the catch), so a count cannot leak.
 *
 *	  Without shared_preload_libraries there is no table: nothing is
 *	  contended, and automatic escrow is off.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "contention.h"

#define EM_HOT_WAYS		8
#define EM_HOT_SETS		512

typedef struct EmHotEntry
{
	uint64		key;			/* 0: empty */
	int32		inside;			/* reserves on the budget's slow path */
	bool		escrowed;		/* last seen with slots */
} EmHotEntry;

typedef struct EmHotSet
{
	slock_t		lock;
	EmHotEntry	entry[EM_HOT_WAYS];
} EmHotSet;

typedef struct EmHotShared
{
	EmHotSet	sets[EM_HOT_SETS];
} EmHotShared;

static EmHotShared *hot_shared = NULL;

/* the budget this backend counted itself in for (0: none) */
static uint64 my_key = 0;
static bool exit_callback_set = false;

Size
em_contention_shmem_size(void)
{
	return sizeof(EmHotShared);
}

/* in the shmem_startup_hook, under AddinShmemInitLock */
void
em_contention_shmem_init(void)
{
	bool		found;
	int			i;

	hot_shared = ShmemInitStruct("earmark contention", em_contention_shmem_size(), &found);
	if (found)
		return;
	for (i = 0; i < EM_HOT_SETS; i++)
	{
		SpinLockInit(&hot_shared->sets[i].lock);
		memset(hot_shared->sets[i].entry, 0, sizeof(hot_shared->sets[i].entry));
	}
}

/*
 * The budget's key: database, account and feature, never 0 (also gate.c's
 * key for the budgets a backend saw refused).
 */
uint64
em_contention_key(text *account, text *feature)
{
	uint64		h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(account),
										VARSIZE_ANY_EXHDR(account),
										(uint64) MyDatabaseId);

	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(feature),
							VARSIZE_ANY_EXHDR(feature), h);
	return h == 0 ? 1 : h;
}

static EmHotSet *
hot_set(uint64 key)
{
	return &hot_shared->sets[key % EM_HOT_SETS];
}

/* the key's entry in its locked set, or NULL */
static EmHotEntry *
hot_find(EmHotSet *set, uint64 key)
{
	int			i;

	for (i = 0; i < EM_HOT_WAYS; i++)
	{
		if (set->entry[i].key == key)
			return &set->entry[i];
	}
	return NULL;
}

/* the key's entry, or one it may take (then cleared); NULL when none */
static EmHotEntry *
hot_take(EmHotSet *set, uint64 key)
{
	EmHotEntry *victim = NULL;
	EmHotEntry *e = hot_find(set, key);
	int			i;

	if (e != NULL)
		return e;
	for (i = 0; i < EM_HOT_WAYS; i++)
	{
		e = &set->entry[i];
		if (e->inside > 0)
			continue;
		/* an empty entry first, then an unflagged one */
		if (victim == NULL || e->key == 0 ||
			(victim->key != 0 && victim->escrowed && !e->escrowed))
			victim = e;
		if (e->key == 0)
			break;
	}
	if (victim != NULL)
	{
		victim->key = key;
		victim->inside = 0;
		victim->escrowed = false;
	}
	return victim;
}

static void
hot_exit(int code, Datum arg)
{
	em_contention_leave();
}

/*
 * Count this backend in on the budget's slow path, before it asks for the
 * budget row's lock.
 */
void
em_contention_enter(text *account, text *feature)
{
	uint64		key;
	EmHotSet   *set;
	EmHotEntry *e;

	if (hot_shared == NULL)
		return;
	em_contention_leave();
	if (!exit_callback_set)
	{
		before_shmem_exit(hot_exit, (Datum) 0);
		exit_callback_set = true;
	}
	key = em_contention_key(account, feature);
	set = hot_set(key);
	SpinLockAcquire(&set->lock);
	e = hot_take(set, key);
	if (e != NULL)
	{
		e->inside++;
		my_key = key;
	}
	SpinLockRelease(&set->lock);
}

/*
 * With the budget row locked: note whether the budget has slots, and
 * return how many reserves are on its slow path now, this one included
 * (0 when it is not counted).
 */
int
em_contention_inside(bool escrowed)
{
	EmHotSet   *set;
	EmHotEntry *e;
	int			inside = 0;

	if (hot_shared == NULL || my_key == 0)
		return 0;
	set = hot_set(my_key);
	SpinLockAcquire(&set->lock);
	e = hot_find(set, my_key);
	if (e != NULL)
	{
		e->escrowed = escrowed;
		inside = e->inside;
	}
	SpinLockRelease(&set->lock);
	return inside;
}

/* count this backend out again (nothing when it is not in) */
void
em_contention_leave(void)
{
	EmHotSet   *set;
	EmHotEntry *e;

	if (hot_shared == NULL || my_key == 0)
		return;
	set = hot_set(my_key);
	SpinLockAcquire(&set->lock);
	e = hot_find(set, my_key);
	if (e != NULL && e->inside > 0)
		e->inside--;
	SpinLockRelease(&set->lock);
	my_key = 0;
}

/* whether the budget was last seen with escrow slots */
bool
em_contention_escrowed(text *account, text *feature)
{
	uint64		key;
	EmHotSet   *set;
	EmHotEntry *e;
	bool		escrowed = false;

	if (hot_shared == NULL)
		return false;
	key = em_contention_key(account, feature);
	set = hot_set(key);
	SpinLockAcquire(&set->lock);
	e = hot_find(set, key);
	if (e != NULL)
		escrowed = e->escrowed;
	SpinLockRelease(&set->lock);
	return escrowed;
}
