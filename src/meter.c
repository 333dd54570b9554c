/*-------------------------------------------------------------------------
 *
 * meter.c
 *	  The reporter: sends each marked cycle's absolute total to the
 *	  provider's meter.  A pass has three steps:
 *	  1. claim (a transaction): up to earmark.report_batch marks, oldest
 *	     first, with their cycle's total and ids, each cycle once (writers
 *	     that ran together may have marked a cycle more than once).
 *	     Nothing is locked or deleted, so a worker killed after this step
 *	     loses nothing.
 *	  2. send (no transaction in the worker, no earmark lock anywhere):
 *	     the totals, earmark.report_parallel requests at once.  A closed
 *	     cycle is not sent.
 *	  3. finish (a transaction): log every send in earmark.meter_send;
 *	     delete the marks of a cycle the provider took, but only with the
 *	     cycle's mark lock taken exclusively without waiting and only if
 *	     the total has not moved since step 1 (ledger.c: every writer that
 *	     may have found the mark holds that lock shared until it commits,
 *	     so a mark is never deleted under usage it does not cover); move a
 *	     closed cycle to earmark.meter_review; leave a failed cycle marked,
 *	     behind the others; after a 429, no request before its reset.
 *	  A repeated send sets the same total: absolute writes make every
 *	  step safe to run twice.
 *
 *	  One sender at a time: a pass runs its three steps under the
 *	  database's send lock (em_send_lock), which earmark_reconcile's repairs
 *	  take too.  The meter keeps whichever total reached it last, so two
 *	  senders of a cycle at once could leave the older of their totals
 *	  there, and the later finish would delete the marks that were to send
 *	  the newer one again.  The worker holds the lock for the session,
 *	  from before its claim to after its finish commits, and skips a pass
 *	  while another sender has it; earmark_report() waits for it and holds
 *	  it to the end of its transaction.  Only senders take it: no writer,
 *	  sweep or claim of the inbox ever waits for it.  It is per node: on
 *	  a distributed install the coordinator's worker reports and a repair
 *	  runs on the account's node, and the two are not kept apart
 *	  (docs/api.md, Known issues).
 *
 *	  Tables: earmark.meter_mark, meter_send, meter_review, reporter_state,
 *	  and reads of budget, budget_slot, usage_shard, account.  Locks: the
 *	  send lock (above); the mark lock (exclusive, never waited for) and
 *	  the cycle's mark rows deleted or updated under it; never a budget
 *	  row.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "budget.h"
#include "cluster.h"
#include "earmark.h"
#include "ledger.h"
#include "meter.h"
#include "provider.h"
#include "settings.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_report);

static EmStatement blocked_until = {
	"SELECT blocked_until FROM earmark.reporter_state",
	0, {InvalidOid}
};

/*
 * A cycle may have more than one mark (earmark.sql): the claim walks the
 * marks oldest first by meter_mark_order and claims each cycle once, so
 * that a cycle whose writers each marked it takes one place of the pass,
 * not many.  The walk starts at CLAIM_WALK marks for each cycle to claim
 * and, while the marks it walked were too few cycles and there are more,
 * is made CLAIM_WALK times longer (em_report_claim).  (A pass leaves a
 * cycle it does not clear with one mark, finish_cycle: more than one is
 * left only by writers since the last pass that could take its lock.)
 *
 * A total past bigint reads as NULL here: that cycle fails, not the pass.
 */
#define CLAIM_WALK 4

static EmStatement claim_marks = {
	"SELECT m.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end, "
	"       a.provider_customer, a.provider_agreement, "
	"       CASE WHEN t.tot <= 9223372036854775807 THEN t.tot::bigint END, "
	"       (SELECT x.total FROM earmark.meter_send x "
	"         WHERE x.account = m.account AND x.budget_id = m.budget_id AND x.ok "
	"         ORDER BY x.send_id DESC LIMIT 1), m.account, m.walked "
	"FROM (SELECT r.account, r.budget_id, pg_catalog.min(r.marked_at) AS marked_at, "
	"             (pg_catalog.sum(pg_catalog.count(*)) OVER ())::bigint AS walked "
	"        FROM (SELECT account, budget_id, marked_at FROM earmark.meter_mark "
	"               ORDER BY marked_at, account, budget_id LIMIT $2) r "
	"       GROUP BY r.account, r.budget_id "
	"       ORDER BY 3, 1, 2 LIMIT $1) m "
	"LEFT JOIN earmark.budget b ON b.account = m.account AND b.budget_id = m.budget_id "
	"LEFT JOIN earmark.account a ON a.account = b.account "
	"LEFT JOIN LATERAL (SELECT " EM_CYCLE_TOTAL_NUMERIC_SQL " AS tot) t ON true "
	"ORDER BY m.marked_at, m.account, m.budget_id",
	2, {INT4OID, INT4OID}
};

