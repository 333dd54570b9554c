/*-------------------------------------------------------------------------
 *
 * leasefloor.c
 *	  A budget's lease floor, in shared memory: a time before which none of
 *	  the budget's open holds' leases ends.  A reserve that finds no room
 *	  looks for the budget's dead holds before it refuses (a hold whose
 *	  lease has passed never causes a refusal: budget.c, em_budget_reclaim),
 *	  and that search reads every open hold of the budget.  On a full
 *	  account with thousands of holds open every refusal read them all,
 *	  under the budget row's lock.  With a floor later than the call's time
 *	  it need not: no hold can be dead.
 *
 *	  Why it is exact.  The floor is a lower bound, kept so by two rules:
 *	  - a search that read every open hold of the budget, found none dead,
 *	  and ran at READ COMMITTED (its snapshot taken after em_floor_begin)
 *	  stores the earliest lease end it read;
 *	  - every hold lowers its budget's floor to its own lease end twice:
 *	  at PRE_COMMIT, before its commit is visible, and at COMMIT, after it
 *	  (em_floor_note_hold; the transaction callback below); each time it
 *	  moves its set's generation, and between the two its set counts it as
 *	  committing.
 *	  A store is made only if its set's generation did not move since the
 *	  search began, before its snapshot, and no hold of the set is between
 *	  PRE_COMMIT and COMMIT.  So a hold the search did not see became
 *	  visible after the snapshot was taken: if its PRE_COMMIT came before
 *	  em_floor_begin, the store finds it committing or the generation
 *	  moved by its COMMIT; if after, the generation moved, or the store
 *	  came first and is lowered.  And once the hold is visible the floor is
 *	  at most its lease end (PRE_COMMIT came first), so a refusal that
 *	  trusts the floor in the moment between the commit and its callback
 *	  does not miss the hold if it is already dead.  Leases only
 *	  ever move later (every renewal is GREATEST), and a settled or expired
 *	  hold has no lease, so neither can break the bound.  A store is made
 *	  only when the search found no dead hold, and only when its
 *	  transaction holds no lock on the job table that a write takes
 *	  (RowExclusiveLock or stronger: the caller, budget.c): a hold it
 *	  expired, settled or renewed would be open again, with its old lease,
 *	  if the transaction rolled back.  A floor is trusted only when the
 *	  transaction's own holds in the budget (not yet committed, so not in
 *	  the floor) are not dead either.
 *
 *	  Prepared transactions: a hold's transaction that is prepared lowers
 *	  the floor at PREPARE (and moves its set's generation), and its xid
 *	  joins a list; while any listed xid is in progress the floors are
 *	  neither used nor stored.  The list holds max_prepared_transactions
 *	  xids, as many as can be prepared at once (finished ones are dropped
 *	  before a new one is listed).  A prepared transaction
 *	  that recovery brought back after a restart is in no list: until
 *	  every transaction older than the first xid this start saw has ended
 *	  (GetOldestActiveTransactionId), no floor is used or stored.
 *
 *	  What it does not see: a hold written into earmark.job by hand (an
 *	  INSERT, a COPY, an UPDATE of lease_until to an earlier time).  A
 *	  sweep never uses a floor: the worker's next pass in a database it
 *	  runs in (earmark.database), or earmark_sweep(), expires such a hold,
 *	  and the floor is then true again.  A restart forgets every floor.
 *
 *	  On Citus the floors are never used (a hold may be admitted on another
 *	  node); without shared_preload_libraries there are none.
 *
 *	  The table: EM_FLOOR_SETS sets of EM_FLOOR_WAYS entries, keyed by
 *	  database and budget id; an entry also names the job table's file
 *	  node, so that a floor is never read after a TRUNCATE of the table (or
 *	  its budget ids started again, as RESTART IDENTITY does) or once the
 *	  extension was dropped and made again.  Each set has
 *	  its own spinlock, never held across anything but a scan of its
 *	  entries; the list of prepared xids has another.  An entry lost to
 *	  eviction costs one search, never correctness.  Outside the spinlocks
 *	  the checks for prepared transactions take ProcArrayLock shared
 *	  (TransactionIdIsInProgress, GetOldestActiveTransactionId), and the
 *	  first one after a start XidGenLock shared (ReadNextFullTransactionId).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/memutils.h"

#include "leasefloor.h"
#include "settings.h"

#define EM_FLOOR_WAYS		8
#define EM_FLOOR_SETS		1024

typedef struct EmFloorEntry
{
	Oid			dbid;			/* InvalidOid: empty */
	Oid			jobnode;
	int64		budget_id;
	TimestampTz floor;
} EmFloorEntry;

