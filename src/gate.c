/*-------------------------------------------------------------------------
 *
 * gate.c
 *	  The gate: earmark_reserve, earmark_charge, earmark_heartbeat,
 *	  earmark_settle and earmark_sweep.
 *
 *	  Tables: earmark.budget (held, used, rate state), earmark.job (the
 *	  holds), earmark.ledger (a row per settled job that used something)
 *	  and earmark.meter_mark (the cycle's "tell the meter" mark).
 *
 *	  Locks, and why they cannot deadlock among themselves:
 *	  - reserve locks the budget row FOR UPDATE (check and hold in one
 *	    transaction), then may expire that budget's dead holds, taking their
 *	    job rows FOR UPDATE SKIP LOCKED: it never waits for a job row.  The
 *	    rate limit then updates the account row: budget before account, as
 *	    in earmark_set_account.  Creating a cycle's budget row first takes
 *	    the account's advisory lock shared (see account.c).
 *	  - sweep locks a budget row (earmark_sweep waits only for the first
 *	    budget of a call, the worker for none: SKIP LOCKED), then its dead
 *	    job rows with SKIP LOCKED.
 *	  - charge and heartbeat lock one job row and nothing else.
 *	  - earmark_set_account: advisory lock, budget rows, account row.
 *	  - settle locks the job row, then updates (and so locks) its budget.
 *	    (The hot tables have no foreign keys: a key-share lock taken by an
 *	    FK check before the budget update would have to be upgraded, a
 *	    deadlock with any reserve waiting for the row.)
 *	  Only settle waits for a budget while holding a job, and nobody waits
 *	  for a job while holding a budget, so no cycle can form.  A settle that
 *	  waits on a job held by a long application transaction therefore holds
 *	  no budget lock meanwhile, and admissions go on.
 *
 *	  Time is the wall clock (GetCurrentTimestamp), not the transaction
 *	  start: a lease that passes inside a long transaction has passed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "earmark.h"
#include "provider.h"

PG_FUNCTION_INFO_V1(earmark_reserve);
PG_FUNCTION_INFO_V1(earmark_charge);
PG_FUNCTION_INFO_V1(earmark_heartbeat);
PG_FUNCTION_INFO_V1(earmark_settle);
PG_FUNCTION_INFO_V1(earmark_sweep);


/* ---------------------------------------------------------------------
 * Statements
 * ---------------------------------------------------------------------
 */
static EmStatement job_by_key = {
	"SELECT job_id, amount, feature FROM earmark.job "
	"WHERE account = $1 AND idempotency_key = $2",
	2, {TEXTOID, TEXTOID}
};

/* the same key's job if there is one, and the account's anchor and
 * whether its limit is known: one statement before any lock */
static EmStatement reserve_start = {
	"SELECT j.job_id, j.amount, j.feature, a.cycle_anchor, "
	"       (SELECT l.source FROM earmark.account_limit l "
	"                WHERE l.account = $1 AND l.feature = $3), a.account IS NOT NULL, "
	"       coalesce(a.escrow_slots, $4), a.limits_fetched_at, a.limits_wanted_at IS NOT NULL "
	"FROM (SELECT 1) AS one "
	"LEFT JOIN earmark.job j ON j.account = $1 AND j.idempotency_key = $2 "
	"LEFT JOIN earmark.account a ON a.account = $1",
	4, {TEXTOID, TEXTOID, TEXTOID, INT4OID}
};

/* no row lock: the advisory lock orders this with earmark_set_account, and
 * a share lock here would deadlock with the rate limit's update below */
static EmStatement account_anchor_again = {
	"SELECT cycle_anchor FROM earmark.account WHERE account = $1",
	1, {TEXTOID}
};

static EmStatement advisory_shared = {
	"SELECT pg_catalog.pg_advisory_xact_lock_shared($2, pg_catalog.hashtext($1))",
	2, {TEXTOID, INT4OID}
};

static EmStatement create_budget = {
	"INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, slots) "
	"SELECT $1, $2, $3, $4, coalesce(a.escrow_slots, $5) FROM earmark.account a WHERE a.account = $1 "
	"ON CONFLICT (account, feature, cycle_start) DO NOTHING",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID}
};

static EmStatement lock_budget = {
	"SELECT budget_id, used, held, slots, slot_lim, slot_gen FROM earmark.budget "
	"WHERE account = $1 AND feature = $2 AND cycle_start = $3 FOR UPDATE",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* read after the budget lock, in a new snapshot: a limit or anchor change
 * committed before the lock was granted applies to this admission */
static EmStatement read_limit = {
	"SELECT l.lim, l.account IS NOT NULL, a.cycle_anchor, "
	"       coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u "
	"                  WHERE u.budget_id = $4), 0)::bigint "
	"FROM earmark.account a "
	"LEFT JOIN earmark.account_limit l ON l.account = a.account AND l.feature = $2 "
	"WHERE a.account = $1",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID}
};

/* a budget's totals, its escrow slots included */
static EmStatement budget_numbers = {
	"SELECT b.used + coalesce(s.used, 0) + coalesce((SELECT pg_catalog.sum(u.units) "
	"         FROM earmark.usage_shard u WHERE u.budget_id = b.budget_id), 0)::bigint, "
	"       b.held + coalesce(s.held, 0), l.lim, l.account IS NOT NULL "
	"FROM earmark.budget b LEFT JOIN earmark.account_limit l "
	"  ON l.account = b.account AND l.feature = b.feature "
	"LEFT JOIN LATERAL (SELECT pg_catalog.sum(used)::bigint AS used, pg_catalog.sum(held)::bigint AS held "
	"                   FROM earmark.budget_slot WHERE budget_id = b.budget_id) s ON true "
	"WHERE b.budget_id = $1",
	1, {INT8OID}
};

/* the hold: the job row and the budget's new numbers in one statement;
 * neither happens when the key is already taken ($9 used, $10 the held
 * before this hold) */
