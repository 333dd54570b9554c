/*-------------------------------------------------------------------------
 *
 * escrow.c
 *	  Escrow for hot budgets (O'Neil's escrow method): a budget
 *	  with slots > 0 splits its free room into earmark.budget_slot rows, so
 *	  that admissions take room from a slot instead of queueing on the one
 *	  budget row.
 *
 *	  The books: a slot's allocation is room + held + used.  An admission
 *	  through a slot moves room to held, a settlement moves held to used and
 *	  the rest back to room, so neither changes the allocation; only a
 *	  rebalance does, and only under the budget row's lock.  A settlement
 *	  may do its move in any free slot, not the one the hold came from, and
 *	  an expiry does it in the budget row: a slot's (or the row's) own held
 *	  may then go below zero, but the sums are what the books use: held
 *	  over the row and all slots is the sum of the open holds.  The limit
 *	  holds because a rebalance never hands out more than
 *	    limit - budget.used - budget.held - (allocations it does not touch)
 *	  and admissions outside slots (the rebalance's own) are counted in
 *	  budget.used/held.  So used + held over budget and slots never passes
 *	  the limit, and never by one unit.
 *
 *	  Slots get half of the free room; the other half stays unallocated on
 *	  the budget row.  An admission whose slot ran dry takes from it under
 *	  the budget row's lock and tops up only the free slots running low.
 *	  Only near the limit (or after a limit change, or when the
 *	  allocations no longer fit the recorded usage) does a rebalance gather
 *	  the room of every free slot, so that a refusal means the whole budget
 *	  lacks room; and when the whole budget, every slot summed, lacks room
 *	  for the job and no new generation is due, the slow path refuses
 *	  without gathering (refused_outright): it writes nothing, so the fast
 *	  path's checks (slot_rec, the limit row's version, slot_cut) still
 *	  compare with the last rebalance that did.
 *
 *	  A limit change, and usage recorded without a hold (the counter rows
 *	  earmark_record_usage writes; it locks no slot): budget.slot_lim is
 *	  the raw limit (the account's limit, not less recorded usage) the
 *	  current generation was cut for, NULL when cut unlimited.  The fast
 *	  path reads, in one snapshot (one SPI statement's on Citus; by index
 *	  from C, direct.c, on a single node), the budget row, the sums
 *	  of every slot row (room, held and used, whatever its generation or
 *	  slot number), the account's limit and the recorded usage, and uses
 *	  the slots only while slot_lim is the limit it read and they fit:
 *	    budget.used + budget.held + allocations + recorded <= limit
 *	  (unlimited, only slots cut unlimited admit), and its take uses only
 *	  a slot of the generation it read whose stamp (budget_slot.cut) is at
 *	  most the budget's slot_cut it read.  Every rebalance stamps the slots
 *	  it cuts with a slot_cut one above the last, under the budget row's
 *	  lock, so a slot the take may use was last cut by a rebalance that
 *	  committed before the fast path's read: the read summed that slot's
 *	  allocation as it is at the take.  (A settlement moves room, held and
 *	  used inside one allocation; nothing else but a cut raises one.)
 *	  Why that keeps the limit: every writer that raises an allocation or
 *	  budget.used/held is a slow path under the budget row's lock
 *	  (admit_from_unallocated, the gathering cut), and it leaves
 *	  budget.used + budget.held + allocations at most its raw limit less
 *	  the recorded usage its own snapshot after the lock reads.  A fast
 *	  path's take stays inside one slot's allocation, which its read
 *	  counted with every other allocation, the budget row and the recorded
 *	  usage it saw, within the limit it saw.  Without the stamp it would
 *	  not: a rebalance that read the recorded usage before some usage
 *	  committed could cut room into a slot after the fast path's read saw
 *	  that usage, and the take would spend room its fit check never summed
 *	  (isolation spec review_stale_recorded).  Nor would it without a third
 *	  rule: recorded usage is written without the budget row's lock, so a
 *	  rebalance running now may have read less of it than the fast path
 *	  did and be admitting, uncommitted, from the unallocated room the fast
 *	  path's read counts as free (review_stale_budget_row).  So the fast
 *	  path also needs one of two things.  Either the recorded usage it
 *	  read is what the last committed rebalance read (budget.slot_rec):
 *	  usage goes down only under the budget row's lock, where a correction
 *	  or a rebuild of the counters sets slot_rec NULL, so a rebalance
 *	  running since read at least as much; and the limit row it read is
 *	  the very version the last committed rebalance saw (budget.slot_limx
 *	  and slot_limt, the row's xmin and updated_at, read after that
 *	  rebalance's lock; an xid alone repeats after a restore, a move
 *	  between Citus nodes or a wraparound): the limit, too, is
 *	  written without the budget row's lock, and a limit raised and set
 *	  back (1000, 2000, 1000) while a rebalance under 2000 is admitting
 *	  would otherwise pass (review_limit_back).  Or, on a single node, the
 *	  budget row's newest version, looked at after the fast path's read,
 *	  has the slot_cut that read saw (no rebalance committed in between)
 *	  and no running transaction locks or updates it (em_direct_unclaimed):
 *	  a rebalance locks the row before it reads the recorded usage, so one
 *	  that read less than the fast path held the lock at the fast path's
 *	  read, and still holds it or has committed a new slot_cut.  On Citus
 *	  the row is in a shard and only the first applies.  Usage recorded
 *	  concurrently with an admission, as before, counts from the next one.  So usage
 *	  recorded within the unallocated room leaves the slots admitting, and
 *	  only usage beyond it sends admissions to the slow path.
 *	  The rebalance starts a new generation (gathering every free slot and
 *	  cutting them for what is left) on the first cut, when limited-ness
 *	  changed, when the raw limit is not slot_lim, or when the allocations
 *	  no longer fit the limit less the recorded usage, summed under the
 *	  budget row's lock; otherwise it keeps the generation.  Recorded usage
 *	  that changes alone, up or down, thus bumps it only once the
 *	  allocations no longer fit.  Any limit change sends admissions to the
 *	  slow path (the fast path sees slot_lim differ), whose first rebalance
 *	  bumps the generation and re-cuts the rooms it can lock; slots it
 *	  could not lock stop admitting (their generation is old) until a
 *	  later rebalance takes them.
 *
 *	  Locks (the order gate.c keeps, extended):
 *	  - the fast path locks one slot FOR UPDATE SKIP LOCKED and reads the
 *	    budget and limit rows without locking them; it never waits.
 *	  - the rebalance (reserve's slow path) locks the budget row, then the
 *	    slots FOR UPDATE SKIP LOCKED: it never waits for a slot, so a
 *	    transaction that holds a slot and then needs a rebalance itself
 *	    cannot deadlock with another rebalance (SKIP LOCKED does not skip
 *	    rows the transaction itself locked, so it reuses its own slots).
 *	    Room inside slots other transactions hold is waited for by
 *	    retrying a few times, never by blocking on their locks.  On a
 *	    single node its slot locks (and reclaim's job locks, budget.c)
 *	    are taken from C (direct.c's lock_or_skip): the executor's FOR
 *	    UPDATE SKIP LOCKED can wait for a transaction that holds a row's
 *	    newest version (a fast path's admission, which may then wait for
 *	    this budget row) when the version it found was being updated by
 *	    one that ended meanwhile (test/integration/review_slot_skip_chain.sh).
 *	    On Citus the statements remain.
 *	  - settle of a job held by a slot locks the job row, then a free slot
 *	    of its generation (SKIP LOCKED) or, when every slot is busy, the
 *	    budget row, and only then writes the job (gate.c, settle_target).
 *	  - budget_slot has no foreign key: PostgreSQL runs the check when a
 *	    transaction updates a row it already changed (a second admission
 *	    from its own slot), and the key-share lock it takes on the budget
 *	    row would queue the fast path behind every rebalance.
 *	  - the sweeper and reserve's reclaim expire holds into the budget row,
 *	    which they hold; they touch no slot.
 *	  - earmark_set_escrow takes the account's advisory lock exclusive (as
 *	    earmark_set_account; reserve takes it shared only to create a
 *	    cycle's budget row), then the budget rows, then the account row.
 *	    Automatic escrow (gate.c) reads the account's own number again
 *	    once it holds the budget row, so a number set while it waited wins.
 *
 *	  Generations: a hold taken from a slot records the generation it was
 *	  taken in (job.gen), and its settlement returns room only to a free
 *	  slot of that generation, else to the budget row (gate.c).  A new
 *	  generation's cut counts the old holds as taken; room released by an
 *	  old hold into a new slot would be room that cut never gave, handed
 *	  out while the budget may be over a lowered limit.
 *
 *	  Every statement names the account (account = $1 on every relation)
 *	  and none has a correlated subquery or a row lock under a subquery, so
 *	  that on Citus each runs on the account's shard (earmark_distribute).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "account.h"
#include "budget.h"
#include "cluster.h"
#include "direct.h"
#include "escrow.h"
#include "leasefloor.h"
#include "settings.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_set_escrow);

/* how often a rebalance retries for room inside slots others hold */
#define REBALANCE_TRIES		20
#define REBALANCE_WAIT_US	1000

