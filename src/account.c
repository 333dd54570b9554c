/*-------------------------------------------------------------------------
 *
 * account.c
 *	  Accounts, limits and billing cycles: earmark_set_limit,
 *	  earmark_set_account, and the cycle arithmetic the gate uses
 *	  (earmark_budget, which reports a cycle's numbers, is ledger.c's).
 *
 *	  Tables: earmark.account, earmark.account_limit (written here) and
 *	  earmark.budget (read here, locked by earmark_set_account).  The
 *	  cycle anchor that reserve and earmark_record_usage read is read by
 *	  the account's key, by index from C on a single node (direct.c).
 *
 *	  Locks: earmark_set_account takes the account's lock exclusive (an
 *	  advisory lock in a key space no SQL function reaches, keyed by a
 *	  64-bit hash of the account: em_account_key_lock), then every budget
 *	  row of the account and then the account row FOR UPDATE, so that an
 *	  anchor can only change while no reserve is creating or filling a
 *	  budget.  Budget rows before the account row is the order reserve
 *	  keeps too (its rate limit updates the account row).  Escrow's fast
 *	  path takes no budget row, only a slot: so an anchor change also locks
 *	  every slot of the account, without waiting (SKIP LOCKED, as every
 *	  other taker of slots under a budget row: a transaction that holds a
 *	  slot may be waiting for one of our budget rows).  A slot it cannot
 *	  have is an admission or settlement in progress: the account is in use
 *	  and the anchor stays.  The slots it has lose their room, so that a
 *	  fast path whose snapshot predates the change, and that locks the slot
 *	  once the change committed, re-checks the emptied row and passes it
 *	  over (it then waits for the budget row, and holds in the new cycle).
 *	  earmark_reserve takes the same advisory lock shared, and only when it
 *	  creates a cycle's budget row.  earmark_set_limit writes the limit row;
 *	  a reserve reads the limit while it holds the budget row lock, so a new
 *	  limit applies from the next admission on.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/datetime.h"

#include "account.h"
#include "cluster.h"
#include "direct.h"
#include "earmark.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_set_limit);
PG_FUNCTION_INFO_V1(earmark_set_account);

/*
 * A cycle is one month that starts at the anchor's day and time of day, in
 * UTC; without an anchor, at 00:00 UTC on the 1st.  The anchor's day is
 * 1-28 (checked when it is set), so every month has that day.
 */
