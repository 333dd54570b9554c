/*-------------------------------------------------------------------------
 *
 * delegation.c
 *	  A fence in front of Citus's function call delegation, installed as a
 *	  planner hook when earmark is preloaded.
 *
 *	  On a distributed install Citus delegates a call of one of earmark's
 *	  functions to the account's node when the statement is that call
 *	  alone: SELECT * FROM earmark_reserve(...), SELECT earmark_budget(...).
 *	  It decides on the statement as the planner left it, after subqueries,
 *	  views, CTEs, one-row VALUES lists and SQL-language functions were
 *	  pulled up or inlined; then it deparses that statement for the worker,
 *	  and Citus 13.2 crashes there (SIGSEGV in pg_get_query_def, and the
 *	  postmaster restarts every backend of the node) whenever something was
 *	  pulled up.  SELECT * FROM (SELECT * FROM earmark_budget('a')) s does
 *	  it, and so does a view over a bare call, which any role may create as
 *	  a temporary view.
 *
 *	  Citus delegates nothing from a statement whose WHERE clause is not
 *	  empty after planning, and that is its first test.  So earmark's hook,
 *	  which runs before Citus's (Citus must be first in
 *	  shared_preload_libraries, and earmark's hook wraps the one it finds),
 *	  adds an always-true condition that the planner keeps, the volatile
 *	  clock_timestamp() IS NOT NULL, to each SELECT that could become a bare
 *	  call only by planning: one whose FROM tree holds no table, that is not
 *	  already bare, and that calls a function that is not built in.  Such a
 *	  statement then runs where it was sent, as every other form of a call
 *	  always has; there the functions that need the account's node refuse
 *	  with 0A000 (em_require_account_local).  It is done on a distributed
 *	  install only, decided without the caller's privileges.
 *
 *	  Why not refuse, or decide on the planned form: the statement as
 *	  written does not show what the planner will pull up (an earlier guard
 *	  that looked at it missed nested subqueries, views and inlined
 *	  functions), and planning a copy first with standard_planner is not
 *	  safe under Citus (its join hooks expect its own planner's context).
 *
 *	  Tables: reads pg_proc through the catalog cache and, for the
 *	  statements above only, pg_dist_partition (cluster.c).  Writes nothing.
 *	  Locks: none beyond those reads' AccessShareLock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "utils/fmgroids.h"
#include "utils/syscache.h"

#include "cluster.h"
#include "delegation.h"

static planner_hook_type prev_planner_hook = NULL;

static bool rte_has_table(Query *q, RangeTblEntry *rte, List *outer);

/* whether the function is written in SQL (the planner may inline it) */
static bool
is_sql_function(Oid funcid)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	bool		sql;

	if (!HeapTupleIsValid(tup))
		return false;
	sql = ((Form_pg_proc) GETSTRUCT(tup))->prolang == SQLlanguageId;
	ReleaseSysCache(tup);
	return sql;
}

/*
 * The form Citus delegates as it stands: no FROM, or one function in FROM
 * that the planner cannot inline; no CTE, no sublink.  Planning cannot pull
 * anything into it.
 */
static bool
is_bare(Query *q)
{
	RangeTblEntry *rte;
	RangeTblFunction *rtf;

	if (q->cteList != NIL || q->hasSubLinks)
		return false;
	if (q->rtable == NIL)
		return true;
	if (list_length(q->rtable) != 1)
		return false;
	rte = linitial_node(RangeTblEntry, q->rtable);
	if (rte->rtekind != RTE_FUNCTION || list_length(rte->functions) != 1)
		return false;
	rtf = linitial_node(RangeTblFunction, rte->functions);
	return IsA(rtf->funcexpr, FuncExpr) &&
		!is_sql_function(((FuncExpr *) rtf->funcexpr)->funcid);
}