/*
 * On a distributed install Citus plans no correlated subquery over the
 * whole cluster: the marks are claimed with joins on the account alone
 * (CLAIM_WALK times as many rows as cycles, of which first_of_each_cycle
 * keeps each cycle's first), and each cycle's total and last send are
 * read with a statement of its own that names the account (one shard).
 */
/* the columns of claim_marks (CM_) and of claim_marks_distributed (CD_) */
enum
{
	CM_BUDGET_ID = 1, CM_ACCOUNT, CM_FEATURE, CM_CYCLE_START, CM_CYCLE_END,
	CM_CUSTOMER, CM_AGREEMENT, CM_TOTAL, CM_LAST_SENT, CM_MARK_ACCOUNT, CM_WALKED
};
enum
{
	CD_BUDGET_ID = 1, CD_ACCOUNT, CD_FEATURE, CD_CYCLE_START, CD_CYCLE_END,
	CD_CUSTOMER, CD_AGREEMENT, CD_MARK_ACCOUNT
};

static EmStatement claim_marks_distributed = {
	"SELECT m.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end, "
	"       a.provider_customer, a.provider_agreement, m.account "
	"FROM earmark.meter_mark m "
	"LEFT JOIN earmark.budget b ON b.account = m.account AND b.budget_id = m.budget_id "
	"LEFT JOIN earmark.account a ON a.account = m.account "
	"ORDER BY m.marked_at, m.account, m.budget_id LIMIT $1",
	1, {INT4OID}
};

static EmStatement cycle_total_numeric = {
	"SELECT CASE WHEN t.tot <= 9223372036854775807 THEN t.tot::bigint END FROM ("
	"  SELECT b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s "
	"                             WHERE s.account = $1 AND s.budget_id = $2), 0) "
	"                + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u "
	"                             WHERE u.account = $1 AND u.budget_id = $2), 0) AS tot "
	"    FROM earmark.budget b WHERE b.account = $1 AND b.budget_id = $2) t",
	2, {TEXTOID, INT8OID}
};

static EmStatement last_sent_total = {
	"SELECT total FROM earmark.meter_send WHERE account = $1 AND budget_id = $2 AND ok "
	"ORDER BY send_id DESC LIMIT 1",
	2, {TEXTOID, INT8OID}
};

static EmStatement log_send = {
	"INSERT INTO earmark.meter_send (budget_id, total, origin, ok, http_status, error, duration_ms, account) "
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
	8, {INT8OID, INT8OID, TEXTOID, BOOLOID, INT4OID, TEXTOID, FLOAT8OID, TEXTOID}
};

static EmStatement delete_mark = {
	"DELETE FROM earmark.meter_mark WHERE budget_id = $1 AND account = $2",
	2, {INT8OID, TEXTOID}
};

static EmStatement mark_exists = {
	"SELECT 1 FROM earmark.meter_mark WHERE budget_id = $1 AND account = $2 LIMIT 1",
	2, {INT8OID, TEXTOID}
};

/* the cycle's marks: how many, and the earliest */
static EmStatement count_marks = {
	"SELECT pg_catalog.count(*), pg_catalog.min(marked_at) FROM earmark.meter_mark "
	"WHERE budget_id = $1 AND account = $2",
	2, {INT8OID, TEXTOID}
};