/* the room an unlimited budget is treated as having */
#define UNLIMITED_CAP		(PG_INT64_MAX / 4)

/* ---------------------------------------------------------------------
 * The fast path
 * ---------------------------------------------------------------------
 */

/*
 * The budget's slot state, its limit and recorded usage, and the sums of
 * its slots, without a lock, in one snapshot: whether the slots may admit
 * (everything allocated and recorded fits the limit now in force), and
 * the numbers reserve's "remaining" is computed from.  The three sums come
 * from one walk of the budget's slot rows (s): a sum each was a walk each,
 * three times the slot count of rows read at every admission
 * (test/integration/slot_reads.sh).  On Citus; a single node reads the
 * same by index from C (fast_read_direct).
 */
static EmStatement fast_numbers = {
	"SELECT b.budget_id, b.slots, b.slot_gen, b.slot_lim, b.used, b.held, l.lim, b.slot_cut, "
	"       b.slot_rec, b.slot_limx, l.xmin::text::bigint, b.slot_limt, l.updated_at, "
	"       (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint FROM earmark.usage_shard u "
	"         WHERE u.account = $1 AND u.budget_id = "
	"               (SELECT x.budget_id FROM earmark.budget x "
	"                 WHERE x.account = $1 AND x.feature = $2 AND x.cycle_start = $3)), "
	"       s.used, s.held, s.room "
	"FROM earmark.budget b "
	"JOIN earmark.account_limit l ON l.account = b.account AND l.feature = b.feature "
	"CROSS JOIN (SELECT coalesce(pg_catalog.sum(t.used), 0)::bigint AS used, "
	"                   coalesce(pg_catalog.sum(t.held), 0)::bigint AS held, "
	"                   coalesce(pg_catalog.sum(t.room), 0)::bigint AS room "
	"              FROM earmark.budget_slot t "
	"             WHERE t.account = $1 AND t.budget_id = "
	"                   (SELECT x.budget_id FROM earmark.budget x "
	"                     WHERE x.account = $1 AND x.feature = $2 AND x.cycle_start = $3)) s "
	"WHERE b.account = $1 AND b.feature = $2 AND b.cycle_start = $3 AND b.slot_gen > 0",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};
enum
{
	FN_BUDGET_ID = 1, FN_SLOTS, FN_SLOT_GEN, FN_SLOT_LIM, FN_USED, FN_HELD, FN_LIM,
	FN_SLOT_CUT, FN_SLOT_REC, FN_SLOT_LIMX, FN_LIMX, FN_SLOT_LIMT, FN_LIMT, FN_RECORDED, FN_SLOTS_USED, FN_SLOTS_HELD, FN_SLOTS_ROOM
};

/*
 * The free slot: the first slot from a random start ($3) upward, then
 * from 0, that is of the budget's generation ($5), below its slot count
 * ($4), has the room, was last cut no later than the read saw ($12, the
 * budget's slot_cut), and no other transaction holds.  Each probe walks
 * the primary key (account, budget_id, slot) in order and stops at the
 * first such slot, so an admission reads a slot or two, not all of them.
 * COALESCE runs the second probe only when the first found nothing.  Each
 * probe's FOR UPDATE re-checks room, generation and stamp on the slot's
 * newest version (READ COMMITTED), so a slot drained or cut again
 * meanwhile is passed over.  Then the job (nothing when the key is already taken), and
 * the slot's room to held only for a job that was written.  On Citus; a
 * single node does the same in three steps (take_direct).
 */
#define FREE_SLOT_PROBE(from_to) \
	"(SELECT t.slot FROM earmark.budget_slot t" \
	" WHERE t.account = $1 AND t.budget_id = $2 AND " from_to \
	"   AND t.slot < $4 AND t.gen = $5 AND t.room >= $6 AND t.cut <= $12" \
	" ORDER BY t.slot LIMIT 1 FOR UPDATE SKIP LOCKED)"

static EmStatement fast_take = {
	"WITH s AS (SELECT coalesce(" FREE_SLOT_PROBE("t.slot >= $3") ", "
	FREE_SLOT_PROBE("t.slot < $3") ") AS slot),"
	" j AS ("
	"  INSERT INTO earmark.job (account, budget_id, feature, idempotency_key, amount, lease, lease_until, created_at, slot, gen)"
	"  SELECT $1, $2, $7, $8, $6, $9, $10, $11, s.slot, $5 FROM s WHERE s.slot IS NOT NULL"
	"  ON CONFLICT (account, idempotency_key) DO NOTHING RETURNING job_id, slot),"
	" u AS ("
	"  UPDATE earmark.budget_slot t SET room = t.room - $6, held = t.held + $6"
	"   WHERE t.account = $1 AND t.budget_id = $2 AND t.slot = (SELECT j.slot FROM j)) "
	"SELECT (SELECT s.slot FROM s), (SELECT j.job_id FROM j)",
	12, {TEXTOID, INT8OID, INT4OID, INT4OID, INT8OID, INT8OID, TEXTOID, TEXTOID,
	INTERVALOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID}
};
enum
{
	FT_SLOT = 1, FT_JOB_ID
};

/*
 * Where a search for a free slot starts: a slot of 0 .. slots - 1 at
 * random, so that concurrent sessions spread over the slots instead of
 * all probing slot 0 first.  (Slots beyond the budget's count are never
 * free; the wrap-around probe covers a count that changed meanwhile.)
 */
int
em_random_slot(int slots)
{
	if (slots <= 1)
		return 0;
	return (int) pg_prng_uint64_range(&pg_global_prng_state, 0, (uint64) slots - 1);
}