void
em_cycle_bounds(TimestampTz anchor, bool has_anchor, TimestampTz at,
				TimestampTz *start, TimestampTz *end)
{
	struct pg_tm tm;
	struct pg_tm atm;
	fsec_t		fsec;
	fsec_t		afsec = 0;
	Timestamp	t;

	memset(&atm, 0, sizeof(atm));
	atm.tm_mday = 1;
	if (has_anchor &&
		timestamp2tm(anchor, NULL, &atm, &afsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("cycle anchor out of range")));
	if (timestamp2tm(at, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));

	tm.tm_mday = atm.tm_mday;
	tm.tm_hour = atm.tm_hour;
	tm.tm_min = atm.tm_min;
	tm.tm_sec = atm.tm_sec;
	if (tm2timestamp(&tm, afsec, NULL, &t) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	if (t > at)
	{
		/* this month's start is still ahead: the cycle began last month */
		if (--tm.tm_mon < 1)
		{
			tm.tm_mon = 12;
			tm.tm_year--;
		}
		if (tm2timestamp(&tm, afsec, NULL, &t) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("timestamp out of range")));
	}
	*start = t;
	if (++tm.tm_mon > 12)
	{
		tm.tm_mon = 1;
		tm.tm_year++;
	}
	if (tm2timestamp(&tm, afsec, NULL, &t) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	*end = t;
}

static EmStatement upsert_account = {
	"INSERT INTO earmark.account (account) VALUES ($1) "
	"ON CONFLICT (account) DO NOTHING",
	1, {TEXTOID}
};

/*
 * updated_at is the clock when the limit is written, and moves only when
 * the limit changes: earmark_check() compares it with the times holds
 * were admitted (a transaction's start, or a write that changed nothing,
 * would make it report holds admitted under the old limit, or hide later
 * ones).
 */
static EmStatement upsert_limit = {
	"INSERT INTO earmark.account_limit AS l (account, feature, lim, source, updated_at) "
	"VALUES ($1, $2, $3, 'manual', pg_catalog.clock_timestamp()) "
	"ON CONFLICT (account, feature) DO UPDATE "
	"SET lim = excluded.lim, source = 'manual', "
	"    updated_at = CASE WHEN l.lim IS NOT DISTINCT FROM excluded.lim AND l.source = 'manual' "
	"                      THEN l.updated_at ELSE excluded.updated_at END",
	3, {TEXTOID, TEXTOID, INT8OID}
};

/*
 * earmark_set_limit(account, lim, feature): a manual limit, NULL meaning
 * unlimited.  Running holds are not touched.
 */
Datum
earmark_set_limit(PG_FUNCTION_ARGS)
{
	text	   *account;
	text	   *feature;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	feature = em_arg_name(fcinfo, 2, "feature");

	if (!PG_ARGISNULL(1) && PG_GETARG_INT64(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("limit must not be negative"),
				 errhint("Use NULL for an unlimited account and 0 to admit nothing.")));

	SPI_connect();
	values[0] = PointerGetDatum(account);
	em_exec(&upsert_account, values, NULL, 0);

	values[1] = PointerGetDatum(feature);
	if (PG_ARGISNULL(1))
	{
		values[2] = (Datum) 0;
		nulls[2] = 'n';
	}
	else
		values[2] = Int64GetDatum(PG_GETARG_INT64(1));
	em_exec(&upsert_limit, values, nulls, 0);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * One of the account's own locks (kind: EARMARK_ACCOUNT_LOCKTAG,
 * EARMARK_REFRESH_LOCKTAG), in mode, until the transaction ends.  A
 * transaction-level advisory lock whose fourth key no SQL advisory lock
 * function makes, so that no role can hold it by hand and stall the
 * account's writers or the worker.  Keyed by a 64-bit hash of the account
 * (hash_bytes_extended, as SQL's hashtextextended(account, 0)): two names
 * chosen at random share one only by a chance too small to matter, and a
 * name chosen to collide with another only makes the two accounts' anchor
 * changes (or limit reads) wait for each other.
 */
void
em_account_key_lock(const char *account, int len, uint16 kind, LOCKMODE mode)
{
	LOCKTAG		tag;
	uint64		h = hash_bytes_extended((const unsigned char *) account, len, 0);

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h, kind);
	(void) LockAcquire(&tag, mode, false, false);
}

/* the account's lock (above) of a text account */
static void
account_lock(text *account, LOCKMODE mode)
{
	text	   *a = pg_detoast_datum_packed(account);

	em_account_key_lock(VARDATA_ANY(a), VARSIZE_ANY_EXHDR(a), EARMARK_ACCOUNT_LOCKTAG, mode);
}

/*
 * The account's lock, exclusive, until the transaction ends: no reserve is
 * creating one of its budget rows meanwhile (a reserve takes it shared for
 * that), so a budget row created later reads what this transaction writes
 * to the account.  For earmark_set_account and earmark_set_escrow.
 */
void
em_account_lock(text *account)
{
	account_lock(account, ExclusiveLock);
}

/* no row lock: the account's lock orders this with earmark_set_account */
static EmStatement account_anchor = {
	"SELECT cycle_anchor FROM earmark.account WHERE account = $1",
	1, {TEXTOID}
};

/*
 * The same read by index from C (direct.c: by the primary key, in the
 * snapshot the statement would take), on a single node; the statement on
 * Citus, whose tables here are shells.  The statement's plan reads a small
 * account table whole: under SERIALIZABLE that is a predicate lock on the
 * table, which any other account's write of its own row (a limit
 * refresh's flag, automatic escrow's slot count) conflicts with.  Read by
 * the key, it is the row and its index page.
 */
static EmDirect anchor_of_account = {
	.table = "account", .nkeys = 1, .keys = {"account"},
	.ncols = 1, .cols = {"cycle_anchor"}, .types = {TIMESTAMPTZOID}
};

/*
 * The anchor in the caller's snapshot, by index from C: on a single node
 * only.  False if no account.
 */
bool
em_account_anchor_in(text *account, Snapshot snap, bool *has_anchor, TimestampTz *anchor)
{
	Datum		args[1];
	Datum		v[1];
	bool		n[1];

	args[0] = PointerGetDatum(account);
	if (!em_direct_get(&anchor_of_account, args, snap, v, n))
		return false;
	*has_anchor = !n[0];
	*anchor = n[0] ? 0 : DatumGetTimestampTz(v[0]);
	return true;
}

static const char *const anchor_tables[] = {"account"};

/* the anchor in a new snapshot: a statement's, or with latest the latest */
static bool
read_anchor(text *account, bool latest, bool *has_anchor, TimestampTz *anchor)
{
	Datum		args[1];
	Snapshot	snap;
	bool		found;
	bool		isnull;
	Datum		v;

	if (!em_distributed())
	{
		snap = latest ? em_direct_latest_snapshot(anchor_tables, 1) :
			em_direct_statement_snapshot(anchor_tables, 1);
		found = em_account_anchor_in(account, snap, has_anchor, anchor);
		em_direct_release(snap);
		return found;
	}
	args[0] = PointerGetDatum(account);
	if (latest)
		em_exec_latest(&account_anchor, args, NULL, 1);
	else
		em_exec(&account_anchor, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	v = em_get(0, 1, &isnull);
	*has_anchor = !isnull;
	*anchor = isnull ? 0 : DatumGetTimestampTz(v);
	return true;
}

/*
 * The account's lock, shared, until the transaction ends, and its
 * cycle anchor read under it: earmark_set_account (which takes the lock
 * exclusive) cannot change the anchor under us from here on.  For the
 * reserve and earmark_record_usage that create a cycle's budget row.
 * False if the account does not exist; inside SPI.
 */
bool
em_account_anchor_shared(text *account, bool *has_anchor, TimestampTz *anchor)
{
	account_lock(account, ShareLock);
	return read_anchor(account, false, has_anchor, anchor);
}

/*
 * The account's cycle anchor in a snapshot that sees every commit (no
 * lock taken): under REPEATABLE READ, whether the anchor read in the
 * transaction's snapshot is still the anchor.  False if no account.
 */
bool
em_account_anchor_latest(text *account, bool *has_anchor, TimestampTz *anchor)
{
	return read_anchor(account, true, has_anchor, anchor);
}

static EmStatement lock_account_row = {
	"SELECT cycle_anchor FROM earmark.account WHERE account = $1 FOR UPDATE",
	1, {TEXTOID}
};

static EmStatement lock_account_budgets = {
	"SELECT budget_id FROM earmark.budget WHERE account = $1 FOR UPDATE",
	1, {TEXTOID}
};

/*
 * Every slot of the account's budgets that no other transaction holds,
 * locked, and whether that was all of them.  (No slot is created meanwhile:
 * only a rebalance creates slots, under the budget row we hold.)
 */
static EmStatement count_account_slots = {
	"SELECT pg_catalog.count(*) FROM earmark.budget_slot WHERE account = $1",
	1, {TEXTOID}
};

static EmStatement lock_account_slots = {
	"SELECT slot FROM earmark.budget_slot WHERE account = $1 FOR UPDATE SKIP LOCKED",
	1, {TEXTOID}
};

/*
 * lock_account_slots from C on a single node (direct.c's
 * em_direct_lock_skip_all), so that it never waits: the executor's FOR
 * UPDATE SKIP LOCKED waits, with the budget rows held, for a transaction
 * that holds a slot's newest version when the version its scan found was
 * being updated by one that ended meanwhile (direct.c, lock_or_skip;
 * test/integration/review_slot_skip_chain.sh, its anchor case).
 */
static EmDirect account_slots = {
	.table = "budget_slot", .nkeys = 1, .keys = {"account"},
	.ncols = 1, .cols = {"slot"}
};

/* how many of the account's slots are locked now; -1: run the SQL */
static int64
lock_slots_of_account(Datum *values)
{
	if (em_distributed())
		return -1;
	return em_direct_lock_skip_all(&account_slots, values, em_direct_any_row, NULL,
								   INT_MAX, em_direct_any_row, NULL);
}

/* the room of the slots locked above goes back to their budgets */
static EmStatement empty_account_slots = {
	"UPDATE earmark.budget_slot SET room = 0 WHERE account = $1 AND room <> 0",
	1, {TEXTOID}
};

/*
 * Runs after the budget rows are locked, in a snapshot that sees their
 * commits.  A budget's numbers are sums over its row and its slots (a
 * hold taken from a slot may be settled into the budget row: one row's
 * held above zero, another's below), so they are compared as sums.  The
 * ledger is probed cycle by cycle (its rows are found by cycle: the
 * primary key is led by budget_id, earmark.sql), each probe a subplan by
 * index (OFFSET 0 keeps it one, as in reconcile.c) rather than a join the
 * planner could make a scan of the whole ledger.
 */
static EmStatement account_in_use = {
	"SELECT EXISTS (SELECT 1 FROM earmark.budget b "
	"               LEFT JOIN (SELECT s.budget_id, pg_catalog.sum(s.used) AS used, "
	"                                 pg_catalog.sum(s.held) AS held "
	"                            FROM earmark.budget_slot s WHERE s.account = $1 "
	"                           GROUP BY s.budget_id) s ON s.budget_id = b.budget_id "
	"               WHERE b.account = $1 "
	"                 AND (b.used + coalesce(s.used, 0) <> 0 OR b.held + coalesce(s.held, 0) <> 0)) "
	"    OR EXISTS (SELECT 1 FROM earmark.job j WHERE j.account = $1 AND j.status IN ('running', 'capped')) "
	"    OR EXISTS (SELECT 1 FROM earmark.budget b WHERE b.account = $1 "
	"                  AND EXISTS (SELECT 1 FROM earmark.ledger l "
	"                               WHERE l.account = $1 AND l.budget_id = b.budget_id OFFSET 0))",
	1, {TEXTOID}
};

static EmStatement update_account = {
	"UPDATE earmark.account SET "
	"  cycle_anchor = CASE WHEN $2 IS NULL THEN cycle_anchor ELSE $2 END, "
	"  provider_customer = coalesce($3, provider_customer), "
	"  provider_agreement = coalesce($4, provider_agreement), "
	"  updated_at = pg_catalog.now() "
	"WHERE account = $1",
	4, {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID}
};

/*
 * With the account's budget rows locked: refuse an anchor change while the
 * account has usage or holds, or an admission is in progress in one of its
 * escrow slots; otherwise empty the slots' room (see the file header).
 */
static void
check_anchor_may_move(text *account, Datum *values)
{
	bool		isnull;
	bool		all_slots;
	int64		nslots;
	int64		nlocked;

	em_exec(&count_account_slots, values, NULL, 1);
	nslots = em_get_int64(0, 1, 0);
	nlocked = lock_slots_of_account(values);
	if (nlocked < 0)
	{
		em_exec(&lock_account_slots, values, NULL, 0);
		nlocked = (int64) SPI_processed;
	}
	all_slots = nlocked == nslots;
	if (!all_slots)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_ANCHOR_LOCKED),
				 errmsg("cycle anchor of account \"%s\" cannot change: an admission is in progress",
						text_to_cstring(account)),
				 errdetail("Another transaction is taking or settling a hold in one of the account's escrow slots."),
				 errhint("Set the anchor when the account is created, before its first reserve or usage.")));
	em_exec(&account_in_use, values, NULL, 1);
	if (DatumGetBool(em_get(0, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_ANCHOR_LOCKED),
				 errmsg("cycle anchor of account \"%s\" cannot change: the account has usage or holds",
						text_to_cstring(account)),
				 errdetail("Changing the anchor now would move recorded usage into other cycles."),
				 errhint("Set the anchor when the account is created, before its first reserve or usage.")));
	em_exec(&empty_account_slots, values, NULL, 0);
}