typedef struct EmFloorSet
{
	slock_t		lock;
	uint64		gen;			/* moved by every hold committed into the set */
	int			committing;		/* holds between PRE_COMMIT and COMMIT */
	int			victim;			/* the next entry a store may take */
	EmFloorEntry entry[EM_FLOOR_WAYS];
} EmFloorSet;

typedef struct EmFloorShared
{
	slock_t		lock;			/* the fields up to sets */
	bool		recovered_gone; /* no transaction from before the start runs */
	TransactionId first_xid;	/* the next xid when first looked at */
	int			nprepared;
	EmFloorSet	sets[EM_FLOOR_SETS];
	TransactionId prepared[FLEXIBLE_ARRAY_MEMBER];
} EmFloorShared;

static EmFloorShared *floor_shared = NULL;

/*
 * This transaction's holds: the earliest lease end of each budget (in
 * TopMemoryContext, kept from one transaction to the next).
 */
typedef struct EmFloorPending
{
	int64		budget_id;
	TimestampTz lease_until;
} EmFloorPending;

static EmFloorPending *pending = NULL;
static int	npending = 0;
static int	pending_size = 0;
static bool precommitted = false;	/* counted in at PRE_COMMIT */
static bool callback_registered = false;

Size
em_floor_shmem_size(void)
{
	return add_size(offsetof(EmFloorShared, prepared),
					mul_size(Max(max_prepared_xacts, 1), sizeof(TransactionId)));
}

/* in the shmem_startup_hook, under AddinShmemInitLock */
void
em_floor_shmem_init(void)
{
	bool		found;
	int			i;

	floor_shared = ShmemInitStruct("earmark lease floors", em_floor_shmem_size(), &found);
	if (found)
		return;
	SpinLockInit(&floor_shared->lock);
	floor_shared->recovered_gone = max_prepared_xacts == 0;
	floor_shared->first_xid = InvalidTransactionId;
	floor_shared->nprepared = 0;
	for (i = 0; i < EM_FLOOR_SETS; i++)
	{
		SpinLockInit(&floor_shared->sets[i].lock);
		floor_shared->sets[i].gen = 0;
		floor_shared->sets[i].committing = 0;
		floor_shared->sets[i].victim = 0;
		memset(floor_shared->sets[i].entry, 0, sizeof(floor_shared->sets[i].entry));
	}
}

static EmFloorSet *
set_of(int64 budget_id, int *index)
{
	uint64		h = hash_bytes_extended((const unsigned char *) &budget_id,
										sizeof(budget_id), (uint64) MyDatabaseId);
	int			i = (int) (h % EM_FLOOR_SETS);

	if (index != NULL)
		*index = i;
	return &floor_shared->sets[i];
}

/* the budget's entry in its locked set, of any job table when jobnode is 0 */
static EmFloorEntry *
find_entry(EmFloorSet *set, Oid jobnode, int64 budget_id)
{
	int			i;

	for (i = 0; i < EM_FLOOR_WAYS; i++)
	{
		EmFloorEntry *e = &set->entry[i];

		if (e->dbid == MyDatabaseId && e->budget_id == budget_id &&
			(jobnode == InvalidOid || e->jobnode == jobnode))
			return e;
	}
	return NULL;
}

/* ---------------------------------------------------------------------
 * A hold's commit lowers its budget's floor
 * ---------------------------------------------------------------------
 */

/*
 * Lower the budget's floor to lease_until, move its set's generation, and
 * count a commit in or out of the set (committing: +1, -1 or 0).
 */
static void
lower_floor(int64 budget_id, TimestampTz lease_until, int committing)
{
	EmFloorSet *set = set_of(budget_id, NULL);
	int			i;

	SpinLockAcquire(&set->lock);
	set->gen++;
	set->committing += committing;
	for (i = 0; i < EM_FLOOR_WAYS; i++)
	{
		EmFloorEntry *e = &set->entry[i];

		if (e->dbid == MyDatabaseId && e->budget_id == budget_id)
			e->floor = Min(e->floor, lease_until);
	}
	SpinLockRelease(&set->lock);
}

static void
apply_pending(int committing)
{
	int			i;

	for (i = 0; i < npending; i++)
		lower_floor(pending[i].budget_id, pending[i].lease_until, committing);
}

static void
clear_pending(void)
{
	npending = 0;
	precommitted = false;
}

/* the earliest lease end of this transaction's holds in the budget */
static TimestampTz
own_earliest(int64 budget_id)
{
	int			i;

	for (i = 0; i < npending; i++)
		if (pending[i].budget_id == budget_id)
			return pending[i].lease_until;
	return DT_NOEND;
}

