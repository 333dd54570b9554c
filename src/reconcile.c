/*-------------------------------------------------------------------------
 *
 * reconcile.c
 *	  earmark_reconcile: proves that the provider's meter matches the
 *	  ledger, repairs an open cycle that does not, and keeps the evidence.
 *
 *	  For each cycle (budget row) with usage or sends, in pages of
 *	  RECONCILE_PAGE cycles: the ledger total (the sum of its rows, a scan:
 *	  this is the proof), the counters (budget row, escrow slots, usage
 *	  shards: rebuilt from the ledger when they differ), the last total
 *	  sent, and the provider's total read back (a page's reads run
 *	  earmark.report_parallel at once).  The verdict never trusts the meter
 *	  over the ledger: unreadable, match, closed_cycle_drift (a person
 *	  decides), else over_billed / under_billed, repaired by an absolute
 *	  write of the ledger total and confirmed only by reading the meter
 *	  back.  A repair that fails or does not read back is that cycle's
 *	  evidence (its cause says so), not an error of the run.  A run on the
 *	  same numbers as the cycle's last evidence adds no row.
 *
 *	  Two phases, so that no lock a writer waits for is held during any
 *	  provider call:
 *	  1. every page: the reads, each cycle's numbers, its verdict and its
 *	     repair (write and read back).  No row lock and no mark lock is
 *	     taken; the repair's send is logged (an insert nobody waits for).
 *	     Before the run's first repair it takes the database's send lock
 *	     (meter.c), which only senders take, and holds it until the marks
 *	     after its repairs are written (phase 2): a report pass neither
 *	     sends nor finishes between a repair's write and its mark.  A
 *	     cycle whose meter was read before that lock is read again (the
 *	     meter, then the ledger), and a cycle that has closed meanwhile is
 *	     not written.
 *	  2. after the last provider call of the run, in budget_id order: the
 *	     marks after the repairs (each a unit of its own, first: the
 *	     provider keeps the repair whatever happens next); the send lock
 *	     given back, unless a repaired cycle's counters are to be rebuilt
 *	     (then it is held to the end of the transaction: a pass before the
 *	     commit would send the drifted counters over the repair); then
 *	     each cycle's rebuild of counters that differ, its evidence, its
 *	     row.  These locks are held to the end of the caller's
 *	     transaction.
 *	  Each cycle's step of each phase is its own unit, a subtransaction:
 *	  an error in one (any error but a cancel) is rolled back, reported as
 *	  a WARNING that names the cycle, and the run goes on with the others.
 *	  A row lock cannot be released before the transaction ends except by
 *	  rolling back, so a locked step can only come after the provider
 *	  calls, never between them.
 *
 *	  Tables: reads ledger, budget, budget_slot, usage_shard, meter_send,
 *	  account; writes evidence, meter_send (repairs), meter_mark and, to
 *	  rebuild, usage_shard and budget.  Locks: the send lock (phase 1,
 *	  above, waited for); in phase 2 only: a rebuild
 *	  locks the budget row FOR UPDATE and then takes the cycle's mark lock
 *	  exclusively without waiting (ledger.c: every writer of the cycle
 *	  holds it shared until it commits): with both, no counter can move
 *	  while it is rebuilt.  When the mark lock stays busy (tried for
 *	  100 ms) the rebuild is left for the next run (never a wait: a settle
 *	  holds the mark lock while it waits for the budget row); a repaired
 *	  cycle whose rebuild is left is no repair (a report sends the
 *	  counters' total).  The mark after a repair takes the mark lock
 *	  shared, as any writer of a mark does, but tried for 100 ms, not
 *	  waited for: it holds the send lock, and another reconcile's rebuild
 *	  keeps the mark lock until its transaction ends.  Updating a cycle's
 *	  last evidence row locks that row (only another reconcile waits for
 *	  it).
 *
 *	  The provider is read before the ledger: a usage (and its report)
 *	  landing in between makes the ledger look ahead, and the repair then
 *	  writes the newer total, never an older one.  Usage committed after
 *	  the ledger was read is covered by marking the cycle after a repair:
 *	  the reporter sends its current total once more, after this
 *	  transaction ends (on a distributed install the coordinator's pass is
 *	  not kept out by the send lock of the account's node: docs/api.md,
 *	  Known issues).
 *	  It refuses to run after its transaction wrote anything (spi.c,
 *	  em_require_no_writes): a repair would send the transaction's own
 *	  uncommitted usage, which a rollback would leave on the meter.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "budget.h"
#include "cluster.h"
#include "meter.h"
#include "provider.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_reconcile);

/* cycles read and checked together */
#define RECONCILE_PAGE	50

/* the columns of page_of_cycles and page_of_account_cycles */
enum
{
	PC_BUDGET_ID = 1, PC_ACCOUNT, PC_FEATURE, PC_CYCLE_START, PC_CYCLE_END,
	PC_CUSTOMER, PC_AGREEMENT
};