static EmStatement put_mark = {
	"INSERT INTO earmark.meter_mark (budget_id, account, marked_at) VALUES ($1, $2, $3)",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement requeue_mark = {
	"UPDATE earmark.meter_mark SET marked_at = $3 WHERE budget_id = $1 AND account = $2",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement note_review = {
	"INSERT INTO earmark.meter_review AS r (budget_id, account, feature, cycle_start, cycle_end, "
	"                                      ledger_total, last_sent, reason, first_noted, last_noted) "
	"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) "
	"ON CONFLICT (account, budget_id) DO UPDATE SET ledger_total = excluded.ledger_total, "
	"  last_sent = excluded.last_sent, reason = excluded.reason, last_noted = excluded.last_noted",
	9, {INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement note_pass = {
	"UPDATE earmark.reporter_state SET last_pass_at = pg_catalog.now(), "
	"  last_pass_sent = $1, last_pass_failed = $2, last_error = $3, "
	"  blocked_until = CASE WHEN $4 IS NULL THEN blocked_until "
	"                       ELSE GREATEST(blocked_until, $4) END",
	4, {INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID}
};

/* a claimed cycle's row of claim_marks */
static void
read_claimed(EmMeterOp *op, int i, TimestampTz now, MemoryContext cxt)
{
	MemoryContext old;
	bool		isnull;
	Datum		d;

	op->budget_id = em_get_int64(i, CM_BUDGET_ID, 0);
	old = MemoryContextSwitchTo(cxt);
	op->mark_account = TextDatumGetCString(em_get(i, CM_MARK_ACCOUNT, &isnull));
	MemoryContextSwitchTo(old);
	(void) em_get(i, CM_ACCOUNT, &isnull);
	if (isnull)
	{
		/* the cycle is gone (its account was deleted) */
		op->account = NULL;
		return;
	}
	old = MemoryContextSwitchTo(cxt);
	op->account = TextDatumGetCString(em_get(i, CM_ACCOUNT, &isnull));
	op->feature = TextDatumGetCString(em_get(i, CM_FEATURE, &isnull));
	op->cycle_start = DatumGetTimestampTz(em_get(i, CM_CYCLE_START, &isnull));
	op->cycle_end = DatumGetTimestampTz(em_get(i, CM_CYCLE_END, &isnull));
	op->closed = op->cycle_end <= now;
	d = em_get(i, CM_CUSTOMER, &isnull);
	op->customer = isnull ? NULL : TextDatumGetCString(d);
	d = em_get(i, CM_AGREEMENT, &isnull);
	op->agreement = isnull ? NULL : TextDatumGetCString(d);
	(void) em_get(i, CM_TOTAL, &isnull);
	op->total = em_get_int64(i, CM_TOTAL, 0);
	op->too_large = isnull;
	d = em_get(i, CM_LAST_SENT, &isnull);
	op->read_total = isnull ? -1 : DatumGetInt64(d);	/* last sent, for the review */
	MemoryContextSwitchTo(old);
}

/* the same from claim_marks_distributed, then the cycle's own reads */
static void
read_claimed_distributed(EmMeterOp *op, int i, TimestampTz now, MemoryContext cxt)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);
	bool		isnull;
	Datum		d;

	op->budget_id = em_get_int64(i, CD_BUDGET_ID, 0);
	op->mark_account = TextDatumGetCString(em_get(i, CD_MARK_ACCOUNT, &isnull));
	d = em_get(i, CD_ACCOUNT, &isnull);
	op->account = isnull ? NULL : TextDatumGetCString(d);
	if (op->account != NULL)
	{
		op->feature = TextDatumGetCString(em_get(i, CD_FEATURE, &isnull));
		op->cycle_start = DatumGetTimestampTz(em_get(i, CD_CYCLE_START, &isnull));
		op->cycle_end = DatumGetTimestampTz(em_get(i, CD_CYCLE_END, &isnull));
		op->closed = op->cycle_end <= now;
		d = em_get(i, CD_CUSTOMER, &isnull);
		op->customer = isnull ? NULL : TextDatumGetCString(d);
		d = em_get(i, CD_AGREEMENT, &isnull);
		op->agreement = isnull ? NULL : TextDatumGetCString(d);
	}
	MemoryContextSwitchTo(old);
}

static void
read_cycle_numbers(EmMeterOp *op)
{
	Datum		args[2];
	bool		isnull = true;

	args[0] = CStringGetTextDatum(op->account);
	args[1] = Int64GetDatum(op->budget_id);
	em_exec(&cycle_total_numeric, args, NULL, 1);
	if (SPI_processed == 1)
		(void) em_get(0, 1, &isnull);
	op->total = isnull ? 0 : em_get_int64(0, 1, 0);
	op->too_large = isnull;
	em_exec(&last_sent_total, args, NULL, 1);
	op->read_total = SPI_processed == 1 ? em_get_int64(0, 1, -1) : -1;
}

/* a claimed row's cycle and its place in the claim, for first_of_each_cycle */
typedef struct ClaimedRow
{
	int64		budget_id;
	const char *account;
	int			pos;
} ClaimedRow;

static int
claimed_row_cmp(const void *a, const void *b)
{
	const ClaimedRow *x = a;
	const ClaimedRow *y = b;
	int			c;

	if (x->budget_id != y->budget_id)
		return x->budget_id < y->budget_id ? -1 : 1;
	c = strcmp(x->account, y->account);
	if (c != 0)
		return c;
	return x->pos - y->pos;
}

/*
 * The claim's rows with each cycle's first only, in the claim's order, at
 * most max: the number kept.  (Sorted by cycle and place, so that a large
 * claim costs n log n.)
 */
static int
first_of_each_cycle(EmMeterOp *ops, int n, int max)
{
	ClaimedRow *rows = palloc(sizeof(ClaimedRow) * Max(n, 1));
	bool	   *repeat = palloc0(sizeof(bool) * Max(n, 1));
	int			kept = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		rows[i].budget_id = ops[i].budget_id;
		rows[i].account = ops[i].mark_account;
		rows[i].pos = i;
	}
	qsort(rows, n, sizeof(ClaimedRow), claimed_row_cmp);
	for (i = 1; i < n; i++)
		repeat[rows[i].pos] = rows[i].budget_id == rows[i - 1].budget_id &&
			strcmp(rows[i].account, rows[i - 1].account) == 0;
	for (i = 0; i < n && kept < max; i++)
		if (!repeat[i])
			ops[kept++] = ops[i];
	pfree(rows);
	pfree(repeat);
	return kept;
}

/*
 * One claim over a walk of at most walk marks: the cycles, each once, at
 * most max_cycles, into *ops_out (the caller's context); *walked is the
 * number of marks walked (on Citus, the rows: one a mark).
 */
static int
claim_walk(int max_cycles, int walk, TimestampTz now, EmMeterOp **ops_out,
		   int64 *walked, MemoryContext cxt)
{
	bool		distributed = em_distributed();
	Datum		args[2];
	EmMeterOp  *ops;
	int			n;
	int			i;

	args[0] = Int32GetDatum(distributed ? walk : max_cycles);
	args[1] = Int32GetDatum(walk);
	em_exec(distributed ? &claim_marks_distributed : &claim_marks, args, NULL, 0);
	n = (int) SPI_processed;
	*walked = distributed ? n : (n > 0 ? em_get_int64(0, CM_WALKED, 0) : 0);
	ops = MemoryContextAllocZero(cxt, sizeof(EmMeterOp) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (distributed)
			read_claimed_distributed(&ops[i], i, now, cxt);
		else
			read_claimed(&ops[i], i, now, cxt);
	}
	*ops_out = ops;
	/* (the single node's statement claims each cycle once itself) */
	return distributed ? first_of_each_cycle(ops, n, max_cycles) : n;
}

/*
 * Step 1: the marked cycles, in memory of the caller's context.  Returns
 * -1 while the provider's 429 reset has not passed.  A walk that found
 * fewer cycles than max_cycles while more marks were left (one cycle's
 * marks filled it) is made CLAIM_WALK times longer, until it finds them
 * or walks every mark.
 */
int
em_report_claim(int max_cycles, TimestampTz now, EmMeterOp **ops_out,
				MemoryContext cxt)
{
	bool		isnull;
	int64		walk = (int64) max_cycles * CLAIM_WALK;
	int64		walked;
	EmMeterOp  *ops;
	int			n;
	int			i;
	Datum		d;

	em_exec(&blocked_until, NULL, NULL, 1);
	d = em_get(0, 1, &isnull);
	if (!isnull && DatumGetTimestampTz(d) > now)
		return -1;

	for (;;)
	{
		walk = Min(walk, PG_INT32_MAX);
		n = claim_walk(max_cycles, (int) walk, now, &ops, &walked, cxt);
		if (n >= max_cycles || walked < walk || walk == PG_INT32_MAX)
			break;
		pfree(ops);
		walk *= CLAIM_WALK;
	}
	/* (the claim's result is read whole before these replace it) */
	if (em_distributed())
		for (i = 0; i < n; i++)
			if (ops[i].account != NULL)
				read_cycle_numbers(&ops[i]);
	*ops_out = ops;
	return n;
}

/* Step 2: send the open cycles' totals (no transaction needed). */
void
em_report_send(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg)
{
	EmMeterOp **open_ops = palloc(sizeof(EmMeterOp *) * Max(n, 1));
	EmMeterOp  *batch;
	int			m = 0;
	int			i;

	for (i = 0; i < n; i++)
		if (ops[i].account != NULL && !ops[i].closed && !ops[i].too_large)
			open_ops[m++] = &ops[i];
	if (m == 0)
		return;
	batch = palloc(sizeof(EmMeterOp) * m);
	for (i = 0; i < m; i++)
		batch[i] = *open_ops[i];
	em_meter_write(batch, m, tick, tick_arg);
	for (i = 0; i < m; i++)
	{
		int64		last_sent = open_ops[i]->read_total;

		*open_ops[i] = batch[i];
		open_ops[i]->read_total = last_sent;
	}
}

/* ---------------------------------------------------------------------
 * The send lock (see the file header)
 * ---------------------------------------------------------------------
 */

/*
 * The fourth key 3 is one no SQL function makes (pg_advisory_lock's forms
 * use 1 and 2): an application's advisory locks never meet it.
 */
static void
send_locktag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, EARMARK_SEND_CLASS, 0, EARMARK_SEND_LOCKTAG);
}