static EmStatement admit_job = {
	"WITH j AS ("
	"  INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, lease, lease_until, created_at) "
	"  VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
	"  ON CONFLICT (account, idempotency_key) DO NOTHING RETURNING job_id),"
	" b AS (UPDATE earmark.budget SET used = $9, held = $10 + $5 "
	"       WHERE budget_id = $1 AND EXISTS (SELECT 1 FROM j)) "
	"SELECT job_id FROM j",
	10, {INT8OID, TEXTOID, TEXTOID, TEXTOID, INT8OID, INTERVALOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	INT8OID, INT8OID}
};

static EmStatement write_budget = {
	"UPDATE earmark.budget SET used = $2, held = $3 WHERE budget_id = $1",
	3, {INT8OID, INT8OID, INT8OID}
};

/*
 * The admission rate limit as GCRA on the account row: an admission at
 * "now" conforms when the theoretical arrival time is at most "tolerance"
 * ahead; it then moves on by one emission interval.  No row comes back
 * when the account is over its rate, and then nothing was written.
 */
static EmStatement rate_admit = {
	"UPDATE earmark.account "
	"SET rate_tat = GREATEST(coalesce(rate_tat, $2), $2) + $3 * interval '1 microsecond' "
	"WHERE account = $1 "
	"  AND GREATEST(coalesce(rate_tat, $2), $2) <= $2 + $4 * interval '1 microsecond' "
	"RETURNING 1",
	4, {TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID}
};

static EmStatement release_budget = {
	"UPDATE earmark.budget SET held = held - $2, used = used + $3 WHERE budget_id = $1",
	3, {INT8OID, INT8OID, INT8OID}
};

/*
 * Expire a locked budget's dead holds, at the use they recorded: the job
 * rows, their ledger rows and the meter mark in one statement.  The caller
 * holds the budget row lock and applies the returned sums to it.
 */
/*
 * A hold taken from an escrow slot is expired into the budget row like any
 * other (the sums are what count: escrow.c).
 */
static EmStatement expire_jobs = {
	"WITH j AS ("
	"  UPDATE earmark.job AS t"
	"     SET status = 'expired', settled_at = $2, charged = t.used, released = t.amount - t.used"
	"   WHERE t.job_id IN (SELECT s.job_id FROM earmark.job s"
	"                       WHERE s.budget_id = $1 AND s.status IN ('running', 'capped')"
	"                         AND s.lease_until < $2"
	"                       LIMIT $3 FOR UPDATE SKIP LOCKED)"
	"  RETURNING t.job_id, t.amount, t.used),"
	" l AS (INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)"
	"       SELECT $1, j.used, j.job_id, $2 FROM j WHERE j.used > 0 RETURNING 1),"
	" m AS (INSERT INTO earmark.meter_mark (budget_id)"
	"       SELECT $1 WHERE EXISTS (SELECT 1 FROM l) ON CONFLICT DO NOTHING)"
	"SELECT pg_catalog.count(*), coalesce(pg_catalog.sum(j.amount), 0)::bigint,"
	"       coalesce(pg_catalog.sum(j.used), 0)::bigint FROM j",
	3, {INT8OID, TIMESTAMPTZOID, INT4OID}
};

/*
 * The job row, locked.  Column 9 is the budget's slot count, read only for
 * a hold taken from a slot: settle starts its search for a free slot at a
 * random one of them; column 10 the slots' generation the hold was taken
 * in.
 */
static EmStatement lock_job = {
	"SELECT budget_id, amount, used, status, lease_until, lease, last_step, slot, "
	"       CASE WHEN slot IS NOT NULL THEN "
	"         (SELECT b.slots FROM earmark.budget b WHERE b.budget_id = j.budget_id) END, gen "
	"FROM earmark.job j WHERE job_id = $1 FOR UPDATE",
	1, {INT8OID}
};

/*
 * A charge that changes nothing but the use, the step and the lease (the
 * job is running, its lease has not passed, the tokens fit, the step is
 * new): one UPDATE, which takes the row lock itself, instead of a locking
 * read and an update (a statement and a WAL record fewer).  Under READ
 * COMMITTED a concurrent settle makes the UPDATE re-check its conditions
 * on the settled row, so it finds nothing and the caller takes the general
 * path.  "$2 <= amount - used" cannot overflow as "used + $2" could.
 *
 * A renewal never shortens a lease: the clock ($4) was read when the call
 * came, and the call may then have waited for the row while another
 * renewal set a later end (isolation spec renewal_order).
 */
static EmStatement charge_fits = {
	"UPDATE earmark.job SET used = used + $2, last_step = coalesce($3, last_step), "
	"       lease_until = GREATEST(lease_until, $4 + lease) "
	"WHERE job_id = $1 AND status = 'running' AND lease_until >= $4 AND $2 <= amount - used "
	"  AND ($3 IS NULL OR last_step IS NULL OR $3 > last_step) "
	"RETURNING amount - used",
	4, {INT8OID, INT8OID, INT8OID, TIMESTAMPTZOID}
};