/*
 * earmark_set_account(account, cycle_anchor, provider_customer,
 * provider_agreement).  A NULL argument leaves that field as it is.  The
 * anchor may change only while the account has no usage and no holds:
 * afterwards old usage would move to other cycles.
 */
Datum
earmark_set_account(PG_FUNCTION_ARGS)
{
	text	   *account;
	bool		has_anchor;
	TimestampTz anchor;
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	int			i;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	has_anchor = !PG_ARGISNULL(1);
	anchor = has_anchor ? PG_GETARG_TIMESTAMPTZ(1) : 0;

	if (has_anchor)
	{
		struct pg_tm tm;
		fsec_t		fsec;

		/*
		 * Whether the account is in use is read after its budget rows are
		 * locked, and a transaction snapshot would not show the usage and
		 * holds committed since it was taken (usage is recorded without a
		 * budget row lock; a first reserve creates a budget row the
		 * snapshot cannot see).
		 */
		em_require_read_committed("earmark_set_account with a cycle anchor");

		if (TIMESTAMP_NOT_FINITE(anchor) ||
			timestamp2tm(anchor, NULL, &tm, &fsec, NULL, NULL) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("cycle anchor must be a finite timestamp")));
		if (tm.tm_mday > 28)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("cycle anchor must fall on day 1 to 28 of a month (UTC)"),
					 errdetail("The anchor falls on day %d, which some months do not have.",
							   tm.tm_mday),
					 errhint("Choose an agreement start between the 1st and the 28th.")));
	}
	for (i = 2; i <= 3; i++)
	{
		if (!PG_ARGISNULL(i))
			(void) em_arg_name(fcinfo, i, i == 2 ? "provider_customer" : "provider_agreement");
	}

	em_require_account_local(account);

	SPI_connect();
	values[0] = PointerGetDatum(account);
	em_account_lock(account);
	em_exec(&upsert_account, values, NULL, 0);
	if (has_anchor)
		em_exec(&lock_account_budgets, values, NULL, 0);
	em_exec(&lock_account_row, values, NULL, 1);

	if (has_anchor)
	{
		bool		isnull;
		Datum		old = em_get(0, 1, &isnull);

		if (isnull || DatumGetTimestampTz(old) != anchor)
			check_anchor_may_move(account, values);
	}

	for (i = 1; i <= 3; i++)
	{
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	em_exec(&update_account, values, nulls, 0);
	SPI_finish();

	PG_RETURN_VOID();
}
