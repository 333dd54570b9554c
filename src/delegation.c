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
 *	  call only by planning: one that is not already bare, whose FROM tree
 *	  keeps no item Citus never delegates from (a table, a set operation, a
 *	  CTE that is not inlined), and that calls a function that is not built
 *	  in.  Such a statement then runs where it was sent, as every other form
 *	  of a call always has; there the functions that need the account's
 *	  node refuse with 0A000 (em_require_account_local).  It is done on a
 *	  distributed install only, decided without the caller's privileges.
 *	  Grouping sets and HAVING count as not bare: Citus also crashes (or
 *	  errs) writing out what the planner made of them in place.  A bare
 *	  call whose account (its first argument) the planner folds to NULL
 *	  gets that argument made volatile (same value), which Citus does not
 *	  delegate either: it would hash the NULL and crash.
 *
 *	  Why not refuse, or decide on the planned form: the statement as
 *	  written does not show what the planner will pull up (an earlier guard
 *	  that looked at it missed nested subqueries, views and inlined
 *	  functions), and planning a copy first with standard_planner is not
 *	  safe under Citus (its join hooks expect its own planner's context).
 *	  So the tests below lean to the filter wherever they cannot tell: the
 *	  filter costs a call per row, a crash every backend of the node.
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
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/syscache.h"

#include "cluster.h"
#include "delegation.h"

static planner_hook_type prev_planner_hook = NULL;

/* the FROM walk's memory: the CTEs whose bodies were found to keep nothing */
typedef struct FromWalk
{
	List	   *walked;
} FromWalk;

static bool rte_keeps_item(FromWalk *w, Query *q, RangeTblEntry *rte, List *outer);

/*
 * Whether planning may replace a call of the function in FROM: an SQL
 * function may be inlined; an immutable one that returns no set may be
 * folded to a constant, and a strict one that returns no set and no record
 * to NULL when an argument is NULL (evaluate_function in clauses.c).
 * Citus cannot write out the RTE_RESULT that takes its place.  True for an
 * unknown function: the caller then adds the filter.
 */
static bool
planner_may_replace(Oid funcid)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	Form_pg_proc proc;
	bool		replaced;

	if (!HeapTupleIsValid(tup))
		return true;
	proc = (Form_pg_proc) GETSTRUCT(tup);
	replaced = proc->prolang == SQLlanguageId ||
		(proc->provolatile == PROVOLATILE_IMMUTABLE && !proc->proretset) ||
		(proc->proisstrict && !proc->proretset && proc->prorettype != RECORDOID);
	ReleaseSysCache(tup);
	return replaced;
}

/*
 * The form Citus delegates as it stands: no FROM, or one function in FROM
 * that planning keeps as it is; no CTE, no sublink.  Planning cannot pull
 * anything into it.  Grouping sets and a HAVING clause make it not bare
 * too: the planner rewrites them in place (groupingSets into lists of
 * integers, havingQual into an implicit-AND list), and Citus 13.2 crashes
 * writing out the first and writes the second out wrong.
 */
static bool
is_bare(Query *q)
{
	RangeTblEntry *rte;
	RangeTblFunction *rtf;

	if (q->cteList != NIL || q->hasSubLinks || q->groupingSets != NIL ||
		q->havingQual != NULL)
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
		!planner_may_replace(((FuncExpr *) rtf->funcexpr)->funcid);
}

/*
 * Whether the statement's FROM tree keeps an item that Citus never
 * delegates from, whatever planning pulls up: a table, a set operation, a
 * CTE that is not inlined.  Walked through the join tree, the subqueries,
 * views and inlined CTEs it reads (not the range table: in PostgreSQL 15 a
 * view's rule keeps entries for the view itself that no join tree reads).
 * A pulled-up table stays a FROM item of its own; a set operation stays one
 * (at most an append relation); a CTE the planner does not inline (read
 * twice, MATERIALIZED, recursive, data-modifying) stays a CTE scan.  Where
 * it cannot tell, it answers false, and the caller adds the filter.
 * "outer" holds the enclosing queries, innermost first, for CTEs of outer
 * levels; it is not changed.  Each CTE's body is walked once (w), so the
 * walk is linear in the statement however often its CTEs are read.
 */
