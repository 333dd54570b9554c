/*-------------------------------------------------------------------------
 *
 * escrow.c
 *	  Escrow for hot budgets (DESIGN §5, O'Neil's escrow method): a budget
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
 *	  Only near the limit (or after a limit change) does a rebalance gather
 *	  the room of every free slot, so that a refusal means the whole budget
 *	  lacks room.
 *
 *	  A limit change: the fast path only uses a slot whose gen is the
 *	  budget's slot_gen while the account's limit, less the usage recorded
 *	  without a hold (earmark_record_usage's counter rows), still equals
 *	  slot_lim.  So recorded usage that committed before an admission's
 *	  snapshot also sends it to the slow path, which cuts the slots again
 *	  from what is left: the slots never hand out room that usage took.
 *	  The first admission after a change finds no usable slot, rebalances,
 *	  bumps the generation and re-cuts the rooms it can lock to the new
 *	  limit; the others stop admitting until a later rebalance takes them.
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
 *	    retrying a few times, never by blocking on their locks.
 *	  - settle of a job held by a slot locks the job, then any free slot
 *	    (SKIP LOCKED), or, when every slot is busy, updates the budget row.
 *	  - budget_slot has no foreign key: PostgreSQL runs the check when a
 *	    transaction updates a row it already changed (a second admission
 *	    from its own slot), and the key-share lock it takes on the budget
 *	    row would queue the fast path behind every rebalance.
 *	  - the sweeper and reserve's reclaim expire holds into the budget row,
 *	    which they hold; they touch no slot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/int.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "earmark.h"

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
 * The free slot: the first slot from a random start ($9) upward, then from
 * 0, that is of the budget's generation, has the room, and no other
 * transaction holds.  Each probe walks the primary key (budget_id, slot)
 * in order and stops at the first such slot, so an admission reads a slot
 * or two, not all of them (an ORDER BY random() over every slot did, and
 * on a hot budget that was most of the fast path's cost).  COALESCE runs
 * the second probe only when the first found nothing.  Each probe's FOR
 * UPDATE re-checks room and generation on the slot's newest version
 * (READ COMMITTED), so a slot drained meanwhile is passed over.
 */
#define FREE_SLOT_PROBE(from_to) \
	"(SELECT t.slot FROM earmark.budget_slot t" \
	" WHERE t.budget_id = b.budget_id AND " from_to \
	"   AND t.slot < b.slots AND t.gen = b.slot_gen AND t.room >= $5" \
	" ORDER BY t.slot LIMIT 1 FOR UPDATE SKIP LOCKED)"

static EmStatement fast_admit = {
	"WITH s AS ("
	"  SELECT b.budget_id, b.used, b.held, b.slot_gen, l.lim, r.recorded, coalesce("
	FREE_SLOT_PROBE("t.slot >= $9") ", " FREE_SLOT_PROBE("t.slot < $9") ") AS slot"
	"  FROM earmark.budget b"
	"  JOIN earmark.account_limit l ON l.account = b.account AND l.feature = b.feature"
	"  CROSS JOIN LATERAL (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint AS recorded"
	"                      FROM earmark.usage_shard u WHERE u.budget_id = b.budget_id) r"
	"  WHERE b.account = $1 AND b.feature = $2 AND b.cycle_start = $3 AND b.slot_gen > 0"
	"    AND CASE WHEN l.lim IS NOT NULL THEN GREATEST(l.lim - r.recorded, 0) END"
	"        IS NOT DISTINCT FROM b.slot_lim),"
	" j AS ("
	"  INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, lease, lease_until, created_at, slot, gen)"
	"  SELECT s.budget_id, $1, $2, $4, $5, $6, $7, $8, s.slot, s.slot_gen FROM s WHERE s.slot IS NOT NULL"
	"  ON CONFLICT (account, idempotency_key) DO NOTHING RETURNING job_id, budget_id, slot),"
	" u AS ("
	"  UPDATE earmark.budget_slot t SET room = t.room - $5, held = t.held + $5"
	"  FROM j WHERE t.budget_id = j.budget_id AND t.slot = j.slot) "
	"SELECT s.slot, (SELECT job_id FROM j), "
	"       s.used + s.recorded + coalesce(x.used, 0), s.held + coalesce(x.held, 0), s.lim "
	"FROM (SELECT 1) AS one LEFT JOIN s ON true "
	"LEFT JOIN LATERAL (SELECT pg_catalog.sum(t.used)::bigint AS used, pg_catalog.sum(t.held)::bigint AS held"
	"                   FROM earmark.budget_slot t WHERE t.budget_id = s.budget_id AND s.slot IS NOT NULL) x ON true",
	9, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID, INT8OID, INTERVALOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	INT4OID}
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
 * Try to admit through a free slot of the cycle's budget.  Returns
 * ESCROW_NO_SLOT when no slot with enough room could be had (the caller
 * takes the slow path), ESCROW_ADMITTED with *job_id, or ESCROW_KEY_TAKEN
 * when a concurrent reserve with the same key won.  On admission, *used
 * and *held are the budget's totals (slots and recorded usage included,
 * this hold not yet) as the statement's snapshot saw them, and *lim its
 * limit, *unlimited when it has none: what reserve's "remaining" is
 * computed from, without another look at the slots.
 */
