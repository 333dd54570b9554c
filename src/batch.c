/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  The batch forms of the gate and the ledger: earmark_record_usage_many,
 *	  earmark_reserve_many and earmark_settle_many.  Each takes one account
 *	  and parallel arrays, and returns a row per element (ord, 1-based).
 *
 *	  The rule: a batch does exactly what the same single calls would do
 *	  one after another in one transaction, in array order.  Each element is
 *	  checked as its single call checks its arguments, with the same
 *	  SQLSTATE, and an error in any element fails the whole call (the error
 *	  names the element in its CONTEXT): like an error in one of those single
 *	  calls, it leaves nothing of the call.  There are no per-element
 *	  subtransactions.
 *
 *	  reserve and settle run the single calls' steps (gate.c) once per
 *	  element in one SPI connection: the gain is one statement, one round
 *	  trip and one commit for the lot.  Their locks are the single calls'
 *	  (gate.c), held until the transaction ends, so a batch of reserves holds
 *	  the budget row from its first admission on.
 *
 *	  record_usage takes the account's advisory lock (shared) once, looks
 *	  each cycle's budget row up once, and writes the events' ledger rows,
 *	  counters and marks in one statement per run of events (entries.c's
 *	  key row, for many rows: the cycle's mark lock in share mode, then one
 *	  counter row per cycle).  A key the ledger has already is found by that
 *	  write (its row is not written) and then checked as a repeat, as the
 *	  single call's first step would have: the batch reads the key index
 *	  once per event, not twice.  What has to see the events before it goes
 *	  through the single call's steps after the events before it are
 *	  written: a correction (its check against the cycle's total), and a key
 *	  repeated within the batch (its repeat check).  The key is looked up
 *	  first wherever the single call's later steps would change something
 *	  for a repeat: a correction's check, and a new cycle's budget row.
 *
 *	  Tables: earmark.ledger_entry (its rows, with their counters and marks,
 *	  written through entries.c); the rest
 *	  through the single calls' steps (gate.c, ledger.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "account.h"
#include "budget.h"
#include "cluster.h"
#include "earmark.h"
#include "entries.h"
#include "gate.h"
#include "ledger.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_record_usage_many);
PG_FUNCTION_INFO_V1(earmark_reserve_many);
PG_FUNCTION_INFO_V1(earmark_settle_many);

/* events written by one statement at most: a cycle's sum stays far from bigint's end */
#define FLUSH_EVENTS	1000

/* ---------------------------------------------------------------------
 * Arrays and the element an error is about
 * ---------------------------------------------------------------------
 */
typedef struct EmArray
{
	int			n;				/* -1: the argument is NULL */
	Datum	   *values;
	bool	   *nulls;
} EmArray;

/* the element being checked or run, for an error's CONTEXT line */
typedef struct BatchContext
{
	const char *fname;
	int			ord;			/* 0: none */
} BatchContext;

static void
batch_error_context(void *arg)
{
	BatchContext *c = (BatchContext *) arg;

	if (c->ord > 0)
		errcontext("%s, element %d", c->fname, c->ord);
}

/*
 * SPI keeps every statement's result until SPI_finish: a long batch lets
 * them go every so often.  (The statements' plans are kept across it.)
 */
static void
spi_reconnect(void)
{
	SPI_finish();
	SPI_connect();
}

#define RECONNECT_EVERY	64

/* an array argument, one-dimensional; NULL gives n = -1 unless required */
static EmArray
arg_array(FunctionCallInfo fcinfo, int argno, const char *what, Oid elemtype,
		  bool required)
{
	EmArray		a = {-1, NULL, NULL};
	ArrayType  *arr;
	int16		len;
	bool		byval;
	char		align;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be NULL", what)));
		return a;
	}
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", what)));
	get_typlenbyvalalign(elemtype, &len, &byval, &align);
	deconstruct_array(arr, elemtype, len, byval, align, &a.values, &a.nulls, &a.n);
	return a;
}

/* an optional array, when given, has the first array's length */
static void
same_length(EmArray *first, const char *first_name, EmArray *other, const char *name)
{
	if (other->n < 0 || other->n == first->n)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s and %s must have the same length", first_name, name),
			 errdetail("%s has %d elements, %s has %d.", first_name, first->n, name, other->n),
			 errhint("Pass one element per event in each array, or NULL for an optional one.")));
}

/* element i, which must not be NULL (the single call's message) */
static Datum
element(EmArray *a, int i, const char *what)
{
	if (a->nulls[i])
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return a->values[i];
}