/*
 * Whether the slots may admit: unlimited, when they were cut unlimited
 * (slot_lim NULL); limited, when the current generation was cut for this
 * very limit (slot_lim, the raw limit of the last rebalance, equals the
 * limit read now) and the budget row's used and held, every allocation
 * (the room, held and used of every slot row, whatever its generation or
 * slot number) and the usage recorded without a hold (the nparts numbers
 * in parts) all fit the limit now.  A sum that passes the largest bigint
 * does not fit.
 */
static bool
slots_fit_limit(bool unlimited, int64 lim, bool slot_lim_null, int64 slot_lim,
				const int64 *parts, int nparts)
{
	int64		whole = 0;
	int			i;

	if (unlimited)
		return slot_lim_null;
	if (slot_lim_null || slot_lim != lim)
		return false;
	for (i = 0; i < nparts; i++)
		if (pg_add_s64_overflow(whole, parts[i], &whole))
			return false;
	return whole <= lim;
}

/*
 * The budget row's newest version, read without a lock (direct.c), when no
 * running transaction locks or updates it.
 */
static EmDirect budget_unclaimed = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"slot_cut"}
};

/*
 * What the fast path read, in one snapshot: the budget row's escrow
 * columns, the limit row's limit and version, the recorded usage and the
 * sums of every slot row of the budget.
 */
typedef struct FastRead
{
	int64		budget_id;
	int32		slots;
	int64		slot_gen;
	bool		slot_lim_null;
	int64		slot_lim;
	int64		used;
	int64		held;
	int64		slot_cut;
	bool		slot_rec_null;
	int64		slot_rec;
	bool		slot_limx_null;
	int64		slot_limx;
	bool		slot_limt_null;
	TimestampTz slot_limt;
	bool		unlimited;
	int64		lim;
	int64		limx;			/* the limit row's xmin */
	bool		limt_null;
	TimestampTz limt;			/* its updated_at */
	int64		recorded;
	int64		slots_used;
	int64		slots_held;
	int64		slots_room;
} FastRead;

/* fast_numbers' one row into *f */
static void
fast_read_spi(FastRead *f)
{
	Datum		d;

	f->budget_id = em_get_int64(0, FN_BUDGET_ID, 0);
	f->slots = (int32) em_get_int64(0, FN_SLOTS, 0);
	f->slot_gen = em_get_int64(0, FN_SLOT_GEN, 0);
	d = em_get(0, FN_SLOT_LIM, &f->slot_lim_null);
	f->slot_lim = f->slot_lim_null ? 0 : DatumGetInt64(d);
	f->used = em_get_int64(0, FN_USED, 0);
	f->held = em_get_int64(0, FN_HELD, 0);
	d = em_get(0, FN_LIM, &f->unlimited);
	f->lim = f->unlimited ? 0 : DatumGetInt64(d);
	f->slot_cut = em_get_int64(0, FN_SLOT_CUT, 0);
	d = em_get(0, FN_SLOT_REC, &f->slot_rec_null);
	f->slot_rec = f->slot_rec_null ? 0 : DatumGetInt64(d);
	d = em_get(0, FN_SLOT_LIMX, &f->slot_limx_null);
	f->slot_limx = f->slot_limx_null ? 0 : DatumGetInt64(d);
	f->limx = em_get_int64(0, FN_LIMX, -1);
	d = em_get(0, FN_SLOT_LIMT, &f->slot_limt_null);
	f->slot_limt = f->slot_limt_null ? 0 : DatumGetTimestampTz(d);
	d = em_get(0, FN_LIMT, &f->limt_null);
	f->limt = f->limt_null ? 0 : DatumGetTimestampTz(d);
	f->recorded = em_get_int64(0, FN_RECORDED, 0);
	f->slots_used = em_get_int64(0, FN_SLOTS_USED, 0);
	f->slots_held = em_get_int64(0, FN_SLOTS_HELD, 0);
	f->slots_room = em_get_int64(0, FN_SLOTS_ROOM, 0);
}

/*
 * The same reads by index from C (direct.c), on a single node, in one
 * snapshot taken as the SPI statement takes it: fast_numbers' executor
 * start-up, its sub-plans and its aggregates cost more than the rows it
 * reads (docs/benchmarks.md).
 */
static EmDirect budget_escrow = {
	.table = "budget", .nkeys = 3, .keys = {"account", "feature", "cycle_start"},
	.ncols = 10, .cols = {"budget_id", "slots", "slot_gen", "slot_lim", "used", "held",
	"slot_cut", "slot_rec", "slot_limx", "slot_limt"}
};
static EmDirect limit_version_row = {
	.table = "account_limit", .nkeys = 2, .keys = {"account", "feature"},
	.ncols = 3, .cols = {"lim", "xmin", "updated_at"}
};
static EmDirect slots_of_budget = {
	.table = "budget_slot", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 3, .cols = {"used", "held", "room"}, .types = {INT8OID, INT8OID, INT8OID}
};

/*
 * Add a slot row's used, held and room to the sums, in 128 bits: as the
 * SQL sums (numeric, then cast to bigint), only a total past a bigint is
 * an error (em_bigint_sum), not a running total on the way.
 */
static bool
add_slot(Datum *values, bool *nulls, void *arg)
{
	INT128	   *sums = (INT128 *) arg;
	int			i;

	for (i = 0; i < 3; i++)
		if (!nulls[i])
			int128_add_int64(&sums[i], DatumGetInt64(values[i]));
	return true;
}

/*
 * The budget's slots' used and (unless held is NULL) held, summed as snap
 * sees them, by index from C (a single node): what gate.c reports as the
 * room of a budget a repeated key's job is in, and ledger.c's cycle total.
 * A sum past a bigint is an error, as the SQL's sum()::bigint; a caller
 * that sums used only (held NULL) does not fail on held's.
 */
void
em_escrow_slot_totals(text *account, int64 budget_id, Snapshot snap,
					  int64 *used, int64 *held)
{
	Datum		keys[2];
	INT128		sums[3];

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	sums[0] = sums[1] = sums[2] = int64_to_int128(0);
	(void) em_direct_scan(&slots_of_budget, keys, snap, add_slot, sums);
	*used = em_bigint_sum(sums[0]);
	if (held)
		*held = em_bigint_sum(sums[1]);
}

/* false when fast_numbers would return no row */
static bool
fast_read_direct(EmHold *h, TimestampTz cycle_start, Snapshot snap, FastRead *f)
{
	Datum		keys[3];
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];
	INT128		sums[3];

	keys[0] = PointerGetDatum(h->account);
	keys[1] = PointerGetDatum(h->feature);
	keys[2] = TimestampTzGetDatum(cycle_start);
	if (!em_direct_get(&budget_escrow, keys, snap, v, n) || DatumGetInt64(v[2]) <= 0)
		return false;
	f->budget_id = DatumGetInt64(v[0]);
	f->slots = DatumGetInt32(v[1]);
	f->slot_gen = DatumGetInt64(v[2]);
	f->slot_lim_null = n[3];
	f->slot_lim = n[3] ? 0 : DatumGetInt64(v[3]);
	f->used = DatumGetInt64(v[4]);
	f->held = DatumGetInt64(v[5]);
	f->slot_cut = DatumGetInt64(v[6]);
	f->slot_rec_null = n[7];
	f->slot_rec = n[7] ? 0 : DatumGetInt64(v[7]);
	f->slot_limx_null = n[8];
	f->slot_limx = n[8] ? 0 : DatumGetInt64(v[8]);
	f->slot_limt_null = n[9];
	f->slot_limt = n[9] ? 0 : DatumGetTimestampTz(v[9]);

	if (!em_direct_get(&limit_version_row, keys, snap, v, n))
		return false;
	f->unlimited = n[0];
	f->lim = n[0] ? 0 : DatumGetInt64(v[0]);
	f->limx = (int64) DatumGetTransactionId(v[1]);
	f->limt_null = n[2];
	f->limt = n[2] ? 0 : DatumGetTimestampTz(v[2]);

	f->recorded = em_budget_recorded(h->account, f->budget_id, snap);
	keys[1] = Int64GetDatum(f->budget_id);
	sums[0] = sums[1] = sums[2] = int64_to_int128(0);
	(void) em_direct_scan(&slots_of_budget, keys, snap, add_slot, sums);
	f->slots_used = em_bigint_sum(sums[0]);
	f->slots_held = em_bigint_sum(sums[1]);
	f->slots_room = em_bigint_sum(sums[2]);
	return true;
}

