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
 *	  back; a read back that differs is an error.  A run on the same
 *	  numbers as the cycle's last evidence adds no row.
 *
 *	  Tables: reads ledger, budget, budget_slot, usage_shard, meter_send,
 *	  account; writes evidence, meter_send (repairs), meter_mark and, to
 *	  rebuild, usage_shard and budget.  Locks: no lock at all during the
 *	  provider calls.  A rebuild, after every call of the cycle is done,
 *	  locks the budget row FOR UPDATE and then takes the cycle's mark lock
 *	  exclusively without waiting (ledger.c: every writer of the cycle
 *	  holds it shared until it commits): with both, no counter can move
 *	  while it is rebuilt.  When the mark lock is busy the rebuild is left
 *	  for the next run (never a wait: a settle holds the mark lock while it
 *	  waits for the budget row).  A repair takes the mark lock shared, as
 *	  any writer of a mark does.
 *
 *	  The provider is read before the ledger: a usage (and its report)
 *	  landing in between makes the ledger look ahead, and the repair then
 *	  writes the newer total, never an older one.  A report of a newer
 *	  total racing the repair's write is covered by marking the cycle
 *	  after a repair: the reporter sends its current total once more.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "earmark.h"
#include "provider.h"

PG_FUNCTION_INFO_V1(earmark_reconcile);

/* cycles read and checked together */
#define RECONCILE_PAGE	50

/* the cycles to check: with ledger rows or sends, after $3, in id order */
static EmStatement page_of_cycles = {
	"SELECT b.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end, "
	"       a.provider_customer, a.provider_agreement "
	"FROM earmark.budget b JOIN earmark.account a ON a.account = b.account "
	"WHERE ($1::text IS NULL OR b.account = $1) AND ($2::text IS NULL OR b.feature = $2) "
	"  AND b.budget_id > $3 "
	"  AND (EXISTS (SELECT 1 FROM earmark.ledger l WHERE l.budget_id = b.budget_id) "
	"       OR EXISTS (SELECT 1 FROM earmark.meter_send x WHERE x.budget_id = b.budget_id)) "
	"ORDER BY b.budget_id LIMIT $4",
	4, {TEXTOID, TEXTOID, INT8OID, INT4OID}
};

/*
 * The cycle's numbers: ledger total (and its keyed part), counters, the
 * last total sent, and the last send's outcome.
 */
static EmStatement cycle_numbers = {
	"SELECT coalesce((SELECT pg_catalog.sum(units) FROM earmark.ledger WHERE budget_id = b.budget_id), 0)::bigint, "
	"       " EM_CYCLE_TOTAL_SQL ", "
	"       (SELECT x.total FROM earmark.meter_send x WHERE x.budget_id = b.budget_id AND x.ok "
	"         ORDER BY x.send_id DESC LIMIT 1), "
	"       (SELECT x.ok FROM earmark.meter_send x WHERE x.budget_id = b.budget_id "
	"         ORDER BY x.send_id DESC LIMIT 1), "
	"       (SELECT x.error FROM earmark.meter_send x WHERE x.budget_id = b.budget_id "
	"         ORDER BY x.send_id DESC LIMIT 1) "
	"FROM earmark.budget b WHERE b.budget_id = $1",
	1, {INT8OID}
};

static EmStatement lock_for_rebuild = {
	"SELECT 1 FROM earmark.budget WHERE budget_id = $1 FOR UPDATE",
	1, {INT8OID}
};

/*
 * Rebuild the counters from the ledger: the keyed rows into one shard, the
 * job rows into the budget row (the slots keep their own used; the budget
 * row takes the difference, as an expiry into the budget row does).  Two
 * statements: the shards' delete must be done before the insert.
 */
static EmStatement clear_shards = {
	"DELETE FROM earmark.usage_shard WHERE budget_id = $1",
	1, {INT8OID}
};

static EmStatement rebuild_counters = {
	"WITH k AS (SELECT coalesce(pg_catalog.sum(units), 0)::bigint AS units FROM earmark.ledger "
	"            WHERE budget_id = $1 AND job_id IS NULL),"
	"     j AS (SELECT coalesce(pg_catalog.sum(units), 0)::bigint AS units FROM earmark.ledger "
	"            WHERE budget_id = $1 AND job_id IS NOT NULL),"
	"     s AS (SELECT coalesce(pg_catalog.sum(used), 0)::bigint AS used FROM earmark.budget_slot "
	"            WHERE budget_id = $1),"
	"     i AS (INSERT INTO earmark.usage_shard (account, budget_id, shard, units) "
	"           SELECT (SELECT account FROM earmark.budget WHERE budget_id = $1), $1, 0, k.units "
	"             FROM k WHERE k.units <> 0) "
	"UPDATE earmark.budget SET used = (SELECT units FROM j) - (SELECT used FROM s) "
	"WHERE budget_id = $1",
	1, {INT8OID}
};