/* drop a listed xid found finished */
static void
drop_prepared(TransactionId xid)
{
	int			j;

	SpinLockAcquire(&floor_shared->lock);
	for (j = 0; j < floor_shared->nprepared; j++)
	{
		if (TransactionIdEquals(floor_shared->prepared[j], xid))
		{
			floor_shared->prepared[j] =
				floor_shared->prepared[--floor_shared->nprepared];
			break;
		}
	}
	SpinLockRelease(&floor_shared->lock);
}

/*
 * Whether a transaction that began before the server started may still be
 * running: a prepared transaction that recovery brought back.  Its holds
 * lowered no floor of this start (the list above is in shared memory, and
 * COMMIT PREPARED runs none of its backend's callbacks), so no floor is
 * used or stored until every transaction older than the first xid seen
 * here has ended.  When the oldest running transaction is this one, none
 * from before the start runs (this one's xid was assigned after it).  With
 * max_prepared_transactions 0 there is none.
 */
static bool
recovered_busy(void)
{
	TransactionId first;
	TransactionId oldest;
	TransactionId mine = GetTopTransactionIdIfAny();

	SpinLockAcquire(&floor_shared->lock);
	first = floor_shared->first_xid;
	SpinLockRelease(&floor_shared->lock);
	if (!TransactionIdIsValid(first))
	{
		TransactionId next = XidFromFullTransactionId(ReadNextFullTransactionId());

		SpinLockAcquire(&floor_shared->lock);
		if (!TransactionIdIsValid(floor_shared->first_xid))
			floor_shared->first_xid = next;
		first = floor_shared->first_xid;
		SpinLockRelease(&floor_shared->lock);
	}
	oldest = GetOldestActiveTransactionId();
	if (!(TransactionIdIsValid(mine) && TransactionIdEquals(oldest, mine)) &&
		TransactionIdPrecedes(oldest, first))
		return true;
	SpinLockAcquire(&floor_shared->lock);
	floor_shared->recovered_gone = true;
	SpinLockRelease(&floor_shared->lock);
	return false;
}

/* whether a listed xid is in progress; those that are not are dropped */
static bool
listed_busy(void)
{
	TransactionId *xids;
	int			n;
	int			i;
	bool		busy = false;

	xids = palloc(sizeof(TransactionId) * Max(max_prepared_xacts, 1));
	SpinLockAcquire(&floor_shared->lock);
	n = floor_shared->nprepared;
	memcpy(xids, floor_shared->prepared, n * sizeof(TransactionId));
	SpinLockRelease(&floor_shared->lock);
	for (i = 0; i < n; i++)
	{
		if (TransactionIdIsInProgress(xids[i]))
			busy = true;
		else
			drop_prepared(xids[i]);
	}
	pfree(xids);
	return busy;
}

/*
 * Whether a prepared transaction with holds may be in progress: a listed
 * one (the finished ones are dropped first), or one that recovery brought
 * back.  The caller holds no lock.
 */
static bool
prepared_busy(void)
{
	bool		gone;
	int			n;
	bool		busy = false;

	SpinLockAcquire(&floor_shared->lock);
	gone = floor_shared->recovered_gone;
	n = floor_shared->nprepared;
	SpinLockRelease(&floor_shared->lock);
	if (n > 0)
		busy = listed_busy();
	if (!gone && recovered_busy())
		busy = true;
	return busy;
}

/* a transaction with holds is being prepared: list it, lower the floors */
static void
list_prepared(void)
{
	TransactionId xid = GetTopTransactionIdIfAny();
	bool		listed = false;

	(void) listed_busy();
	SpinLockAcquire(&floor_shared->lock);
	if (floor_shared->nprepared < Max(max_prepared_xacts, 1))
	{
		floor_shared->prepared[floor_shared->nprepared++] = xid;
		listed = true;
	}
	SpinLockRelease(&floor_shared->lock);
	if (!listed)
		elog(ERROR, "earmark: too many prepared transactions with holds");
	apply_pending(0);
}

static void
floor_xact_callback(XactEvent event, void *arg)
{
	if (npending == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			list_prepared();
			clear_pending();
			break;
		case XACT_EVENT_PRE_COMMIT:
			/* before the commit is visible: see the file header */
			apply_pending(1);
			precommitted = true;
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			apply_pending(precommitted ? -1 : 0);
			clear_pending();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* the holds are gone; only a PRE_COMMIT's count is taken back */
			if (precommitted)
				apply_pending(-1);
			clear_pending();
			break;
		case XACT_EVENT_PREPARE:
			clear_pending();
			break;
		default:
			break;
	}
}

/*
 * Remember a hold this transaction wrote into the budget, with its lease
 * end; its commit lowers the budget's floor.  (A hold that a savepoint
 * rolled back lowers it too, which costs a search, never correctness.)
 */