/* fast_read_direct's, in its order: the budget row, the limit, the recorded usage, the slots */
static const char *const fast_tables[] = {"budget", "account_limit", "usage_shard", "budget_slot"};

/* the fast path's read; false when the budget has no slots to use */
static bool
fast_read(EmHold *h, TimestampTz cycle_start, FastRead *f)
{
	Datum		args[3];
	Snapshot	snap;
	bool		found;

	memset(f, 0, sizeof(*f));
	if (!em_distributed())
	{
		snap = em_direct_statement_snapshot(fast_tables, lengthof(fast_tables));
		found = fast_read_direct(h, cycle_start, snap, f);
		em_direct_release(snap);
		return found;
	}
	args[0] = PointerGetDatum(h->account);
	args[1] = PointerGetDatum(h->feature);
	args[2] = TimestampTzGetDatum(cycle_start);
	em_exec(&fast_numbers, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	fast_read_spi(f);
	return true;
}

/*
 * Whether the limit row the fast path read is the version the last
 * rebalance saw: the same xmin and updated_at (slot_limx, slot_limt).
 */
static bool
same_limit_version(const FastRead *f)
{
	return !f->slot_limx_null && !f->slot_limt_null && !f->limt_null &&
		f->slot_limx == f->limx && f->slot_limt == f->limt;
}

/*
 * Whether no running rebalance may be admitting on a recorded usage older
 * than the one the fast path read, or on another limit: either both are
 * what the last committed rebalance saw (the recorded usage it read,
 * slot_rec: usage only goes down under the budget row's lock, which
 * forgets slot_rec, so a running rebalance read at least as much; and the
 * same version of the limit row, slot_limx: a running rebalance read that
 * version or a newer one the fast path has not seen), or, on a single
 * node, the budget row's newest version is the one the read saw (the same
 * slot_cut: no rebalance committed since) and no transaction holds it (no
 * rebalance is running).  On Citus, where the row is in a shard, only the
 * first.  See the file's header.
 */
static bool
no_rebalance_missed_usage(text *account, const FastRead *f)
{
	Datum		keys[2];
	Datum		v[1];
	bool		n[1];

	if (!f->slot_rec_null && f->slot_rec == f->recorded && same_limit_version(f))
		return true;
	if (em_distributed())
		return false;
	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(f->budget_id);
	return em_direct_unclaimed(&budget_unclaimed, keys, v, n) &&
		DatumGetInt64(v[0]) == f->slot_cut;
}

/*
 * A slot's free room, found and locked from C on a single node (direct.c):
 * what fast_take's probes and gate.c's settlement probes do in SQL, one
 * probe from a random start upward, then one below it.
 */
static EmDirect free_slot = {
	.table = "budget_slot", .nkeys = 3, .keys = {"account", "budget_id", "slot"},
	.ncols = 4, .cols = {"slot", "gen", "room", "cut"}
};

/* the probes' conditions beyond the keys (em_direct_lock_skip's fn) */
static bool
slot_wanted(Datum *values, bool *nulls, void *arg)
{
	const EmSlotWant *w = (const EmSlotWant *) arg;

	if (DatumGetInt64(values[1]) != w->gen)
		return false;
	return !w->taking ||
		(DatumGetInt32(values[0]) < w->slots && DatumGetInt64(values[2]) >= w->amount &&
		 DatumGetInt64(values[3]) <= w->cut);
}

/*
 * Lock a slot of the budget that w wants, never waiting for one (FOR UPDATE
 * SKIP LOCKED): the first from start upward, else the first below start;
 * -1 when none.  On a single node only.
 */
int32
em_escrow_lock_slot(text *account, int64 budget_id, int32 start, const EmSlotWant *w)
{
	Datum		keys[3];
	Datum		v[4];
	bool		n[4];

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	keys[2] = Int32GetDatum(start);
	if (em_direct_lock_skip(&free_slot, keys, false, slot_wanted, (void *) w, v, n) ||
		em_direct_lock_skip(&free_slot, keys, true, slot_wanted, (void *) w, v, n))
		return DatumGetInt32(v[0]);
	return -1;
}

/*
 * A move between a slot's room, held and used (an admission's take, a
 * settlement's release), which leaves its allocation as it is: by index
 * from C on a single node, else (Citus, or a table the executor would do
 * more for) SQL.  Whether the row was there.
 */
typedef struct SlotMove
{
	int64		delta[3];		/* room, held, used */
} SlotMove;

static EmDirect slot_move = {
	.table = "budget_slot", .nkeys = 3, .keys = {"account", "budget_id", "slot"},
	.ncols = 3, .cols = {"room", "held", "used"}, .nwrite = 3,
	.types = {INT8OID, INT8OID, INT8OID}
};

static EmStatement slot_move_sql = {
	"UPDATE earmark.budget_slot SET room = room + $4, held = held + $5, used = used + $6 "
	"WHERE account = $1 AND budget_id = $2 AND slot = $3",
	6, {TEXTOID, INT8OID, INT4OID, INT8OID, INT8OID, INT8OID}
};

/*
 * An admission's move in SQL: room and held only, so that an operator's
 * trigger "UPDATE OF used" on the slots fires for a settlement, which
 * charges, and not for an admission, as before the move was written from C
 */
static EmStatement slot_take_sql = {
	"UPDATE earmark.budget_slot SET room = room + $4, held = held + $5 "
	"WHERE account = $1 AND budget_id = $2 AND slot = $3",
	5, {TEXTOID, INT8OID, INT4OID, INT8OID, INT8OID}
};

static bool
move_fit(Datum *values, bool *nulls, void *arg)
{
	const SlotMove *m = (const SlotMove *) arg;
	int			i;

	for (i = 0; i < 3; i++)
	{
		int64		v;

		if (pg_add_s64_overflow(DatumGetInt64(values[i]), m->delta[i], &v))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("bigint out of range")));
		values[i] = Int64GetDatum(v);
	}
	return true;
}

static bool
slot_write(text *account, int64 budget_id, int32 slot, SlotMove *m,
		   EmStatement *sql)
{
	Datum		args[3 + lengthof(m->delta)];
	EmDirectWrite w;
	int			i;

	/* the statement's arguments past the key are the deltas, in order */
	Assert(sql->nargs <= lengthof(args));
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int32GetDatum(slot);
	w = em_direct_update(&slot_move, args, move_fit, m);
	if (w != EM_DIRECT_UNWRITABLE)
		return w == EM_DIRECT_WRITTEN;
	for (i = 3; i < sql->nargs; i++)
		args[i] = Int64GetDatum(m->delta[i - 3]);
	em_exec(sql, args, NULL, 0);
	return SPI_processed > 0;
}

