/*-------------------------------------------------------------------------
 *
 * ledger.c
 *	  The usage ledger's writers and its counters: earmark_record_usage,
 *	  the cycle's meter mark, and a cycle's total read without a scan.
 *
 *	  Tables: earmark.ledger (append-only; keyed rows from here, job rows
 *	  from gate.c), earmark.usage_shard (64 counter rows per cycle),
 *	  earmark.meter_mark, and earmark.budget rows, which are created here
 *	  on a cycle's first usage but not locked (a positive record touches no
 *	  budget row: that is what keeps many writers on one account apart).
 *
 *	  Locks:
 *	  - the account's advisory lock, shared (as reserve takes it), so that
 *	    earmark_set_account cannot move the anchor while usage is written
 *	    into a cycle computed from it;
 *	  - a correction (negative units) updates the budget row (to itself):
 *	    corrections of one cycle queue, so two of them cannot both pass the
 *	    check that the total stays at or above zero, and one whose snapshot
 *	    is older than another's commit fails with 40001;
 *	  - the cycle's mark lock, shared (em_mark_lock): held by every writer
 *	    that may find the mark already there, until it commits.  The
 *	    reporter deletes a mark only with that lock taken exclusively and
 *	    without waiting (meter.c), so it never deletes a mark whose
 *	    writer's usage it has not seen.
 *	  - the random shard's row, for the length of the writer's transaction:
 *	    with 64 shards, writers rarely meet there.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "earmark.h"

PG_FUNCTION_INFO_V1(earmark_record_usage);

/* how far ahead of the clock a usage's occurred_at may be */
#define FUTURE_SLACK_US		(5 * 60 * USECS_PER_SEC)

static EmStatement account_anchor = {
	"SELECT cycle_anchor FROM earmark.account WHERE account = $1",
	1, {TEXTOID}
};

static EmStatement advisory_shared = {
	"SELECT pg_catalog.pg_advisory_xact_lock_shared($2, pg_catalog.hashtext($1))",
	2, {TEXTOID, INT4OID}
};

/* the key's row if it exists: a repeat adds nothing */
static EmStatement key_row = {
	"SELECT l.units, b.feature FROM earmark.ledger l "
	"JOIN earmark.budget b USING (budget_id) "
	"WHERE l.account = $1 AND l.entry_key = $2",
	2, {TEXTOID, TEXTOID}
};

static EmStatement find_budget = {
	"SELECT budget_id FROM earmark.budget "
	"WHERE account = $1 AND feature = $2 AND cycle_start = $3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement create_budget = {
	"INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, slots) "
	"SELECT $1, $2, $3, $4, coalesce(a.escrow_slots, $5) FROM earmark.account a WHERE a.account = $1 "
	"ON CONFLICT (account, feature, cycle_start) DO NOTHING",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID}
};

/*
 * A correction updates its budget row (to itself): corrections of one cycle
 * queue on it, and under REPEATABLE READ or SERIALIZABLE a correction whose
 * snapshot missed another's commit fails with 40001 instead of checking an
 * old total.
 */
static EmStatement lock_budget_for_correction = {
	"UPDATE earmark.budget SET used = used WHERE budget_id = $1",
	1, {INT8OID}
};

/*
 * A cycle's total without reading its ledger: the settled jobs (budget row
 * and escrow slots) and the recorded usage (the shards).
 */
static EmStatement cycle_total = {
	"SELECT " EM_CYCLE_TOTAL_SQL " FROM earmark.budget b WHERE b.budget_id = $1",
	1, {INT8OID}
};

/*
 * The row, its counter and the cycle's mark in one statement; nothing when
 * the key is already taken (a concurrent writer of the same key is waited
 * for by the unique index, then conflicts).
 */