static EmStatement write_charge = {
	"UPDATE earmark.job SET used = $2, last_step = coalesce($3, last_step), "
	"status = $4, lease_until = GREATEST(lease_until, $5) WHERE job_id = $1",
	5, {INT8OID, INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement heartbeat_job = {
	"UPDATE earmark.job SET lease_until = GREATEST(lease_until, $2 + lease) "
	"WHERE job_id = $1 AND status IN ('running', 'capped') AND lease_until >= $2 "
	"RETURNING lease_until",
	2, {INT8OID, TIMESTAMPTZOID}
};

static EmStatement job_exists = {
	"SELECT 1 FROM earmark.job WHERE job_id = $1",
	1, {INT8OID}
};

/*
 * A settlement: the budget, the job, its ledger row and the cycle's meter
 * mark in one statement ($6 the hold, $7 the budget).  The ledger row and
 * the mark are written only after the budget row's update, which they
 * reference: a CTE nobody reads runs last, and a mark inserted before the
 * budget lock was granted would be held, uncommitted, while waiting for
 * it (a deadlock with any holder of the budget row that settles too).
 *
 * settle_slot_job is the same for a hold taken from an escrow slot: it
 * settles into whichever slot of the budget is free and of the generation
 * the hold was taken in ($9) (held to used, the rest to room; the first
 * free one from a random start, $8, as escrow.c's fast path searches), so
 * that it never queues behind the admissions using the slot it came from;
 * when no such slot is free it settles into the budget row, as an expiry
 * does.  Either way no slot's allocation (room + held + used) changes,
 * which is what the limit's books rest on (escrow.c); a row's own held may
 * go below zero, only the sums count.  The generation matters: slots are
 * cut again in a new generation when the limit, or the usage recorded
 * against it, changes, and the new cut counts the old holds as taken; a
 * hold of the old generation released into a slot of the new one would
 * add room the new cut never gave, while the budget may be over its new
 * limit (in the budget row, the release only lowers held, and a rebalance
 * hands it out again only if the limit has room).
 */
static EmStatement settle_job = {
	"WITH b AS (UPDATE earmark.budget SET held = held - $6, used = used + $4 WHERE budget_id = $7 RETURNING 1),"
	" j AS (UPDATE earmark.job SET status = $2, settled_at = $3, charged = $4, "
	"       released = $5 WHERE job_id = $1),"
	" l AS (INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)"
	"       SELECT $7, $4, $1, $3 WHERE $4 > 0 AND EXISTS (SELECT 1 FROM b) RETURNING 1)"
	"INSERT INTO earmark.meter_mark (budget_id) SELECT $7 WHERE EXISTS (SELECT 1 FROM l) "
	"ON CONFLICT DO NOTHING",
	7, {INT8OID, TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID, INT8OID, INT8OID}
};

static EmStatement settle_slot_job = {
	"WITH f AS (SELECT coalesce("
	"    (SELECT slot FROM earmark.budget_slot WHERE budget_id = $7 AND slot >= $8 AND gen = $9 "
	"      ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED),"
	"    (SELECT slot FROM earmark.budget_slot WHERE budget_id = $7 AND slot < $8 AND gen = $9 "
	"      ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)) AS slot),"
	" bs AS (UPDATE earmark.budget_slot t SET held = t.held - $6, used = t.used + $4, "
	"        room = t.room + ($6 - $4) FROM f WHERE t.budget_id = $7 AND t.slot = f.slot RETURNING 1),"
	" bb AS (UPDATE earmark.budget SET held = held - $6, used = used + $4 "
	"        WHERE budget_id = $7 AND (SELECT slot FROM f) IS NULL RETURNING 1),"
	" j AS (UPDATE earmark.job SET status = $2, settled_at = $3, charged = $4, "
	"       released = $5 WHERE job_id = $1),"
	" l AS (INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)"
	"       SELECT $7, $4, $1, $3 WHERE $4 > 0 "
	"          AND (EXISTS (SELECT 1 FROM bs) OR EXISTS (SELECT 1 FROM bb)) RETURNING 1)"
	"INSERT INTO earmark.meter_mark (budget_id) SELECT $7 WHERE EXISTS (SELECT 1 FROM l) "
	"ON CONFLICT DO NOTHING",
	9, {INT8OID, TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID, INT8OID, INT8OID, INT4OID, INT8OID}
};

static EmStatement expired_budgets = {
	"SELECT budget_id FROM earmark.job "
	"WHERE status IN ('running', 'capped') AND lease_until < $1 "
	"GROUP BY budget_id ORDER BY pg_catalog.min(lease_until) LIMIT $2",
	2, {TIMESTAMPTZOID, INT4OID}
};

static EmStatement lock_budget_wait = {
	"SELECT 1 FROM earmark.budget WHERE budget_id = $1 FOR UPDATE",
	1, {INT8OID}
};

static EmStatement lock_budget_skip = {
	"SELECT 1 FROM earmark.budget WHERE budget_id = $1 FOR UPDATE SKIP LOCKED",
	1, {INT8OID}
};

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/* limit - used - held, at least 0; unlimited reads as PG_INT64_MAX */
static int64
room_left(bool unlimited, int64 lim, int64 used, int64 held)
{
	int64		r;

	if (unlimited)
		return PG_INT64_MAX;
	if (pg_sub_s64_overflow(lim, used, &r) || pg_sub_s64_overflow(r, held, &r))
		return 0;
	return Max(r, 0);
}

static bool
is_open(const char *status)
{
	return strcmp(status, "running") == 0 || strcmp(status, "capped") == 0;
}

/*
 * A job status as a string constant, so that it outlives SPI's memory and
 * can be returned after SPI_finish.
 */
static const char *
status_const(const char *s)
{
	static const char *const statuses[] = {
		"running", "capped", "completed", "failed", "cancelled", "expired"
	};
	int			i;

	for (i = 0; i < (int) lengthof(statuses); i++)
	{
		if (strcmp(s, statuses[i]) == 0)
			return statuses[i];
	}
	elog(ERROR, "earmark: unknown job status \"%s\"", s);
	return NULL;				/* keep compiler quiet */
}

static TimestampTz
add_interval(TimestampTz t, Interval *i)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(t),
												   IntervalPGetDatum(i)));
}

/*
 * Expire up to max dead holds of a locked budget; returns how many.
 * *released and *charged are their sums, for the caller to apply to the
 * budget row.  It may find the cycle marked, so it takes the cycle's mark
 * lock (ledger.c); without wait, a lock the reporter holds makes it expire
 * nothing (the worker never waits while it holds a budget row).
 */
int64
em_expire_budget_jobs(int64 budget_id, TimestampTz now, int max, bool wait,
					  int64 *released, int64 *charged)
{
	Datum		args[3];
	int64		n;

	args[0] = Int64GetDatum(budget_id);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int32GetDatum(max);
	*released = 0;
	*charged = 0;
	if (!wait && !em_mark_try_lock(budget_id))
		return 0;
	if (wait)
		em_mark_lock(budget_id);
	em_exec(&expire_jobs, args, NULL, 0);
	n = em_get_int64(0, 1, 0);
	*released = em_get_int64(0, 2, 0);
	*charged = em_get_int64(0, 3, 0);
	return n;
}

static void
check_positive(int64 v, const char *what)
{
	if (v <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be greater than zero", what),
				 errdetail("The value given was " INT64_FORMAT ".", v)));
}

/* ---------------------------------------------------------------------
 * earmark_reserve(account, amount, idempotency_key, feature, lease)
 *	  RETURNS TABLE (job_id, admitted, remaining, reason)
 * ---------------------------------------------------------------------
 */