/* after a repair the reporter sends the cycle once more (see repair) */
static EmStatement mark_cycle = {
	"INSERT INTO earmark.meter_mark (account, budget_id) "
	"SELECT account, budget_id FROM earmark.budget WHERE budget_id = $1 ON CONFLICT DO NOTHING",
	1, {INT8OID}
};

static EmStatement last_evidence = {
	"SELECT ledger_total, "
	"       CASE WHEN counters_rebuilt THEN ledger_total ELSE counter_total END, "
	"       coalesce(repaired_to, last_sent), coalesce(read_back, provider_total), "
	"       CASE WHEN read_back IS NOT NULL THEN 'match' ELSE verdict END, evidence_id "
	"FROM earmark.evidence WHERE budget_id = $1 ORDER BY evidence_id DESC LIMIT 1",
	1, {INT8OID}
};

static EmStatement touch_evidence = {
	"UPDATE earmark.evidence SET last_checked_at = pg_catalog.now() "
	"WHERE evidence_id = $1 RETURNING *",
	1, {INT8OID}
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
	int64		ledger;
	int64		counters;
	bool		has_sent;
	int64		last_sent;
	bool		last_send_failed;
	char	   *last_send_error;
	const char *verdict;
	char	   *cause;
	bool		repaired;
	int64		read_back;
	bool		rebuilt;
} Check;

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

static void
decide(Check *c)
{
	if (!c->op.ok)
	{
		c->verdict = "unreadable";
		c->cause = psprintf("The provider's total could not be read: %s",
							c->op.error ? c->op.error : "no answer");
		return;
	}
	if (c->op.read_total == c->ledger)
	{
		c->verdict = "match";
		c->cause = NULL;
		return;
	}
	c->cause = drift_cause(c);
	if (c->op.closed)
	{
		c->verdict = "closed_cycle_drift";
		c->cause = psprintf("The cycle has closed: it is not written, a person decides. %s", c->cause);
		return;
	}
	c->verdict = c->op.read_total > c->ledger ? "over_billed" : "under_billed";
}

/* write the ledger total, read it back: only an equal read back is a repair */
static void
repair(Check *c)
{
	EmMeterOp	w = c->op;
	EmMeterOp	r = c->op;

	w.total = c->ledger;
	em_meter_write(&w, 1, NULL, NULL);
	em_log_send(&w, "repair");
	if (!w.ok)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_PROVIDER),
				 errmsg("could not repair the meter of account \"%s\", feature \"%s\"",
						c->op.account, c->op.feature),
				 errdetail("Writing the ledger total " INT64_FORMAT " failed: %s",
						   c->ledger, w.error ? w.error : "no answer"),
				 errhint("Run earmark_reconcile again once the provider answers.")));
	em_meter_read(&r, 1);
	if (!r.ok || r.read_total != c->ledger)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_READ_BACK_DIFFERS),
				 errmsg("the meter of account \"%s\", feature \"%s\" does not read back the repaired total",
						c->op.account, c->op.feature),
				 r.ok ? errdetail("Wrote " INT64_FORMAT ", read back " INT64_FORMAT ".",
								  c->ledger, r.read_total)
				 : errdetail("Wrote " INT64_FORMAT "; the read back failed: %s",
							 c->ledger, r.error ? r.error : "no answer"),
				 errhint("A write that the provider accepted is not proof; check the provider's meter.")));
	c->repaired = true;
	c->read_back = r.read_total;

	/*
	 * A report of a newer total may have landed just before this write:
	 * mark the cycle, so that the reporter sends its total once more.
	 */
	{
		Datum		arg = Int64GetDatum(c->op.budget_id);

		em_mark_lock(c->op.budget_id);
		em_exec(&mark_cycle, &arg, NULL, 0);
	}
}

static void
put_row(ReturnSetInfo *rsinfo)
{
	tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[0]);
}

/* store the evidence, unless the last row says the same; return it */
static void
keep_evidence(Check *c, ReturnSetInfo *rsinfo)
{
	Datum		args[15];
	char		nulls[15];
	bool		isnull;
	int64		counters_after = c->rebuilt ? c->ledger : c->counters;

	memset(nulls, ' ', sizeof(nulls));
	args[0] = Int64GetDatum(c->op.budget_id);
	em_exec(&last_evidence, args, NULL, 1);
	if (SPI_processed == 1 && !c->repaired && !c->rebuilt)
	{
		bool		same = em_get_int64(0, 1, -1) == c->ledger &&
			em_get_int64(0, 2, -1) == counters_after;
		Datum		d;

		d = em_get(0, 3, &isnull);
		same = same && (isnull ? !c->has_sent : (c->has_sent && DatumGetInt64(d) == c->last_sent));
		d = em_get(0, 4, &isnull);
		same = same && (isnull ? !c->op.ok : (c->op.ok && DatumGetInt64(d) == c->op.read_total));
		same = same && strcmp(TextDatumGetCString(em_get(0, 5, &isnull)), c->verdict) == 0;
		if (same)
		{
			args[0] = em_get(0, 6, &isnull);
			em_exec(&touch_evidence, args, NULL, 1);
			put_row(rsinfo);
			return;
		}
	}

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
	args[12] = c->cause ? CStringGetTextDatum(c->cause) : (Datum) 0;
	nulls[12] = c->cause ? ' ' : 'n';
	args[13] = Int64GetDatum(c->ledger);
	nulls[13] = c->repaired ? ' ' : 'n';
	args[14] = Int64GetDatum(c->read_back);
	nulls[14] = c->repaired ? ' ' : 'n';
	em_exec(&add_evidence, args, nulls, 1);
	put_row(rsinfo);
}

