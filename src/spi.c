/*-------------------------------------------------------------------------
 *
 * spi.c
 *	  The statements every earmark file runs: SPI with plans prepared once
 *	  per backend and kept, result access, the argument checks of the SQL
 *	  functions, returning one row, and the search path pinned for the
 *	  entry points that have no SET clause (em_call_pinned), with an
 *	  fmgr_hook that gives a function of the user's run inside such a call
 *	  its own SET search_path (user_function_hook).
 *
 *	  Owns no shared state and takes no locks of its own; installs the
 *	  hook and a transaction and a subtransaction callback once per backend.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
#include "utils/varlena.h"

#include "cluster.h"
#include "spi.h"

/*
 * The search path of earmark's hot entry points, pinned by the C code for
 * exactly the duration of the call instead of by a SET clause on the
 * function (which costs a GUC nesting level, parsing and assigning
 * search_path twice, and a recomputation of the namespace path inside the
 * call and again in the caller's next statement).  The path is the one
 * "SET search_path = pg_catalog, pg_temp" gives: pg_catalog, then this
 * session's temporary schema if it has one (searched for relations and
 * types only, as always).  Being the same list, a plan that earmark's
 * statements share with entry points that still use the SET clause is not
 * re-planned when a session calls both (the plan cache compares the path a
 * plan was made under with the active one).
 *
 * The override is popped on a normal return (em_call_pinned); on an error
 * the abort of the (sub)transaction the call ran in pops it
 * (AtEOXact_Namespace, AtEOSubXact_Namespace), before a caller's
 * EXCEPTION block runs.  While it is in force the caller's search_path
 * setting is not consulted at all.
 */
static void
pin_search_path(void)
{
	OverrideSearchPath path;
	Oid			temp;
	Oid			temp_toast;

	memset(&path, 0, sizeof(path));
	path.schemas = list_make1_oid(PG_CATALOG_NAMESPACE);
	GetTempNamespaceState(&temp, &temp_toast);
	if (OidIsValid(temp))
		path.schemas = lappend_oid(path.schemas, temp);
	path.addCatalog = false;
	path.addTemp = false;
	PushOverrideSearchPath(&path);	/* copies the list */
	list_free(path.schemas);
}

/* ---------------------------------------------------------------------
 * A function's own search path under the pin
 * ---------------------------------------------------------------------
 *
 * While an override search path is in force, a function's SET
 * search_path clause changes the setting but not the path names resolve
 * through (namespace.c consults the setting only when no override is in
 * force).  So a function of the user's that runs inside a pinned call, a
 * trigger a superuser put on an earmark table say, declared the safe way
 * ("SET search_path = app, pg_catalog, pg_temp"), would resolve its
 * unqualified names through earmark's pg_catalog, pg_temp instead: to
 * nothing, or to a table the caller planted in its temporary schema.
 *
 * fmgr runs every function with a SET clause through
 * fmgr_security_definer, which calls fmgr_hook after applying the clause
 * and again when the function returns.  While a pin (or a path pushed
 * here) is in force, the hook pushes the path the function's own setting
 * names, computed as namespace.c would compute it, for the function's
 * call, and pops it on its return.  On an error the abort of the
 * (sub)transaction pops it, as it pops the pin.  frames records each pin
 * and each call the hook sees under one (whether it pushed a path for
 * it), with the transaction nest level of each, so that the hook knows a
 * pin is in force and which start a return ends, also when a function's
 * SET clause changed between two nested calls of it; the (sub)transaction
 * callbacks drop the frames whose paths an abort popped.
 *
 * Not covered: a function that changes search_path as it runs (SET
 * inside its body, set_config) does not change the path under the pin,
 * and a function whose path starts with pg_temp before the session has a
 * temporary schema creates unqualified objects in the next schema rather
 * than in a new temporary one.
 */
typedef struct PinFrame
{
	int			nest_level;
	FmgrInfo   *flinfo;			/* the function's call, NULL for a pin */
	bool		pushed;			/* a path was pushed for the function */
} PinFrame;

static PinFrame *frames = NULL;
static int	nframes = 0;
static int	maxframes = 0;
static fmgr_hook_type prev_fmgr_hook = NULL;

static void
push_frame(FmgrInfo *flinfo, bool pushed)
{
	if (nframes == maxframes)
	{
		maxframes = Max(8, maxframes * 2);
		frames = frames == NULL
			? MemoryContextAlloc(TopMemoryContext, maxframes * sizeof(PinFrame))
			: repalloc(frames, maxframes * sizeof(PinFrame));
	}
	frames[nframes].nest_level = GetCurrentTransactionNestLevel();
	frames[nframes].flinfo = flinfo;
	frames[nframes].pushed = pushed;
	nframes++;
}