typedef struct Admission
{
	bool		admitted;
	int64		job_id;
	bool		unlimited;
	int64		remaining;
	const char *reason;			/* NULL, a constant, or reason_buf */
	char		reason_buf[128];
	bool		want_limits;	/* the limit is stale: ask the worker */
} Admission;

/*
 * The same key again: the same job, or an error if the parameters differ.
 * The job's id, amount and feature are columns 1-3 of the last result.
 */
static void
existing_job(text *account, text *key, text *feature, int64 amount,
			 Admission *result)
{
	int64		job_id = em_get_int64(0, 1, 0);
	int64		old_amount = em_get_int64(0, 2, 0);
	bool		isnull;
	char	   *old_feature = TextDatumGetCString(em_get(0, 3, &isnull));
	char	   *new_feature = text_to_cstring(feature);

	if (old_amount != amount || strcmp(old_feature, new_feature) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_IDEMPOTENCY_CONFLICT),
				 errmsg("idempotency key \"%s\" of account \"%s\" was used for a different job",
						text_to_cstring(key), text_to_cstring(account)),
				 errdetail("Job " INT64_FORMAT " holds " INT64_FORMAT " of feature \"%s\"; this call asks for " INT64_FORMAT " of feature \"%s\".",
						   job_id, old_amount, old_feature, amount, new_feature),
				 errhint("Use a new key for a new job, or repeat the first call's amount and feature.")));

	result->admitted = true;
	result->job_id = job_id;
	result->reason = "already admitted";
}

static void
fill_remaining_of_job_budget(int64 budget_id, Admission *result)
{
	Datum		arg = Int64GetDatum(budget_id);
	bool		isnull;

	em_exec(&budget_numbers, &arg, NULL, 1);
	if (SPI_processed == 1)
	{
		int64		used = em_get_int64(0, 1, 0);
		int64		held = em_get_int64(0, 2, 0);
		Datum		lim = em_get(0, 3, &isnull);
		bool		known = DatumGetBool(em_get(0, 4, &isnull));

		result->unlimited = known && isnull;
		result->remaining = known ? room_left(result->unlimited,
											  DatumGetInt64(lim), used, held) : 0;
	}
}

static EmStatement job_budget = {
	"SELECT budget_id FROM earmark.job WHERE job_id = $1",
	1, {INT8OID}
};

static void
remaining_for_job(int64 job_id, Admission *result)
{
	Datum		arg = Int64GetDatum(job_id);

	em_exec(&job_budget, &arg, NULL, 1);
	if (SPI_processed == 1)
		fill_remaining_of_job_budget(em_get_int64(0, 1, 0), result);
}

/*
 * Before a refusal: did a concurrent reserve with the same key commit while
 * we waited for the budget row?  Then the answer is that job, not a
 * refusal.  (Only refusals pay for this look-up; an admission finds the
 * key through its insert.)
 */
static bool
key_taken_meanwhile(text *account, text *key, text *feature, int64 amount,
					Admission *result)
{
	Datum		args[2];

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(key);
	em_exec(&job_by_key, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	existing_job(account, key, feature, amount, result);
	remaining_for_job(result->job_id, result);
	return true;
}

static EmStatement rate_refund = {
	"UPDATE earmark.account SET rate_tat = rate_tat - $2 * interval '1 microsecond' WHERE account = $1",
	2, {TEXTOID, INT8OID}
};

/*
 * Give back the admission rate_conforms counted, when the hold then found
 * its key taken by a concurrent reserve: a repeat of a key never counts.
 */
static void
rate_give_back(text *account)
{
	Datum		args[2];

	if (earmark_rate_limit <= 0)
		return;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(USECS_PER_MINUTE / earmark_rate_limit);
	em_exec(&rate_refund, args, NULL, 0);
}

/* GCRA, per account: true when one more admission conforms (and is counted) */
static bool
rate_conforms(text *account, TimestampTz now)
{
	Datum		rargs[4];
	int64		step;

	if (earmark_rate_limit <= 0)
		return true;
	step = USECS_PER_MINUTE / earmark_rate_limit;
	rargs[0] = PointerGetDatum(account);
	rargs[1] = TimestampTzGetDatum(now);
	rargs[2] = Int64GetDatum(step);
	rargs[3] = Int64GetDatum(USECS_PER_MINUTE - step);
	em_exec(&rate_admit, rargs, NULL, 1);
	return SPI_processed == 1;
}

typedef struct ReserveCtx
{
	text	   *account;
	text	   *key;
	text	   *feature;
	int64		amount;
	Interval   *lease;
	TimestampTz now;
	Admission  *result;
} ReserveCtx;

/*
 * The hold outside any escrow slot: the job row and the budget row's new
 * numbers (used, held + amount).  ESCROW_KEY_TAKEN when a concurrent
 * reserve with the same key committed first (then *result is that job).
 */
static EscrowResult
insert_hold(ReserveCtx *c, int64 budget_id, int64 used, int64 held)
{
	int64		new_held;
	Datum		hargs[10];

	if (pg_add_s64_overflow(held, c->amount, &new_held))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("the account's holds would exceed the largest bigint")));
	hargs[0] = Int64GetDatum(budget_id);
	hargs[1] = PointerGetDatum(c->account);
	hargs[2] = PointerGetDatum(c->feature);
	hargs[3] = PointerGetDatum(c->key);
	hargs[4] = Int64GetDatum(c->amount);
	hargs[5] = IntervalPGetDatum(c->lease);
	hargs[6] = TimestampTzGetDatum(add_interval(c->now, c->lease));
	hargs[7] = TimestampTzGetDatum(c->now);
	hargs[8] = Int64GetDatum(used);
	hargs[9] = Int64GetDatum(held);
	em_exec(&admit_job, hargs, NULL, 1);
	if (SPI_processed == 1)
	{
		c->result->admitted = true;
		c->result->job_id = em_get_int64(0, 1, 0);
		c->result->reason = NULL;
		return ESCROW_ADMITTED;
	}
	/* the same key committed after reserve_start (ON CONFLICT waited) */
	if (!key_taken_meanwhile(c->account, c->key, c->feature, c->amount, c->result))
		elog(ERROR, "earmark: job with key \"%s\" vanished", text_to_cstring(c->key));
	return ESCROW_KEY_TAKEN;
}

