/*-------------------------------------------------------------------------
 *
 * ledger.c
 *	  The usage ledger's writers and its counters: earmark_record_usage,
 *	  the cycle's meter mark, a cycle's total read without a scan, and
 *	  earmark_budget, which reports a cycle's numbers (read by index from C
 *	  on a single node, in one snapshot).
 *
 *	  Tables: earmark.ledger_entry (a key's row read here, by index from C
 *	  on a single node (direct.c), written through entries.c),
 *	  earmark.usage_shard (64 counter rows per cycle),
 *	  earmark.meter_mark, and earmark.budget rows, which are created here
 *	  on a cycle's first usage but not locked (a positive record touches no
 *	  budget row: that is what keeps many writers on one account apart).
 *	  The budget row and the account's anchor are read by their keys, by
 *	  index from C on a single node (budget.c em_budget_find, account.c),
 *	  and so are a correction's write of the budget row and a cycle's total
 *	  (budget_slot_rec, cycle_total_direct): under SERIALIZABLE their
 *	  statements' plans read small tables whole, a predicate lock that
 *	  every other account's write of those tables conflicts with.
 *
 *	  Locks:
 *	  - the account's advisory lock, shared (as reserve takes it), so that
 *	    earmark_set_account cannot move the anchor while usage is written
 *	    into a cycle computed from it;
 *	  - a correction (negative units) updates the budget row (escrow's
 *	    slot_rec, to NULL):
 *	    corrections of one cycle queue, so two of them cannot both pass the
 *	    check that the total stays at or above zero, and one whose snapshot
 *	    is older than another's commit fails with 40001;
 *	  - the cycle's mark lock, shared (em_mark_lock, budget.c): held by
 *	    every writer that may find the mark already there, until it
 *	    commits.  The reporter deletes a mark only with that lock taken
 *	    exclusively and without waiting (meter.c), so it never deletes a
 *	    mark whose writer's usage it has not seen.
 *	  - the backend's shard row (em_usage_shard), for the length of the
 *	    writer's transaction: sessions rarely meet there.
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
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "account.h"
#include "budget.h"
#include "cluster.h"
#include "direct.h"
#include "earmark.h"
#include "entries.h"
#include "escrow.h"
#include "ledger.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_record_usage);
PG_FUNCTION_INFO_V1(earmark_budget);

/* how far ahead of the clock a usage's occurred_at may be */
#define FUTURE_SLACK_US		(5 * 60 * USECS_PER_SEC)

/* the key's row if it exists: a repeat adds nothing */
/* the columns of key_row */
enum
{
	KR_UNITS = 1, KR_FEATURE
};

static EmStatement key_row = {
	"SELECT l.units, b.feature FROM earmark.ledger_entry l "
	"JOIN earmark.budget b ON b.account = l.account AND b.budget_id = l.budget_id "
	"WHERE l.account = $1 AND l.entry_key = $2",
	2, {TEXTOID, TEXTOID}
};

static EmStatement lock_budget_for_correction = {
	"UPDATE earmark.budget SET slot_rec = NULL WHERE account = $1 AND budget_id = $2",
	2, {TEXTOID, INT8OID}
};

/*
 * A cycle's total without reading its ledger: the settled jobs (budget row
 * and escrow slots) and the recorded usage (the shards).
 */
static EmStatement cycle_total = {
	"SELECT b.used "
	"       + (SELECT coalesce(pg_catalog.sum(s.used), 0)::bigint FROM earmark.budget_slot s "
	"           WHERE s.account = $1 AND s.budget_id = $2) "
	"       + (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint FROM earmark.usage_shard u "
	"           WHERE u.account = $1 AND u.budget_id = $2) "
	"FROM earmark.budget b WHERE b.account = $1 AND b.budget_id = $2",
	2, {TEXTOID, INT8OID}
};