/*
 * The next page of every account's cycles to check (with ledger rows or
 * sends) after budget_id $2, in budget_id order; $1 a feature or NULL.
 * The walk is budget_order's (earmark.sql), in order from $2, and stops
 * at the page's last cycle: the primary key leads with the account, and
 * without that index every page sorted all the cycles after $2 (a run
 * over N cycles read N * N / 100 of them).
 *
 * Nothing in it lets the planner expect fewer rows after $2 than a page,
 * which is when it sorts instead (it then reads every row after $2, at
 * every page):
 * - no "$n IS NULL OR account = $n" (the other statement's case): in the
 *   generic plan it is estimated to keep 1 row in 200;
 * - the feature is tested inside the CASE, not as a clause of its own:
 *   "feature = $1" would be estimated from the feature's statistics,
 *   taken as independent of budget_id, and a feature whose cycles are
 *   all at the end of the ids (one launched since the others), or one
 *   missing from the statistics (new since the last ANALYZE, or none
 *   taken yet), is estimated at a few rows: every page sorted all of
 *   that feature's cycles after $2, and scanned the whole (account,
 *   feature, cycle_start) index for it.  A CASE is an opaque filter to
 *   the planner, and its EXISTS run only for the feature's rows;
 * - the account is a probe by index for each row returned (LATERAL,
 *   OFFSET 0), never a join the planner can turn into a hash of every
 *   account, built again for every page;
 * - each EXISTS is a probe by index for each budget row the walk reads:
 *   OFFSET 0 keeps the planner from turning it into a hash of the whole
 *   table, built again for every page, which for the send log (a row per
 *   report, and the run's own repairs) grows without bound.
 */
static EmStatement page_of_cycles = {
	"SELECT b.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end, "
	"       a.provider_customer, a.provider_agreement "
	"FROM earmark.budget b "
	"JOIN LATERAL (SELECT a.provider_customer, a.provider_agreement FROM earmark.account a "
	"              WHERE a.account = b.account OFFSET 0) a ON true "
	"WHERE b.budget_id > $2 "
	"  AND CASE WHEN $1::text IS NULL OR b.feature = $1 "
	"      THEN EXISTS (SELECT 1 FROM earmark.ledger l "
	"                    WHERE l.account = b.account AND l.budget_id = b.budget_id OFFSET 0) "
	"        OR EXISTS (SELECT 1 FROM earmark.meter_send x "
	"                    WHERE x.account = b.account AND x.budget_id = b.budget_id OFFSET 0) "
	"      ELSE false END "
	"ORDER BY b.budget_id LIMIT $3",
	3, {TEXTOID, INT8OID, INT4OID}
};

/*
 * The last of one account's next RECONCILE_PAGE cycles after $2 (with
 * usage or not), by the primary key: where the account's next page ends.
 * No row: fewer are left, and the page ends with the account's last one.
 */
static EmStatement account_page_end = {
	"SELECT budget_id FROM earmark.budget WHERE account = $1 AND budget_id > $2 "
	"ORDER BY budget_id OFFSET $3 LIMIT 1",
	3, {TEXTOID, INT8OID, INT8OID}
};

/*
 * The same for one account: its cycles after $3 up to $5, where the page
 * ends (account_page_end), in budget_id order by the primary key.  Each
 * relation is filtered by the account (inside a call Citus runs on the
 * account's node, in the caller's transaction, each is routed to the
 * account's shard).  Each EXISTS is a probe by index for each budget row
 * (OFFSET 0, as in page_of_cycles): an "IN (every ledger row and send of
 * the account)" read every ledger row of the account at each page (a
 * run over an account with C cycles and L ledger rows read L * C / 50),
 * and, bounded to the page, a generic plan rescanned the page's ledger
 * rows for each of its cycles.
 */
static EmStatement page_of_account_cycles = {
	"SELECT b.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end, "
	"       a.provider_customer, a.provider_agreement "
	"FROM earmark.budget b JOIN earmark.account a ON a.account = b.account "
	"WHERE b.account = $1 AND a.account = $1 AND ($2::text IS NULL OR b.feature = $2) "
	"  AND b.budget_id > $3 AND b.budget_id <= $5 "
	"  AND (EXISTS (SELECT 1 FROM earmark.ledger l "
	"                WHERE l.account = $1 AND l.budget_id = b.budget_id OFFSET 0) "
	"       OR EXISTS (SELECT 1 FROM earmark.meter_send x "
	"                   WHERE x.account = $1 AND x.budget_id = b.budget_id OFFSET 0)) "
	"ORDER BY b.budget_id LIMIT $4",
	5, {TEXTOID, TEXTOID, INT8OID, INT4OID, INT8OID}
};

/*
 * The cycle's numbers: ledger total (and its keyed part), counters, the
 * last total sent, and the last send's outcome.
 */
static EmStatement cycle_numbers = {
	"SELECT (SELECT coalesce(pg_catalog.sum(units), 0)::bigint FROM earmark.ledger "
	"         WHERE account = $1 AND budget_id = $2), "
	"       b.used + (SELECT coalesce(pg_catalog.sum(s.used), 0)::bigint FROM earmark.budget_slot s "
	"                  WHERE s.account = $1 AND s.budget_id = $2) "
	"              + (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint FROM earmark.usage_shard u "
	"                  WHERE u.account = $1 AND u.budget_id = $2), "
	"       (SELECT x.total FROM earmark.meter_send x WHERE x.account = $1 AND x.budget_id = $2 AND x.ok "
	"         ORDER BY x.send_id DESC LIMIT 1), "
	"       (SELECT x.ok FROM earmark.meter_send x WHERE x.account = $1 AND x.budget_id = $2 "
	"         ORDER BY x.send_id DESC LIMIT 1), "
	"       (SELECT x.error FROM earmark.meter_send x WHERE x.account = $1 AND x.budget_id = $2 "
	"         ORDER BY x.send_id DESC LIMIT 1) "
	"FROM earmark.budget b WHERE b.account = $1 AND b.budget_id = $2",
	2, {TEXTOID, INT8OID}
};
enum
{
	CN_LEDGER = 1, CN_COUNTERS, CN_LAST_SENT, CN_LAST_OK, CN_LAST_ERROR
};