bool
em_escrow_slot_move(text *account, int64 budget_id, int32 slot, int64 room,
					int64 held, int64 used)
{
	SlotMove	m = {{room, held, used}};

	return slot_write(account, budget_id, slot, &m, &slot_move_sql);
}

/* an admission's: amount from room to held */
static bool
slot_take(text *account, int64 budget_id, int32 slot, int64 amount)
{
	SlotMove	m = {{-amount, amount, 0}};

	return slot_write(account, budget_id, slot, &m, &slot_take_sql);
}

/*
 * The job of an admission through a slot the caller locked (on a single
 * node, where the take is three steps: the slot locked from C, this
 * statement, the slot's move from C); no row when the key is taken.
 */
static EmStatement fast_job = {
	"INSERT INTO earmark.job (account, budget_id, feature, idempotency_key, amount, lease, lease_until, created_at, slot, gen) "
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
	"ON CONFLICT (account, idempotency_key) DO NOTHING RETURNING job_id",
	10, {TEXTOID, INT8OID, TEXTOID, TEXTOID, INT8OID, INTERVALOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT4OID, INT8OID}
};

/* fast_take's work on a single node: the slot, the job, the slot's move */
static EmAdmit
take_direct(EmHold *h, const FastRead *f)
{
	EmSlotWant	w = {f->slot_gen, true, f->slots, h->amount, f->slot_cut};
	int32		slot = em_escrow_lock_slot(h->account, f->budget_id,
										   em_random_slot(f->slots), &w);
	Datum		args[10];

	if (slot < 0)
		return EM_ADMIT_NO_SLOT;
	args[0] = PointerGetDatum(h->account);
	args[1] = Int64GetDatum(f->budget_id);
	args[2] = PointerGetDatum(h->feature);
	args[3] = PointerGetDatum(h->key);
	args[4] = Int64GetDatum(h->amount);
	args[5] = IntervalPGetDatum(h->lease);
	args[6] = TimestampTzGetDatum(h->lease_until);
	args[7] = TimestampTzGetDatum(h->now);
	args[8] = Int32GetDatum(slot);
	args[9] = Int64GetDatum(f->slot_gen);
	em_exec(&fast_job, args, NULL, 1);
	if (SPI_processed == 0)
		return EM_ADMIT_KEY_TAKEN;	/* the slot stays as it was, locked */
	h->job_id = em_get_int64(0, 1, 0);
	em_floor_note_hold(f->budget_id, h->lease_until);
	if (!slot_take(h->account, f->budget_id, slot, h->amount))
		elog(ERROR, "earmark: escrow slot %d of budget " INT64_FORMAT " vanished",
			 slot, f->budget_id);
	return EM_ADMIT_OK;
}

/* fast_take, on Citus: one statement on the account's shard */
static EmAdmit
take_spi(EmHold *h, const FastRead *f)
{
	Datum		args[12];
	bool		isnull;

	args[0] = PointerGetDatum(h->account);
	args[1] = Int64GetDatum(f->budget_id);
	args[2] = Int32GetDatum(em_random_slot(f->slots));
	args[3] = Int32GetDatum(f->slots);
	args[4] = Int64GetDatum(f->slot_gen);
	args[5] = Int64GetDatum(h->amount);
	args[6] = PointerGetDatum(h->feature);
	args[7] = PointerGetDatum(h->key);
	args[8] = IntervalPGetDatum(h->lease);
	args[9] = TimestampTzGetDatum(h->lease_until);
	args[10] = TimestampTzGetDatum(h->now);
	args[11] = Int64GetDatum(f->slot_cut);
	em_exec(&fast_take, args, NULL, 1);
	(void) em_get(0, FT_SLOT, &isnull);
	if (isnull)
		return EM_ADMIT_NO_SLOT;
	h->job_id = DatumGetInt64(em_get(0, FT_JOB_ID, &isnull));
	if (isnull)
		return EM_ADMIT_KEY_TAKEN;
	em_floor_note_hold(f->budget_id, h->lease_until);
	return EM_ADMIT_OK;
}

/*
 * Try to admit through a free slot of the cycle's budget.  EM_ADMIT_NO_SLOT
 * when no slot with enough room could be had (the caller takes the slow
 * path), EM_ADMIT_OK with h->job_id, or EM_ADMIT_KEY_TAKEN when a
 * concurrent reserve with the same key won.  On admission *numbers are
 * the budget's totals (slots and recorded usage included, this hold not
 * yet) and its limit: what reserve's "remaining" is computed from.
 */
EmAdmit
em_escrow_fast(EmHold *h, TimestampTz cycle_start, EscrowNumbers *numbers)
{
	FastRead	f;
	int64		parts[6];

	if (!fast_read(h, cycle_start, &f))
		return EM_ADMIT_NO_SLOT;
	numbers->unlimited = f.unlimited;
	numbers->lim = f.lim;
	parts[0] = f.used;
	parts[1] = f.held;
	parts[2] = f.slots_room;
	parts[3] = f.slots_held;
	parts[4] = f.slots_used;
	parts[5] = f.recorded;
	if (!slots_fit_limit(f.unlimited, f.lim, f.slot_lim_null, f.slot_lim,
						 parts, lengthof(parts)) ||
		!no_rebalance_missed_usage(h->account, &f))
		return EM_ADMIT_NO_SLOT;
	numbers->used = f.used + f.recorded + f.slots_used;
	numbers->held = f.held + f.slots_held;
	return em_distributed() ? take_spi(h, &f) : take_direct(h, &f);
}

/* ---------------------------------------------------------------------
 * The rebalance
 * ---------------------------------------------------------------------
 */
static EmStatement count_slots = {
	"SELECT pg_catalog.count(*) FROM earmark.budget_slot "
	"WHERE account = $1 AND budget_id = $2 AND slot < $3",
	3, {TEXTOID, INT8OID, INT4OID}
};

static EmStatement create_slot = {
	"INSERT INTO earmark.budget_slot (account, budget_id, slot) VALUES ($1, $2, $3) "
	"ON CONFLICT DO NOTHING",
	3, {TEXTOID, INT8OID, INT4OID}
};

/* the slots running low (or cut for another limit, or beyond the count) */
static EmStatement lock_low_slots = {
	"SELECT slot FROM earmark.budget_slot "
	"WHERE account = $1 AND budget_id = $2 AND (room < $3 OR gen <> $4 OR slot >= $5) "
	"ORDER BY slot FOR UPDATE SKIP LOCKED",
	5, {TEXTOID, INT8OID, INT8OID, INT8OID, INT4OID}
};

static EmStatement lock_free_slots = {
	"SELECT slot FROM earmark.budget_slot WHERE account = $1 AND budget_id = $2 "
	"ORDER BY slot FOR UPDATE SKIP LOCKED",
	2, {TEXTOID, INT8OID}
};