/*
 * earmark_reconcile(account, feature) RETURNS SETOF earmark.evidence: one
 * row per cycle checked, the stored evidence (new or unchanged).
 */
Datum
earmark_reconcile(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *account = PG_ARGISNULL(0) ? NULL : em_arg_name(fcinfo, 0, "account");
	text	   *feature = PG_ARGISNULL(1) ? NULL : em_arg_name(fcinfo, 1, "feature");
	int64		after = 0;
	MemoryContext page_cxt;

	em_require_read_committed("earmark_reconcile");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC | MAT_SRF_BLESS);
	page_cxt = AllocSetContextCreate(CurrentMemoryContext, "earmark reconcile page",
									 ALLOCSET_DEFAULT_SIZES);
	SPI_connect();
	for (;;)
	{
		Datum		args[4];
		char		nulls[4] = {' ', ' ', ' ', ' '};
		Check	   *checks;
		EmMeterOp  *reads;
		int			n;
		int			i;
		bool		isnull;
		MemoryContext old;
		TimestampTz now = GetCurrentTimestamp();

		MemoryContextReset(page_cxt);
		old = MemoryContextSwitchTo(page_cxt);

		args[0] = account ? PointerGetDatum(account) : (Datum) 0;
		nulls[0] = account ? ' ' : 'n';
		args[1] = feature ? PointerGetDatum(feature) : (Datum) 0;
		nulls[1] = feature ? ' ' : 'n';
		args[2] = Int64GetDatum(after);
		args[3] = Int32GetDatum(RECONCILE_PAGE);
		em_exec(&page_of_cycles, args, nulls, 0);
		n = (int) SPI_processed;
		if (n == 0)
		{
			MemoryContextSwitchTo(old);
			break;
		}
		checks = palloc0(sizeof(Check) * n);
		for (i = 0; i < n; i++)
		{
			EmMeterOp  *op = &checks[i].op;
			Datum		d;

			op->budget_id = em_get_int64(i, 1, 0);
			op->account = TextDatumGetCString(em_get(i, 2, &isnull));
			op->feature = TextDatumGetCString(em_get(i, 3, &isnull));
			op->cycle_start = DatumGetTimestampTz(em_get(i, 4, &isnull));
			op->cycle_end = DatumGetTimestampTz(em_get(i, 5, &isnull));
			op->closed = op->cycle_end <= now;
			d = em_get(i, 6, &isnull);
			op->customer = isnull ? NULL : TextDatumGetCString(d);
			d = em_get(i, 7, &isnull);
			op->agreement = isnull ? NULL : TextDatumGetCString(d);
		}
		after = checks[n - 1].op.budget_id;

		/* the provider's totals, a page at a time (no lock is held) */
		reads = palloc(sizeof(EmMeterOp) * n);
		for (i = 0; i < n; i++)
			reads[i] = checks[i].op;
		em_meter_read(reads, n);
		for (i = 0; i < n; i++)
			checks[i].op = reads[i];

		/* then the record (see the header: never an older total) */
		for (i = 0; i < n; i++)
		{
			Check	   *c = &checks[i];
			Datum		d;

			args[0] = Int64GetDatum(c->op.budget_id);
			em_exec(&cycle_numbers, args, NULL, 1);
			c->ledger = em_get_int64(0, 1, 0);
			c->counters = em_get_int64(0, 2, 0);
			d = em_get(0, 3, &isnull);
			c->has_sent = !isnull;
			c->last_sent = isnull ? 0 : DatumGetInt64(d);
			d = em_get(0, 4, &isnull);
			c->last_send_failed = !isnull && !DatumGetBool(d);
			d = em_get(0, 5, &isnull);
			c->last_send_error = isnull ? NULL : TextDatumGetCString(d);
		}

		for (i = 0; i < n; i++)
		{
			Check	   *c = &checks[i];

			decide(c);
			if (strcmp(c->verdict, "over_billed") == 0 ||
				strcmp(c->verdict, "under_billed") == 0)
				repair(c);

			/* counters last: the only locks, after every provider call */
			if (c->counters != c->ledger)
			{
				args[0] = Int64GetDatum(c->op.budget_id);
				em_exec(&lock_for_rebuild, args, NULL, 1);
				if (em_mark_try_lock_exclusive(c->op.budget_id))
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
			keep_evidence(c, rsinfo);
		}
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return (Datum) 0;
}