static EmStatement lock_for_rebuild = {
	"SELECT 1 FROM earmark.budget WHERE account = $1 AND budget_id = $2 FOR UPDATE",
	2, {TEXTOID, INT8OID}
};

/*
 * Rebuild the counters from the ledger: the keyed rows into one shard, the
 * job rows into the budget row (the slots keep their own used; the budget
 * row takes the difference, as an expiry into the budget row does).  Two
 * statements: the shards' delete must be done before the insert.
 */
static EmStatement clear_shards = {
	"DELETE FROM earmark.usage_shard WHERE account = $1 AND budget_id = $2",
	2, {TEXTOID, INT8OID}
};

static EmStatement rebuild_counters = {
	"WITH k AS (SELECT coalesce(pg_catalog.sum(units), 0)::bigint AS units FROM earmark.ledger "
	"            WHERE account = $1 AND budget_id = $2 AND job_id IS NULL),"
	"     j AS (SELECT coalesce(pg_catalog.sum(units), 0)::bigint AS units FROM earmark.ledger "
	"            WHERE account = $1 AND budget_id = $2 AND job_id IS NOT NULL),"
	"     s AS (SELECT coalesce(pg_catalog.sum(used), 0)::bigint AS used FROM earmark.budget_slot "
	"            WHERE account = $1 AND budget_id = $2),"
	"     i AS (INSERT INTO earmark.usage_shard (account, budget_id, shard, units) "
	"           SELECT $1, $2, 0, k.units FROM k WHERE k.units <> 0) "
	"UPDATE earmark.budget SET used = (SELECT units FROM j) - (SELECT used FROM s), "
	"       slot_rec = NULL "
	"WHERE account = $1 AND budget_id = $2",
	2, {TEXTOID, INT8OID}
};

/* the columns of last_evidence */
enum
{
	LE_LEDGER = 1, LE_COUNTERS, LE_LAST_SENT, LE_PROVIDER, LE_VERDICT, LE_EVIDENCE_ID
};

static EmStatement last_evidence = {
	"SELECT ledger_total, "
	"       CASE WHEN counters_rebuilt THEN ledger_total ELSE counter_total END, "
	"       coalesce(repaired_to, last_sent), coalesce(read_back, provider_total), "
	"       CASE WHEN read_back = repaired_to THEN 'match' ELSE verdict END, evidence_id "
	"FROM earmark.evidence WHERE account = $1 AND budget_id = $2 ORDER BY evidence_id DESC LIMIT 1",
	2, {TEXTOID, INT8OID}
};

static EmStatement touch_evidence = {
	"UPDATE earmark.evidence SET last_checked_at = $3 "
	"WHERE account = $1 AND evidence_id = $2 RETURNING *",
	3, {TEXTOID, INT8OID, TIMESTAMPTZOID}
};

static EmStatement add_evidence = {
	"INSERT INTO earmark.evidence (budget_id, account, feature, cycle_start, cycle_end, closed, "
	"  ledger_total, counter_total, counters_rebuilt, last_sent, provider_total, verdict, cause, "
	"  repaired_to, read_back) "
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING *",
	15, {INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, BOOLOID,
		INT8OID, INT8OID, BOOLOID, INT8OID, INT8OID, TEXTOID, TEXTOID,
	INT8OID, INT8OID}
};

typedef struct Check
{
	EmMeterOp	op;				/* ids, and the provider's read */
	char	   *read_error;		/* why the read failed */
	bool		checked;		/* phase 1 read its numbers */
	int64		ledger;
	int64		counters;
	bool		has_sent;
	int64		last_sent;
	bool		last_send_failed;
	char	   *last_send_error;
	const char *verdict;
	bool		repair_tried;	/* a repair write was sent */
	bool		written;		/* the provider took it */
	bool		unmarked;		/* written, but the mark after it failed */
	bool		undone;			/* repaired, but its counters not rebuilt */
	bool		read_back_ok;	/* the meter was read after it */
	int64		read_back;
	char	   *repair_error;	/* the write's error, or the read back's */
	bool		repaired;		/* written, and read back equal */
	bool		rebuilt;
} Check;

/* one run: the cycles checked, and where the rows go */
typedef struct Run
{
	MemoryContext cxt;			/* the checks, for the whole run */
	ReturnSetInfo *rsinfo;
	ResourceOwner owner;		/* the tuplestore's, outside the subtransactions */
	Check	   *checks;
	int			n;
	int			size;
	bool		send_locked;	/* the send lock is held (give_send_lock_back) */
	int			locked_from;	/* the first check whose read came after it */
} Run;

