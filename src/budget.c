/*-------------------------------------------------------------------------
 *
 * budget.c
 *	  A cycle's budget row and what is written under its lock: creating
 *	  and locking the row, admitting a hold into it, expiring its dead
 *	  holds, and the cycle's mark lock.  The
 *	  gate (gate.c) and escrow's slow path (escrow.c) both call these; the
 *	  ledger (ledger.c) creates budget rows and takes mark locks here too.
 *
 *	  Tables: earmark.budget, earmark.job (inserted and expired here),
 *	  and earmark.meter_mark (every writer's mark, em_mark_cycle; an
 *	  expired job row is its own ledger entry, see the view
 *	  earmark.ledger).
 *
 *	  Locks: the budget row FOR UPDATE (em_budget_lock; the callers hold
 *	  it for the rest of their transaction); dead job rows FOR UPDATE SKIP
 *	  LOCKED (an expiry never waits for a job); the cycle's mark lock
 *	  (below).  The rate limit (ratelimit.c) takes no row lock.
 *
 *	  A reserve's search for dead holds (em_budget_reclaim) reads none
 *	  while the budget's lease floor (leasefloor.c, shared memory) says
 *	  none can be dead; a search that read them all and found none dead
 *	  stores the floor, and every hold admitted here notes its lease end
 *	  for its commit to lower the floor.  The sweeper's
 *	  (em_budget_expire) never trusts a floor.
 *
 *	  The mark lock of a cycle is a transaction-level advisory lock in a
 *	  key space of its own (earmark's mark class, and a fourth key no SQL
 *	  function makes, EARMARK_MARK_LOCKTAG), so that it never meets an
 *	  application's advisory locks and no role can hold it by hand.
 *	  Every writer that may find the cycle's meter mark already there
 *	  holds it shared until it commits; the reporter takes it
 *	  exclusively, without waiting, before it deletes a mark (meter.c), so
 *	  it never deletes a mark whose writer's usage it has not seen.  Two
 *	  cycles whose ids agree in the low 32 bits share a lock; that only
 *	  makes a mark live one pass longer.  Advisory locks are per node: on
 *	  Citus every taker runs on the node that holds the account (cluster.c
 *	  checks it).
 *
 *	  On a single node the row's look-up (em_budget_find) and lock, the
 *	  writes of its used and held, and the expiry of each dead job row,
 *	  are made by index from C (direct.c), as the SQL statements below
 *	  would make them; on Citus, or where the table has something the
 *	  executor would run, the statements are used.
 *
 *	  Every statement names the account (account = $1 on every relation),
 *	  so that on Citus it runs on the account's shard alone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "budget.h"
#include "cluster.h"
#include "direct.h"
#include "earmark.h"
#include "leasefloor.h"
#include "settings.h"
#include "spi.h"

/* ---------------------------------------------------------------------
 * The budget row
 * ---------------------------------------------------------------------
 */
static EmStatement lock_budget = {
	"SELECT budget_id, used, held, slots, slot_lim, slot_gen, slot_cut FROM earmark.budget "
	"WHERE account = $1 AND feature = $2 AND cycle_start = $3 FOR UPDATE",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};
enum
{
	LB_BUDGET_ID = 1, LB_USED, LB_HELD, LB_SLOTS, LB_SLOT_LIM, LB_SLOT_GEN, LB_SLOT_CUT
};

/* the new row takes the account's escrow slots, or earmark.escrow_slots */
static EmStatement create_budget = {
	"INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, slots) "
	"SELECT $1, $2, $3, $4, coalesce(a.escrow_slots, $5) FROM earmark.account a WHERE a.account = $1 "
	"ON CONFLICT (account, feature, cycle_start) DO NOTHING",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID}
};

static EmStatement write_budget = {
	"UPDATE earmark.budget SET used = $3, held = $4 WHERE account = $1 AND budget_id = $2",
	4, {TEXTOID, INT8OID, INT8OID, INT8OID}
};

static EmStatement release_budget = {
	"UPDATE earmark.budget SET held = held - $3, used = used + $4 "
	"WHERE account = $1 AND budget_id = $2",
	4, {TEXTOID, INT8OID, INT8OID, INT8OID}
};

