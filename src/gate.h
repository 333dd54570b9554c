/*-------------------------------------------------------------------------
 *
 * gate.h
 *	  The gate (gate.c): reserve, charge, heartbeat, settle, and the sweep
 *	  of holds whose lease has passed.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_GATE_H
#define EARMARK_GATE_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "fmgr.h"

/*
 * Settle up to max_jobs holds whose lease has passed, in the caller's SPI
 * connection.  With wait_first the first budget is waited for; the worker
 * waits for none.
 */
extern int	em_sweep(int max_jobs, bool wait_first);

/*
 * One reserve and one settle inside the caller's SPI connection, on
 * checked arguments: the steps of earmark_reserve and earmark_settle, for
 * their batch forms (batch.c).
 */
typedef struct EmReserveAnswer
{
	bool		admitted;
	int64		job_id;
	bool		unlimited;
	int64		remaining;
	bool		has_reason;
	char		reason[128];
} EmReserveAnswer;

typedef struct EmSettleAnswer
{
	int64		charged;
	int64		released;
	const char *status;			/* a constant */
} EmSettleAnswer;

extern void em_reserve_one(text *account, int64 amount, text *key, text *feature,
						   Interval *lease, TimestampTz now, EmReserveAnswer *out);
extern void em_settle_one(text *account, int64 job_id, bool has_used, int64 used,
						  const char *outcome, TimestampTz now, EmSettleAnswer *out);

/*
 * A reserve's lease argument: a positive interval, or earmark.lease when
 * it is NULL (earmark_reserve's and earmark_reserve_many's).
 */
extern Interval *em_arg_lease(FunctionCallInfo fcinfo, int argno, TimestampTz now);

#endif							/* EARMARK_GATE_H */