static void
pop_frame(void)
{
	Assert(nframes > 0);
	nframes--;
}

/* does the function set search_path itself (a SET clause)? */
static bool
sets_search_path(Oid fn)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	bool		isnull;
	Datum		config;
	bool		found = false;

	if (!HeapTupleIsValid(tup))
		return false;
	config = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_proconfig, &isnull);
	if (!isnull)
	{
		ArrayType  *a = DatumGetArrayTypeP(config);
		Datum	   *items;
		int			n;
		int			i;

		deconstruct_array(a, TEXTOID, -1, false, TYPALIGN_INT, &items, NULL, &n);
		for (i = 0; i < n && !found; i++)
			found = strncmp(TextDatumGetCString(items[i]), "search_path=", 12) == 0;
	}
	ReleaseSysCache(tup);
	return found;
}

/*
 * Push the path the search_path setting names, as namespace.c's
 * recomputeNamespacePath computes it: "$user" and the named schemas that
 * exist and that the current user may use, pg_temp where it stands if the
 * session has a temporary schema, pg_catalog first unless named, the
 * temporary schema first unless named.
 */
static void
push_setting_path(void)
{
	char	   *raw = pstrdup(namespace_search_path);
	List	   *names;
	ListCell   *lc;
	Oid			role = GetUserId();
	Oid			temp;
	Oid			temp_toast;
	OverrideSearchPath path;

	memset(&path, 0, sizeof(path));
	GetTempNamespaceState(&temp, &temp_toast);
	if (!SplitIdentifierString(raw, ',', &names))
		elog(ERROR, "earmark: search_path \"%s\" is not a list", namespace_search_path);
	foreach(lc, names)
	{
		char	   *name = (char *) lfirst(lc);
		Oid			ns;

		if (strcmp(name, "$user") == 0)
		{
			char	   *rolname = GetUserNameFromId(role, true);

			ns = rolname ? get_namespace_oid(rolname, true) : InvalidOid;
		}
		else if (strcmp(name, "pg_temp") == 0)
		{
			if (OidIsValid(temp) && !list_member_oid(path.schemas, temp) &&
				InvokeNamespaceSearchHook(temp, false))
				path.schemas = lappend_oid(path.schemas, temp);
			continue;
		}
		else
			ns = get_namespace_oid(name, true);
		if (OidIsValid(ns) && !list_member_oid(path.schemas, ns) &&
			pg_namespace_aclcheck(ns, role, ACL_USAGE) == ACLCHECK_OK &&
			InvokeNamespaceSearchHook(ns, false))
			path.schemas = lappend_oid(path.schemas, ns);
	}
	path.addCatalog = !list_member_oid(path.schemas, PG_CATALOG_NAMESPACE);
	path.addTemp = OidIsValid(temp) && !list_member_oid(path.schemas, temp);
	PushOverrideSearchPath(&path);
	list_free(path.schemas);
	list_free(names);
	pfree(raw);
}

static void
user_function_hook(FmgrHookEventType event, FmgrInfo *flinfo, Datum *private)
{
	if (prev_fmgr_hook)
		prev_fmgr_hook(event, flinfo, private);
	if (nframes == 0)
		return;
	if (event == FHET_START)
	{
		/* every call under a pin has a frame, so that starts and ends pair */
		bool		sets = sets_search_path(flinfo->fn_oid);

		if (sets)
			push_setting_path();
		push_frame(flinfo, sets);
	}
	else if (event == FHET_END &&
			 frames[nframes - 1].flinfo == flinfo &&
			 frames[nframes - 1].nest_level == GetCurrentTransactionNestLevel())
	{
		if (frames[nframes - 1].pushed)
			PopOverrideSearchPath();
		pop_frame();
	}
	/* FHET_ABORT: the (sub)transaction's abort pops the path (and frame) */
}

/* drop the frames whose paths the end of a (sub)transaction pops */
static void
drop_frames_from(int nest_level)
{
	while (nframes > 0 && frames[nframes - 1].nest_level >= nest_level)
		nframes--;
}

static void
frames_subxact_end(SubXactEvent event, SubTransactionId mySubid,
				   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB || event == SUBXACT_EVENT_COMMIT_SUB)
		drop_frames_from(GetCurrentTransactionNestLevel());
}

static void
frames_xact_end(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
		nframes = 0;
}

/* install the hook and the callbacks, once per backend */
static void
watch_user_functions(void)
{
	static bool installed = false;

	if (installed)
		return;
	prev_fmgr_hook = fmgr_hook;
	fmgr_hook = user_function_hook;
	RegisterSubXactCallback(frames_subxact_end, NULL);
	RegisterXactCallback(frames_xact_end, NULL);
	installed = true;
}