/* whether this backend holds the lock for its session */
static bool send_lock_session = false;

/* until the transaction ends; waits for the sender that has it */
void
em_send_lock(void)
{
	LOCKTAG		tag;

	send_locktag(&tag);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * Give back the transaction's lock before the transaction ends (the
 * current resource owner must be the one that took it).  For a sender
 * whose writes after its sends are held under other locks to the end of
 * the transaction (earmark_reconcile: the mark after a repair).
 */
void
em_send_unlock(void)
{
	LOCKTAG		tag;

	send_locktag(&tag);
	(void) LockRelease(&tag, ExclusiveLock, false);
}

/* for the session, without waiting: false when another sender has it */
bool
em_send_try_lock_session(void)
{
	LOCKTAG		tag;

	Assert(!send_lock_session);
	send_locktag(&tag);
	if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	/* remembered only once taken: an unlock of a lock not held warns */
	send_lock_session = true;
	return true;
}

/* give the session's lock back, if this backend holds it */
void
em_send_unlock_session(void)
{
	LOCKTAG		tag;

	if (!send_lock_session)
		return;
	send_lock_session = false;
	send_locktag(&tag);
	(void) LockRelease(&tag, ExclusiveLock, true);
}

/* log one send (the reconciler's repairs too) */
void
em_log_send(EmMeterOp *op, const char *origin)
{
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

	args[0] = Int64GetDatum(op->budget_id);
	args[1] = Int64GetDatum(op->total);
	args[2] = CStringGetTextDatum(origin);
	args[3] = BoolGetDatum(op->ok);
	args[4] = Int32GetDatum((int32) op->http_status);
	nulls[4] = op->http_status == 0 ? 'n' : ' ';
	args[5] = op->error ? CStringGetTextDatum(op->error) : (Datum) 0;
	nulls[5] = op->error ? ' ' : 'n';
	args[6] = Float8GetDatum(op->elapsed_ms);
	args[7] = CStringGetTextDatum(op->account);
	em_exec(&log_send, args, nulls, 0);
}