typedef void (*CycleStep) (Run *run, Check *c);

/* a cycle's statement arguments: its account and budget */
static void
cycle_args(Check *c, Datum *args)
{
	args[0] = CStringGetTextDatum(c->op.account);
	args[1] = Int64GetDatum(c->op.budget_id);
}

/* the cause, from the evidence */
static char *
drift_cause(Check *c)
{
	int64		meter = c->op.read_total;

	if (c->last_send_failed)
		return psprintf("The last report failed (%s). The meter kept an older total.",
						c->last_send_error ? c->last_send_error : "no answer");
	if (c->has_sent && meter != c->last_sent)
		return pstrdup("The meter moved without a report. A report was counted twice, "
					   "or something else wrote to the meter.");
	if (!c->has_sent)
		return pstrdup("The ledger was never reported. The cycle's usage has not reached the meter.");
	return pstrdup("The ledger changed after the last report. A late usage or a correction arrived.");
}

/* what became of a repair that did not prove itself */
static char *
repair_outcome(Check *c)
{
	if (!c->written)
		return psprintf("The repair failed: writing the ledger total " INT64_FORMAT
						" failed (%s). Run earmark_reconcile again once the provider answers.",
						c->ledger, c->repair_error);
	if (!c->read_back_ok)
		return psprintf("The repair did not read back: wrote " INT64_FORMAT
						"; the read back failed (%s). A write the provider accepted is not proof; "
						"check the provider's meter.", c->ledger, c->repair_error);
	return psprintf("The repair did not read back: wrote " INT64_FORMAT ", read back " INT64_FORMAT
					". A write the provider accepted is not proof; check the provider's meter.",
					c->ledger, c->read_back);
}

static void
decide(Check *c)
{
	if (!c->op.ok)
		c->verdict = "unreadable";
	else if (c->op.read_total == c->ledger)
		c->verdict = "match";
	else if (c->op.closed)
		c->verdict = "closed_cycle_drift";
	else
		c->verdict = c->op.read_total > c->ledger ? "over_billed" : "under_billed";
}

static char *
cause_of(Check *c)
{
	char	   *cause;

	if (!c->op.ok)
		return psprintf("The provider's total could not be read: %s",
						c->read_error ? c->read_error : "no answer");
	if (c->op.read_total == c->ledger)
		return NULL;
	cause = drift_cause(c);
	if (c->op.closed)
		return psprintf("The cycle has closed: it is not written, a person decides. %s", cause);
	if (c->repaired)
		return psprintf("%s: the meter read " INT64_FORMAT ", the ledger " INT64_FORMAT ". %s "
						"The repair wrote " INT64_FORMAT " and read it back: the meter equals the ledger%s",
						c->op.read_total > c->ledger ? "Over-billed" : "Under-billed",
						c->op.read_total, c->ledger, cause, c->ledger,
						c->undone ? psprintf(", but the counters (" INT64_FORMAT ") could not be rebuilt "
											 "while usage was written, and the next report sends their "
											 "total. Run earmark_reconcile again.", c->counters) : ".");
	if (c->repair_tried)
		cause = psprintf("%s %s", cause, repair_outcome(c));
	return cause;
}

/*
 * Write the ledger total, read it back: only an equal read back is a
 * repair.  A failure is noted on the check (phase 2 puts it in the
 * evidence), never raised: one cycle does not undo the run.
 */
static void
repair(Run *run, Check *c)
{
	EmMeterOp	w = c->op;
	EmMeterOp	r = c->op;

	w.total = c->ledger;
	em_meter_write(&w, 1, NULL, NULL);
	em_log_send(&w, "repair");
	c->repair_tried = true;
	if (!w.ok)
	{
		c->repair_error = MemoryContextStrdup(run->cxt, w.error ? w.error : "no answer");
		return;
	}
	c->written = true;
	em_meter_read(&r, 1);
	c->read_back_ok = r.ok;
	c->read_back = r.read_total;
	c->repaired = r.ok && r.read_total == c->ledger;
	if (!r.ok)
		c->repair_error = MemoryContextStrdup(run->cxt, r.error ? r.error : "no answer");
}

/* the verdicts a repair is for */
static bool
needs_repair(Check *c)
{
	return strcmp(c->verdict, "over_billed") == 0 || strcmp(c->verdict, "under_billed") == 0;
}

/*
 * The send lock (meter.c), before the run's first repair, until the marks
 * after the repairs are written (give_send_lock_back): no report pass sends while a repair is
 * written, read back and marked.  It is held by the run's own resource
 * owner, not the unit's, so that a later cycle's error does not give it
 * back.  Waits for a pass that is sending (lock_timeout applies; its
 * error is this cycle's WARNING).
 */
static void
take_send_lock(Run *run)
{
	ResourceOwner owner = CurrentResourceOwner;

	if (run->send_locked)
		return;
	CurrentResourceOwner = run->owner;
	PG_TRY();
	{
		em_send_lock();
	}
	PG_FINALLY();
	{
		CurrentResourceOwner = owner;
	}
	PG_END_TRY();
	run->send_locked = true;
	run->locked_from = run->n;
}