EscrowResult
em_escrow_fast(text *account, text *feature, TimestampTz cycle_start,
			   text *key, int64 amount, Interval *lease,
			   TimestampTz lease_until, TimestampTz now, int slots,
			   int64 *job_id, EscrowNumbers *numbers)
{
	Datum		args[9];
	bool		isnull;
	Datum		lim;

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(cycle_start);
	args[3] = PointerGetDatum(key);
	args[4] = Int64GetDatum(amount);
	args[5] = IntervalPGetDatum(lease);
	args[6] = TimestampTzGetDatum(lease_until);
	args[7] = TimestampTzGetDatum(now);
	args[8] = Int32GetDatum(em_random_slot(slots));
	em_exec(&fast_admit, args, NULL, 1);
	(void) em_get(0, 1, &isnull);
	if (isnull)
		return ESCROW_NO_SLOT;
	*job_id = DatumGetInt64(em_get(0, 2, &isnull));
	if (isnull)
		return ESCROW_KEY_TAKEN;
	numbers->used = em_get_int64(0, 3, 0);
	numbers->held = em_get_int64(0, 4, 0);
	lim = em_get(0, 5, &numbers->unlimited);
	numbers->lim = numbers->unlimited ? 0 : DatumGetInt64(lim);
	return ESCROW_ADMITTED;
}

/* ---------------------------------------------------------------------
 * The rebalance
 * ---------------------------------------------------------------------
 */
static EmStatement count_slots = {
	"SELECT pg_catalog.count(*) FROM earmark.budget_slot WHERE budget_id = $1 AND slot < $2",
	2, {INT8OID, INT4OID}
};

static EmStatement create_slots = {
	"INSERT INTO earmark.budget_slot (budget_id, slot) "
	"SELECT $1, g FROM pg_catalog.generate_series(0, $2 - 1) g "
	"ON CONFLICT DO NOTHING",
	2, {INT8OID, INT4OID}
};

/* the slots running low (or cut for another limit, or beyond the count) */
static EmStatement lock_low_slots = {
	"SELECT coalesce(pg_catalog.array_agg(slot ORDER BY slot), '{}') FROM "
	"(SELECT slot FROM earmark.budget_slot WHERE budget_id = $1 "
	"   AND (room < $2 OR gen <> $3 OR slot >= $4) "
	" FOR UPDATE SKIP LOCKED) AS s",
	4, {INT8OID, INT8OID, INT8OID, INT4OID}
};

static EmStatement lock_free_slots = {
	"SELECT coalesce(pg_catalog.array_agg(slot ORDER BY slot), '{}') FROM "
	"(SELECT slot FROM earmark.budget_slot WHERE budget_id = $1 "
	" FOR UPDATE SKIP LOCKED) AS s",
	1, {INT8OID}
};

/* every slot, with the allocation of those others hold as last committed */
static EmStatement read_slots = {
	"SELECT slot = ANY($2), coalesce(pg_catalog.sum(room), 0)::bigint, "
	"       coalesce(pg_catalog.sum(held), 0)::bigint, coalesce(pg_catalog.sum(used), 0)::bigint, "
	"       pg_catalog.count(*) "
	"FROM earmark.budget_slot WHERE budget_id = $1 GROUP BY 1",
	2, {INT8OID, INT4ARRAYOID}
};

static EmStatement cut_slots = {
	"UPDATE earmark.budget_slot "
	"SET room = CASE WHEN slot >= $3 THEN 0 "
	"                WHEN slot = $2[1] THEN $4 + $5 ELSE $4 END, gen = $6 "
	"WHERE budget_id = $1 AND slot = ANY($2)",
	6, {INT8OID, INT4ARRAYOID, INT4OID, INT8OID, INT8OID, INT8OID}
};

static EmStatement write_escrow_budget = {
	"UPDATE earmark.budget SET used = $2, held = $3, slot_lim = $4, slot_gen = $5 "
	"WHERE budget_id = $1",
	5, {INT8OID, INT8OID, INT8OID, INT8OID, INT8OID}
};