/*
 * Call body, a SQL-callable function's implementation, under the pinned
 * search path.  For functions declared without a SET search_path clause
 * (SECURITY DEFINER, or SECURITY INVOKER ones that switch to their owner
 * themselves, inbox.c): nothing may resolve a name before this.  Code of
 * the user's that body's statements run (a trigger on an earmark table,
 * and what it calls) gets its own SET search_path (user_function_hook).
 */
Datum
em_call_pinned(FunctionCallInfo fcinfo, PGFunction body)
{
	Datum		result;

	watch_user_functions();
	pin_search_path();
	push_frame(NULL, true);
	result = body(fcinfo);
	pop_frame();
	PopOverrideSearchPath();
	return result;
}

/*
 * Run a cached statement.  Errors from SPI itself are internal errors; the
 * SQL errors of the statement (constraint violations, serialization
 * failures) propagate with their own SQLSTATE.
 *
 * Always with read_only = false: only then does SPI take a new snapshot for
 * each statement (under READ COMMITTED), and the gate depends on that: a
 * read after a row lock must see what the lock waited for.
 */
SPIPlanPtr
em_prepare_kept(const char *sql, int nargs, Oid *argtypes, int cursor_options)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, cursor_options);

	if (plan == NULL)
		elog(ERROR, "earmark: could not prepare statement: %s",
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "earmark: could not keep plan");
	return plan;
}

static SPIPlanPtr
em_plan(EmStatement *stmt)
{
	if (stmt->plan == NULL)
		stmt->plan = em_prepare_kept(stmt->sql, stmt->nargs, stmt->argtypes, 0);
	return stmt->plan;
}

/*
 * The row count to run plan with.  A count stops the executor after that
 * many returned rows, and for an INSERT, UPDATE, DELETE or MERGE at the
 * statement's top level (with RETURNING) that is before its ModifyTable
 * node sees the end of its input: the statement's AFTER STATEMENT
 * triggers (an operator's audit with transition tables) would not fire,
 * and rows past the count would not be written.  earmark's writes name
 * their rows by key, so none returns more rows than its caller counts on:
 * such a statement runs to its end.  (A SELECT's data-modifying WITH parts
 * run to their end anyway, in ExecutorFinish.)
 */
static long
run_count(SPIPlanPtr plan, long count)
{
	CachedPlanSource *source;

	if (count == 0)
		return 0;
	source = linitial(SPI_plan_get_plan_sources(plan));
	switch (source->commandTag)
	{
		case CMDTAG_INSERT:
		case CMDTAG_UPDATE:
		case CMDTAG_DELETE:
		case CMDTAG_MERGE:
			return 0;
		default:
			return count;
	}
}

int
em_exec(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	MemoryContext cxt = CurrentMemoryContext;
	SPIPlanPtr	plan = em_plan(stmt);
	int			rc;

	rc = SPI_execute_plan(plan, values, nulls, false, run_count(plan, count));
	/* SPI leaves its own context current; give the caller's back */
	MemoryContextSwitchTo(cxt);
	if (rc < 0)
		elog(ERROR, "earmark: statement failed: %s", SPI_result_code_string(rc));
	return rc;
}

/* em_exec of a statement whose plan is prepared with cursor_options */
static int
exec_planned_as(EmStatement *stmt, int cursor_options, Datum *values,
				const char *nulls, long count)
{
	if (stmt->plan == NULL)
		stmt->plan = em_prepare_kept(stmt->sql, stmt->nargs, stmt->argtypes,
									 cursor_options);
	return em_exec(stmt, values, nulls, count);
}

/*
 * em_exec with a generic plan, for a statement whose custom plans always
 * look cheaper than the generic one and so would be planned at every call
 * (the plan cache never switches): a custom plan that folds "$1 OR ..." to
 * one side is such a case.  Only for statements whose best plan does not
 * depend on the parameters' values.
 */
int
em_exec_generic(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	return exec_planned_as(stmt, CURSOR_OPT_GENERIC_PLAN, values, nulls, count);
}

/*
 * em_exec planned again at every call, for the call's values: for a
 * statement that has no usable generic plan (Citus makes no distributed
 * plan of a generic plan whose distribution column is a parameter of a
 * sub-select), or whose best plan depends on the values.
 */
int
em_exec_custom(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	return exec_planned_as(stmt, CURSOR_OPT_CUSTOM_PLAN, values, nulls, count);
}

/*
 * A look-up in a table the caller's own run fills (the reconciler's last
 * evidence, last send and local meter total of each cycle), whose caller
 * forgets the plan now and then (em_forget_plan, once a page of cycles):
 * a generic plan, made for the tables' size since the last forget, so that
 * one made while an ANALYZE had seen the table empty does not scan it whole
 * at every call for the rest of the run, and planning does not cost more
 * than the look-up.  On a distributed install a plan for the call's values
 * (em_exec_custom).
 */