/*
 * Whether a table is in the statement's FROM tree: its join tree, through
 * the subqueries, views and CTEs it reads (not the range table: in
 * PostgreSQL 15 a view's rule keeps entries for the view itself that no
 * join tree reads).  Pulled up, a table stays a FROM item of its own, and
 * Citus delegates no call from a FROM list with a table.  A recursive or
 * data-modifying CTE is never inlined and counts as a table.  "outer" holds
 * the enclosing queries, innermost first, for CTEs of outer levels.
 */
static bool
from_has_table(Query *q, Node *jtnode, List *outer)
{
	check_stack_depth();
	if (jtnode == NULL)
		return false;
	if (IsA(jtnode, FromExpr))
	{
		ListCell   *lc;

		foreach(lc, ((FromExpr *) jtnode)->fromlist)
			if (from_has_table(q, lfirst(lc), outer))
				return true;
		return false;
	}
	if (IsA(jtnode, JoinExpr))
		return from_has_table(q, ((JoinExpr *) jtnode)->larg, outer) ||
			from_has_table(q, ((JoinExpr *) jtnode)->rarg, outer);
	if (IsA(jtnode, RangeTblRef))
		return rte_has_table(q, rt_fetch(((RangeTblRef *) jtnode)->rtindex, q->rtable), outer);
	return true;
}

static bool
rte_has_table(Query *q, RangeTblEntry *rte, List *outer)
{
	List	   *chain = lcons(q, outer);
	Query	   *owner;
	ListCell   *lc;

	switch (rte->rtekind)
	{
		case RTE_RELATION:
			return true;
		case RTE_SUBQUERY:
			return from_has_table(rte->subquery, (Node *) rte->subquery->jointree, chain);
		case RTE_CTE:
			if (rte->self_reference || rte->ctelevelsup >= list_length(chain))
				return true;
			owner = list_nth_node(Query, chain, rte->ctelevelsup);
			foreach(lc, owner->cteList)
			{
				CommonTableExpr *cte = lfirst_node(CommonTableExpr, lc);
				Query	   *body = (Query *) cte->ctequery;

				if (strcmp(cte->ctename, rte->ctename) != 0)
					continue;
				if (cte->cterecursive || !IsA(body, Query) || body->commandType != CMD_SELECT)
					return true;
				return from_has_table(body, (Node *) body->jointree,
									  list_copy_tail(chain, rte->ctelevelsup + 1));
			}
			return true;
		default:
			return false;
	}
}

static bool
is_not_built_in(Oid funcid, void *context)
{
	return funcid >= FirstNormalObjectId;
}

/* whether the statement calls, anywhere, a function that is not built in */
static bool
calls_added_function(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (check_functions_in_node(node, is_not_built_in, context))
		return true;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, calls_added_function, context, 0);
	return expression_tree_walker(node, calls_added_function, context);
}

/* clock_timestamp() IS NOT NULL: true, and volatile, so the planner keeps it */
static Node *
fence(void)
{
	NullTest   *test = makeNode(NullTest);

	test->arg = (Expr *) makeFuncExpr(F_CLOCK_TIMESTAMP, TIMESTAMPTZOID, NIL,
									  InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
	test->nulltesttype = IS_NOT_NULL;
	test->argisrow = false;
	test->location = -1;
	return (Node *) test;
}

static PlannedStmt *
em_planner(Query *parse, const char *query_string, int cursorOptions,
		   ParamListInfo boundParams)
{
	/* cheapest tests first: the catalog scan runs for the few that pass */
	if (parse->commandType == CMD_SELECT && parse->setOperations == NULL &&
		!is_bare(parse) && !from_has_table(parse, (Node *) parse->jointree, NIL) &&
		calls_added_function((Node *) parse, NULL) &&
		em_account_table_distributed())
		parse->jointree->quals = make_and_qual(parse->jointree->quals, fence());

	if (prev_planner_hook)
		return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

void
em_install_delegation_fence(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = em_planner;
}
