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

#endif							/* EARMARK_LEDGER_H */