/* every slot, with the allocation of those others hold as last committed */
static EmStatement read_slots = {
	"SELECT slot = ANY($3), coalesce(pg_catalog.sum(room), 0)::bigint, "
	"       coalesce(pg_catalog.sum(held), 0)::bigint, coalesce(pg_catalog.sum(used), 0)::bigint, "
	"       pg_catalog.count(*) "
	"FROM earmark.budget_slot WHERE account = $1 AND budget_id = $2 GROUP BY 1",
	3, {TEXTOID, INT8OID, INT4ARRAYOID}
};
enum
{
	RS_MINE = 1, RS_ROOM, RS_HELD, RS_USED, RS_COUNT
};

static EmStatement cut_slots = {
	"UPDATE earmark.budget_slot "
	"SET room = CASE WHEN slot >= $4 THEN 0 "
	"                WHEN slot = $3[1] THEN $5 + $6 ELSE $5 END, gen = $7, cut = $8 "
	"WHERE account = $1 AND budget_id = $2 AND slot = ANY($3)",
	8, {TEXTOID, INT8OID, INT4ARRAYOID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID}
};

static EmStatement write_escrow_budget = {
	"UPDATE earmark.budget SET used = $3, held = $4, slot_lim = $5, slot_gen = $6, "
	"       slot_cut = $7, slot_rec = $8, slot_limx = $9, slot_limt = $10 "
	"WHERE account = $1 AND budget_id = $2",
	10, {TEXTOID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID,
	TIMESTAMPTZOID}
};

/*
 * The version of the feature's limit row: the transaction that wrote it
 * and when (an xid alone repeats after a restore, a move between Citus
 * nodes or a wraparound; with the time it does not).
 */
static EmStatement limit_version = {
	"SELECT xmin::text::bigint, updated_at FROM earmark.account_limit "
	"WHERE account = $1 AND feature = $2",
	2, {TEXTOID, TEXTOID}
};

/* the slots the last statement locked, as an int[] datum, and how many */
static Datum
locked_array(int *nlocked)
{
	Datum	   *slots = palloc(sizeof(Datum) * Max(SPI_processed, 1));
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
		slots[i] = Int32GetDatum((int32) em_get_int64(i, 1, 0));
	*nlocked = (int) SPI_processed;
	return PointerGetDatum(construct_array(slots, (int) SPI_processed, INT4OID,
										   sizeof(int32), true, TYPALIGN_INT));
}

/*
 * The rebalance's slot locks by index from C on a single node (direct.c's
 * em_direct_lock_skip_all; the slots returned in slot order), as lock_free_slots
 * and lock_low_slots lock them, so that they never wait: the executor's
 * FOR UPDATE SKIP LOCKED waits, with the budget row held, for a transaction
 * that holds a slot's newest version when the version its scan found was
 * being updated by a transaction that ended meanwhile (direct.c,
 * lock_or_skip; test/integration/review_slot_skip_chain.sh).  The SQL on
 * Citus, or where the table has no index this read may go by.
 */
static EmDirect rebalance_slots = {
	.table = "budget_slot", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 3, .cols = {"slot", "room", "gen"}
};

/* which slots: all, or those lock_low_slots' WHERE clause matches */
typedef struct SlotsWanted
{
	bool		all;
	int64		low_water;
	int64		gen;
	int32		slots;
} SlotsWanted;

static bool
slot_low(Datum *values, bool *nulls, void *arg)
{
	const SlotsWanted *w = (const SlotsWanted *) arg;

	return w->all || DatumGetInt64(values[1]) < w->low_water ||
		DatumGetInt64(values[2]) != w->gen || DatumGetInt32(values[0]) >= w->slots;
}

typedef struct LockedSlots
{
	Datum	   *slots;
	int			n;
	int			size;
} LockedSlots;

static bool
take_slot(Datum *values, bool *nulls, void *arg)
{
	LockedSlots *l = (LockedSlots *) arg;

	if (l->n == l->size)
	{
		l->size *= 2;
		l->slots = repalloc(l->slots, sizeof(Datum) * l->size);
	}
	l->slots[l->n++] = values[0];
	return true;
}

static int
slot_order(const void *a, const void *b)
{
	int32		x = DatumGetInt32(*(const Datum *) a);
	int32		y = DatumGetInt32(*(const Datum *) b);

	return (x > y) - (x < y);
}

/*
 * false when the caller's SQL must run.  The slots in slot order, as ORDER
 * BY slot returns them (cut gives the remainder to the first): the index
 * the lock goes by may be an operator's one on (account, budget_id, ...)
 * that choose_index ranks with the primary key and takes first in OID
 * order (after a REINDEX CONCURRENTLY of the primary key).  The order the
 * rows were locked in does not matter: none was waited for.
 */
static bool
lock_slots_direct(text *account, int64 budget_id, const SlotsWanted *w,
				  Datum *locked, int *nlocked)
{
	Datum		keys[2];
	LockedSlots l = {palloc(sizeof(Datum) * 16), 0, 16};

	if (em_distributed())
		return false;
	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	if (em_direct_lock_skip_all(&rebalance_slots, keys, slot_low, (void *) w, INT_MAX,
								take_slot, &l) < 0)
		return false;
	qsort(l.slots, l.n, sizeof(Datum), slot_order);
	*nlocked = l.n;
	*locked = PointerGetDatum(construct_array(l.slots, l.n, INT4OID, sizeof(int32), true,
											  TYPALIGN_INT));
	return true;
}

/* every slot this transaction could lock */
static Datum
lock_slots(text *account, int64 budget_id, int *nlocked)
{
	Datum		args[2];
	SlotsWanted w = {true};
	Datum		locked;

	if (lock_slots_direct(account, budget_id, &w, &locked, nlocked))
		return locked;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	em_exec(&lock_free_slots, args, NULL, 0);
	return locked_array(nlocked);
}

/* the free slots whose room is below low_water, and any stale ones */
static Datum
lock_low(text *account, int64 budget_id, int64 low_water, int64 gen, int slots,
		 int *nlocked)
{
	Datum		args[5];
	SlotsWanted w = {false, low_water, gen, slots};
	Datum		locked;

	if (lock_slots_direct(account, budget_id, &w, &locked, nlocked))
		return locked;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int64GetDatum(low_water);
	args[3] = Int64GetDatum(gen);
	args[4] = Int32GetDatum(slots);
	em_exec(&lock_low_slots, args, NULL, 0);
	return locked_array(nlocked);
}

static Datum
empty_array(void)
{
	return PointerGetDatum(construct_empty_array(INT4OID));
}

static void
cut(text *account, EmBudget *b, Datum locked, int nlocked, int64 nmine,
	int64 pool, int64 per_slot_max, int64 gen)
{
	Datum		args[8];
	int			live = Max(Min((int) nmine, b->slots), 1);
	int64		share = b->slots > 0 ? pool / live : 0;
	int64		rem = b->slots > 0 ? pool % live : 0;

	if (nlocked == 0)
		return;
	if (share > per_slot_max)
	{
		share = per_slot_max;
		rem = 0;
	}
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(b->budget_id);
	args[2] = locked;
	args[3] = Int32GetDatum(b->slots);
	args[4] = Int64GetDatum(share);
	args[5] = Int64GetDatum(rem);
	args[6] = Int64GetDatum(gen);
	args[7] = Int64GetDatum(b->slot_cut);
	em_exec(&cut_slots, args, NULL, 0);
}