/* a feature: the element, or 'default' when the array is NULL */
static text *
element_feature(EmArray *features, int i, text *dflt)
{
	if (features->n < 0)
		return dflt;
	return em_check_name(DatumGetTextPP(element(features, i, "feature")), "feature");
}

/* ---------------------------------------------------------------------
 * earmark_record_usage_many(account, units[], idempotency_keys[],
 *	  features[], occurred_at[]) RETURNS TABLE (ord, idempotency_key, recorded)
 * ---------------------------------------------------------------------
 */
typedef struct UsageEvent
{
	text	   *key;
	text	   *feature;
	int64		units;
	TimestampTz occurred_at;
	int64		budget_id;
	TimestampTz cycle_start;
	bool		seen;			/* the key is in the ledger, or earlier in the batch */
	bool		recorded;
} UsageEvent;

/* a cycle's budget row, found once per call */
typedef struct UsageBudget
{
	text	   *feature;
	TimestampTz start;
	int64		budget_id;
} UsageBudget;

typedef struct UsageBatch
{
	text	   *account;
	UsageEvent *ev;
	int			n;
	int		   *pending;		/* new events not written yet, in array order */
	int			npending;
	UsageBudget *budgets;
	int			nbudgets;
	TimestampTz now;
	BatchContext *ctx;
} UsageBatch;

static UsageEvent *sort_events;

static int
cmp_event_keys(const void *a, const void *b)
{
	int			ia = *(const int *) a;
	int			ib = *(const int *) b;
	int			c = em_text_cmp(sort_events[ia].key, sort_events[ib].key);

	return c != 0 ? c : (ia > ib) - (ia < ib);
}

/*
 * The events whose key came earlier in the batch (sorted by key): those go
 * through the single call's repeat check once the events before them are
 * written.  A key the ledger has already is found by the write itself
 * (flush_pending), or looked up first where the single call's next step
 * must not run for a repeat (new_usage).
 */
static void
mark_repeated_keys(UsageBatch *ub)
{
	int		   *order = palloc(sizeof(int) * ub->n);
	int			i;

	for (i = 0; i < ub->n; i++)
		order[i] = i;
	sort_events = ub->ev;
	qsort(order, ub->n, sizeof(int), cmp_event_keys);
	for (i = 1; i < ub->n; i++)
	{
		if (em_text_eq(ub->ev[order[i - 1]].key, ub->ev[order[i]].key))
			ub->ev[order[i]].seen = true;
	}
	pfree(order);
}

/*
 * Write the pending events: their cycles' mark locks (shared, as a single
 * call takes it) and which of the cycles are marked already (em_mark_seen),
 * then one statement (em_entry_keys, entries.c: the rows, one counter row
 * per cycle and the marks of the others).  An event whose key
 * another transaction wrote meanwhile is a repeat of it (or EM001), as in
 * a single call.
 */
static void
flush_pending(UsageBatch *ub)
{
	int			n = ub->npending;
	Datum	   *budget_ids;
	Datum	   *units;
	Datum	   *keys;
	Datum	   *times;
	bool	   *written;
	Datum	   *marked;
	int			nmarked = 0;
	int			i;

	if (n == 0)
		return;
	ub->ctx->ord = 0;			/* the statement is about all of them */
	budget_ids = palloc(sizeof(Datum) * n);
	units = palloc(sizeof(Datum) * n);
	keys = palloc(sizeof(Datum) * n);
	times = palloc(sizeof(Datum) * n);
	written = palloc(sizeof(bool) * n);
	for (i = 0; i < n; i++)
	{
		UsageEvent *e = &ub->ev[ub->pending[i]];

		budget_ids[i] = Int64GetDatum(e->budget_id);
		units[i] = Int64GetDatum(e->units);
		keys[i] = PointerGetDatum(e->key);
		times[i] = TimestampTzGetDatum(e->occurred_at);
	}
	marked = palloc(sizeof(Datum) * Max(ub->nbudgets, 1));
	for (i = 0; i < ub->nbudgets; i++)
	{
		em_mark_lock(ub->budgets[i].budget_id);
		if (em_mark_seen(ub->account, ub->budgets[i].budget_id))
			marked[nmarked++] = Int64GetDatum(ub->budgets[i].budget_id);
	}
	em_entry_keys(ub->account, n, budget_ids, units, keys, times, nmarked, marked,
				  em_usage_shard(),
				  ub->now, written);
	for (i = 0; i < n; i++)
	{
		if (written[i])
			ub->ev[ub->pending[i]].recorded = true;
	}

	/*
	 * keys the ledger had (the call's repeats) or a concurrent transaction
	 * wrote first: the same usage, or EM001
	 */
	for (i = 0; i < n; i++)
	{
		UsageEvent *e = &ub->ev[ub->pending[i]];

		if (e->recorded)
			continue;
		ub->ctx->ord = ub->pending[i] + 1;
		if (!em_usage_repeat(ub->account, e->key, e->units, e->feature))
			elog(ERROR, "earmark: ledger row of key \"%s\" vanished", text_to_cstring(e->key));
	}
	ub->npending = 0;
}