static bool
from_keeps_item(FromWalk *w, Query *q, Node *jtnode, List *outer)
{
	check_stack_depth();
	CHECK_FOR_INTERRUPTS();
	if (jtnode == NULL)
		return false;
	if (IsA(jtnode, FromExpr))
	{
		ListCell   *lc;

		foreach(lc, ((FromExpr *) jtnode)->fromlist)
			if (from_keeps_item(w, q, lfirst(lc), outer))
				return true;
		return false;
	}
	if (IsA(jtnode, JoinExpr))
		return from_keeps_item(w, q, ((JoinExpr *) jtnode)->larg, outer) ||
			from_keeps_item(w, q, ((JoinExpr *) jtnode)->rarg, outer);
	if (IsA(jtnode, RangeTblRef))
		return rte_keeps_item(w, q, rt_fetch(((RangeTblRef *) jtnode)->rtindex, q->rtable), outer);
	return false;
}

/* a CTE the planner leaves a CTE scan (see inline_cte in subselect.c) */
static bool
cte_not_inlined(CommonTableExpr *cte)
{
	return cte->cterecursive || !IsA(cte->ctequery, Query) ||
		((Query *) cte->ctequery)->commandType != CMD_SELECT ||
		cte->ctematerialized == CTEMaterializeAlways ||
		(cte->ctematerialized == CTEMaterializeDefault && cte->cterefcount != 1) ||
		contain_volatile_functions(cte->ctequery);
}

/*
 * A CTE reference: the CTE is found in the query ctelevelsup levels up
 * ("chain" starts at the query that holds the reference), and its body
 * walked if the planner inlines it.
 */
static bool
cte_keeps_item(FromWalk *w, RangeTblEntry *rte, List *chain)
{
	Query	   *owner;
	ListCell   *lc;

	if (rte->ctelevelsup >= list_length(chain))
		return false;
	owner = list_nth_node(Query, chain, rte->ctelevelsup);
	foreach(lc, owner->cteList)
	{
		CommonTableExpr *cte = lfirst_node(CommonTableExpr, lc);
		Query	   *body = (Query *) cte->ctequery;
		List	   *outer;
		bool		keeps;

		if (strcmp(cte->ctename, rte->ctename) != 0)
			continue;
		if (list_member_ptr(w->walked, cte))
			return false;
		if (cte_not_inlined(cte))
			return true;
		/* the body's own references count levels from the owner */
		outer = list_copy_tail(chain, rte->ctelevelsup);
		keeps = from_keeps_item(w, body, (Node *) body->jointree, outer);
		list_free(outer);
		if (!keeps)
			w->walked = lappend(w->walked, cte);
		return keeps;
	}
	return false;
}