/*
 * The row (entries.c), its counter and the cycle's mark: one single-table
 * statement after another, each naming the account, so that on Citus each
 * runs on the account's shard alone.  Nothing after the row when its key
 * is already taken (a concurrent writer of the same key is waited for by
 * the unique index, then conflicts).
 */
static EmStatement count_in_shard = {
	"INSERT INTO earmark.usage_shard AS u (account, budget_id, shard, units) "
	"VALUES ($1, $2, $3, $4) "
	"ON CONFLICT (account, budget_id, shard) DO UPDATE SET units = u.units + excluded.units",
	4, {TEXTOID, INT8OID, INT4OID, INT8OID}
};

/*
 * cycle_total by index from C on a single node (direct.c), its three
 * reads in one snapshot: the statement's plan reads small tables whole,
 * and under SERIALIZABLE that is a predicate lock on every account's rows
 * (sql/serializable_reads.sql).  The sums as the SQL's: only a total past
 * a bigint is an error.
 */
static EmDirect budget_used = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"used"}
};

/* a + b, or the error the SQL's bigint + gives */
static int64
bigint_add(int64 a, int64 b)
{
	int64		sum;

	if (pg_add_s64_overflow(a, b, &sum))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	return sum;
}

static int64
cycle_total_direct(text *account, int64 budget_id, Snapshot snap, bool *found)
{
	Datum		keys[2];
	Datum		v[1];
	bool		n[1];
	int64		slots_used;

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	*found = em_direct_get(&budget_used, keys, snap, v, n);
	if (!*found)
		return 0;
	em_escrow_slot_totals(account, budget_id, snap, &slots_used, NULL);
	return bigint_add(bigint_add(DatumGetInt64(v[0]), slots_used),
					  em_budget_recorded(account, budget_id, snap));
}

/* cycle_total_direct's: the budget row, its slots, the recorded usage */
static const char *const total_tables[] = {"budget", "budget_slot", "usage_shard"};

/*
 * The cycle's total; with latest, in a snapshot that sees every commit so
 * far (spi.c em_exec_latest) whatever the transaction's isolation.
 */
int64
em_cycle_total(text *account, int64 budget_id, bool latest, bool *found)
{
	Datum		args[2];

	if (!em_distributed())
	{
		Snapshot	snap = latest ?
			em_direct_latest_snapshot(total_tables, lengthof(total_tables)) :
			em_direct_statement_snapshot(total_tables, lengthof(total_tables));
		int64		total = cycle_total_direct(account, budget_id, snap, found);

		em_direct_release(snap);
		return total;
	}
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	if (latest)
		em_exec_latest(&cycle_total, args, NULL, 1);
	else
		em_exec(&cycle_total, args, NULL, 1);
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
check_anchor_current(text *account, bool has_anchor, TimestampTz anchor)
{
	bool		now_has = false;
	TimestampTz now_anchor = 0;

	if (em_account_anchor_latest(account, &now_has, &now_anchor) &&
		now_has == has_anchor && (!has_anchor || now_anchor == anchor))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to a concurrent change of the cycle anchor of account \"%s\"",
					text_to_cstring(account)),
			 errdetail("The account's cycle anchor changed after this transaction's snapshot was taken."),
			 errhint("Retry the transaction.")));
}

/*
 * The same look-up by index from C (direct.c), on a single node: the key's
 * row by the key's index (entry_key, account), then its cycle's feature,
 * in one snapshot taken as the SPI statement takes it.  Every call looks
 * its key up, and finds none for new usage: the statement's plan, made
 * with statistics from when accounts had few rows (after a bulk load, say),
 * could take the primary key (account, ...) and read every row of the
 * account at each call.  (key_row on Citus, whose tables here are shells.)
 */
static EmDirect row_of_key = {
	.table = "ledger_entry", .nkeys = 2, .keys = {"entry_key", "account"},
	.ncols = 2, .cols = {"units", "budget_id"}
};
static EmDirect feature_of_budget = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"feature"}
};