/* escrow's slow path admits outside the slots through this */
static EscrowResult
escrow_admit_outside(void *arg, EscrowBudget *b, int64 amount)
{
	ReserveCtx *c = (ReserveCtx *) arg;

	EscrowResult r;

	if (!rate_conforms(c->account, c->now))
		return ESCROW_RATE_LIMITED;
	r = insert_hold(c, b->budget_id, b->used, b->held);
	if (r == ESCROW_KEY_TAKEN)
		rate_give_back(c->account);
	return r;
}

/*
 * Under REPEATABLE READ and SERIALIZABLE, read_limit saw the limit, the
 * cycle's recorded usage and the account's cycle anchor in the
 * transaction's snapshot.  None is locked (usage is recorded without the
 * budget row, so that many writers do not queue on it; an anchor change
 * locks the budget rows but need not change them), so a lower limit,
 * usage or a new anchor committed after that snapshot, even before this
 * call, would be invisible.  Read them again in a snapshot
 * that sees every commit: if anything differs, fail with 40001, as the
 * budget row's lock does when the row changed after the snapshot.
 */
static void
check_limit_current(Datum *args, bool unlimited, int64 lim, int64 recorded,
					bool has_anchor, TimestampTz anchor, text *account)
{
	bool		now_unlimited;
	bool		no_anchor;
	bool		isnull;
	int64		now_lim;
	Datum		now_anchor;

	em_exec_latest(&read_limit, args, NULL, 1);
	if (SPI_processed == 1 && DatumGetBool(em_get(0, 2, &isnull)))
	{
		now_lim = DatumGetInt64(em_get(0, 1, &now_unlimited));
		now_anchor = em_get(0, 3, &no_anchor);
		if (now_unlimited == unlimited && (unlimited || now_lim == lim) &&
			em_get_int64(0, 4, 0) == recorded && no_anchor == !has_anchor &&
			(no_anchor || DatumGetTimestampTz(now_anchor) == anchor))
			return;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to a concurrent change of the limit, usage or cycle anchor of account \"%s\"",
					text_to_cstring(account)),
			 errdetail("The limit, the recorded usage or the cycle anchor changed after this transaction's snapshot was taken."),
			 errhint("Retry the transaction.")));
}

static void
refuse(Admission *result, int64 amount, int64 remaining)
{
	result->remaining = remaining;
	snprintf(result->reason_buf, sizeof(result->reason_buf),
			 "the job needs " INT64_FORMAT " and " INT64_FORMAT " is left",
			 amount, remaining);
	result->reason = result->reason_buf;
}