static Datum
locked_array(int *nlocked)
{
	bool		isnull;
	Datum		d;

	d = SPI_datumTransfer(em_get(0, 1, &isnull), false, -1);
	*nlocked = ArrayGetNItems(ARR_NDIM(DatumGetArrayTypeP(d)),
							  ARR_DIMS(DatumGetArrayTypeP(d)));
	return d;
}

/* every slot this transaction could lock, as an int[] datum */
static Datum
lock_slots(int64 budget_id, int *nlocked)
{
	Datum		arg = Int64GetDatum(budget_id);

	em_exec(&lock_free_slots, &arg, NULL, 1);
	return locked_array(nlocked);
}

/* the free slots whose room is below low_water, and any stale ones */
static Datum
lock_low(int64 budget_id, int64 low_water, int64 gen, int slots, int *nlocked)
{
	Datum		args[4];

	args[0] = Int64GetDatum(budget_id);
	args[1] = Int64GetDatum(low_water);
	args[2] = Int64GetDatum(gen);
	args[3] = Int32GetDatum(slots);
	em_exec(&lock_low_slots, args, NULL, 1);
	return locked_array(nlocked);
}

static Datum
empty_array(void)
{
	return PointerGetDatum(construct_empty_array(INT4OID));
}

static void
cut(EscrowBudget *b, Datum locked, int nlocked, int64 nmine, int64 pool,
	int64 per_slot_max, int64 gen)
{
	Datum		args[6];
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
	args[0] = Int64GetDatum(b->budget_id);
	args[1] = locked;
	args[2] = Int32GetDatum(b->slots);
	args[3] = Int64GetDatum(share);
	args[4] = Int64GetDatum(rem);
	args[5] = Int64GetDatum(gen);
	em_exec(&cut_slots, args, NULL, 0);
}

static void
write_budget(EscrowBudget *b, int64 gen)
{
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	args[0] = Int64GetDatum(b->budget_id);
	args[1] = Int64GetDatum(b->used);
	args[2] = Int64GetDatum(b->held);
	args[3] = Int64GetDatum(b->lim);
	nulls[3] = b->unlimited ? 'n' : ' ';
	args[4] = Int64GetDatum(gen);
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

static void
sum_slots(int64 budget_id, Datum locked, SlotSums *s)
{
	Datum		args[2];
	uint64		i;

	memset(s, 0, sizeof(*s));
	args[0] = Int64GetDatum(budget_id);
	args[1] = locked;
	em_exec(&read_slots, args, NULL, 0);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		bool		mine = DatumGetBool(em_get(i, 1, &isnull));
		int64		room = em_get_int64(i, 2, 0);
		int64		held = em_get_int64(i, 3, 0);
		int64		used = em_get_int64(i, 4, 0);

		s->used += used;
		s->held += held;
		if (mine)
		{
			s->mine_held_used += held + used;
			s->nmine = em_get_int64(i, 5, 0);
		}
		else
		{
			s->others_alloc += room + held + used;
			s->others_room += room;
		}
	}
}

/*
 * Reserve's slow path for an escrow budget, with the budget row locked:
 * reclaim dead holds, see whether the whole budget has room, admit the job
 * outside the slots if it has, and cut the rest of the free room into the
 * slots we could lock.  Fills *result; inserts the job through
 * admit_outside(), which the gate provides.
 */