static const char *const key_tables[] = {"ledger_entry", "budget"};

/* the key's units and feature; false when the ledger has no such key */
static bool
key_usage(text *account, text *key, int64 *units, char **feature)
{
	Datum		args[2];
	Datum		keys[2];
	Datum		v[2];
	bool		n[2];
	bool		isnull;
	bool		found;
	Snapshot	snap;

	if (em_distributed())
	{
		args[0] = PointerGetDatum(account);
		args[1] = PointerGetDatum(key);
		em_exec(&key_row, args, NULL, 1);
		if (SPI_processed == 0)
			return false;
		*units = em_get_int64(0, KR_UNITS, 0);
		*feature = TextDatumGetCString(em_get(0, KR_FEATURE, &isnull));
		return true;
	}
	snap = em_direct_statement_snapshot(key_tables, lengthof(key_tables));
	/* row_of_key's keys in its index's order: the key, then the account */
	keys[0] = PointerGetDatum(key);
	keys[1] = PointerGetDatum(account);
	found = em_direct_get(&row_of_key, keys, snap, v, n);
	if (found)
	{
		*units = DatumGetInt64(v[0]);
		keys[0] = PointerGetDatum(account);
		keys[1] = v[1];
		/* the statement's join: a row without its budget row is no row */
		found = em_direct_get(&feature_of_budget, keys, snap, v, n);
		if (found)
			*feature = TextDatumGetCString(v[0]);
	}
	em_direct_release(snap);
	return found;
}

/* the same key again: nothing new, or a conflict when it differs */
static bool
repeat_of_key(text *account, text *key, int64 units, text *feature)
{
	int64		old_units;
	char	   *old_feature;

	if (!key_usage(account, key, &old_units, &old_feature))
		return false;
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

/* the arguments' checks that need no table: units and occurred_at */
static void
check_usage(int64 units, TimestampTz occurred_at, TimestampTz now)
{
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
}

/*
 * The account's cycle anchor, under the account's advisory lock (shared):
 * the anchor cannot change under us from here on (account.c).
 */
static void
lock_anchor(text *account, bool *has_anchor, TimestampTz *anchor)
{
	if (!em_account_anchor_shared(account, has_anchor, anchor))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_UNKNOWN_ACCOUNT),
				 errmsg("account \"%s\" does not exist", text_to_cstring(account)),
				 errhint("Create it with earmark_set_account or earmark_set_limit first.")));
	if (IsolationUsesXactSnapshot())
		check_anchor_current(account, *has_anchor, *anchor);
}

/* the budget row of the cycle that contains occurred_at, created on first use */
static int64
usage_budget(text *account, text *feature, TimestampTz start, TimestampTz end)
{
	int64		budget_id;

	if (em_budget_find(account, feature, start, &budget_id))
		return budget_id;
	em_budget_create(account, feature, start, end);
	if (!em_budget_find(account, feature, start, &budget_id))
		elog(ERROR, "earmark: budget row of account \"%s\" vanished",
			 text_to_cstring(account));
	return budget_id;
}

/*
 * lock_budget_for_correction by index from C on a single node (direct.c:
 * the update with its wait, READ COMMITTED's re-check and REPEATABLE
 * READ's 40001), else the SQL.
 */
static EmDirect budget_slot_rec = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"slot_rec"},
	.nwrite = 1, .types = {INT8OID}, .nullok = {[0] = true}
};

static bool
slot_rec_null(Datum *values, bool *nulls, void *arg)
{
	values[0] = (Datum) 0;
	nulls[0] = true;
	return true;
}

static void
forget_recorded(text *account, int64 budget_id)
{
	Datum		args[2];

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	if (em_direct_update(&budget_slot_rec, args, slot_rec_null, NULL) != EM_DIRECT_UNWRITABLE)
		return;
	em_exec(&lock_budget_for_correction, args, NULL, 1);
}