static EmStatement record_row = {
	"WITH l AS ("
	"  INSERT INTO earmark.ledger (budget_id, units, account, entry_key, occurred_at, recorded_at)"
	"  VALUES ($1, $2, $3, $4, $5, pg_catalog.clock_timestamp())"
	"  ON CONFLICT (account, entry_key) WHERE entry_key IS NOT NULL DO NOTHING"
	"  RETURNING 1),"
	" c AS (INSERT INTO earmark.usage_shard AS u (budget_id, shard, units)"
	"       SELECT $1, $6, $2 WHERE EXISTS (SELECT 1 FROM l)"
	"       ON CONFLICT (budget_id, shard) DO UPDATE SET units = u.units + excluded.units"
	"       RETURNING 1),"
	" m AS (INSERT INTO earmark.meter_mark (budget_id)"
	"       SELECT $1 WHERE EXISTS (SELECT 1 FROM c)"
	"       ON CONFLICT DO NOTHING) "
	"SELECT pg_catalog.count(*) FROM l",
	6, {INT8OID, INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID, INT4OID}
};

/*
 * The mark lock of a cycle: a transaction-level advisory lock in a key
 * space of its own (the int4-pair form with earmark's mark class), so that
 * it never meets an application's advisory locks on plain bigints.  Two
 * cycles whose ids agree in the low 32 bits share a lock; that only makes
 * a mark live one pass longer.
 */
static void
mark_locktag(LOCKTAG *tag, int64 budget_id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, EARMARK_MARK_CLASS,
						 (uint32) budget_id, 2);
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

int64
em_cycle_total(int64 budget_id, bool *found)
{
	Datum		arg = Int64GetDatum(budget_id);

	em_exec(&cycle_total, &arg, NULL, 1);
	*found = SPI_processed == 1;
	return *found ? em_get_int64(0, 1, 0) : 0;
}

/*
 * Under REPEATABLE READ and SERIALIZABLE the anchor was read in the
 * transaction's snapshot; an anchor change committed after it (the
 * advisory lock orders the two, but cannot show a snapshot what committed
 * later) would put the usage into a cycle of the old anchor.  Read it again
 * in a snapshot that sees every commit, and fail with 40001 if it moved.
 */
static void
check_anchor_current(Datum *args, bool has_anchor, TimestampTz anchor,
					 text *account)
{
	bool		isnull = true;
	Datum		d = (Datum) 0;

	em_exec_latest(&account_anchor, args, NULL, 1);
	if (SPI_processed == 1)
		d = em_get(0, 1, &isnull);
	if (SPI_processed == 1 && isnull == !has_anchor &&
		(isnull || DatumGetTimestampTz(d) == anchor))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to a concurrent change of the cycle anchor of account \"%s\"",
					text_to_cstring(account)),
			 errdetail("The account's cycle anchor changed after this transaction's snapshot was taken."),
			 errhint("Retry the transaction.")));
}

/* the same key again: nothing new, or a conflict when it differs */
static bool
repeat_of_key(text *account, text *key, int64 units, text *feature)
{
	Datum		args[2];
	bool		isnull;
	int64		old_units;
	char	   *old_feature;

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(key);
	em_exec(&key_row, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	old_units = em_get_int64(0, 1, 0);
	old_feature = TextDatumGetCString(em_get(0, 2, &isnull));
	if (old_units != units || strcmp(old_feature, text_to_cstring(feature)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_IDEMPOTENCY_CONFLICT),
				 errmsg("idempotency key \"%s\" was already used for other usage",
						text_to_cstring(key)),
				 errdetail("It recorded " INT64_FORMAT " units of feature \"%s\"; this call records "
						   INT64_FORMAT " units of \"%s\".",
						   old_units, old_feature, units, text_to_cstring(feature)),
				 errhint("Use a new key for new usage; a correction is new usage with negative units.")));
	return true;
}

/*
 * earmark_record_usage(account, units, idempotency_key, feature,
 * occurred_at): usage that did not pass a hold.  Returns true when the row
 * was written, false when the key had already written it.
 */