void
em_escrow_rebalance(EscrowBudget *b, int64 amount, TimestampTz now,
					EscrowAdmitFn admit_outside, void *admit_arg,
					EscrowOutcome *out)
{
	int64		cap = b->unlimited ? UNLIMITED_CAP : b->lim;
	int64		gen = b->slot_gen;
	int			try;

	memset(out, 0, sizeof(*out));

	/*
	 * A new limit (or the first rebalance): a new generation, so that slots
	 * cut for the old limit stop admitting once this commits.
	 */
	if (gen == 0 || b->slot_lim_null != b->unlimited ||
		(!b->unlimited && b->slot_lim != b->lim))
		gen++;

	/*
	 * Create missing slot rows.  Only when some are missing: the insert's
	 * conflict check would wait for every transaction that is changing an
	 * existing slot, which is exactly the wait SKIP LOCKED avoids below.
	 */
	if (b->slots > 0)
	{
		Datum		args[2];

		args[0] = Int64GetDatum(b->budget_id);
		args[1] = Int32GetDatum(b->slots);
		em_exec(&count_slots, args, NULL, 1);
		if (em_get_int64(0, 1, 0) < b->slots)
			em_exec(&create_slots, args, NULL, 0);
	}

	/*
	 * Usually a slot ran dry while the budget still has room that no slot
	 * holds: admit from that, and refill only the free slots that are low.
	 * Locking every slot here would make all concurrent admissions miss
	 * their fast path for as long as this transaction lasts.
	 */
	if (gen == b->slot_gen)
	{
		Datum		none = empty_array();
		SlotSums	s;
		int64		unallocated;

		sum_slots(b->budget_id, none, &s);
		unallocated = cap - b->used - b->held - s.others_alloc;
		if (amount <= unallocated)
		{
			int64		fair = b->slots > 0 ?
				(unallocated - amount + s.others_room) / (2 * (int64) b->slots) : 0;
			int			nlocked;
			Datum		locked;
			int64		pool;

			out->result = admit_outside(admit_arg, b, amount);
			if (out->result == ESCROW_ADMITTED)
			{
				b->held += amount;
				unallocated -= amount;
			}
			out->remaining = Max(cap - b->used - b->held - s.used - s.held, 0);

			locked = lock_low(b->budget_id, fair / 2, gen, b->slots, &nlocked);
			if (nlocked > 0)
			{
				sum_slots(b->budget_id, locked, &s);
				pool = Max(cap - b->used - b->held - s.others_alloc - s.mine_held_used, 0);
				cut(b, locked, nlocked, s.nmine, pool, fair, gen);
			}
			write_budget(b, gen);
			return;
		}
	}

	for (try = 0;; try++)
	{
		int			nlocked;
		Datum		locked = lock_slots(b->budget_id, &nlocked);
		SlotSums	s;
		int64		pool;
		int64		whole;
		bool		reclaimed = false;

		/* near the limit, or a new limit: gather the room of every free slot */
		for (;;)
		{
			sum_slots(b->budget_id, locked, &s);
			/* room we may hand out: the limit less everything not ours to cut */
			pool = cap - b->used - b->held - s.others_alloc - s.mine_held_used;
			whole = cap - b->used - b->held - s.used - s.held;
			if (pool >= amount || reclaimed)
				break;
			/* a hold whose lease has passed never causes a refusal */
			{
				int64		released;
				int64		charged;

				reclaimed = true;
				if (em_expire_budget_jobs(b->budget_id, now, EARMARK_RECLAIM_BATCH, true,
										  &released, &charged) == 0)
					break;
				b->held -= released;
				b->used += charged;
			}
		}
		pool = Max(pool, 0);
		whole = Max(whole, 0);

		if (amount <= pool)
		{
			/* the rate limit, then the hold, outside the slots */
			out->result = admit_outside(admit_arg, b, amount);
			if (out->result == ESCROW_ADMITTED)
			{
				b->held += amount;
				pool -= amount;
				whole -= amount;
			}
		}
		else if (whole >= amount && try < REBALANCE_TRIES)
		{
			/*
			 * The room is there, inside slots other transactions hold
			 * this instant: let them finish rather than wait on their
			 * locks (which could deadlock with a transaction that holds a
			 * slot and now waits for this budget row).
			 */
			pg_usleep(REBALANCE_WAIT_US);
			CHECK_FOR_INTERRUPTS();
			continue;
		}
		else
			out->result = ESCROW_REFUSED;
		out->remaining = whole;

		/*
		 * Cut half of what is free into the slots we hold; the other half
		 * stays unallocated, for the next admission that finds its slot
		 * dry (above: it need not lock any slot).
		 */
		cut(b, locked, nlocked, s.nmine, pool,
			pool / (2 * (int64) Max(Min((int) s.nmine, b->slots), 1)), gen);
		write_budget(b, gen);
		return;
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

static EmStatement set_budget_slots = {
	"UPDATE earmark.budget SET slots = $2 WHERE account = $1 AND cycle_end > pg_catalog.now()",
	2, {TEXTOID, INT4OID}
};

/*
 * Split the account's budgets into this many slots (0: no escrow).  The
 * next admission that finds no free slot rebalances into the new number;
 * slots beyond it are drained.
 */
Datum
earmark_set_escrow(PG_FUNCTION_ARGS)
{
	text	   *account = em_arg_name(fcinfo, 0, "account");
	int32		slots;
	Datum		args[2];

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("slots must not be NULL")));
	slots = PG_GETARG_INT32(1);
	if (slots < 0 || slots > EARMARK_MAX_SLOTS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("slots must be between 0 and %d", EARMARK_MAX_SLOTS)));

	SPI_connect();
	args[0] = PointerGetDatum(account);
	args[1] = Int32GetDatum(slots);
	/* budget rows before the account row: the order reserve keeps */
	em_exec(&set_budget_slots, args, NULL, 0);
	em_exec(&set_account_slots, args, NULL, 0);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("account \"%s\" does not exist", text_to_cstring(account)),
				 errhint("Set its limit or its account first.")));
	SPI_finish();
	PG_RETURN_VOID();
}