/*
 * A correction (negative units) may not take the cycle's total below zero.
 * It updates the budget row first: corrections of one cycle queue there,
 * and one whose snapshot missed another's commit fails with 40001 instead
 * of checking an old total.  The update forgets the recorded usage the
 * last escrow rebalance read (slot_rec): recorded usage that goes down
 * and up again would otherwise look unchanged to the fast path (escrow.c).
 */
static void
check_correction(text *account, int64 budget_id, int64 units, TimestampTz start)
{
	bool		found;
	int64		total;

	forget_recorded(account, budget_id);
	total = em_cycle_total(account, budget_id, false, &found);
	if (total + units < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the correction is larger than the cycle's usage"),
				 errdetail("The cycle starting %s has " INT64_FORMAT " units; the correction takes away "
						   INT64_FORMAT ".", timestamptz_to_str(start), total, -units)));
}

/*
 * The backend's own counter row.  PostgreSQL 15 hands a new session the
 * most recently freed PGPROC, so while no more than EARMARK_USAGE_SHARDS
 * client sessions have ever been connected at once, the live ones have
 * numbers distinct mod 64 and writers of one cycle never wait for each
 * other there; past that, two may share a row, as two random draws could.
 * A shard drawn at random met another open writer's 1 time in 64, and the
 * writer then waited for that one's commit (isolation marks_together
 * failed so, now and then).
 */
int32
em_usage_shard(void)
{
	return (int32) (MyProc->pgprocno % EARMARK_USAGE_SHARDS);
}

/* the ledger row, one counter and the mark; false when the key was taken */
static bool
write_usage(text *account, int64 budget_id, int64 units, text *key,
			TimestampTz occurred_at, TimestampTz now)
{
	Datum		args[4];

	em_mark_lock(budget_id);
	if (!em_entry_key(account, budget_id, units, key, occurred_at, now))
		return false;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int32GetDatum(em_usage_shard());
	args[3] = Int64GetDatum(units);
	em_exec(&count_in_shard, args, NULL, 0);
	em_mark_cycle(account, budget_id);
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
	text	   *account;
	int64		units;
	text	   *key;
	text	   *feature;
	TimestampTz occurred_at;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz anchor;
	bool		has_anchor;
	TimestampTz start;
	TimestampTz end;
	int64		budget_id;
	bool		written = false;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	units = em_arg_int64(fcinfo, 1, "units");
	key = em_arg_name(fcinfo, 2, "idempotency_key");
	feature = em_arg_name(fcinfo, 3, "feature");
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("occurred_at must not be NULL")));
	occurred_at = PG_GETARG_TIMESTAMPTZ(4);
	check_usage(units, occurred_at, now);
	em_require_account_local(account);

	SPI_connect();
	lock_anchor(account, &has_anchor, &anchor);
	if (!repeat_of_key(account, key, units, feature))
	{
		/* the cycle of the usage: a correction goes where the usage went */
		em_cycle_bounds(anchor, has_anchor, occurred_at, &start, &end);
		budget_id = usage_budget(account, feature, start, end);
		if (units < 0)
			check_correction(account, budget_id, units, start);
		written = write_usage(account, budget_id, units, key, occurred_at, now);
		/* a concurrent call with the same key won: same usage, or a conflict */
		if (!written && !repeat_of_key(account, key, units, feature))
			elog(ERROR, "earmark: ledger row of key \"%s\" vanished", text_to_cstring(key));
	}
	SPI_finish();
	PG_RETURN_BOOL(written);
}

/* ---------------------------------------------------------------------
 * The single call's steps, for earmark_record_usage_many (batch.c)
 * ---------------------------------------------------------------------
 */
void
em_usage_check(int64 units, TimestampTz occurred_at, TimestampTz now)
{
	check_usage(units, occurred_at, now);
}

void
em_usage_lock_anchor(text *account, bool *has_anchor, TimestampTz *anchor)
{
	lock_anchor(account, has_anchor, anchor);
}