static void
do_reserve(text *account, int64 amount, text *key, text *feature,
		   Interval *lease, TimestampTz now, Admission *result)
{
	Datum		args[8];
	char		nulls[8];
	bool		isnull;
	bool		has_anchor;
	TimestampTz anchor = 0;
	TimestampTz start;
	TimestampTz end;
	int64		budget_id;
	int64		used;
	int64		held;
	int64		lim = 0;
	int64		recorded;
	bool		unlimited;
	int64		remaining;
	bool		changed = false;
	int			attempt;
	int			escrow_slots;
	int			slots;
	bool		slot_lim_null;
	int64		slot_lim;
	int64		slot_gen;
	ReserveCtx	ctx;

	memset(nulls, ' ', sizeof(nulls));
	ctx.account = account;
	ctx.key = key;
	ctx.feature = feature;
	ctx.amount = amount;
	ctx.lease = lease;
	ctx.now = now;
	ctx.result = result;

	/*
	 * 1. the same key again returns the same job and holds nothing new; 2.
	 * an account without a known limit is refused: fail closed
	 */
	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(key);
	args[2] = PointerGetDatum(feature);
	args[3] = Int32GetDatum(earmark_escrow_slots);
	em_exec(&reserve_start, args, NULL, 1);
	(void) em_get(0, 1, &isnull);
	if (!isnull)
	{
		existing_job(account, key, feature, amount, result);
		remaining_for_job(result->job_id, result);
		return;
	}
	if (!DatumGetBool(em_get(0, 6, &isnull)))
	{
		result->reason = "limit unknown";
		result->remaining = 0;
		return;
	}
	{
		/* the limit cache (limits.c): a provider's limit ages */
		Datum		src = em_get(0, 5, &isnull);
		bool		has_row = !isnull;
		bool		provider_row = has_row &&
			strcmp(TextDatumGetCString(src), "provider") == 0;
		Datum		fetched = em_get(0, 8, &isnull);
		bool		has_fetched = !isnull;
		bool		wanted = DatumGetBool(em_get(0, 9, &isnull));
		EmLimitAge	age = em_limit_age(has_row, provider_row, has_fetched,
									   has_fetched ? DatumGetTimestampTz(fetched) : 0,
									   now);

		if (age == EM_LIMIT_UNKNOWN || age == EM_LIMIT_UNKNOWN_WANTED)
		{
			/* no lock is held yet, and none is taken after this one */
			if (age == EM_LIMIT_UNKNOWN_WANTED && !wanted)
				em_want_limits(account);
			result->reason = "limit unknown";
			result->remaining = 0;
			return;
		}
		/* flagged after the budget row, in earmark_reserve */
		result->want_limits = age == EM_LIMIT_STALE && !wanted;
	}
	anchor = DatumGetTimestampTz(em_get(0, 4, &isnull));
	has_anchor = !isnull;
	escrow_slots = DatumGetInt32(em_get(0, 7, &isnull));
	args[1] = PointerGetDatum(feature);

	/*
	 * Escrow's fast path: take room from a free slot without touching the
	 * budget row.  Only while the rate limit is off: with it on, every
	 * admission of the account is serialized on the account row anyway,
	 * and a slot admission that the rate limit then refused could not be
	 * taken back.  Not under REPEATABLE READ or SERIALIZABLE either: the
	 * fast path reads the limit and the recorded usage without a lock, in
	 * the transaction's snapshot, which may be older than a lower limit or
	 * usage committed before this call; the slow path checks them.
	 */
	if (escrow_slots > 0 && earmark_rate_limit <= 0 && !IsolationUsesXactSnapshot())
	{
		int64		job_id;
		EscrowResult r;
		EscrowNumbers n;

		em_cycle_bounds(anchor, has_anchor, now, &start, &end);
		r = em_escrow_fast(account, feature, start, key, amount, lease,
						   add_interval(now, lease), now, escrow_slots, &job_id, &n);
		if (r == ESCROW_ADMITTED)
		{
			int64		held;

			result->admitted = true;
			result->job_id = job_id;
			result->unlimited = n.unlimited;
			/* the numbers are from before this hold */
			if (pg_add_s64_overflow(n.held, amount, &held))
				held = PG_INT64_MAX;
			result->remaining = n.unlimited ? 0 : room_left(false, n.lim, n.used, held);
			return;
		}
		if (r == ESCROW_KEY_TAKEN)
		{
			if (!key_taken_meanwhile(account, key, feature, amount, result))
				elog(ERROR, "earmark: job with key \"%s\" vanished", text_to_cstring(key));
			return;
		}
	}

	for (attempt = 0;; attempt++)
	{
		TimestampTz locked_start;

		em_cycle_bounds(anchor, has_anchor, now, &start, &end);

		/* 3. lock the cycle's budget row, creating it on first use */
		args[2] = TimestampTzGetDatum(start);
		em_exec(&lock_budget, args, NULL, 1);
		if (SPI_processed == 0)
		{
			/*
			 * Creating a cycle's budget row: hold the account's advisory
			 * lock shared so that earmark_set_account cannot change the
			 * anchor under us, and read the anchor again under it.
			 */
			Datum		lockargs[2];

			lockargs[0] = PointerGetDatum(account);
			lockargs[1] = Int32GetDatum(EARMARK_ADVISORY_CLASS);
			em_exec(&advisory_shared, lockargs, NULL, 0);
			em_exec(&account_anchor_again, lockargs, NULL, 1);
			if (SPI_processed == 1)
			{
				anchor = DatumGetTimestampTz(em_get(0, 1, &isnull));
				has_anchor = !isnull;
			}
			em_cycle_bounds(anchor, has_anchor, now, &start, &end);
			args[2] = TimestampTzGetDatum(start);
			args[3] = TimestampTzGetDatum(end);
			args[4] = Int32GetDatum(earmark_escrow_slots);
			em_exec(&create_budget, args, NULL, 0);
			em_exec(&lock_budget, args, NULL, 1);
			if (SPI_processed == 0)
				elog(ERROR, "earmark: budget row of account \"%s\" vanished",
					 text_to_cstring(account));
		}
		budget_id = em_get_int64(0, 1, 0);
		used = em_get_int64(0, 2, 0);
		held = em_get_int64(0, 3, 0);
		slots = DatumGetInt32(em_get(0, 4, &isnull));
		slot_lim = DatumGetInt64(em_get(0, 5, &slot_lim_null));
		slot_gen = em_get_int64(0, 6, 0);
		locked_start = start;

		/*
		 * 4. the limit, and the anchor, as they are now that we hold the
		 * row (a new snapshot: whatever the lock waited for is visible).
		 * earmark_set_account may have moved the anchor while we waited for
		 * an existing budget row: then this row is of the old cycles and
		 * the hold belongs in the new anchor's cycle.  Usage recorded
		 * without a hold (the cycle's shards) counts against the limit.
		 */
		args[3] = Int64GetDatum(budget_id);
		em_exec(&read_limit, args, NULL, 1);
		if (SPI_processed == 0 || !DatumGetBool(em_get(0, 2, &isnull)))
		{
			result->reason = "limit unknown";
			result->remaining = 0;
			return;
		}
		anchor = DatumGetTimestampTz(em_get(0, 3, &isnull));
		has_anchor = !isnull;
		em_cycle_bounds(anchor, has_anchor, now, &start, &end);
		if (start == locked_start)
			break;
		if (attempt >= 3)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("cycle anchor of account \"%s\" keeps changing", text_to_cstring(account)),
					 errhint("Retry the transaction.")));
	}
	lim = DatumGetInt64(em_get(0, 1, &unlimited));
	recorded = em_get_int64(0, 4, 0);
	result->unlimited = unlimited;
	if (IsolationUsesXactSnapshot())
		check_limit_current(args, unlimited, lim, recorded, has_anchor, anchor, account);

	/* an escrow budget: the slow path rebalances its slots (escrow.c) */
	if (slots > 0 || slot_gen > 0)
	{
		EscrowBudget b;
		EscrowOutcome out;

		b.budget_id = budget_id;
		b.used = used;
		b.held = held;
		/* recorded usage takes its part of the limit before the slots */
		b.lim = unlimited ? lim : Max(lim - recorded, 0);
		b.unlimited = unlimited;
		b.slots = slots;
		b.slot_lim = slot_lim;
		b.slot_lim_null = slot_lim_null;
		b.slot_gen = slot_gen;
		em_escrow_rebalance(&b, amount, now, escrow_admit_outside, &ctx, &out);
		switch (out.result)
		{
			case ESCROW_ADMITTED:
				result->remaining = unlimited ? 0 : out.remaining;
				break;
			case ESCROW_KEY_TAKEN:
				break;
			case ESCROW_RATE_LIMITED:
				if (!key_taken_meanwhile(account, key, feature, amount, result))
				{
					result->remaining = out.remaining;
					result->reason = "rate limited";
				}
				break;
			default:
				if (!key_taken_meanwhile(account, key, feature, amount, result))
					refuse(result, amount, out.remaining);
				break;
		}
		return;
	}

	remaining = room_left(unlimited, lim, used + recorded, held);

	/* 5. a hold whose lease has passed never causes a refusal */
	if (amount > remaining)
	{
		int64		released;
		int64		charged;

		if (em_expire_budget_jobs(budget_id, now, EARMARK_RECLAIM_BATCH, true,
								  &released, &charged) > 0)
		{
			held -= released;
			used += charged;
			changed = true;
			remaining = room_left(unlimited, lim, used + recorded, held);
		}
	}

	if (amount > remaining && key_taken_meanwhile(account, key, feature, amount, result))
		;						/* the same key was admitted while we waited */
	else if (amount > remaining)
		refuse(result, amount, remaining);
	else
	{
		/*
		 * 6. the rate limit, per account (GCRA on the account row, locked
		 * after the budget row, the order every earmark function keeps);
		 * 7. the hold
		 */
		if (!rate_conforms(account, now))
		{
			if (!key_taken_meanwhile(account, key, feature, amount, result))
			{
				result->remaining = remaining;
				result->reason = "rate limited";
			}
		}
		else if (insert_hold(&ctx, budget_id, used, held) == ESCROW_ADMITTED)
		{
			/* admit_job wrote the budget row too */
			result->remaining = unlimited ? 0 : remaining - amount;
			changed = false;
		}
		else
			rate_give_back(account);
	}

	if (changed)
	{
		args[0] = Int64GetDatum(budget_id);
		args[1] = Int64GetDatum(used);
		args[2] = Int64GetDatum(held);
		em_exec(&write_budget, args, NULL, 0);
	}
}

