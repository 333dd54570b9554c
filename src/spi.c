/*-------------------------------------------------------------------------
 *
 * spi.c
 *	  The statements every earmark file runs: SPI with plans prepared once
 *	  per backend and kept, result access, the argument checks of the SQL
 *	  functions, returning one row, and the search path pinned for the
 *	  entry points that have no SET clause (em_call_pinned).
 *
 *	  Owns no shared state and takes no locks of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

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

/*
 * Call body, a SQL-callable function's implementation, under the pinned
 * search path.  For functions declared without a SET search_path clause
 * (SECURITY DEFINER, or SECURITY INVOKER ones that switch to their owner
 * themselves, inbox.c): nothing may resolve a name before this, and body
 * must run no code of the user's, whose own SET search_path would not
 * take effect while the override is in force.
 */
Datum
em_call_pinned(FunctionCallInfo fcinfo, PGFunction body)
{
	Datum		result;

	pin_search_path();
	result = body(fcinfo);
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

int
em_exec(EmStatement *stmt, Datum *values, const char *nulls, long count)
{
	MemoryContext cxt = CurrentMemoryContext;
	int			rc;

	rc = SPI_execute_plan(em_plan(stmt), values, nulls, false, count);
	/* SPI leaves its own context current; give the caller's back */
	MemoryContextSwitchTo(cxt);
	if (rc < 0)
		elog(ERROR, "earmark: statement failed: %s", SPI_result_code_string(rc));
	return rc;
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
	if (stmt->plan == NULL)
		stmt->plan = em_prepare_kept(stmt->sql, stmt->nargs, stmt->argtypes,
									 CURSOR_OPT_GENERIC_PLAN);
	return em_exec(stmt, values, nulls, count);
}

/*
 * Run a cached read-only statement in a new snapshot that sees every commit
 * so far, whatever the transaction's isolation level.  Under REPEATABLE
 * READ the gate compares what its transaction snapshot showed with this,
 * and fails with 40001 when they differ (see gate.c).
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
 * The reporter and the reconciler compare totals with what concurrent
 * writers committed a moment ago: that needs a snapshot per statement.
 * Under REPEATABLE READ a mark could be deleted for usage the report never
 * saw, so they refuse to run there.
 */
void
em_require_read_committed(const char *what)
{
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("%s must run in a READ COMMITTED transaction", what),
				 errdetail("It compares totals with what other sessions committed since it started; "
						   "a transaction snapshot would hide that."),
				 errhint("Call it outside a REPEATABLE READ or SERIALIZABLE transaction.")));
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