bool
em_usage_repeat(text *account, text *key, int64 units, text *feature)
{
	return repeat_of_key(account, key, units, feature);
}

int64
em_usage_budget(text *account, text *feature, TimestampTz start, TimestampTz end)
{
	return usage_budget(account, feature, start, end);
}

void
em_usage_check_correction(text *account, int64 budget_id, int64 units, TimestampTz start)
{
	check_correction(account, budget_id, units, start);
}

/* ---------------------------------------------------------------------
 * earmark_budget(account, feature, at)
 * ---------------------------------------------------------------------
 */

/* a cycle's numbers, as earmark_budget reports them */
typedef struct CycleReport
{
	bool		known;			/* the account has a limit for the feature */
	bool		unlimited;		/* ... and it is NULL */
	int64		lim;
	bool		provider;		/* its source is the provider */
	TimestampTz start;
	TimestampTz end;
	int64		used;			/* the cycle's, escrow slots and recorded usage included */
	int64		held;
} CycleReport;

/* the columns of read_account_limit (RL_) and read_budget (RB_) */
enum
{
	RL_ANCHOR = 1, RL_LIM, RL_KNOWN, RL_SOURCE
};
enum
{
	RB_USED = 1, RB_HELD
};

static EmStatement read_account_limit = {
	"SELECT a.cycle_anchor, l.lim, l.account IS NOT NULL, l.source "
	"FROM earmark.account a "
	"LEFT JOIN earmark.account_limit l ON l.account = a.account AND l.feature = $2 "
	"WHERE a.account = $1",
	2, {TEXTOID, TEXTOID}
};

/* the cycle's totals, escrow slots included */
static EmStatement read_budget = {
	"SELECT b.used + coalesce(pg_catalog.sum(s.used), 0)::bigint "
	"         + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u "
	"                     WHERE u.account = $1 AND u.budget_id = "
	"                           (SELECT x.budget_id FROM earmark.budget x "
	"                             WHERE x.account = $1 AND x.feature = $2 AND x.cycle_start = $3)), 0)::bigint, "
	"       b.held + coalesce(pg_catalog.sum(s.held), 0)::bigint "
	"FROM earmark.budget b "
	"LEFT JOIN earmark.budget_slot s ON s.account = b.account AND s.budget_id = b.budget_id "
	"WHERE b.account = $1 AND b.feature = $2 AND b.cycle_start = $3 "
	"GROUP BY b.account, b.budget_id",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

/* the report by its two statements: on Citus (inside SPI) */
static void
report_sql(text *account, text *feature, TimestampTz at, CycleReport *r)
{
	Datum		args[3];
	bool		has_anchor = false;
	TimestampTz anchor = 0;
	bool		isnull;

	args[0] = PointerGetDatum(account);
	args[1] = PointerGetDatum(feature);
	em_exec(&read_account_limit, args, NULL, 1);
	if (SPI_processed == 1)
	{
		Datum		d = em_get(0, RL_ANCHOR, &isnull);

		has_anchor = !isnull;
		anchor = has_anchor ? DatumGetTimestampTz(d) : 0;
		r->known = DatumGetBool(em_get(0, RL_KNOWN, &isnull));
		if (r->known)
		{
			d = em_get(0, RL_LIM, &isnull);
			r->unlimited = isnull;
			r->lim = isnull ? 0 : DatumGetInt64(d);
			r->provider = strcmp(TextDatumGetCString(em_get(0, RL_SOURCE, &isnull)),
								 "provider") == 0;
		}
	}
	em_cycle_bounds(anchor, has_anchor, at, &r->start, &r->end);

	args[2] = TimestampTzGetDatum(r->start);
	em_exec(&read_budget, args, NULL, 1);
	if (SPI_processed == 1)
	{
		r->used = em_get_int64(0, RB_USED, 0);
		r->held = em_get_int64(0, RB_HELD, 0);
	}
}

/*
 * The same reads by index from C on a single node (direct.c), in one
 * snapshot, the statement's: the statements' plans read small tables
 * whole (the account, its limits and the budget table), and under
 * SERIALIZABLE that is a predicate lock which every other account's
 * reserve or settle conflicts with: a transaction that asked for its
 * numbers and then reserved failed other accounts' transactions with 40001
 * (sql/serializable_reads.sql).  The sums as the SQL's: only a total past
 * a bigint is an error.
 */
static EmDirect limit_of_feature = {
	.table = "account_limit", .nkeys = 2, .keys = {"account", "feature"},
	.ncols = 2, .cols = {"lim", "source"}, .types = {INT8OID, TEXTOID}
};

/* the tables report_direct reads, locked before its snapshot is taken */
static const char *const report_tables[] = {
	"account", "account_limit", "budget", "budget_slot", "usage_shard"
};

static void
report_direct(text *account, text *feature, TimestampTz at, CycleReport *r)
{
	Snapshot	snap;
	bool		has_anchor = false;
	TimestampTz anchor = 0;
	Datum		keys[2];
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];
	int64		budget_id;
	int64		used;
	int64		held;
	int64		slots_used;
	int64		slots_held;

	snap = em_direct_statement_snapshot(report_tables, lengthof(report_tables));
	keys[0] = PointerGetDatum(account);
	keys[1] = PointerGetDatum(feature);
	if (em_account_anchor_in(account, snap, &has_anchor, &anchor) &&
		em_direct_get(&limit_of_feature, keys, snap, v, n))
	{
		r->known = true;
		r->unlimited = n[0];
		r->lim = n[0] ? 0 : DatumGetInt64(v[0]);
		r->provider = strcmp(TextDatumGetCString(v[1]), "provider") == 0;
	}
	em_cycle_bounds(anchor, has_anchor, at, &r->start, &r->end);

	if (em_budget_numbers(account, feature, r->start, snap, &budget_id, &used, &held))
	{
		em_escrow_slot_totals(account, budget_id, snap, &slots_used, &slots_held);
		r->used = bigint_add(bigint_add(used, slots_used),
							 em_budget_recorded(account, budget_id, snap));
		r->held = bigint_add(held, slots_held);
	}
	em_direct_release(snap);
}