Datum
earmark_reserve(PG_FUNCTION_ARGS)
{
	text	   *account = em_arg_name(fcinfo, 0, "account");
	int64		amount = em_arg_int64(fcinfo, 1, "amount");
	text	   *key = em_arg_name(fcinfo, 2, "idempotency_key");
	text	   *feature = em_arg_name(fcinfo, 3, "feature");
	TimestampTz now = GetCurrentTimestamp();
	Interval   *lease;
	Admission	result;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	check_positive(amount, "amount");
	if (PG_ARGISNULL(4))
	{
		lease = palloc0(sizeof(Interval));
		lease->time = (int64) earmark_lease_s * USECS_PER_SEC;
	}
	else
	{
		lease = PG_GETARG_INTERVAL_P(4);
		if (add_interval(now, lease) <= now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease must be longer than zero")));
	}

	memset(&result, 0, sizeof(result));
	SPI_connect();
	do_reserve(account, amount, key, feature, lease, now, &result);
	if (result.want_limits)
		em_want_limits(account);	/* after the budget row: gate.c's order */
	SPI_finish();

	values[0] = Int64GetDatum(result.job_id);
	nulls[0] = !result.admitted;
	values[1] = BoolGetDatum(result.admitted);
	values[2] = Int64GetDatum(result.remaining);
	nulls[2] = result.unlimited;
	if (result.reason)
		values[3] = CStringGetTextDatum(result.reason);
	nulls[3] = result.reason == NULL;
	em_return_row(fcinfo, values, nulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_charge(job_id, tokens, step)
 *	  RETURNS TABLE (charged, capped, room, status)
 * ---------------------------------------------------------------------
 */
static void
unknown_job(int64 job_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_EARMARK_UNKNOWN_JOB),
			 errmsg("earmark job " INT64_FORMAT " does not exist", job_id),
			 errhint("Use the job_id that earmark_reserve returned.")));
}

