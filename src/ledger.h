/*-------------------------------------------------------------------------
 *
 * ledger.h
 *	  The usage ledger (ledger.c): recorded usage, and a cycle's total read
 *	  from its counters.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_LEDGER_H
#define EARMARK_LEDGER_H

#include "postgres.h"

/* counter rows per cycle for recorded usage */
#define EARMARK_USAGE_SHARDS	64

/*
 * The most units one earmark_record_usage call records (10^15): far past
 * any real usage, and small enough that a cycle's counters stay far from
 * bigint's end.
 */
#define EARMARK_MAX_UNITS		INT64CONST(1000000000000000)

/* a cycle's total without a scan of its ledger: budget row, slots, counters */
extern int64 em_cycle_total(text *account, int64 budget_id, bool *found);

/*
 * A cycle's total as SQL, for a budget row aliased b: the settled jobs
 * (the budget row and its escrow slots) and the recorded usage (its
 * shards).  Equal to the sum of the cycle's ledger rows; the reconciler
 * proves it.  For readers of many cycles; one cycle's total is
 * em_cycle_total (below).
 */
#define EM_CYCLE_TOTAL_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.account = b.account AND s.budget_id = b.budget_id), 0)::bigint " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.account = b.account AND u.budget_id = b.budget_id), 0)::bigint)"

/*
 * The same as numeric, which cannot overflow: for readers of many cycles
 * (the reporter), where one cycle past bigint must not fail the rest.
 */
#define EM_CYCLE_TOTAL_NUMERIC_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.account = b.account AND s.budget_id = b.budget_id), 0) " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.account = b.account AND u.budget_id = b.budget_id), 0))"

#endif							/* EARMARK_LEDGER_H */