/*
 * Once every repair has been written, read back and marked, not at the
 * end of the transaction: each mark is kept from a pass's finish by the
 * mark lock held shared to the transaction's end, and a pass from here on
 * sends the cycle's total as it is then, committed after the ledger this
 * run read.  Held longer, the lock would stop every report while the
 * caller's transaction stays open, or while a later cycle's rebuild waits
 * for a budget row.
 */
static void
give_send_lock_back(Run *run)
{
	ResourceOwner owner = CurrentResourceOwner;

	if (!run->send_locked)
		return;
	CurrentResourceOwner = run->owner;
	em_send_unlock();
	CurrentResourceOwner = owner;
	run->send_locked = false;
}

/*
 * Whether a repaired cycle's counters are to be rebuilt.  A pass sends
 * the counters' total, and the rebuild's is seen only once the transaction
 * commits: a pass before then would send the drifted total over the
 * repair.  Such a run keeps the send lock to the end of its transaction.
 */
static bool
rebuilds_a_repair(Run *run)
{
	int			i;

	for (i = 0; i < run->n; i++)
	{
		Check	   *c = &run->checks[i];

		if (c->checked && c->written && !c->unmarked && c->counters != c->ledger)
			return true;
	}
	return false;
}

/* the provider's total again, for a check whose read came before the lock */
static void
read_meter_again(Run *run, Check *c)
{
	EmMeterOp	r = c->op;

	em_meter_read(&r, 1);
	c->op.ok = r.ok;
	c->op.read_total = r.read_total;
	c->op.http_status = r.http_status;
	c->read_error = r.ok ? NULL :
		MemoryContextStrdup(run->cxt, r.error ? r.error : "no answer");
}

/* the cycle's numbers from the ledger, the counters and the send log */
static void
read_numbers(Run *run, Check *c)
{
	Datum		args[2];
	bool		isnull;
	Datum		d;

	cycle_args(c, args);
	em_exec_lookup(&cycle_numbers, args, NULL, 1);
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the cycle was deleted while it was reconciled")));
	c->ledger = em_get_int64(0, CN_LEDGER, 0);
	c->counters = em_get_int64(0, CN_COUNTERS, 0);
	d = em_get(0, CN_LAST_SENT, &isnull);
	c->has_sent = !isnull;
	c->last_sent = isnull ? 0 : DatumGetInt64(d);
	d = em_get(0, CN_LAST_OK, &isnull);
	c->last_send_failed = !isnull && !DatumGetBool(d);
	d = em_get(0, CN_LAST_ERROR, &isnull);
	c->last_send_error = isnull ? NULL : MemoryContextStrdup(run->cxt, TextDatumGetCString(d));
}

/* phase 1, one cycle: its numbers, its verdict, its repair */
static void
check_cycle(Run *run, Check *c)
{
	read_numbers(run, c);
	decide(c);
	if (needs_repair(c))
	{
		take_send_lock(run);
		/*
		 * A read from before the lock may be older than a pass that sent
		 * while we waited: the meter again, then the ledger (the header's
		 * order), and the verdict on those.
		 */
		if (c - run->checks < run->locked_from)
		{
			read_meter_again(run, c);
			read_numbers(run, c);
		}
		/*
		 * And the time: a cycle that closed since its page was read (while
		 * we waited, or while the page's meters were read) is not written.
		 */
		c->op.closed = c->op.cycle_end <= GetCurrentTimestamp();
		decide(c);
	}
	if (needs_repair(c))
		repair(run, c);
	/*
	 * A proven repair is its own verdict, so that a cycle that was fixed
	 * does not read as a drift on every later run (they return this row
	 * while the meter still equals the ledger).  One that did not prove
	 * itself keeps over_billed / under_billed: it still needs a person.
	 */
	if (c->repaired)
		c->verdict = "repaired";
	/* only a cycle whose step went through has a phase 2 */
	c->checked = true;
}

/*
 * The cycle's mark lock, without waiting for its holders, but tried again
 * for up to MARK_RETRY_MS.  Exclusively, for a rebuild: a writer that
 * waits for the budget row we hold would wait for us in turn; tried again
 * because a writer whose commit just let us have the budget row gives
 * its mark lock back a moment after its row lock (PostgreSQL releases
 * advisory locks last), and the first try could fall in between
 * (isolation rebuild_vs_settle, under load).
 */
#define MARK_RETRY_MS	100

static bool
mark_lock_tried(int64 budget_id, bool exclusive)
{
	int			ms;

	for (ms = 0;; ms++)
	{
		if (exclusive ? em_mark_try_lock_exclusive(budget_id) : em_mark_try_lock(budget_id))
			return true;
		if (ms == MARK_RETRY_MS)
			return false;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(1000L);
	}
}

/*
 * After a repair's write, a report of a newer total may have landed just
 * before it: mark the cycle, so that the reporter sends its total once
 * more.  A unit of its own, before the rebuild and the evidence: an error
 * in those (a lock_timeout on the budget row) must not take the mark back
 * with it, since the provider keeps the repair.
 */