Datum
earmark_charge(PG_FUNCTION_ARGS)
{
	int64		job_id = em_arg_int64(fcinfo, 0, "job_id");
	int64		tokens = em_arg_int64(fcinfo, 1, "tokens");
	bool		has_step = !PG_ARGISNULL(2);
	int64		step = has_step ? PG_GETARG_INT64(2) : 0;
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	int64		amount;
	int64		used;
	int64		charged = 0;
	bool		capped = false;
	const char *status;
	const char *cur;
	TimestampTz lease_until;
	Datum		values[4];
	bool		rnulls[4] = {false, false, false, false};

	if (tokens < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", tokens)));
	if (has_step && step < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", step),
				 errhint("Number a job's steps from 0 or 1 upward.")));

	SPI_connect();
	args[0] = Int64GetDatum(job_id);
	args[1] = Int64GetDatum(tokens);
	args[2] = Int64GetDatum(step);
	nulls[2] = has_step ? ' ' : 'n';
	args[3] = TimestampTzGetDatum(now);
	em_exec(&charge_fits, args, nulls, 1);
	if (SPI_processed == 1)
	{
		values[2] = Int64GetDatum(em_get_int64(0, 1, 0));
		SPI_finish();
		values[0] = Int64GetDatum(tokens);
		values[1] = BoolGetDatum(false);
		values[3] = CStringGetTextDatum("running");
		em_return_row(fcinfo, values, rnulls);
		return (Datum) 0;
	}
	nulls[2] = ' ';

	/* capped, a repeated step, a dead lease, settled, or unknown */
	em_exec(&lock_job, args, NULL, 1);
	if (SPI_processed == 0)
		unknown_job(job_id);
	amount = em_get_int64(0, 2, 0);
	used = em_get_int64(0, 3, 0);
	cur = status_const(TextDatumGetCString(em_get(0, 4, &isnull)));
	lease_until = DatumGetTimestampTz(em_get(0, 5, &isnull));

	if (!is_open(cur))
		status = cur;
	else if (lease_until < now)
		status = "expired";		/* dead before the sweeper gets to it */
	else if (strcmp(cur, "capped") == 0)
	{
		status = cur;			/* a capped job charges nothing more */
		capped = tokens > 0;
	}
	else
	{
		Interval   *lease = DatumGetIntervalP(em_get(0, 6, &isnull));
		Datum		last = em_get(0, 7, &isnull);

		status = "running";
		if (!(has_step && !isnull && step <= DatumGetInt64(last)))
		{
			charged = Min(tokens, amount - used);
			capped = charged < tokens;
			used += charged;
			if (capped)
				status = "capped";
			args[1] = Int64GetDatum(used);
			args[2] = Int64GetDatum(step);
			nulls[2] = has_step ? ' ' : 'n';
			args[3] = CStringGetTextDatum(status);
			args[4] = TimestampTzGetDatum(add_interval(now, lease));
			em_exec(&write_charge, args, nulls, 0);
		}
	}
	SPI_finish();

	values[0] = Int64GetDatum(charged);
	values[1] = BoolGetDatum(capped);
	values[2] = Int64GetDatum(amount - used);
	values[3] = CStringGetTextDatum(status);
	em_return_row(fcinfo, values, rnulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_heartbeat(job_id) RETURNS timestamptz
 *	  The new lease end, or NULL when the job is no longer running.
 * ---------------------------------------------------------------------
 */
Datum
earmark_heartbeat(PG_FUNCTION_ARGS)
{
	int64		job_id = em_arg_int64(fcinfo, 0, "job_id");
	Datum		args[2];
	TimestampTz result = 0;
	bool		found;
	bool		isnull;

	SPI_connect();
	args[0] = Int64GetDatum(job_id);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	em_exec(&heartbeat_job, args, NULL, 1);
	found = SPI_processed == 1;
	if (found)
		result = DatumGetTimestampTz(em_get(0, 1, &isnull));
	else
	{
		em_exec(&job_exists, args, NULL, 1);
		if (SPI_processed == 0)
			unknown_job(job_id);
	}
	SPI_finish();

	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(result);
}

/* ---------------------------------------------------------------------
 * earmark_settle(job_id, used, outcome)
 *	  RETURNS TABLE (charged, released, status)
 * ---------------------------------------------------------------------
 */
Datum
earmark_settle(PG_FUNCTION_ARGS)
{
	int64		job_id = em_arg_int64(fcinfo, 0, "job_id");
	bool		has_used = !PG_ARGISNULL(1);
	int64		used_arg = has_used ? PG_GETARG_INT64(1) : 0;
	char	   *outcome;
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	int64		charged = 0;
	int64		released = 0;
	const char *status;
	Datum		values[3];
	bool		rnulls[3] = {false, false, false};

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outcome must not be NULL")));
	outcome = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(outcome, "completed") != 0 && strcmp(outcome, "failed") != 0 &&
		strcmp(outcome, "cancelled") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown outcome \"%s\"", outcome),
				 errhint("Use 'completed', 'failed' or 'cancelled'.")));
	if (has_used && used_arg < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("used must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", used_arg)));

	SPI_connect();
	args[0] = Int64GetDatum(job_id);
	em_exec(&lock_job, args, NULL, 1);
	if (SPI_processed == 0)
		unknown_job(job_id);
	status = status_const(TextDatumGetCString(em_get(0, 4, &isnull)));
	if (is_open(status))
	{
		int64		budget_id = em_get_int64(0, 1, 0);
		int64		amount = em_get_int64(0, 2, 0);
		int64		recorded = em_get_int64(0, 3, 0);
		TimestampTz lease_until = DatumGetTimestampTz(em_get(0, 5, &isnull));
		bool		has_slot;

		(void) em_get(0, 8, &has_slot);
		has_slot = !has_slot;

		if (lease_until < now)
		{
			/* too late: settled as the sweeper would, at the recorded use */
			status = "expired";
			charged = Min(recorded, amount);
		}
		else
		{
			status = status_const(outcome);
			charged = Min(has_used ? used_arg : recorded, amount);
		}
		released = amount - charged;

		args[1] = CStringGetTextDatum(status);
		args[2] = TimestampTzGetDatum(now);
		args[3] = Int64GetDatum(charged);
		args[4] = Int64GetDatum(released);
		args[5] = Int64GetDatum(amount);
		args[6] = Int64GetDatum(budget_id);
		if (has_slot)
		{
			Datum		nslots = em_get(0, 9, &isnull);

			args[7] = Int32GetDatum(em_random_slot(isnull ? 0 : DatumGetInt32(nslots)));
			/* no generation (a hold from before 0.3.0): the budget row */
			args[8] = em_get(0, 10, &isnull);
			nulls[8] = isnull ? 'n' : ' ';
		}
		if (charged > 0)
			em_mark_lock(budget_id);	/* see ledger.c */
		em_exec(has_slot ? &settle_slot_job : &settle_job, args, nulls, 0);
	}
	SPI_finish();

	values[0] = Int64GetDatum(charged);
	values[1] = Int64GetDatum(released);
	values[2] = CStringGetTextDatum(status);
	em_return_row(fcinfo, values, rnulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_sweep(max_jobs) RETURNS int
 * ---------------------------------------------------------------------
 */

/*
 * Settle up to max_jobs holds whose lease has passed, as 'expired' at the
 * use they recorded.  Runs inside the caller's SPI connection.  With
 * wait_first (earmark_sweep) the first budget is waited for; every other
 * one (and with !wait_first, the worker's, every one) is skipped when
 * another session holds it, so a sweep never waits while it holds a
 * budget lock, and the worker never waits at all.
 */
int
em_sweep(int max_jobs, bool wait_first)
{
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[2];
	int64	   *budgets;
	int			nbudgets;
	int			i;
	int			done = 0;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(max_jobs);
	em_exec(&expired_budgets, args, NULL, 0);
	nbudgets = (int) SPI_processed;
	budgets = palloc(sizeof(int64) * Max(nbudgets, 1));
	for (i = 0; i < nbudgets; i++)
		budgets[i] = em_get_int64(i, 1, 0);

	for (i = 0; i < nbudgets && done < max_jobs; i++)
	{
		int64		released;
		int64		charged;
		int64		n;

		args[0] = Int64GetDatum(budgets[i]);
		em_exec(i == 0 && wait_first ? &lock_budget_wait : &lock_budget_skip, args, NULL, 1);
		if (SPI_processed == 0)
			continue;
		n = em_expire_budget_jobs(budgets[i], now, max_jobs - done,
								  i == 0 && wait_first, &released, &charged);
		if (n > 0)
		{
			Datum		upd[3];

			upd[0] = Int64GetDatum(budgets[i]);
			upd[1] = Int64GetDatum(released);
			upd[2] = Int64GetDatum(charged);
			em_exec(&release_budget, upd, NULL, 0);
			done += (int) n;
		}
	}
	return done;
}

Datum
earmark_sweep(PG_FUNCTION_ARGS)
{
	int32		max_jobs;
	int			n;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_jobs must not be NULL")));
	max_jobs = PG_GETARG_INT32(0);
	check_positive(max_jobs, "max_jobs");

	SPI_connect();
	n = em_sweep(max_jobs, true);
	SPI_finish();
	PG_RETURN_INT32(n);
}