/* remember a cycle's budget row for the rest of the call */
static UsageBudget *
add_cycle(UsageBatch *ub, text *feature, TimestampTz start, int64 budget_id)
{
	UsageBudget *b = &ub->budgets[ub->nbudgets++];

	b->feature = feature;
	b->start = start;
	b->budget_id = budget_id;
	return b;
}

/*
 * The budget row of a cycle the call has used, or that exists already (one
 * look-up per cycle and call); NULL when the cycle has no budget row yet.
 */
static UsageBudget *
known_cycle(UsageBatch *ub, text *feature, TimestampTz start)
{
	int64		budget_id;
	int			i;

	for (i = 0; i < ub->nbudgets; i++)
	{
		UsageBudget *b = &ub->budgets[i];

		if (b->start == start && em_text_eq(b->feature, feature))
			return b;
	}
	if (!em_budget_find(ub->account, feature, start, &budget_id))
		return NULL;
	return add_cycle(ub, feature, start, budget_id);
}

/*
 * The event's cycle, and whether the event is usage to write (false: a
 * repeat of a key the ledger has).  Most events go to the write at once:
 * a key the ledger has already is found there (ON CONFLICT DO NOTHING) and
 * checked as a repeat after it, which is what the single call's first
 * step would have found.  Where the single call's next steps would change
 * something for a repeat, the key is looked up first, as there: before a
 * new cycle's budget row is created, and before a correction's check.
 * The events before it are written (and checked) before either: a
 * correction is checked against them, and their errors come first, as
 * the single calls' would (an earlier repeat's EM001, not a later cycle's
 * wait for its budget row or 40001).
 */
static bool
new_usage(UsageBatch *ub, int i, bool has_anchor, TimestampTz anchor)
{
	UsageEvent *e = &ub->ev[i];
	UsageBudget *b;
	TimestampTz end;

	em_cycle_bounds(anchor, has_anchor, e->occurred_at, &e->cycle_start, &end);
	b = known_cycle(ub, e->feature, e->cycle_start);
	if (b != NULL && e->units > 0)
	{
		e->budget_id = b->budget_id;
		return true;
	}
	flush_pending(ub);
	ub->ctx->ord = i + 1;
	if (em_usage_repeat(ub->account, e->key, e->units, e->feature))
		return false;
	if (b == NULL)
		b = add_cycle(ub, e->feature, e->cycle_start,
					  em_usage_budget(ub->account, e->feature, e->cycle_start, end));
	e->budget_id = b->budget_id;
	if (e->units < 0)
		em_usage_check_correction(ub->account, e->budget_id, e->units, e->cycle_start);
	return true;
}

/* run the events in array order */
static void
record_events(UsageBatch *ub)
{
	bool		has_anchor;
	TimestampTz anchor;
	int			i;

	em_usage_lock_anchor(ub->account, &has_anchor, &anchor);
	mark_repeated_keys(ub);
	for (i = 0; i < ub->n; i++)
	{
		UsageEvent *e = &ub->ev[i];

		if (e->seen)
		{
			/* the key's first event must be in the ledger for the check */
			flush_pending(ub);
			ub->ctx->ord = i + 1;
			if (!em_usage_repeat(ub->account, e->key, e->units, e->feature))
				elog(ERROR, "earmark: ledger row of key \"%s\" vanished", text_to_cstring(e->key));
			continue;
		}
		ub->ctx->ord = i + 1;
		if (new_usage(ub, i, has_anchor, anchor))
			ub->pending[ub->npending++] = i;
		if (ub->npending >= FLUSH_EVENTS)
			flush_pending(ub);
		if (i % FLUSH_EVENTS == FLUSH_EVENTS - 1)
			spi_reconnect();
	}
	flush_pending(ub);
	ub->ctx->ord = 0;
}