int
em_exec_lookup(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	if (em_distributed())
		return em_exec_custom(stmt, values, nulls, count);
	return em_exec_generic(stmt, values, nulls, count);
}

/*
 * Forget the statement's plan: its next run plans it again, for the tables'
 * current size and statistics.  For a caller whose own writes grow a table
 * it keeps reading (the reconciler, once a page of cycles).
 */
void
em_forget_plan(EmStatement *stmt)
{
	if (stmt->plan == NULL)
		return;
	SPI_freeplan(stmt->plan);
	stmt->plan = NULL;
}

/*
 * Run a cached read-only statement in a new snapshot that sees every commit
 * so far, whatever the transaction's isolation level.  Under REPEATABLE
 * READ the gate compares what its transaction snapshot showed with this,
 * and fails with 40001 when they differ (see gate.c).  The snapshot is
 * taken before SPI locks the plan's tables: a caller must hold their locks
 * already, or a wait there for an operator's rewrite would read the table
 * as it was before (direct.c's reads lock theirs first for that reason).
 * On a single node the one caller, escrow's early refusal under
 * REPEATABLE READ, has read the slots in this transaction; the others are
 * Citus's reads of the limit, the anchor and a cycle's total, which do not
 * lock their tables first yet.
 */
int
em_exec_latest(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	MemoryContext cxt = CurrentMemoryContext;
	int			rc;

	rc = SPI_execute_snapshot(em_plan(stmt), values, nulls, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, count);
	MemoryContextSwitchTo(cxt);
	if (rc < 0)
		elog(ERROR, "earmark: statement failed: %s", SPI_result_code_string(rc));
	return rc;
}

/*
 * A call that sends totals to the provider from its caller's transaction
 * (earmark_report, earmark_reconcile) must not run after the transaction
 * wrote: a write that rolls back later would be counted in what the
 * provider took, and the marks that would send the ledger's total again
 * roll back with it (test/integration/report_passes.sh).  Any xid counts,
 * a rolled-back subtransaction's too: nothing cheaper tells usage from
 * other writes, and the call belongs in a statement of its own anyway.
 */
void
em_require_no_writes(const char *what)
{
	if (TransactionIdIsValid(GetTopTransactionIdIfAny()))
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("%s cannot run in a transaction that has written", what),
				 errdetail("The totals it sends would count writes that may still roll back."),
				 errhint("Call it in a transaction of its own, after the writes commit.")));
}

Datum
em_get(int row, int col, bool *isnull)
{
	Assert(row < (int) SPI_processed);
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
						 col, isnull);
}

int64
em_get_int64(int row, int col, int64 if_null)
{
	bool		isnull;
	Datum		d = em_get(row, col, &isnull);

	return isnull ? if_null : DatumGetInt64(d);
}

/*
 * An account, feature or idempotency key: not NULL, not empty, at most
 * EARMARK_MAX_NAME_LEN characters.
 */
static text *
check_name(text *t, const char *what)
{
	int			len = pg_mbstrlen_with_len(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > EARMARK_MAX_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("It has %d characters; the most is %d.",
						   len, EARMARK_MAX_NAME_LEN)));
	return t;
}

/* see spi.h: a timestamptz's value is its UTC wall clock as a timestamp */
TimestampTz
em_plus_utc(TimestampTz t, Interval *i)
{
	return DatumGetTimestamp(DirectFunctionCall2(timestamp_pl_interval,
												 TimestampGetDatum(t),
												 IntervalPGetDatum(i)));
}

/*
 * The argument readers check the installed schema's version first (once
 * per transaction, cluster.c): a function of an older install script may
 * pass arguments this library reads otherwise.
 */
text *
em_arg_name(FunctionCallInfo fcinfo, int argno, const char *what)
{
	em_require_schema();
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return check_name(PG_GETARG_TEXT_PP(argno), what);
}

int64
em_arg_int64(FunctionCallInfo fcinfo, int argno, const char *what)
{
	em_require_schema();
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return PG_GETARG_INT64(argno);
}

void
em_return_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/* the same check for a name that is not an argument (an array's element) */
text *
em_check_name(text *t, const char *what)
{
	return check_name(t, what);
}

int
em_text_cmp(text *a, text *b)
{
	int			la = VARSIZE_ANY_EXHDR(a);
	int			lb = VARSIZE_ANY_EXHDR(b);
	int			c = memcmp(VARDATA_ANY(a), VARDATA_ANY(b), Min(la, lb));

	return c != 0 ? c : (la > lb) - (la < lb);
}

bool
em_text_eq(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}