void
em_floor_note_hold(int64 budget_id, TimestampTz lease_until)
{
	int			i;

	if (floor_shared == NULL)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(floor_xact_callback, NULL);
		callback_registered = true;
	}
	for (i = 0; i < npending; i++)
	{
		if (pending[i].budget_id == budget_id)
		{
			pending[i].lease_until = Min(pending[i].lease_until, lease_until);
			return;
		}
	}
	if (npending == pending_size)
	{
		int			size = Max(16, pending_size * 2);

		/* the size only once the array has it (an allocation may fail) */
		pending = pending == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(EmFloorPending) * size) :
			repalloc(pending, sizeof(EmFloorPending) * size);
		pending_size = size;
	}
	pending[npending].budget_id = budget_id;
	pending[npending].lease_until = lease_until;
	npending++;
}

/* ---------------------------------------------------------------------
 * A search for dead holds reads and stores the floor
 * ---------------------------------------------------------------------
 */

/*
 * Whether no open hold of the budget can be dead at now: its floor is
 * later.  False whenever it is not known.  With gen, also the set's
 * generation read with the floor, for em_floor_gen_unmoved: the floor
 * bounds the holds open now, not those of a snapshot taken before (a hold
 * expired since may have let a search store a later floor).
 */
bool
em_floor_none_dead(Oid jobnode, int64 budget_id, TimestampTz now, uint64 *gen)
{
	EmFloorSet *set;
	EmFloorEntry *e;
	bool		none = false;

	if (floor_shared == NULL || !earmark_lease_floors || !OidIsValid(jobnode) ||
		now >= own_earliest(budget_id) || prepared_busy())
		return false;
	set = set_of(budget_id, NULL);
	SpinLockAcquire(&set->lock);
	e = find_entry(set, jobnode, budget_id);
	if (e != NULL)
		none = now < e->floor;
	if (gen != NULL)
		*gen = set->gen;
	SpinLockRelease(&set->lock);
	return none;
}

/*
 * Whether no hold of the budget's set reached PRE_COMMIT, COMMIT or
 * PREPARE since em_floor_none_dead read gen: then every hold visible in a
 * snapshot taken after that read had lowered the floor it read (gate.c,
 * refused_unlocked).
 */
bool
em_floor_gen_unmoved(int64 budget_id, uint64 gen)
{
	EmFloorSet *set;
	bool		same;

	if (floor_shared == NULL)
		return false;
	set = set_of(budget_id, NULL);
	SpinLockAcquire(&set->lock);
	same = set->gen == gen;
	SpinLockRelease(&set->lock);
	return same;
}

/*
 * Before a search's snapshot: what its store must find unchanged.  Not
 * valid under REPEATABLE READ or SERIALIZABLE (the search reads the
 * transaction's snapshot, older than this), nor while a prepared
 * transaction with holds may be in progress: checked after the
 * generation is read, since a PREPARE lowers the floors (and moves the
 * generations) after its xid is listed.  The caller (budget.c, lock_dead)
 * makes no search store in a transaction that wrote the job table.
 */
void
em_floor_begin(int64 budget_id, EmFloorToken *token)
{
	EmFloorSet *set;

	token->valid = false;
	if (floor_shared == NULL || !earmark_lease_floors || IsolationUsesXactSnapshot())
		return;
	set = set_of(budget_id, &token->set);
	SpinLockAcquire(&set->lock);
	token->gen = set->gen;
	SpinLockRelease(&set->lock);
	token->valid = !prepared_busy();
}

/*
 * After a search that read every open hold of the budget and found none
 * dead: floor is the earliest lease end it read (DT_NOEND when none).
 */
void
em_floor_store(const EmFloorToken *token, Oid jobnode, int64 budget_id,
			   TimestampTz floor)
{
	EmFloorSet *set;
	EmFloorEntry *e;
	int			i;

	if (!token->valid || !OidIsValid(jobnode))
		return;
	set = &floor_shared->sets[token->set];
	SpinLockAcquire(&set->lock);
	if (set->gen == token->gen && set->committing == 0)
	{
		e = find_entry(set, InvalidOid, budget_id);
		for (i = 0; i < EM_FLOOR_WAYS && e == NULL; i++)
			if (set->entry[i].dbid == InvalidOid)
				e = &set->entry[i];
		if (e == NULL)
		{
			e = &set->entry[set->victim];
			set->victim = (set->victim + 1) % EM_FLOOR_WAYS;
		}
		e->dbid = MyDatabaseId;
		e->jobnode = jobnode;
		e->budget_id = budget_id;
		e->floor = floor;
	}
	SpinLockRelease(&set->lock);
}
