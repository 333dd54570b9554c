/*-------------------------------------------------------------------------
 *
 * delegation.c
 *	  A guard in front of Citus's function call delegation.  On a
 *	  distributed install earmark's functions are delegated by Citus to the
 *	  account's node (force_delegation).  Citus 13.2 crashes the backend
 *	  that plans such a call (SIGSEGV while it deparses the query for the
 *	  worker, and the postmaster restarts every backend of the node) when
 *	  the statement also has a subquery, a VALUES list or a CTE that the
 *	  planner pulls up: SELECT earmark_budget(v.a) FROM (VALUES ('acme'))
 *	  v (a), or SELECT r.* FROM earmark_reserve(...) r, (SELECT 1) x.  Any
 *	  role that may execute the function could do it.
 *
 *	  earmark's planner hook runs before Citus's (Citus must come first in
 *	  shared_preload_libraries, so its hook is installed first and earmark's
 *	  wraps it).  A SELECT that calls one of earmark's functions at its top
 *	  level (the whole select list, or a function in FROM) and has such a
 *	  range table entry is refused with 0A000 before Citus plans it, on a
 *	  distributed install only; everything else goes on unchanged.  The
 *	  checks that read catalogs (is the function earmark's, is earmark
 *	  distributed) run only for statements of that shape, in that order:
 *	  em_distributed may be asked only where earmark is installed.
 *
 *	  Tables: reads pg_depend (which extension owns a function) and, through
 *	  em_distributed, pg_dist_partition; writes nothing.
 *	  Locks: none beyond those catalog reads' AccessShareLock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/planner.h"
#include "utils/lsyscache.h"

#include "cluster.h"
#include "delegation.h"

static planner_hook_type prev_planner_hook = NULL;

/* a range table entry the planner may pull up into the call's statement */
static bool
has_pulled_up_entry(Query *parse)
{
	ListCell   *lc;

	if (parse->cteList != NIL)
		return true;
	foreach(lc, parse->rtable)
	{
		RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);

		if (rte->rtekind == RTE_SUBQUERY || rte->rtekind == RTE_VALUES ||
			rte->rtekind == RTE_CTE)
			return true;
	}
	return false;
}

/*
 * Whether the function is earmark's: named earmark_* or in the earmark
 * schema (two catalog cache look-ups, so that another function costs no
 * more), and a member of the extension.
 */
static bool
is_earmark_function(Oid funcid)
{
	char	   *name = get_func_name(funcid);
	char	   *schema;
	Oid			earmark;

	if (name == NULL)
		return false;
	schema = get_namespace_name(get_func_namespace(funcid));
	if (strncmp(name, "earmark_", 8) != 0 &&
		(schema == NULL || strcmp(schema, "earmark") != 0))
		return false;
	earmark = get_extension_oid("earmark", true);
	return OidIsValid(earmark) &&
		getExtensionOfObject(ProcedureRelationId, funcid) == earmark;
}

/*
 * The earmark function the statement calls where Citus would delegate it:
 * its only select-list entry, or a function in FROM; InvalidOid if none.
 */
static Oid
delegable_earmark_call(Query *parse)
{
	ListCell   *lc;

	if (list_length(parse->targetList) == 1)
	{
		TargetEntry *te = linitial_node(TargetEntry, parse->targetList);

		if (IsA(te->expr, FuncExpr) &&
			is_earmark_function(((FuncExpr *) te->expr)->funcid))
			return ((FuncExpr *) te->expr)->funcid;
	}
	foreach(lc, parse->rtable)
	{
		RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);
		ListCell   *f;

		if (rte->rtekind != RTE_FUNCTION)
			continue;
		foreach(f, rte->functions)
		{
			Node	   *expr = lfirst_node(RangeTblFunction, f)->funcexpr;

			if (IsA(expr, FuncExpr) &&
				is_earmark_function(((FuncExpr *) expr)->funcid))
				return ((FuncExpr *) expr)->funcid;
		}
	}
	return InvalidOid;
}

static PlannedStmt *
em_planner(Query *parse, const char *query_string, int cursorOptions,
		   ParamListInfo boundParams)
{
	Oid			funcid;

	if (parse->commandType == CMD_SELECT && has_pulled_up_entry(parse) &&
		OidIsValid(funcid = delegable_earmark_call(parse)) && em_distributed())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s cannot be called over a subquery, a VALUES list or a CTE on a distributed install",
						get_func_name(funcid)),
				 errdetail("Citus crashes while it plans such a call for the account's node."),
				 errhint("Call it in a statement of its own, with literals or parameters: SELECT * FROM %s(...).",
						 get_func_name(funcid))));
	if (prev_planner_hook)
		return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

void
em_install_delegation_guard(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = em_planner;
}