static void note_for_review(EmMeterOp *op, TimestampTz now);

/*
 * Under the cycle's exclusive mark lock (no writer of it is running), for
 * a cycle whose total the provider may not have: its marks made one, which
 * keeps the earliest marked_at, or (to_back) is moved behind the others,
 * to now.
 * Writers that ran together may each have inserted one (earmark.sql); left
 * so, each would take a row of every claim's walk.  No mark left is a mark
 * at now: another sender deleted them after sending a later total, and
 * this pass's send may have reached the provider after that one.  The
 * send lock keeps that from happening on one node; on a distributed
 * install a repair on the account's node is not kept apart from the
 * coordinator's pass (the file header).
 */
static void
one_mark(Datum *arg, bool to_back, TimestampTz now)
{
	int64		marks;
	bool		isnull;
	TimestampTz at = now;

	em_exec(&count_marks, arg, NULL, 1);
	marks = em_get_int64(0, 1, 0);
	if (marks == 0)
	{
		arg[2] = TimestampTzGetDatum(now);
		em_exec(&put_mark, arg, NULL, 0);
		return;
	}
	if (marks == 1)
	{
		if (to_back)
		{
			arg[2] = TimestampTzGetDatum(now);
			em_exec(&requeue_mark, arg, NULL, 0);
		}
		return;
	}
	if (!to_back)
		at = DatumGetTimestampTz(em_get(0, 2, &isnull));
	em_exec(&delete_mark, arg, NULL, 0);
	arg[2] = TimestampTzGetDatum(at);
	em_exec(&put_mark, arg, NULL, 0);
}

