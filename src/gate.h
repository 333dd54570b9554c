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

/*
 * Settle up to max_jobs holds whose lease has passed, in the caller's SPI
 * connection.  With wait_first the first budget is waited for; the worker
 * waits for none.
 */
extern int	em_sweep(int max_jobs, bool wait_first);

#endif							/* EARMARK_GATE_H */
