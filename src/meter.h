/*-------------------------------------------------------------------------
 *
 * meter.h
 *	  The reporter (meter.c): the worker's pass that sends marked cycles'
 *	  totals to the provider's meter, in three steps, and its log line.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_METER_H
#define EARMARK_METER_H

#include "postgres.h"

#include "utils/timestamp.h"

#include "http.h"
#include "provider.h"

extern int	em_report_claim(int max_cycles, TimestampTz now, EmMeterOp **ops_out,
							MemoryContext cxt);
extern void em_report_send(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg);
extern int	em_report_finish(EmMeterOp *ops, int n, TimestampTz now, int *failed);
extern void em_log_send(EmMeterOp *op, const char *origin);

/* the database's send lock: one sender of totals at a time (meter.c) */
extern void em_send_lock(void);
extern void em_send_unlock(void);
extern bool em_send_try_lock_session(void);
extern void em_send_unlock_session(void);

#endif							/* EARMARK_METER_H */