static void
write_budget(EmHold *h, EmBudget *b, int64 gen)
{
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 'n', 'n'};

	/*
	 * The limit row's version now, read after the lock and after the limit
	 * this call used: a rebalance that runs after this one commits reads a
	 * version at least as new (see the file's header).
	 */
	args[0] = PointerGetDatum(h->account);
	args[1] = PointerGetDatum(h->feature);
	em_exec(&limit_version, args, NULL, 1);
	if (SPI_processed == 1)
	{
		bool		isnull;

		args[8] = em_get(0, 1, &isnull);
		args[9] = em_get(0, 2, &isnull);
		nulls[8] = nulls[9] = ' ';
	}

	args[0] = PointerGetDatum(h->account);
	args[1] = Int64GetDatum(b->budget_id);
	args[2] = Int64GetDatum(b->used);
	args[3] = Int64GetDatum(b->held);
	/* the raw limit, not less recorded usage: what the generation is cut for */
	args[4] = Int64GetDatum(b->raw_lim);
	nulls[4] = b->unlimited ? 'n' : ' ';
	args[5] = Int64GetDatum(gen);
	args[6] = Int64GetDatum(b->slot_cut);
	/* the recorded usage read after the budget row's lock (gate.c) */
	args[7] = Int64GetDatum(b->recorded);
	em_exec(&write_escrow_budget, args, nulls, 0);
}

typedef struct SlotSums
{
	int64		mine_held_used; /* held + used of the slots we locked */
	int64		others_alloc;	/* room + held + used of the others */
	int64		others_room;
	int64		used;			/* over all slots */
	int64		held;
	int64		nmine;
} SlotSums;

/*
 * The slots' sums (locked: the slots this transaction holds), in the
 * statement's snapshot, or with latest in one that sees every commit
 * whatever the isolation level.
 */
static void
sum_slots_as(text *account, int64 budget_id, Datum locked, bool latest, SlotSums *s)
{
	Datum		args[3];
	uint64		i;

	memset(s, 0, sizeof(*s));
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = locked;
	if (latest)
		em_exec_latest(&read_slots, args, NULL, 0);
	else
		em_exec(&read_slots, args, NULL, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		bool		mine = DatumGetBool(em_get(i, RS_MINE, &isnull));
		int64		room = em_get_int64(i, RS_ROOM, 0);
		int64		held = em_get_int64(i, RS_HELD, 0);
		int64		used = em_get_int64(i, RS_USED, 0);

		s->used += used;
		s->held += held;
		if (mine)
		{
			s->mine_held_used += held + used;
			s->nmine = em_get_int64(i, RS_COUNT, 0);
		}
		else
		{
			s->others_alloc += room + held + used;
			s->others_room += room;
		}
	}
}

static void
sum_slots(text *account, int64 budget_id, Datum locked, SlotSums *s)
{
	sum_slots_as(account, budget_id, locked, false, s);
}

/*
 * Create missing slot rows.  Only when some are missing: the insert's
 * conflict check would wait for every transaction that is changing an
 * existing slot, which is exactly the wait SKIP LOCKED avoids below.
 */
static void
create_missing_slots(text *account, EmBudget *b)
{
	Datum		args[3];
	int			i;

	if (b->slots <= 0)
		return;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(b->budget_id);
	args[2] = Int32GetDatum(b->slots);
	em_exec(&count_slots, args, NULL, 1);
	if (em_get_int64(0, 1, 0) >= b->slots)
		return;
	for (i = 0; i < b->slots; i++)
	{
		args[2] = Int32GetDatum(i);
		em_exec(&create_slot, args, NULL, 0);
	}
}

/*
 * Usually a slot ran dry while the budget still has room that no slot
 * holds: admit from that, and refill only the free slots that are low.
 * Locking every slot here would make all concurrent admissions miss
 * their fast path for as long as this transaction lasts.  all: every
 * slot summed, none locked (sum_slots with an empty array).  Returns false
 * when the job does not fit in the unallocated room (the caller gathers).
 */
static bool
admit_from_unallocated(EmHold *h, EmBudget *b, int64 cap, int64 gen,
					   const SlotSums *all, EmAdmit *result, int64 *remaining)
{
	SlotSums	s = *all;
	int64		unallocated;
	int64		fair;
	int			nlocked;
	Datum		locked;

	unallocated = cap - b->used - b->held - s.others_alloc;
	if (h->amount > unallocated)
		return false;
	fair = b->slots > 0 ?
		(unallocated - h->amount + s.others_room) / (2 * (int64) b->slots) : 0;
	*result = em_budget_admit(h, b);
	*remaining = Max(cap - b->used - b->held - s.used - s.held, 0);

	locked = lock_low(h->account, b->budget_id, fair / 2, gen, b->slots, &nlocked);
	if (nlocked > 0)
	{
		int64		pool;

		sum_slots(h->account, b->budget_id, locked, &s);
		pool = Max(cap - b->used - b->held - s.others_alloc - s.mine_held_used, 0);
		cut(h->account, b, locked, nlocked, s.nmine, pool, fair, gen);
	}
	write_budget(h, b, gen);
	return true;
}

/*
 * Whether the budget row's used and held and every slot's allocation (all:
 * every slot summed as not ours) fit cap; a sum that passes the largest
 * bigint does not.
 */
static bool
allocations_fit(const EmBudget *b, const SlotSums *all, int64 cap)
{
	int64		whole;

	return !pg_add_s64_overflow(b->used, b->held, &whole) &&
		!pg_add_s64_overflow(whole, all->others_alloc, &whole) &&
		whole <= cap;
}

/*
 * Sum the slots we locked and the others; when the room we may hand out
 * is too small, settle the budget's dead holds once and sum again.
 * *pool is what we may cut (the limit less everything not ours to cut),
 * *whole what the whole budget has left.
 */
static void
gather(EmHold *h, EmBudget *b, int64 cap, Datum locked, SlotSums *s,
	   int64 *pool, int64 *whole)
{
	bool		reclaimed = false;

	for (;;)
	{
		int64		released;
		int64		charged;

		sum_slots(h->account, b->budget_id, locked, s);
		*pool = cap - b->used - b->held - s->others_alloc - s->mine_held_used;
		*whole = cap - b->used - b->held - s->used - s->held;
		if (*pool >= h->amount || reclaimed)
			break;
		/* a hold whose lease has passed never causes a refusal */
		reclaimed = true;
		if (em_budget_reclaim(h->account, b->budget_id, h->now, EARMARK_RECLAIM_BATCH,
							  &released, &charged) == 0)
			break;
		b->held -= released;
		b->used += charged;
	}
	*pool = Max(*pool, 0);
	*whole = Max(*whole, 0);
}

/*
 * Whether the whole budget lacks room for the job (all: every slot summed,
 * none locked) even once its dead holds are settled: then the slow path
 * refuses without locking or cutting a slot.  A gathering cut would lock
 * every free slot and write each back with no room in it (a row lock and
 * an update a slot, and a new budget row), for the same refusal, and every
 * refusal of a full account would do it again.  False when the job may
 * fit, or when settling dead holds freed something (the caller goes on
 * and writes the budget row, b's used and held updated).
 */
