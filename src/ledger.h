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

#include "datatype/timestamp.h"

/* counter rows per cycle for recorded usage */
#define EARMARK_USAGE_SHARDS	64

/*
 * The most units one earmark_record_usage call records (10^15): far past
 * any real usage, and small enough that a cycle's counters stay far from
 * bigint's end.
 */
#define EARMARK_MAX_UNITS		INT64CONST(1000000000000000)

/* the usage counter row this backend writes (ledger.c) */
extern int32 em_usage_shard(void);

/* a cycle's total without a scan of its ledger: budget row, slots, counters */
extern int64 em_cycle_total(text *account, int64 budget_id, bool latest, bool *found);

/*
 * earmark_record_usage's steps, for its batch form (batch.c): the checks
 * of units and occurred_at; the account's anchor under its advisory lock
 * (EM007 when the account does not exist); a repeat of a key (true, or
 * EM001); the cycle's budget row, created on first use, or found only
 * (false when the cycle has none yet); a correction's check against the
 * cycle's total (its budget row locked).
 */
extern void em_usage_check(int64 units, TimestampTz occurred_at, TimestampTz now);
extern void em_usage_lock_anchor(text *account, bool *has_anchor, TimestampTz *anchor);
extern bool em_usage_repeat(text *account, text *key, int64 units, text *feature);
extern int64 em_usage_budget(text *account, text *feature, TimestampTz start,
							 TimestampTz end);
extern void em_usage_check_correction(text *account, int64 budget_id, int64 units,
									  TimestampTz start);

/*
 * A cycle's total as SQL, for a budget row aliased b: the settled jobs
 * (the budget row and its escrow slots) and the recorded usage (its
 * shards).  Equal to the sum of the cycle's ledger rows; the reconciler
 * proves it.  For readers of many cycles; one cycle's total is
 * em_cycle_total (above).
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