static void
mark_after_repair(Run *run, Check *c)
{
	(void) run;
	/*
	 * Tried, not waited for: it is taken under the send lock, and the
	 * exclusive holder may be another reconciliation's rebuild of this
	 * cycle, which keeps it until its transaction ends (every report
	 * would wait that long).
	 */
	if (!mark_lock_tried(c->op.budget_id, false))
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("the meter was repaired to " INT64_FORMAT " but the cycle could not be marked: another transaction rebuilds its counters",
						c->ledger)));
	em_mark_cycle(cstring_to_text(c->op.account), c->op.budget_id);
}

/* counters that differ from the ledger: rebuilt, if no writer is at it */
static void
rebuild(Check *c)
{
	Datum		args[2];

	cycle_args(c, args);
	em_exec(&lock_for_rebuild, args, NULL, 1);
	if (mark_lock_tried(c->op.budget_id, true))
	{
		em_exec(&clear_shards, args, NULL, 0);
		em_exec(&rebuild_counters, args, NULL, 0);
		c->rebuilt = true;
		ereport(WARNING,
				(errmsg("the counters of account \"%s\", feature \"%s\" differed from the ledger and were rebuilt",
						c->op.account, c->op.feature),
				 errdetail("Counters " INT64_FORMAT ", ledger " INT64_FORMAT ".",
						   c->counters, c->ledger)));
	}
	else
		ereport(WARNING,
				(errmsg("the counters of account \"%s\", feature \"%s\" differ from the ledger",
						c->op.account, c->op.feature),
				 errdetail("Counters " INT64_FORMAT ", ledger " INT64_FORMAT "; usage was being written, "
						   "so they were not rebuilt.", c->counters, c->ledger),
				 errhint("Run earmark_reconcile again.")));
}

/* hand back the row just stored or touched, in the run's resource owner */
static void
put_row(Run *run)
{
	ResourceOwner owner = CurrentResourceOwner;

	/* a tuplestore that spills to disk must not belong to a subtransaction */
	CurrentResourceOwner = run->owner;
	tuplestore_puttuple(run->rsinfo->setResult, SPI_tuptable->vals[0]);
	CurrentResourceOwner = owner;
}

/* store the evidence, unless the last row says the same; return it */
static void
keep_evidence(Run *run, Check *c)
{
	Datum		args[15];
	char		nulls[15];
	bool		isnull;
	int64		counters_after = c->rebuilt ? c->ledger : c->counters;
	char	   *cause = cause_of(c);

	memset(nulls, ' ', sizeof(nulls));
	cycle_args(c, args);
	em_exec_lookup(&last_evidence, args, NULL, 1);
	if (SPI_processed == 1 && !c->repair_tried && !c->rebuilt)
	{
		bool		same = em_get_int64(0, LE_LEDGER, -1) == c->ledger &&
			em_get_int64(0, LE_COUNTERS, -1) == counters_after;
		Datum		d;

		d = em_get(0, LE_LAST_SENT, &isnull);
		same = same && (isnull ? !c->has_sent : (c->has_sent && DatumGetInt64(d) == c->last_sent));
		d = em_get(0, LE_PROVIDER, &isnull);
		same = same && (isnull ? !c->op.ok : (c->op.ok && DatumGetInt64(d) == c->op.read_total));
		same = same && strcmp(TextDatumGetCString(em_get(0, LE_VERDICT, &isnull)), c->verdict) == 0;
		if (same)
		{
			args[0] = CStringGetTextDatum(c->op.account);
			args[1] = em_get(0, LE_EVIDENCE_ID, &isnull);
			args[2] = TimestampTzGetDatum(GetCurrentTimestamp());
			em_exec(&touch_evidence, args, NULL, 1);
			put_row(run);
			return;
		}
	}

	args[0] = Int64GetDatum(c->op.budget_id);
	args[1] = CStringGetTextDatum(c->op.account);
	args[2] = CStringGetTextDatum(c->op.feature);
	args[3] = TimestampTzGetDatum(c->op.cycle_start);
	args[4] = TimestampTzGetDatum(c->op.cycle_end);
	args[5] = BoolGetDatum(c->op.closed);
	args[6] = Int64GetDatum(c->ledger);
	args[7] = Int64GetDatum(c->counters);
	args[8] = BoolGetDatum(c->rebuilt);
	args[9] = Int64GetDatum(c->last_sent);
	nulls[9] = c->has_sent ? ' ' : 'n';
	args[10] = Int64GetDatum(c->op.read_total);
	nulls[10] = c->op.ok ? ' ' : 'n';
	args[11] = CStringGetTextDatum(c->verdict);
	args[12] = cause ? CStringGetTextDatum(cause) : (Datum) 0;
	nulls[12] = cause ? ' ' : 'n';
	/* what the repair wrote, and what was read after it (equal: proven) */
	args[13] = Int64GetDatum(c->ledger);
	nulls[13] = c->written ? ' ' : 'n';
	args[14] = Int64GetDatum(c->read_back);
	nulls[14] = c->read_back_ok ? ' ' : 'n';
	em_exec(&add_evidence, args, nulls, 1);
	put_row(run);
}

/* phase 2, one cycle: after every provider call of the run */
static void
finish_cycle(Run *run, Check *c)
{
	/* counters last: the only row locks, after every provider call */
	if (c->counters != c->ledger)
		rebuild(c);
	/*
	 * A report sends the counters' total: a repair whose counters still
	 * differ is undone by the next one, so it is no repair.
	 */
	if (c->repaired && c->counters != c->ledger && !c->rebuilt)
	{
		c->verdict = c->op.read_total > c->ledger ? "over_billed" : "under_billed";
		c->undone = true;
	}
	keep_evidence(run, c);
}