Datum
earmark_record_usage_many(PG_FUNCTION_ARGS)
{
	BatchContext ctx = {"earmark_record_usage_many", 0};
	ErrorContextCallback errcb;
	UsageBatch	ub;
	EmArray		units;
	EmArray		keys;
	EmArray		features;
	EmArray		times;
	text	   *dflt = cstring_to_text("default");
	TimestampTz dflt_time = GetCurrentTransactionStartTimestamp();
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	em_require_schema();
	memset(&ub, 0, sizeof(ub));
	ub.account = em_arg_name(fcinfo, 0, "account");
	units = arg_array(fcinfo, 1, "units", INT8OID, true);
	keys = arg_array(fcinfo, 2, "idempotency_keys", TEXTOID, true);
	features = arg_array(fcinfo, 3, "features", TEXTOID, false);
	times = arg_array(fcinfo, 4, "occurred_at", TIMESTAMPTZOID, false);
	same_length(&units, "units", &keys, "idempotency_keys");
	same_length(&units, "units", &features, "features");
	same_length(&units, "units", &times, "occurred_at");
	ub.now = GetCurrentTimestamp();
	ub.n = units.n;
	ub.ev = palloc0(sizeof(UsageEvent) * Max(ub.n, 1));
	ub.pending = palloc(sizeof(int) * Max(ub.n, 1));
	ub.budgets = palloc(sizeof(UsageBudget) * Max(ub.n, 1));
	ub.ctx = &ctx;

	errcb.callback = batch_error_context;
	errcb.arg = &ctx;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	for (i = 0; i < ub.n; i++)
	{
		UsageEvent *e = &ub.ev[i];

		/* the single call's checks, in its order */
		ctx.ord = i + 1;
		e->units = DatumGetInt64(element(&units, i, "units"));
		e->key = em_check_name(DatumGetTextPP(element(&keys, i, "idempotency_key")),
							   "idempotency_key");
		e->feature = element_feature(&features, i, dflt);
		e->occurred_at = times.n < 0 ? dflt_time :
			DatumGetTimestampTz(element(&times, i, "occurred_at"));
		em_usage_check(e->units, e->occurred_at, ub.now);
	}
	ctx.ord = 0;
	em_require_account_local(ub.account);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (ub.n > 0)
	{
		SPI_connect();
		record_events(&ub);
		SPI_finish();
	}
	error_context_stack = errcb.previous;

	for (i = 0; i < ub.n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = PointerGetDatum(ub.ev[i].key);
		values[2] = BoolGetDatum(ub.ev[i].recorded);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_reserve_many(account, amounts[], idempotency_keys[], features[],
 *	  lease) RETURNS TABLE (ord, idempotency_key, job_id, admitted,
 *	  remaining, reason)
 * ---------------------------------------------------------------------
 */

Datum
earmark_reserve_many(PG_FUNCTION_ARGS)
{
	BatchContext ctx = {"earmark_reserve_many", 0};
	ErrorContextCallback errcb;
	text	   *account;
	EmArray		amounts;
	EmArray		keys;
	EmArray		features;
	Interval   *lease;
	text	   *dflt = cstring_to_text("default");
	int64	   *amount;
	text	  **key;
	text	  **feature;
	EmReserveAnswer *answers;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	amounts = arg_array(fcinfo, 1, "amounts", INT8OID, true);
	keys = arg_array(fcinfo, 2, "idempotency_keys", TEXTOID, true);
	features = arg_array(fcinfo, 3, "features", TEXTOID, false);
	same_length(&amounts, "amounts", &keys, "idempotency_keys");
	same_length(&amounts, "amounts", &features, "features");
	/* the lease for every job of the call: earmark_reserve's rule */
	lease = em_arg_lease(fcinfo, 4, GetCurrentTimestamp());
	amount = palloc(sizeof(int64) * Max(amounts.n, 1));
	key = palloc(sizeof(text *) * Max(amounts.n, 1));
	feature = palloc(sizeof(text *) * Max(amounts.n, 1));
	answers = palloc0(sizeof(EmReserveAnswer) * Max(amounts.n, 1));

	errcb.callback = batch_error_context;
	errcb.arg = &ctx;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	for (i = 0; i < amounts.n; i++)
	{
		ctx.ord = i + 1;
		amount[i] = DatumGetInt64(element(&amounts, i, "amount"));
		key[i] = em_check_name(DatumGetTextPP(element(&keys, i, "idempotency_key")),
							   "idempotency_key");
		feature[i] = element_feature(&features, i, dflt);
		if (amount[i] <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("amount must be greater than zero"),
					 errdetail("The value given was " INT64_FORMAT ".", amount[i])));
	}
	ctx.ord = 0;
	em_require_account_local(account);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (amounts.n > 0)
	{
		SPI_connect();
		for (i = 0; i < amounts.n; i++)
		{
			ctx.ord = i + 1;
			if (i > 0 && i % RECONNECT_EVERY == 0)
				spi_reconnect();
			em_reserve_one(account, amount[i], key[i], feature[i], lease,
						   GetCurrentTimestamp(), &answers[i]);
		}
		SPI_finish();
	}
	error_context_stack = errcb.previous;

	for (i = 0; i < amounts.n; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = PointerGetDatum(key[i]);
		values[2] = Int64GetDatum(answers[i].job_id);
		nulls[2] = !answers[i].admitted;
		values[3] = BoolGetDatum(answers[i].admitted);
		values[4] = Int64GetDatum(answers[i].remaining);
		nulls[4] = answers[i].unlimited;
		values[5] = answers[i].has_reason ? CStringGetTextDatum(answers[i].reason) : (Datum) 0;
		nulls[5] = !answers[i].has_reason;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_settle_many(account, job_ids[], used[], outcomes[])
 *	  RETURNS TABLE (ord, job_id, charged, released, status)
 * ---------------------------------------------------------------------
 */

/* an outcome: earmark_settle's rule */
static const char *
element_outcome(EmArray *outcomes, int i)
{
	char	   *o;

	if (outcomes->n < 0)
		return "completed";
	o = TextDatumGetCString(element(outcomes, i, "outcome"));
	if (strcmp(o, "completed") != 0 && strcmp(o, "failed") != 0 && strcmp(o, "cancelled") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown outcome \"%s\"", o),
				 errhint("Use 'completed', 'failed' or 'cancelled'.")));
	return o;
}

Datum
earmark_settle_many(PG_FUNCTION_ARGS)
{
	BatchContext ctx = {"earmark_settle_many", 0};
	ErrorContextCallback errcb;
	text	   *account;
	EmArray		jobs;
	EmArray		used;
	EmArray		outcomes;
	int64	   *job_id;
	const char **outcome;
	EmSettleAnswer *answers;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	jobs = arg_array(fcinfo, 1, "job_ids", INT8OID, true);
	used = arg_array(fcinfo, 2, "used", INT8OID, false);
	outcomes = arg_array(fcinfo, 3, "outcomes", TEXTOID, false);
	same_length(&jobs, "job_ids", &used, "used");
	same_length(&jobs, "job_ids", &outcomes, "outcomes");
	job_id = palloc(sizeof(int64) * Max(jobs.n, 1));
	outcome = palloc(sizeof(char *) * Max(jobs.n, 1));
	answers = palloc0(sizeof(EmSettleAnswer) * Max(jobs.n, 1));

	errcb.callback = batch_error_context;
	errcb.arg = &ctx;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	for (i = 0; i < jobs.n; i++)
	{
		ctx.ord = i + 1;
		job_id[i] = DatumGetInt64(element(&jobs, i, "job_id"));
		outcome[i] = element_outcome(&outcomes, i);
		if (used.n >= 0 && !used.nulls[i] && DatumGetInt64(used.values[i]) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("used must not be negative"),
					 errdetail("The value given was " INT64_FORMAT ".",
							   DatumGetInt64(used.values[i]))));
	}
	ctx.ord = 0;
	em_require_account_local(account);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (jobs.n > 0)
	{
		SPI_connect();
		for (i = 0; i < jobs.n; i++)
		{
			bool		has_used = used.n >= 0 && !used.nulls[i];

			ctx.ord = i + 1;
			if (i > 0 && i % RECONNECT_EVERY == 0)
				spi_reconnect();
			em_settle_one(account, job_id[i], has_used,
						  has_used ? DatumGetInt64(used.values[i]) : 0, outcome[i],
						  GetCurrentTimestamp(), &answers[i]);
		}
		SPI_finish();
	}
	error_context_stack = errcb.previous;

	for (i = 0; i < jobs.n; i++)
	{
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = Int64GetDatum(job_id[i]);
		values[2] = Int64GetDatum(answers[i].charged);
		values[3] = Int64GetDatum(answers[i].released);
		values[4] = CStringGetTextDatum(answers[i].status);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