Datum
earmark_record_usage(PG_FUNCTION_ARGS)
{
	text	   *account = em_arg_name(fcinfo, 0, "account");
	int64		units = em_arg_int64(fcinfo, 1, "units");
	text	   *key = em_arg_name(fcinfo, 2, "idempotency_key");
	text	   *feature = em_arg_name(fcinfo, 3, "feature");
	TimestampTz occurred_at;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz anchor = 0;
	bool		has_anchor = false;
	TimestampTz start;
	TimestampTz end;
	Datum		args[6];
	bool		isnull;
	int64		budget_id;
	bool		written;

	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("occurred_at must not be NULL")));
	occurred_at = PG_GETARG_TIMESTAMPTZ(4);
	if (units == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("units must not be zero"),
				 errhint("A correction is a negative number of units.")));
	if (units > EARMARK_MAX_UNITS || units < -EARMARK_MAX_UNITS)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("units is out of range"),
				 errdetail("One call records at most " INT64_FORMAT " units either way.",
						   EARMARK_MAX_UNITS)));
	if (TIMESTAMP_NOT_FINITE(occurred_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurred_at must be a finite timestamp")));
	if (occurred_at > now + FUTURE_SLACK_US)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurred_at is in the future"),
				 errdetail("Usage is recorded after it happened; five minutes of clock skew are allowed.")));

	SPI_connect();

	/* the anchor cannot change under us from here on (account.c) */
	args[0] = PointerGetDatum(account);
	args[1] = Int32GetDatum(EARMARK_ADVISORY_CLASS);
	em_exec(&advisory_shared, args, NULL, 0);
	em_exec(&account_anchor, args, NULL, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_UNKNOWN_ACCOUNT),
				 errmsg("account \"%s\" does not exist", text_to_cstring(account)),
				 errhint("Create it with earmark_set_account or earmark_set_limit first.")));
	{
		Datum		d = em_get(0, 1, &isnull);

		has_anchor = !isnull;
		if (has_anchor)
			anchor = DatumGetTimestampTz(d);
	}
	if (IsolationUsesXactSnapshot())
		check_anchor_current(args, has_anchor, anchor, account);

	if (repeat_of_key(account, key, units, feature))
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}

	/* the cycle of the usage: a correction goes where the usage went */
	em_cycle_bounds(anchor, has_anchor, occurred_at, &start, &end);
	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	args[2] = TimestampTzGetDatum(start);
	args[3] = TimestampTzGetDatum(end);
	args[4] = Int32GetDatum(earmark_escrow_slots);
	em_exec(&find_budget, args, NULL, 1);
	if (SPI_processed == 0)
	{
		em_exec(&create_budget, args, NULL, 0);
		em_exec(&find_budget, args, NULL, 1);
		if (SPI_processed == 0)
			elog(ERROR, "earmark: budget row of account \"%s\" vanished",
				 text_to_cstring(account));
	}
	budget_id = em_get_int64(0, 1, 0);

	if (units < 0)
	{
		bool		found;
		int64		total;

		args[0] = Int64GetDatum(budget_id);
		em_exec(&lock_budget_for_correction, args, NULL, 1);
		total = em_cycle_total(budget_id, &found);
		if (total + units < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the correction is larger than the cycle's usage"),
					 errdetail("The cycle starting %s has " INT64_FORMAT " units; the correction takes away "
							   INT64_FORMAT ".", timestamptz_to_str(start), total, -units)));
	}

	em_mark_lock(budget_id);
	args[0] = Int64GetDatum(budget_id);
	args[1] = Int64GetDatum(units);
	args[2] = PointerGetDatum(account);
	args[3] = PointerGetDatum(key);
	args[4] = TimestampTzGetDatum(occurred_at);
	args[5] = Int32GetDatum((int32) pg_prng_uint64_range(&pg_global_prng_state, 0,
														 EARMARK_USAGE_SHARDS - 1));
	em_exec(&record_row, args, NULL, 1);
	written = em_get_int64(0, 1, 0) > 0;

	/* a concurrent call with the same key won: same usage, or a conflict */
	if (!written && !repeat_of_key(account, key, units, feature))
		elog(ERROR, "earmark: ledger row of key \"%s\" vanished", text_to_cstring(key));

	SPI_finish();
	PG_RETURN_BOOL(written);
}