/*
 * Run one step of one cycle in a subtransaction of its own.  An error is
 * rolled back with it and reported as a WARNING naming the cycle; the run
 * goes on.  A cancel (or a statement timeout) still ends the run.
 */
static bool
cycle_unit(CycleStep step, Run *run, Check *c)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool ok = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		/*
		 * The cycle's statements in an SPI connection of its own: SPI keeps
		 * every result table until its connection ends (a subtransaction's
		 * commit frees none), so in the run's connection a run over N
		 * cycles held N cycles' results.  What a step keeps is copied into
		 * run->cxt.  On an error the subtransaction's abort ends the
		 * connection.
		 */
		SPI_connect();
		MemoryContextSwitchTo(cxt);
		step(run, c);
		SPI_finish();
		MemoryContextSwitchTo(cxt);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("could not reconcile the cycle of account \"%s\", feature \"%s\" that starts %s",
						c->op.account, c->op.feature, timestamptz_to_str(c->op.cycle_start)),
				 errdetail("%s", edata->message),
				 errhint("The other cycles were reconciled. Run earmark_reconcile again for this one.")));
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}

/* room for n more checks */
static void
grow(Run *run, int n)
{
	int			size;

	if (run->n + n <= run->size)
		return;
	size = Max(run->size * 2, run->n + n);
	if (run->checks == NULL)
		run->checks = MemoryContextAllocZero(run->cxt, sizeof(Check) * size);
	else
	{
		run->checks = repalloc(run->checks, sizeof(Check) * size);
		memset(run->checks + run->size, 0, sizeof(Check) * (size - run->size));
	}
	run->size = size;
}

/*
 * The next page of cycles after budget_id *after, added to the run with
 * the provider's totals (the reads of a page run at once; no lock is
 * held); *after moves to where the page ends.  Returns the page's number
 * of cycles, 0 when none is left.
 */
static int
next_page(Run *run, text *account, text *feature, int64 *after)
{
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	int			n;
	int			i;
	Check	   *page;
	EmMeterOp  *reads;
	TimestampTz now = GetCurrentTimestamp();
	bool		last = true;	/* no cycle after this page's */
	int64		end = PG_INT64_MAX;

	/* page_of_account_cycles: account, feature, after, size, end; else no account */
	args[0] = PointerGetDatum(account);
	args[1] = feature ? PointerGetDatum(feature) : (Datum) 0;
	nulls[1] = feature ? ' ' : 'n';
	args[3] = Int32GetDatum(RECONCILE_PAGE);
	for (;;)
	{
		args[2] = Int64GetDatum(*after);
		if (account == NULL)
		{
			em_exec(&page_of_cycles, args + 1, nulls + 1, 0);
			break;
		}
		/* where the account's next RECONCILE_PAGE cycles end */
		{
			Datum		end_args[3];

			end_args[0] = PointerGetDatum(account);
			end_args[1] = Int64GetDatum(*after);
			end_args[2] = Int64GetDatum(RECONCILE_PAGE - 1);
			em_exec(&account_page_end, end_args, NULL, 1);
			last = SPI_processed == 0;
			end = last ? PG_INT64_MAX : em_get_int64(0, 1, 0);
		}
		args[4] = Int64GetDatum(end);
		em_exec(&page_of_account_cycles, args, nulls, 0);
		if (SPI_processed > 0 || last)
			break;
		/* a page of cycles none of which has usage or sends: the next one */
		*after = end;
	}
	n = (int) SPI_processed;
	if (n == 0)
		return 0;
	/* every cycle up to the page's end was looked at */
	*after = last ? em_get_int64(n - 1, PC_BUDGET_ID, 0) : end;
	grow(run, n);
	page = run->checks + run->n;
	for (i = 0; i < n; i++)
	{
		EmMeterOp  *op = &page[i].op;
		MemoryContext old = MemoryContextSwitchTo(run->cxt);
		Datum		d;

		op->budget_id = em_get_int64(i, PC_BUDGET_ID, 0);
		op->account = TextDatumGetCString(em_get(i, PC_ACCOUNT, &isnull));
		op->feature = TextDatumGetCString(em_get(i, PC_FEATURE, &isnull));
		op->cycle_start = DatumGetTimestampTz(em_get(i, PC_CYCLE_START, &isnull));
		op->cycle_end = DatumGetTimestampTz(em_get(i, PC_CYCLE_END, &isnull));
		op->closed = op->cycle_end <= now;
		d = em_get(i, PC_CUSTOMER, &isnull);
		op->customer = isnull ? NULL : TextDatumGetCString(d);
		d = em_get(i, PC_AGREEMENT, &isnull);
		op->agreement = isnull ? NULL : TextDatumGetCString(d);
		MemoryContextSwitchTo(old);
	}

	/* the provider's totals (in the page's memory); what phase 2 needs is kept */
	reads = palloc(sizeof(EmMeterOp) * n);
	for (i = 0; i < n; i++)
		reads[i] = page[i].op;
	em_meter_read(reads, n);
	for (i = 0; i < n; i++)
	{
		page[i].op.ok = reads[i].ok;
		page[i].op.read_total = reads[i].read_total;
		page[i].op.http_status = reads[i].http_status;
		if (!reads[i].ok)
			page[i].read_error = MemoryContextStrdup(run->cxt,
													 reads[i].error ? reads[i].error : "no answer");
	}
	run->n += n;
	return n;
}