/*
 * The same lock by index from C (direct.c: as SELECT ... FOR UPDATE takes
 * it, READ COMMITTED's re-check and REPEATABLE READ's 40001 included), on
 * a single node; lock_budget through SPI on Citus.  Also the read without
 * a lock of em_budget_find.
 */
static EmDirect budget_of_cycle = {
	.table = "budget", .nkeys = 3, .keys = {"account", "feature", "cycle_start"},
	.ncols = 7, .cols = {"budget_id", "used", "held", "slots", "slot_lim", "slot_gen",
	"slot_cut"},
	.types = {INT8OID, INT8OID, INT8OID, INT4OID, INT8OID, INT8OID, INT8OID}
};

/* the units of a cycle's usage counters (earmark.usage_shard) */
static EmDirect usage_of_cycle = {
	.table = "usage_shard", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"units"}, .types = {INT8OID}
};

static bool
add_units(Datum *values, bool *nulls, void *arg)
{
	if (!nulls[0])
		int128_add_int64((INT128 *) arg, DatumGetInt64(values[0]));
	return true;
}

/*
 * A sum of bigints as SQL's sum(...)::bigint gives it: summed without a
 * bound on the way (numeric there, 128 bits here: a row count cannot
 * carry it past), and an error only when the total is not a bigint.
 */