static bool
rte_keeps_item(FromWalk *w, Query *q, RangeTblEntry *rte, List *outer)
{
	List	   *chain;
	bool		keeps;

	switch (rte->rtekind)
	{
		case RTE_RELATION:
			return true;
		case RTE_SUBQUERY:
			if (rte->subquery->setOperations != NULL)
				return true;
			chain = lcons(q, list_copy(outer));
			keeps = from_keeps_item(w, rte->subquery, (Node *) rte->subquery->jointree, chain);
			list_free(chain);
			return keeps;
		case RTE_CTE:
			if (rte->self_reference)
				return true;
			chain = lcons(q, list_copy(outer));
			keeps = cte_keeps_item(w, rte, chain);
			list_free(chain);
			return keeps;
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

/*
 * Whether the function is one of earmark's C functions (the ones
 * earmark_distribute distributes are all of them; only a superuser can
 * point a C function at earmark's library).
 */
static bool
is_earmark_c_function(Oid funcid)
{
	HeapTuple	tup;
	bool		earmark = false;

	if (!is_not_built_in(funcid, NULL))
		return false;
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (!HeapTupleIsValid(tup))
		return false;
	if (((Form_pg_proc) GETSTRUCT(tup))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		bin = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin, &isnull);

		earmark = !isnull && strcmp(TextDatumGetCString(bin), "$libdir/earmark") == 0;
	}
	ReleaseSysCache(tup);
	return earmark;
}

/*
 * The bare call's calls of earmark's functions that Citus could delegate:
 * the whole select list, or the function in FROM.
 */
static List *
earmark_calls(Query *q)
{
	List	   *candidates = NIL;
	List	   *calls = NIL;
	ListCell   *lc;

	if (list_length(q->targetList) == 1)
		candidates = lappend(candidates, linitial_node(TargetEntry, q->targetList)->expr);
	if (q->rtable != NIL)
		candidates = lappend(candidates,
							 linitial_node(RangeTblFunction,
										   linitial_node(RangeTblEntry, q->rtable)->functions)->funcexpr);
	foreach(lc, candidates)
	{
		Node	   *call = lfirst(lc);

		if (IsA(call, FuncExpr) && is_earmark_c_function(((FuncExpr *) call)->funcid))
			calls = lappend(calls, call);
	}
	return calls;
}

/*
 * The call's first argument as a volatile expression of the same value
 * (CASE WHEN clock_timestamp() IS NOT NULL THEN arg ELSE arg END): Citus
 * delegates no call with a volatile argument.  Not a filter: the statement
 * may be a PL/pgSQL simple expression (v := earmark_budget(NULL)), whose
 * plan must stay a Result without one.
 */
static void
make_first_argument_volatile(FuncExpr *call)
{
	Node	   *arg = linitial(call->args);
	CaseExpr   *c = makeNode(CaseExpr);
	CaseWhen   *w = makeNode(CaseWhen);

	w->expr = (Expr *) fence();
	w->result = (Expr *) copyObject(arg);
	w->location = -1;
	c->casetype = exprType(arg);
	c->casecollid = exprCollation(arg);
	c->arg = NULL;
	c->args = list_make1(w);
	c->defresult = (Expr *) arg;
	c->location = -1;
	linitial(call->args) = c;
}

/*
 * Fence the bare call's earmark calls whose first argument (the account,
 * the argument earmark distributes its functions by) is NULL once folded
 * as the planner will fold it, with the statement's parameters: Citus 13.2
 * hashes a NULL distribution argument and crashes.  Written NULL, a default
 * (the account of earmark_reconcile() is NULL: every account), a folded
 * expression, a bound parameter or a PL/pgSQL variable.  The folded
 * arguments replace the call's own, so that the planner finds them folded
 * and does not run an immutable function among them a second time.
 */
static void
fence_null_account(List *calls, ParamListInfo boundParams)
{
	PlannerGlobal glob;
	PlannerInfo root;
	ListCell   *lc;

	MemSet(&glob, 0, sizeof(glob));
	glob.type = T_PlannerGlobal;
	glob.boundParams = boundParams;
	MemSet(&root, 0, sizeof(root));
	root.type = T_PlannerInfo;
	root.glob = &glob;
	foreach(lc, calls)
	{
		FuncExpr   *call = lfirst_node(FuncExpr, lc);
		Node	   *folded = eval_const_expressions(&root, (Node *) copyObject(call));
		Node	   *arg;

		if (!IsA(folded, FuncExpr) || ((FuncExpr *) folded)->funcid != call->funcid)
			continue;
		call->args = ((FuncExpr *) folded)->args;
		if (call->args == NIL)
			continue;
		arg = strip_implicit_coercions(linitial(call->args));
		if (IsA(arg, Const) && ((Const *) arg)->constisnull)
			make_first_argument_volatile(call);
	}
}

/*
 * Whether the statement gets the filter: on a distributed install, a SELECT
 * that could become a bare call only by planning (see the file header).  A
 * bare call whose account is NULL gets its argument fenced here instead
 * (fence_null_account changes the call).  Cheapest tests first: without
 * Citus it is one catalog cache lookup; the walks and the catalog scan run
 * for the few statements that pass.
 */
static bool
needs_fence(Query *parse, ParamListInfo boundParams)
{
	FromWalk	w = {NIL};

	if (parse->commandType != CMD_SELECT || parse->setOperations != NULL ||
		!em_citus_installed())
		return false;
	if (is_bare(parse))
	{
		List	   *calls;

		if ((calls = earmark_calls(parse)) != NIL &&
			em_account_table_distributed())
			fence_null_account(calls, boundParams);
		return false;
	}
	else if (from_keeps_item(&w, parse, (Node *) parse->jointree, NIL) ||
			 !calls_added_function((Node *) parse, NULL))
		return false;
	return em_account_table_distributed();
}

static PlannedStmt *
em_planner(Query *parse, const char *query_string, int cursorOptions,
		   ParamListInfo boundParams)
{
	if (needs_fence(parse, boundParams))
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