/*
 * Step 3 for one cycle, on the node that holds its account: log the send;
 * then, with the cycle's mark lock taken exclusively without waiting (a
 * writer that holds it shared is still running: the marks stay as they
 * are, for a later pass): delete the marks of a cycle the provider took,
 * if its total did not move; list a closed cycle for review; mark a failed
 * one again, behind the others; leave one mark otherwise (one_mark).
 */
static void
finish_cycle(EmMeterOp *op, TimestampTz now)
{
	Datum		arg[3];
	bool		found;

	arg[0] = Int64GetDatum(op->budget_id);
	arg[1] = CStringGetTextDatum(op->mark_account);
	arg[2] = TimestampTzGetDatum(now);
	if (op->account == NULL)
	{
		/* the cycle is gone (its account was deleted) */
		em_exec(&delete_mark, arg, NULL, 0);
		return;
	}
	if (op->too_large)
	{
		/* logged and marked again, behind the others: it blocks nobody */
		op->ok = false;
		op->error = "the cycle's total is past the largest bigint: not sent";
	}
	else if (op->closed)
	{
		/* never written: listed for a person, who decides */
		if (em_mark_try_lock_exclusive(op->budget_id))
		{
			note_for_review(op, now);
			em_exec(&delete_mark, arg, NULL, 0);
		}
		return;
	}

	em_log_send(op, "report");
	if (!em_mark_try_lock_exclusive(op->budget_id))
		return;
	/*
	 * The total after the lock, in a snapshot that sees every writer that
	 * held it: on Citus the call may run at the node's REPEATABLE READ.
	 */
	if (op->ok &&
		em_cycle_total(cstring_to_text(op->account), op->budget_id, true, &found) == op->total)
		em_exec(&delete_mark, arg, NULL, 0);
	else if (op->ok)
		one_mark(arg, false, now);	/* usage arrived meanwhile: it keeps its place */
	else
		one_mark(arg, true, now);	/* behind the cycles that wait */
}

/* a closed cycle that changed after it closed, for a person */
static void
note_for_review(EmMeterOp *op, TimestampTz now)
{
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		found;

	args[0] = Int64GetDatum(op->budget_id);
	args[1] = CStringGetTextDatum(op->account);
	args[2] = CStringGetTextDatum(op->feature);
	args[3] = TimestampTzGetDatum(op->cycle_start);
	args[4] = TimestampTzGetDatum(op->cycle_end);
	args[5] = Int64GetDatum(em_cycle_total(cstring_to_text(op->account), op->budget_id, false, &found));
	args[6] = Int64GetDatum(op->read_total);
	nulls[6] = op->read_total < 0 ? 'n' : ' ';
	args[7] = CStringGetTextDatum("The cycle closed before its last total reached the meter; "
								  "a closed cycle is not written.");
	args[8] = TimestampTzGetDatum(now);
	em_exec(&note_review, args, nulls, 0);
}