int64
em_bigint_sum(INT128 sum)
{
	if (int128_compare(sum, int64_to_int128(PG_INT64_MAX)) > 0 ||
		int128_compare(sum, int64_to_int128(PG_INT64_MIN)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	return int128_to_int64(sum);
}

/*
 * The usage recorded without a hold in the cycle, as snap sees it: the sum
 * of its counter rows, read by index from C (direct.c), on a single node.
 */
int64
em_budget_recorded(text *account, int64 budget_id, Snapshot snap)
{
	Datum		keys[2];
	INT128		sum = int64_to_int128(0);

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	(void) em_direct_scan(&usage_of_cycle, keys, snap, add_units, &sum);
	return em_bigint_sum(sum);
}

/*
 * Lock the cycle's budget row; false when it does not exist.  Fills the
 * row's own numbers into *b; the limit is the caller's to read.
 */
bool
em_budget_lock(text *account, text *feature, TimestampTz start, EmBudget *b)
{
	Datum		args[3];
	Datum		v[7];
	bool		n[7];

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(start);
	if (!em_distributed())
	{
		if (!em_direct_lock(&budget_of_cycle, args, v, n))
			return false;
		b->cycle_start = start;
		b->budget_id = DatumGetInt64(v[0]);
		b->used = DatumGetInt64(v[1]);
		b->held = DatumGetInt64(v[2]);
		b->slots = DatumGetInt32(v[3]);
		b->slot_lim_null = n[4];
		b->slot_lim = n[4] ? 0 : DatumGetInt64(v[4]);
		b->slot_gen = DatumGetInt64(v[5]);
		b->slot_cut = DatumGetInt64(v[6]);
		return true;
	}
	em_exec(&lock_budget, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	b->cycle_start = start;
	b->budget_id = em_get_int64(0, LB_BUDGET_ID, 0);
	b->used = em_get_int64(0, LB_USED, 0);
	b->held = em_get_int64(0, LB_HELD, 0);
	b->slots = (int) em_get_int64(0, LB_SLOTS, 0);
	b->slot_lim = em_get_int64(0, LB_SLOT_LIM, 0);
	(void) em_get(0, LB_SLOT_LIM, &b->slot_lim_null);
	b->slot_gen = em_get_int64(0, LB_SLOT_GEN, 0);
	b->slot_cut = em_get_int64(0, LB_SLOT_CUT, 0);
	return true;
}

/* the cycle's budget row's id, without a lock (em_budget_find, on Citus) */
static EmStatement find_budget = {
	"SELECT budget_id FROM earmark.budget "
	"WHERE account = $1 AND feature = $2 AND cycle_start = $3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static const char *const budget_tables[] = {"budget"};

/*
 * The id of the cycle's budget row; false when it does not exist.  No
 * lock: read as find_budget reads it, in the snapshot the statement would
 * take, by budget_of_cycle's index from C on a single node.  find_budget's
 * plan reads a small budget table whole, and under SERIALIZABLE that
 * predicate lock on the table meets every other account's budget write
 * (a reserve, a settle): two accounts' transactions that each recorded
 * usage and reserved or settled failed each other with 40001 (isolation
 * spec serializable_usage_accounts).
 */
bool
em_budget_find(text *account, text *feature, TimestampTz start, int64 *budget_id)
{
	Datum		args[3];
	Snapshot	snap;
	bool		found;
	int64		used;
	int64		held;

	if (!em_distributed())
	{
		snap = em_direct_statement_snapshot(budget_tables, lengthof(budget_tables));
		found = em_budget_numbers(account, feature, start, snap, budget_id, &used, &held);
		em_direct_release(snap);
		return found;
	}
	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(start);
	em_exec(&find_budget, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	*budget_id = em_get_int64(0, 1, 0);
	return true;
}

/*
 * The cycle's budget row's id, used and held in snap, by budget_of_cycle's
 * index from C: on a single node only.  False when there is no row.
 */
bool
em_budget_numbers(text *account, text *feature, TimestampTz start, Snapshot snap,
				  int64 *budget_id, int64 *used, int64 *held)
{
	Datum		args[3];
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(start);
	if (!em_direct_get(&budget_of_cycle, args, snap, v, n))
		return false;
	*budget_id = DatumGetInt64(v[0]);
	*used = DatumGetInt64(v[1]);
	*held = DatumGetInt64(v[2]);
	return true;
}

/* create the cycle's row unless it exists (the caller then locks it) */
void
em_budget_create(text *account, text *feature, TimestampTz start,
				 TimestampTz end)
{
	Datum		args[5];

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(start);
	args[3] = TimestampTzGetDatum(end);
	args[4] = Int32GetDatum(earmark_escrow_slots);
	em_exec(&create_budget, args, NULL, 0);
}

/*
 * The budget row's numbers written by index from C on a single node
 * (direct.c: a new version of the row as the UPDATE would make it, with
 * its wait and re-check, no executor); write_budget and release_budget
 * through SPI on Citus, or where the table has something the executor
 * would have to run.
 */
static EmDirect budget_numbers = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 2, .cols = {"used", "held"}, .nwrite = 2, .types = {INT8OID, INT8OID}
};

/* the new numbers: set (write_budget) or moved (release_budget) */
typedef struct BudgetChange
{
	bool		set;
	int64		used;			/* set: used; moved: charged, into used */
	int64		held;			/* set: held; moved: released, out of held */
} BudgetChange;

static bool
change_numbers(Datum *values, bool *nulls, void *arg)
{
	BudgetChange *c = (BudgetChange *) arg;
	int64		used = c->used;
	int64		held = c->held;

	if (!c->set &&
		(pg_add_s64_overflow(DatumGetInt64(values[0]), c->used, &used) ||
		 pg_sub_s64_overflow(DatumGetInt64(values[1]), c->held, &held)))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	values[0] = Int64GetDatum(used);
	values[1] = Int64GetDatum(held);
	nulls[0] = nulls[1] = false;
	return true;
}

/* the change by index from C: EM_DIRECT_UNWRITABLE when the SQL must make it */
static EmDirectWrite
budget_change_direct(text *account, int64 budget_id, BudgetChange *c)
{
	Datum		keys[2];

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	return em_direct_update(&budget_numbers, keys, change_numbers, c);
}

void
em_budget_write(text *account, int64 budget_id, int64 used, int64 held)
{
	BudgetChange c = {true, used, held};
	Datum		args[4];

	if (budget_change_direct(account, budget_id, &c) != EM_DIRECT_UNWRITABLE)
		return;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int64GetDatum(used);
	args[3] = Int64GetDatum(held);
	em_exec(&write_budget, args, NULL, 0);
}

/*
 * holds of *released ended, *charged of them used: into the budget row;
 * whether the row was written (a BEFORE trigger may skip it, an operator
 * may have deleted it)
 */
bool
em_budget_release(text *account, int64 budget_id, int64 released, int64 charged)
{
	BudgetChange c = {false, charged, released};
	Datum		args[4];
	EmDirectWrite w = budget_change_direct(account, budget_id, &c);

	if (w != EM_DIRECT_UNWRITABLE)
		return w == EM_DIRECT_WRITTEN;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int64GetDatum(released);
	args[3] = Int64GetDatum(charged);
	em_exec(&release_budget, args, NULL, 0);
	return SPI_processed > 0;
}

/* limit - used - held, at least 0; unlimited reads as PG_INT64_MAX */
int64
em_room_left(bool unlimited, int64 lim, int64 used, int64 held)
{
	int64		r;

	if (unlimited)
		return PG_INT64_MAX;
	if (pg_sub_s64_overflow(lim, used, &r) || pg_sub_s64_overflow(r, held, &r))
		return 0;
	return Max(r, 0);
}

/* ---------------------------------------------------------------------
 * A hold in the budget row
 * ---------------------------------------------------------------------
 */

/*
 * The job row; nothing when the key is already taken.  The job's id is
 * earmark.job's default (cluster.c's next_id).  The budget row's new
 * numbers follow in write_budget, only when the job was inserted.  (Two
 * small statements cost less than one that does both: executor start-up
 * of a WITH of two writes builds a plan state for each part and the scans
 * that join them; docs/benchmarks.md.)
 */
static EmStatement admit_job = {
	"INSERT INTO earmark.job (account, budget_id, feature, idempotency_key, amount, lease, lease_until, created_at) "
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
	"ON CONFLICT (account, idempotency_key) DO NOTHING RETURNING job_id",
	8, {TEXTOID, INT8OID, TEXTOID, TEXTOID, INT8OID, INTERVALOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID}
};

/*
 * Admit the hold outside any escrow slot, into the locked budget row *b
 * (which then counts it).  EM_ADMIT_KEY_TAKEN when a concurrent reserve
 * with the same key committed first (the insert's conflict check waited
 * for it).
 */
EmAdmit
em_budget_admit(EmHold *h, EmBudget *b)
{
	int64		new_held;
	Datum		args[8];

	if (pg_add_s64_overflow(b->held, h->amount, &new_held))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("the account's holds would exceed the largest bigint")));
	args[0] = PointerGetDatum(h->account);
	args[1] = Int64GetDatum(b->budget_id);
	args[2] = PointerGetDatum(h->feature);
	args[3] = PointerGetDatum(h->key);
	args[4] = Int64GetDatum(h->amount);
	args[5] = IntervalPGetDatum(h->lease);
	args[6] = TimestampTzGetDatum(h->lease_until);
	args[7] = TimestampTzGetDatum(h->now);
	em_exec(&admit_job, args, NULL, 1);
	if (SPI_processed != 1)
		return EM_ADMIT_KEY_TAKEN;
	h->job_id = em_get_int64(0, 1, 0);
	em_floor_note_hold(b->budget_id, h->lease_until);
	em_budget_write(h->account, b->budget_id, b->used, new_held);
	b->held = new_held;
	return EM_ADMIT_OK;
}

/* ---------------------------------------------------------------------
 * Dead holds
 * ---------------------------------------------------------------------
 */

/*
 * Expire a locked budget's dead holds, at the use they recorded: lock the
 * dead job rows (SKIP LOCKED: an expiry never waits for a job), expire
 * them (an expired job row with charged > 0 is its own ledger entry,
 * earmark.sql; on a single node each row by its primary key from C, see
 * job_expiry), and mark the cycle if one used something.  One
 * single-table statement after another, each naming the account, so
 * that on Citus each runs on the account's shard alone.  A
 * hold taken from an escrow slot is expired into the budget row like any
 * other (only the sums count: escrow.c).
 */
static EmStatement lock_dead_jobs = {
	"SELECT job_id FROM earmark.job "
	" WHERE account = $1 AND budget_id = $2 AND status IN ('running', 'capped') "
	"   AND lease_until < $3 "
	" LIMIT $4 FOR UPDATE SKIP LOCKED",
	4, {TEXTOID, INT8OID, TIMESTAMPTZOID, INT4OID}
};

/* the rows are locked: no re-check is needed, and none could fail */
/* the columns of expire_locked_jobs */
enum
{
	EJ_JOB_ID = 1, EJ_AMOUNT, EJ_USED
};

static EmStatement expire_locked_jobs = {
	"UPDATE earmark.job SET status = 'expired', settled_at = $3, charged = used, "
	"       released = amount - used "
	" WHERE account = $1 AND job_id = ANY ($2) "
	"RETURNING job_id, amount, used",
	3, {TEXTOID, INT8ARRAYOID, TIMESTAMPTZOID}
};

/*
 * expire_locked_jobs from C on a single node (direct.c), one job row at a
 * time by its primary key: each expiry reads its own row and no other.
 * The statement's plan depends on the statistics: with those of about one
 * job per account (ANALYZE after a bulk load), it read every job the
 * account ever had, settled ones included, in the idempotency key's index
 * and tested each against the array, at every sweep of every budget
 * (test/integration/sweep_plans.sh).  The first four columns are written.
 */
static EmDirect job_expiry = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 6, .cols = {"status", "settled_at", "charged", "released", "amount", "used"},
	.nwrite = 4, .types = {TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID, INT8OID, INT8OID},
	.nullok = {[1] = true, [2] = true, [3] = true}
};

/* the expiries' sums, as expire_locked_jobs's RETURNING gives them */
typedef struct Expiry
{
	Datum		status;			/* 'expired' */
	TimestampTz now;
	int64		amount;			/* the row expire_fit last wrote */
	int64		used;
	int64		expired;
	int64		released;
	int64		charged;
} Expiry;

/*
 * expire_locked_jobs's SET clause.  The row is locked by this transaction,
 * so (as in the statement) its WHERE clause needs no re-check; the sums are
 * added once the write is made (fn may see a row more than once).
 */
static bool
expire_fit(Datum *v, bool *n, void *arg)
{
	Expiry	   *e = (Expiry *) arg;

	e->amount = DatumGetInt64(v[4]);
	e->used = DatumGetInt64(v[5]);
	v[0] = e->status;
	v[1] = TimestampTzGetDatum(e->now);
	v[2] = Int64GetDatum(e->used);
	v[3] = Int64GetDatum(e->amount - e->used);
	n[0] = n[1] = n[2] = n[3] = false;
	return true;
}

/*
 * Expire the locked jobs ids[0 .. n - 1] from C, into *e; returns how many
 * were done, fewer than n from the first one the SQL must write (on
 * Citus, or where an UPDATE of earmark.job would run something more: all
 * of them).  Each write's own allocations (its index entries' IndexInfo,
 * say) go with a context reset per row: a sweep may expire many.
 */
static int
expire_direct(text *account, Datum *ids, int n, Expiry *e)
{
	MemoryContext row_cxt = AllocSetContextCreate(CurrentMemoryContext,
												  "earmark expiry", ALLOCSET_SMALL_SIZES);
	Datum		keys[2];
	int			i;

	keys[0] = PointerGetDatum(account);
	for (i = 0; i < n; i++)
	{
		MemoryContext old = MemoryContextSwitchTo(row_cxt);
		EmDirectWrite w;

		keys[1] = ids[i];
		w = em_direct_update(&job_expiry, keys, expire_fit, e);
		MemoryContextSwitchTo(old);
		MemoryContextReset(row_cxt);
		if (w == EM_DIRECT_UNWRITABLE)
			break;
		if (w != EM_DIRECT_WRITTEN)
			continue;			/* locked here, so never: as the statement's 0 rows */
		e->expired++;
		e->released += e->amount;	/* the whole hold leaves held */
		e->charged += e->used;
	}
	MemoryContextDelete(row_cxt);
	return i;
}

/* the same by expire_locked_jobs, for the locked jobs ids[0 .. n - 1] */
static void
expire_sql(text *account, Datum *ids, int n, Expiry *e)
{
	Datum		args[3];
	int			i;

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(construct_array(ids, n, INT8OID, sizeof(int64),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	args[2] = TimestampTzGetDatum(e->now);
	em_exec(&expire_locked_jobs, args, NULL, 0);
	for (i = 0; i < (int) SPI_processed; i++)
	{
		e->expired++;
		e->released += em_get_int64(i, EJ_AMOUNT, 0);	/* the whole hold leaves held */
		e->charged += em_get_int64(i, EJ_USED, 0);
	}
}

/*
 * The cycle's mark, inserted when no committed one was seen: meter_mark
 * has no unique key (earmark.sql), so the insert never waits for another
 * writer's uncommitted mark.  That wait closed cycles: a writer that held
 * a job row another transaction waited for (a reserve's key check, a
 * settle of the same job) waited in its mark's insert for that
 * transaction's own mark (isolation specs review_many_mark_deadlock,
 * review_many_vs_settle).  Writers that ran together may each insert one;
 * the reporter deletes them all.
 */
static EmStatement insert_mark = {
	"INSERT INTO earmark.meter_mark (account, budget_id) VALUES ($1, $2)",
	2, {TEXTOID, INT8OID}
};

/*
 * On Citus, where em_mark_seen cannot read: the check in the statement's
 * snapshot, taken after the caller's mark lock under READ COMMITTED (a
 * transaction's snapshot may be older than that lock and still show a mark
 * the reporter deleted since: then the plain insert).
 */
static EmStatement insert_mark_unseen = {
	"INSERT INTO earmark.meter_mark (account, budget_id) SELECT $1, $2 "
	"WHERE NOT EXISTS (SELECT 1 FROM earmark.meter_mark WHERE account = $1 AND budget_id = $2)",
	2, {TEXTOID, INT8OID}
};

/*
 * Mark the cycle for the reporter, unless it is marked already.  The
 * caller holds the cycle's mark lock.
 */
void
em_mark_cycle(text *account, int64 budget_id)
{
	Datum		args[2];

	if (em_mark_seen(account, budget_id))
		return;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	em_exec(em_distributed() && !IsolationUsesXactSnapshot() ?
			&insert_mark_unseen : &insert_mark, args, NULL, 0);
}

/*
 * Whether the cycle's meter mark is there, committed or this
 * transaction's own, so that a writer need not insert it: read by index
 * from C (direct.c), by a caller that holds the cycle's mark lock shared.
 * Holding that lock, no reporter is between its exclusive lock and its
 * commit, so a mark committed now stays until the caller commits (the
 * reporter deletes marks only under the exclusive lock).  Read with
 * SnapshotSelf, which sees what is committed now and the transaction's
 * own rows, not with the transaction's snapshot: under REPEATABLE READ a
 * snapshot older than the lock may still show a mark the reporter deleted
 * since; and SnapshotSelf takes no predicate lock under SERIALIZABLE (an
 * MVCC read would, and two writers of one cycle that each read "no mark"
 * and inserted one would fail each other with 40001).  A transaction that
 * writes a cycle many times so inserts one mark.  False on Citus (the
 * table here is a shell): em_mark_cycle then checks in its insert under
 * READ COMMITTED.
 */
static EmDirect mark_of_cycle = {
	.table = "meter_mark", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"budget_id"}
};

static bool
count_row(Datum *values, bool *nulls, void *arg)
{
	return false;				/* one is enough */
}

bool
em_mark_seen(text *account, int64 budget_id)
{
	Datum		keys[2];

	if (em_distributed())
		return false;
	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	return em_direct_scan(&mark_of_cycle, keys, SnapshotSelf, count_row, NULL) > 0;
}

/*
 * lock_dead_jobs from C on a single node (direct.c), by job_open: the
 * statement's plan reads a small job table whole, and under SERIALIZABLE
 * that is a predicate lock on every account's jobs
 * (sql/serializable_reads.sql).  Its WHERE clause beyond the keys is
 * dead_hold's; status IN ('running', 'capped') is job_open's predicate,
 * so the index has every row it can match.
 */
static EmDirect dead_holds = {
	.table = "job", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 3, .cols = {"job_id", "status", "lease_until"},
	.pred = "(status = ANY (ARRAY['running'::text, 'capped'::text]))"
};

/*
 * The collected ids of dead holds, and the time they are dead at; and,
 * for the budget's lease floor (leasefloor.c), how many dead holds the
 * walk read (locked or not) and the earliest lease end of the others.
 */
typedef struct DeadHolds
{
	TimestampTz now;
	Datum	   *ids;
	int			n;
	int			size;
	int			dead;
	TimestampTz earliest;
} DeadHolds;

/* status IN ('running', 'capped') AND lease_until < now */
static bool
dead_hold(Datum *values, bool *nulls, void *arg)
{
	DeadHolds  *dh = (DeadHolds *) arg;
	text	   *status = DatumGetTextPP(values[1]);
	int			len = VARSIZE_ANY_EXHDR(status);
	const char *s = VARDATA_ANY(status);
	TimestampTz lease_until;

	if (!((len == 7 && memcmp(s, "running", 7) == 0) ||
		  (len == 6 && memcmp(s, "capped", 6) == 0)))
		return false;
	if (nulls[2])
	{
		dh->dead++;				/* no floor from this walk */
		return false;
	}
	lease_until = DatumGetTimestampTz(values[2]);
	if (lease_until >= dh->now)
	{
		dh->earliest = Min(dh->earliest, lease_until);
		return false;
	}
	dh->dead++;
	return true;
}

static bool
take_dead(Datum *values, bool *nulls, void *arg)
{
	DeadHolds  *dh = (DeadHolds *) arg;

	if (dh->n == dh->size)
	{
		dh->size *= 2;
		dh->ids = repalloc(dh->ids, sizeof(Datum) * dh->size);
	}
	dh->ids[dh->n++] = values[0];
	return true;
}

/*
 * The job table, for a search that may use the budget's lease floor; it
 * stores none in a transaction that wrote the table (leasefloor.c).
 */
typedef struct FloorTable
{
	Oid			node;			/* InvalidOid: no floor */
	bool		written;
} FloorTable;

/*
 * The ids of up to max dead holds of the budget, locked; palloc'd.  With a
 * floor table, a walk that read every open hold and found none dead stores
 * the earliest lease end it read as the budget's lease floor:
 * em_floor_begin comes before the walk's snapshot (leasefloor.c says why).
 */
static int
lock_dead(text *account, int64 budget_id, TimestampTz now, int max,
		  const FloorTable *floor, Datum **ids)
{
	Datum		args[4];
	int			n;
	int			i;

	if (!em_distributed())
	{
		DeadHolds	dh = {now, palloc(sizeof(Datum) * 16), 0, 16, 0, DT_NOEND};
		EmFloorToken token = {false};

		if (OidIsValid(floor->node) && !floor->written)
			em_floor_begin(budget_id, &token);
		args[0] = PointerGetDatum(account);
		args[1] = Int64GetDatum(budget_id);
		n = em_direct_lock_skip_all(&dead_holds, args, dead_hold, &dh, max, take_dead, &dh);
		*ids = dh.ids;
		if (n == 0 && dh.dead == 0)
			em_floor_store(&token, floor->node, budget_id, dh.earliest);
		if (n >= 0)
			return n;
		pfree(dh.ids);
	}
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = TimestampTzGetDatum(now);
	args[3] = Int32GetDatum(max);
	em_exec(&lock_dead_jobs, args, NULL, 0);
	n = (int) SPI_processed;
	*ids = palloc(sizeof(Datum) * Max(n, 1));
	for (i = 0; i < n; i++)
		(*ids)[i] = Int64GetDatum(em_get_int64(i, 1, 0));
	return n;
}

static int64 expire_holds(text *account, int64 budget_id, TimestampTz now, int max,
						  bool wait, const FloorTable *floor, int64 *released,
						  int64 *charged);

/*
 * Expire up to max dead holds of a budget whose row the caller holds
 * locked; returns how many.  *released and *charged are their sums, for
 * the caller to apply to the budget row.  It may find the cycle marked, so
 * it takes the cycle's mark lock; without wait, a lock the reporter holds
 * makes it expire nothing (the worker never waits while it holds a budget
 * row).  The sweeper's: it never trusts a lease floor, so that a hold
 * written by hand (leasefloor.c) is expired at its next pass.
 */
int64
em_budget_expire(text *account, int64 budget_id, TimestampTz now, int max,
				 bool wait, int64 *released, int64 *charged)
{
	FloorTable	none = {InvalidOid, false};

	return expire_holds(account, budget_id, now, max, wait, &none, released, charged);
}

/*
 * The same for a reserve that found no room (a hold whose lease has passed
 * never causes a refusal), waiting for the mark lock: nothing to read when
 * the budget's lease floor is later than now, and a walk that finds
 * nothing dead stores the floor (leasefloor.c).
 */
int64
em_budget_reclaim(text *account, int64 budget_id, TimestampTz now, int max,
				  int64 *released, int64 *charged)
{
	FloorTable	floor = {InvalidOid, false};

	if (!em_distributed())
		floor.node = em_direct_table_node("job", &floor.written);
	if (em_floor_none_dead(floor.node, budget_id, now, NULL))
	{
		*released = 0;
		*charged = 0;
		return 0;
	}
	return expire_holds(account, budget_id, now, max, true, &floor, released, charged);
}

/*
 * Whether no open hold of the budget can be dead at now, by its lease
 * floor alone: no hold is read, and nothing is stored (a refusal without
 * the budget row, gate.c, before its snapshot).  *gen is for
 * em_budget_floor_unmoved after that snapshot.  False on Citus, where
 * floors are not kept.
 */
bool
em_budget_none_dead(int64 budget_id, TimestampTz now, uint64 *gen)
{
	bool		written;

	if (em_distributed())
		return false;
	return em_floor_none_dead(em_direct_table_node("job", &written), budget_id, now, gen);
}

/* no hold of the budget's floor set committed since em_budget_none_dead */
bool
em_budget_floor_unmoved(int64 budget_id, uint64 gen)
{
	return em_floor_gen_unmoved(budget_id, gen);
}

static int64
expire_holds(text *account, int64 budget_id, TimestampTz now, int max,
			 bool wait, const FloorTable *floor, int64 *released, int64 *charged)
{
	Expiry		e = {0};
	Datum	   *ids;
	int			n;
	int			done;

	*released = 0;
	*charged = 0;
	if (!wait && !em_mark_try_lock(budget_id))
		return 0;
	if (wait)
		em_mark_lock(budget_id);
	n = lock_dead(account, budget_id, now, max, floor, &ids);
	if (n == 0)
		return 0;

	e.status = CStringGetTextDatum("expired");
	e.now = now;
	done = expire_direct(account, ids, n, &e);
	if (done < n)
		expire_sql(account, ids + done, n - done, &e);
	*released = e.released;
	*charged = e.charged;

	/* the expired job rows (charged = used) are the ledger entries */
	if (*charged > 0)
		em_mark_cycle(account, budget_id);
	return e.expired;
}

/* ---------------------------------------------------------------------
 * The cycle's mark lock (see the file header)
 * ---------------------------------------------------------------------
 */
static void
mark_locktag(LOCKTAG *tag, int64 budget_id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, EARMARK_MARK_CLASS,
						 (uint32) budget_id, EARMARK_MARK_LOCKTAG);
}

void
em_mark_lock(int64 budget_id)
{
	LOCKTAG		tag;

	mark_locktag(&tag, budget_id);
	(void) LockAcquire(&tag, ShareLock, false, false);
}

/* the same without waiting: false when the reporter holds it */
bool
em_mark_try_lock(int64 budget_id)
{
	LOCKTAG		tag;

	mark_locktag(&tag, budget_id);
	return LockAcquire(&tag, ShareLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

bool
em_mark_try_lock_exclusive(int64 budget_id)
{
	LOCKTAG		tag;

	mark_locktag(&tag, budget_id);
	return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}