/*
 * A cycle's numbers (with its last send), its last evidence and the local
 * provider's total are read from tables the run itself fills (its repairs'
 * sends and local meter writes, its evidence).  A
 * plan made at the run's first cycle and kept would scan them whole at
 * every cycle when an ANALYZE saw them empty: they are planned again for
 * each page of cycles, for the tables' size then (once a page, not at
 * every call: planning costs more than the look-up).
 */
static void
replan_cycle_lookups(void)
{
	em_forget_plan(&cycle_numbers);
	em_forget_plan(&last_evidence);
	em_meter_read_replan();
}

/*
 * Phase 1: every provider call, no lock.  A page of cycles is read in an
 * SPI connection of its own (cycle_unit runs each cycle in one too), then
 * each of its cycles is checked against the provider.
 */
static void
call_phase(Run *run, text *account, text *feature, MemoryContext step_cxt)
{
	int64		after = 0;
	MemoryContext old;
	int			i;

	for (;;)
	{
		int			first = run->n;
		int			n;

		old = MemoryContextSwitchTo(step_cxt);
		SPI_connect();
		MemoryContextSwitchTo(step_cxt);
		n = next_page(run, account, feature, &after);
		SPI_finish();
		MemoryContextSwitchTo(old);
		if (n == 0)
			break;
		replan_cycle_lookups();
		/* then the record (see the header: never an older total) */
		for (i = first; i < run->n; i++)
		{
			old = MemoryContextSwitchTo(step_cxt);
			(void) cycle_unit(check_cycle, run, &run->checks[i]);
			MemoryContextSwitchTo(old);
		}
		MemoryContextReset(step_cxt);
	}
}

/* Phase 2: the locked steps and the evidence, after the last call */
static void
locked_phase(Run *run, MemoryContext step_cxt)
{
	MemoryContext old;
	int			i;

	for (i = 0; i < run->n; i++)
	{
		if (!run->checks[i].checked || !run->checks[i].written)
			continue;
		old = MemoryContextSwitchTo(step_cxt);
		run->checks[i].unmarked = !cycle_unit(mark_after_repair, run, &run->checks[i]);
		MemoryContextSwitchTo(old);
		MemoryContextReset(step_cxt);
	}
	if (!rebuilds_a_repair(run))
		give_send_lock_back(run);
	for (i = 0; i < run->n; i++)
	{
		if (i % RECONCILE_PAGE == 0)
			replan_cycle_lookups();
		/* a cycle whose mark failed returns no row, as any failed step */
		if (!run->checks[i].checked || run->checks[i].unmarked)
			continue;
		old = MemoryContextSwitchTo(step_cxt);
		(void) cycle_unit(finish_cycle, run, &run->checks[i]);
		MemoryContextSwitchTo(old);
		MemoryContextReset(step_cxt);
	}
}

/*
 * earmark_reconcile(account, feature) RETURNS SETOF earmark.evidence: one
 * row per cycle checked, the stored evidence (new or unchanged), in
 * budget_id order.  A cycle whose step failed (a WARNING says why) has no
 * row.
 */
Datum
earmark_reconcile(PG_FUNCTION_ARGS)
{
	text	   *account;
	text	   *feature;
	Run			run;
	MemoryContext step_cxt;

	em_require_schema();
	account = PG_ARGISNULL(0) ? NULL : em_arg_name(fcinfo, 0, "account");
	feature = PG_ARGISNULL(1) ? NULL : em_arg_name(fcinfo, 1, "feature");
	em_require_read_committed("earmark_reconcile");
	em_require_no_writes("earmark_reconcile");
	/*
	 * A cycle's locked steps take its mark lock, which only excludes the
	 * cycle's writers on the account's node: on a distributed install an
	 * account is reconciled in a call Citus runs there.
	 */
	if (account == NULL && em_distributed())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("earmark_reconcile needs an account on a distributed install"),
				 errdetail("Each account is reconciled on its node, in a call of its own."),
				 errhint("Call SELECT * FROM earmark_reconcile(account) for each account.")));
	if (account != NULL)
		em_require_account_local(account);
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC | MAT_SRF_BLESS);
	memset(&run, 0, sizeof(run));
	run.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	run.owner = CurrentResourceOwner;
	run.cxt = AllocSetContextCreate(CurrentMemoryContext, "earmark reconcile run",
									ALLOCSET_DEFAULT_SIZES);
	step_cxt = AllocSetContextCreate(CurrentMemoryContext, "earmark reconcile step",
									 ALLOCSET_DEFAULT_SIZES);
	SPI_connect();
	call_phase(&run, account, feature, step_cxt);
	locked_phase(&run, step_cxt);
	SPI_finish();
	MemoryContextDelete(step_cxt);
	MemoryContextDelete(run.cxt);
	return (Datum) 0;
}