/* on a distributed install: a cycle's step 3, on its account's node */
static EmStatement call_report_cycle = {
	"SELECT earmark.report_cycle($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
	14, {TEXTOID, INT8OID, TEXTOID, INT8OID, BOOLOID, INT4OID, TEXTOID, FLOAT8OID, BOOLOID,
	BOOLOID, INT8OID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static void
finish_cycle_delegated(EmMeterOp *op)
{
	Datum		args[14];
	char		nulls[14];

	memset(nulls, ' ', sizeof(nulls));
	args[0] = CStringGetTextDatum(op->mark_account);
	args[1] = Int64GetDatum(op->budget_id);
	args[2] = op->account ? CStringGetTextDatum(op->account) : (Datum) 0;
	nulls[2] = op->account ? ' ' : 'n';
	args[3] = Int64GetDatum(op->total);
	args[4] = BoolGetDatum(op->ok);
	args[5] = Int32GetDatum((int32) op->http_status);
	args[6] = op->error ? CStringGetTextDatum(op->error) : (Datum) 0;
	nulls[6] = op->error ? ' ' : 'n';
	args[7] = Float8GetDatum(op->elapsed_ms);
	args[8] = BoolGetDatum(op->closed);
	args[9] = BoolGetDatum(op->too_large);
	args[10] = Int64GetDatum(op->read_total);
	args[11] = op->account ? CStringGetTextDatum(op->feature) : (Datum) 0;
	nulls[11] = op->account ? ' ' : 'n';
	args[12] = TimestampTzGetDatum(op->cycle_start);
	args[13] = TimestampTzGetDatum(op->cycle_end);
	em_exec(&call_report_cycle, args, nulls, 1);
	if (op->too_large)
	{
		op->ok = false;
		op->error = "the cycle's total is past the largest bigint: not sent";
	}
}

/*
 * earmark.report_cycle(...): a cycle's step 3, for the worker on a
 * distributed install, which calls it on its own so that Citus runs it
 * on the account's node, where the cycle's writers take its mark lock.
 */
PG_FUNCTION_INFO_V1(earmark_report_cycle);
Datum
earmark_report_cycle(PG_FUNCTION_ARGS)
{
	EmMeterOp	op;
	int			i;
	Datum		key[2];

	em_require_schema();
	/* cycle_account, error and feature may be NULL; nothing else */
	for (i = 0; i < PG_NARGS(); i++)
	{
		if (PG_ARGISNULL(i) && i != 2 && i != 6 && i != 11)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("earmark.report_cycle: argument %d must not be NULL", i + 1),
					 errdetail("earmark.report_cycle is the worker's own step; an application does not call it.")));
	}
	memset(&op, 0, sizeof(op));
	op.mark_account = text_to_cstring(em_arg_name(fcinfo, 0, "account"));
	op.budget_id = PG_GETARG_INT64(1);
	op.account = PG_ARGISNULL(2) ? NULL :
		text_to_cstring(em_arg_name(fcinfo, 2, "cycle_account"));
	if (op.account != NULL && strcmp(op.account, op.mark_account) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("earmark.report_cycle: cycle_account must be the account or NULL")));
	op.total = PG_GETARG_INT64(3);
	op.ok = PG_GETARG_BOOL(4);
	op.http_status = PG_GETARG_INT32(5);
	op.error = PG_ARGISNULL(6) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(6));
	op.elapsed_ms = PG_GETARG_FLOAT8(7);
	op.closed = PG_GETARG_BOOL(8);
	op.too_large = PG_GETARG_BOOL(9);
	op.read_total = PG_GETARG_INT64(10);
	/* a live cycle's send is logged under its feature */
	if (op.account != NULL && PG_ARGISNULL(11))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("earmark.report_cycle: feature must not be NULL when cycle_account is given"),
				 errdetail("feature may be NULL only for the cycle of a deleted account (cycle_account NULL).")));
	op.feature = PG_ARGISNULL(11) ? NULL : text_to_cstring(em_arg_name(fcinfo, 11, "feature"));
	op.cycle_start = PG_GETARG_TIMESTAMPTZ(12);
	op.cycle_end = PG_GETARG_TIMESTAMPTZ(13);
	em_require_account_local(cstring_to_text(op.mark_account));
	SPI_connect();
	/* a cycle that is not marked (any more) has nothing to finish */
	key[0] = Int64GetDatum(op.budget_id);
	key[1] = CStringGetTextDatum(op.mark_account);
	em_exec(&mark_exists, key, NULL, 1);
	if (SPI_processed == 1)
		finish_cycle(&op, GetCurrentTimestamp());
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * Step 3.  Returns the number of cycles the provider took; *failed the
 * number it did not.
 */