/*
 * earmark_budget(account, feature, at): the numbers of the cycle that
 * contains "at" (NULL: now).  An account the gate has never heard of reads
 * as a calendar-month cycle with nothing used and an unknown limit.
 */
Datum
earmark_budget(PG_FUNCTION_ARGS)
{
	text	   *account;
	text	   *feature;
	TimestampTz at;
	CycleReport r = {0};
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, false, false, false};

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	feature = em_arg_name(fcinfo, 1, "feature");
	at = PG_ARGISNULL(2) ? GetCurrentTimestamp() : PG_GETARG_TIMESTAMPTZ(2);
	if (TIMESTAMP_NOT_FINITE(at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("at must be a finite timestamp")));

	if (em_distributed())
	{
		SPI_connect();
		report_sql(account, feature, at, &r);
		SPI_finish();
	}
	else
		report_direct(account, feature, at, &r);

	values[0] = TimestampTzGetDatum(r.start);
	values[1] = TimestampTzGetDatum(r.end);
	values[2] = Int64GetDatum(r.lim);
	nulls[2] = !r.known || r.unlimited;
	values[3] = Int64GetDatum(r.used);
	values[4] = Int64GetDatum(r.held);
	if (!r.known)
		values[5] = Int64GetDatum(0);
	else if (r.unlimited)
		nulls[5] = true;
	else
		values[5] = Int64GetDatum(Max(0, r.lim - r.used - r.held));
	values[6] = CStringGetTextDatum(!r.known ? "unknown" : r.provider ? "provider" : "manual");
	em_return_row(fcinfo, values, nulls);
	return (Datum) 0;
}