static bool
refused_outright(EmHold *h, EmBudget *b, int64 cap, const SlotSums *all,
				 int64 *remaining)
{
	int64		whole = cap - b->used - b->held - all->used - all->held;
	int64		released;
	int64		charged;

	if (h->amount <= whole)
		return false;

	/*
	 * Under REPEATABLE READ and SERIALIZABLE all is the transaction's
	 * snapshot, and the slots are not locked here: a settlement that freed
	 * room into a slot after the snapshot writes the slot, not the budget
	 * row, so the budget row's lock does not fail for it.  Refuse early only
	 * on sums that are also the newest committed ones; otherwise gather,
	 * whose FOR UPDATE of a slot changed since the snapshot fails with
	 * 40001 (isolation spec review_escrow_full_rr).
	 */
	if (IsolationUsesXactSnapshot())
	{
		SlotSums	now;

		sum_slots_as(h->account, b->budget_id, empty_array(), true, &now);
		if (now.used != all->used || now.held != all->held ||
			now.others_alloc != all->others_alloc)
			return false;
	}
	/* a hold whose lease has passed never causes a refusal */
	if (em_budget_reclaim(h->account, b->budget_id, h->now, EARMARK_RECLAIM_BATCH,
						  &released, &charged) > 0)
	{
		b->held -= released;
		b->used += charged;
		return false;
	}
	*remaining = Max(whole, 0);
	return true;
}

/*
 * Reserve's slow path for an escrow budget, with the budget row locked:
 * reclaim dead holds, see whether the whole budget has room, admit the job
 * outside the slots if it has, and cut the rest of the free room into the
 * slots we could lock.  *remaining is what the whole budget has left.
 */
EmAdmit
em_escrow_rebalance(EmHold *h, EmBudget *b, int64 *remaining)
{
	int64		cap = b->unlimited ? UNLIMITED_CAP : b->lim;
	int64		gen = b->slot_gen;
	EmAdmit		result = EM_ADMIT_REFUSED;
	SlotSums	all;
	int			try;

	/*
	 * The first rebalance, a change between limited and unlimited, a raw
	 * limit other than the one the current generation was cut for
	 * (budget.slot_lim), or allocations that, with the budget row's used
	 * and held as last committed, no longer fit the limit less the
	 * recorded usage (cap): a new generation, so that slots cut for the
	 * old limit stop admitting once this commits, and the gathering below.
	 * Otherwise the generation stays: the fast path admits only while the
	 * limit it reads is slot_lim and its own fit check holds (see the
	 * file's header).  Recorded usage changing alone, up or down, never
	 * bumps it unless the allocations stop fitting.
	 */
	sum_slots(h->account, b->budget_id, empty_array(), &all);
	/* the stamp of every slot this call cuts (see the file's header) */
	b->slot_cut++;
	if (gen == 0 || b->slot_lim_null != b->unlimited ||
		(!b->unlimited &&
		 (b->slot_lim != b->raw_lim || !allocations_fit(b, &all, cap))))
		gen++;
	create_missing_slots(h->account, b);

	/*
	 * Without a new generation to cut, a budget that has no room for the
	 * job anywhere refuses it here (the limit, the fast path's checks and
	 * the slots are as the last rebalance left them).
	 */
	if (gen == b->slot_gen && refused_outright(h, b, cap, &all, remaining))
		return EM_ADMIT_REFUSED;
	if (gen == b->slot_gen &&
		admit_from_unallocated(h, b, cap, gen, &all, &result, remaining))
		return result;

	for (try = 0;; try++)
	{
		int			nlocked;
		Datum		locked = lock_slots(h->account, b->budget_id, &nlocked);
		SlotSums	s;
		int64		pool;
		int64		whole;

		/* near the limit, or a new limit: gather the room of every free slot */
		gather(h, b, cap, locked, &s, &pool, &whole);
		if (h->amount <= pool)
		{
			/* the hold, outside the slots */
			result = em_budget_admit(h, b);
			if (result == EM_ADMIT_OK)
			{
				pool -= h->amount;
				whole -= h->amount;
			}
		}
		else if (whole >= h->amount && try < REBALANCE_TRIES)
		{
			/*
			 * The room is there, inside slots other transactions hold this
			 * instant: let them finish rather than wait on their locks
			 * (which could deadlock with a transaction that holds a slot and
			 * now waits for this budget row).
			 */
			pg_usleep(REBALANCE_WAIT_US);
			CHECK_FOR_INTERRUPTS();
			continue;
		}
		*remaining = whole;

		/*
		 * Cut half of what is free into the slots we hold; the other half
		 * stays unallocated, for the next admission that finds its slot
		 * dry (above: it need not lock any slot).
		 */
		cut(h->account, b, locked, nlocked, s.nmine, pool,
			pool / (2 * (int64) Max(Min((int) s.nmine, b->slots), 1)), gen);
		write_budget(h, b, gen);
		return result;
	}
}

/* ---------------------------------------------------------------------
 * earmark_set_escrow(account, slots) RETURNS void
 * ---------------------------------------------------------------------
 */
static EmStatement set_account_slots = {
	"UPDATE earmark.account SET escrow_slots = $2, updated_at = pg_catalog.now() "
	"WHERE account = $1",
	2, {TEXTOID, INT4OID}
};

/* the account's budgets of cycles not ended, or only budget $3 */
static EmStatement set_budget_slots = {
	"UPDATE earmark.budget SET slots = $2 "
	"WHERE account = $1 AND cycle_end > pg_catalog.now() AND budget_id = coalesce($3, budget_id)",
	3, {TEXTOID, INT4OID, INT8OID}
};

/*
 * Give a budget this many slots (budget_id 0: every budget of the account
 * whose cycle has not ended).  The next admission that finds no free slot
 * rebalances into the new number, under the budget row's lock; slots
 * beyond it are drained.  earmark_set_escrow, and automatic escrow for
 * the one budget whose row the caller holds (gate.c).
 */
void
em_escrow_set_slots(text *account, int64 budget_id, int slots)
{
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};

	args[0] = PointerGetDatum(account);
	args[1] = Int32GetDatum(slots);
	args[2] = Int64GetDatum(budget_id);
	nulls[2] = budget_id == 0 ? 'n' : ' ';
	em_exec(&set_budget_slots, args, nulls, 0);
}

/*
 * Split the account's budgets into this many slots (0: no escrow).  The
 * number is the account's own (escrow_slots, NULL when never set), and
 * wins over automatic escrow from then on, 0 included.
 */
Datum
earmark_set_escrow(PG_FUNCTION_ARGS)
{
	text	   *account;
	int32		slots;
	Datum		args[2];

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("slots must not be NULL")));
	slots = PG_GETARG_INT32(1);
	if (slots < 0 || slots > EARMARK_MAX_SLOTS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slots must be between 0 and %d", EARMARK_MAX_SLOTS)));
	/*
	 * Every budget row of the account must take the number, also one that a
	 * reserve created and committed after a transaction snapshot: that
	 * row's update would find nothing to update.
	 */
	em_require_read_committed("earmark_set_escrow");

	SPI_connect();
	args[0] = PointerGetDatum(account);
	args[1] = Int32GetDatum(slots);
	/*
	 * The account's advisory lock first, as earmark_set_account: a reserve
	 * creating a cycle's budget row (under that lock, shared) has then
	 * committed, so the update below finds its row, and one that creates a
	 * row later reads the new number.  Then budget rows before the account
	 * row: the order reserve keeps.
	 */
	em_account_lock(account);
	em_escrow_set_slots(account, 0, slots);
	em_exec(&set_account_slots, args, NULL, 0);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("account \"%s\" does not exist", text_to_cstring(account)),
				 errhint("Set its limit or its account first.")));
	SPI_finish();
	PG_RETURN_VOID();
}