int
em_report_finish(EmMeterOp *ops, int n, TimestampTz now, int *failed)
{
	int			sent = 0;
	int			i;
	TimestampTz retry_at = 0;
	bool		saw_429 = false;
	char	   *last_error = NULL;
	bool		distributed = em_distributed();
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	*failed = 0;
	for (i = 0; i < n; i++)
	{
		EmMeterOp  *op = &ops[i];

		if (distributed)
			finish_cycle_delegated(op);
		else
			finish_cycle(op, now);
		if (op->account == NULL || (op->closed && !op->too_large))
			continue;
		if (op->ok)
			sent++;
		else
		{
			(*failed)++;
			last_error = op->error;
			/* the 429 itself, and the requests held back after it */
			if (op->http_status == 429)
			{
				saw_429 = true;
				retry_at = Max(retry_at, op->retry_at);
			}
		}
	}

	args[0] = Int32GetDatum(sent);
	args[1] = Int32GetDatum(*failed);
	args[2] = last_error ? CStringGetTextDatum(last_error) : (Datum) 0;
	nulls[2] = last_error ? ' ' : 'n';
	nulls[3] = 'n';
	if (saw_429)
	{
		/*
		 * The provider's reset as it gave it (counted from its answer, not
		 * from now: a slow pass would otherwise wait longer than asked); no
		 * reset given, one report interval.
		 */
		if (retry_at == 0)
			retry_at = now + (TimestampTz) earmark_report_interval_s * USECS_PER_SEC;
		args[3] = TimestampTzGetDatum(retry_at);
		nulls[3] = ' ';
	}
	em_exec(&note_pass, args, nulls, 0);
	return sent;
}

/*
 * earmark_report(max_cycles): one report pass now, in the caller's
 * transaction (the worker runs the same steps in three).  Returns the
 * number of cycles the provider took, or NULL while a 429's reset has not
 * passed.
 */
Datum
earmark_report(PG_FUNCTION_ARGS)
{
	int			max_cycles;
	TimestampTz now;
	EmMeterOp  *ops;
	int			n;
	int			failed;
	int			sent;

	em_require_schema();
	max_cycles = PG_ARGISNULL(0) ? earmark_report_batch : PG_GETARG_INT32(0);
	if (max_cycles < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_cycles must be at least 1")));
	em_require_read_committed("earmark_report");
	if (em_distributed())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("earmark_report reports from one node; earmark is distributed"),
				 errdetail("On a distributed install the background worker on the coordinator reports, each cycle's last step on its account's node."),
				 errhint("Let the worker report (earmark.report_interval).")));
	/*
	 * The report takes cycles' mark locks exclusively and holds them until
	 * its transaction ends; in an open transaction block they would stay
	 * taken, and every writer of those cycles that may find the mark (a
	 * reserve's reclaim, a settle) would wait for them.
	 */
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("earmark_report cannot run inside a transaction block"),
				 errdetail("It holds the locks of the cycles it reports until its transaction ends, and writers of those cycles would wait for them."),
				 errhint("Call it on its own, outside BEGIN ... COMMIT.")));
	em_require_no_writes("earmark_report");
	/* after the worker's pass or a reconciliation's repairs (the file header) */
	em_send_lock();
	/*
	 * The time after the wait: a cycle that closed while another sender
	 * had the lock goes to review, it is not sent.
	 */
	now = GetCurrentTimestamp();
	SPI_connect();
	n = em_report_claim(max_cycles, now, &ops, CurrentMemoryContext);
	if (n < 0)
	{
		SPI_finish();
		PG_RETURN_NULL();
	}
	em_report_send(ops, n, NULL, NULL);
	sent = em_report_finish(ops, n, GetCurrentTimestamp(), &failed);
	SPI_finish();
	PG_RETURN_INT32(sent);
}
