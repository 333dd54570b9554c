/*-------------------------------------------------------------------------
 *
 * provider.h
 *	  The billing provider (provider.c): writing and reading a cycle's
 *	  meter, and reading an account's limits, over the HTTP batch of
 *	  http.c (or the local stand-in).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_PROVIDER_H
#define EARMARK_PROVIDER_H

#include "postgres.h"

#include "nodes/pg_list.h"
#include "utils/timestamp.h"

#include "http.h"

/* ---------------------------------------------------------------------
 * Provider (provider.c)
 * ---------------------------------------------------------------------
 */
extern const char *em_provider_name(void);

/* a cycle's meter: whose it is and, for a write, the absolute total */
typedef struct EmMeterOp
{
	/* in */
	int64		budget_id;
	const char *mark_account;	/* the mark's account (reporter) */
	const char *account;
	const char *feature;
	const char *customer;		/* provider_customer, may be NULL */
	const char *agreement;		/* provider_agreement, may be NULL */
	TimestampTz cycle_start;
	TimestampTz cycle_end;
	bool		closed;			/* the cycle has ended */
	bool		too_large;		/* its total does not fit a bigint */
	int64		total;			/* a write: the total to set */
	/* out */
	bool		ok;				/* written, or read */
	int64		read_total;		/* a read: the provider's total */
	long		http_status;
	TimestampTz retry_at;		/* the provider's reset, 0 if none */
	double		elapsed_ms;
	char	   *error;
} EmMeterOp;

/*
 * Write each op's absolute total, at most earmark.report_parallel at once.
 * Never raises for a provider failure or answer: each op says how it went.
 * The local provider writes earmark.local_meter through SPI (the caller is
 * connected).  tick (may be NULL) runs between polls, also while a Kinde
 * token is fetched.
 */
extern void em_meter_write(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg);

/* Read each op's total back; ok false means unreadable. */
extern void em_meter_read(EmMeterOp *ops, int n);

/*
 * Plan the local provider's read again at its next call, for the size of
 * earmark.local_meter then (once a page of a run that writes it).
 */
extern void em_meter_read_replan(void);

/* one limit as the provider states it */
typedef struct EmLimit
{
	char	   *feature;
	bool		unlimited;
	int64		lim;
} EmLimit;

/*
 * Read an account's limits from the provider: a List of EmLimit, or NIL
 * with *error set when they could not be read.  Never raises for a
 * provider failure or a hostile answer.  *unreachable (may be NULL) says
 * that the provider itself failed (no answer, a timeout, 429 or 5xx, no
 * token), not just this account's answer.  Needs no transaction: tick
 * (may be NULL) runs between polls.
 */
extern List *em_provider_limits(const char *account, const char *customer,
								EmHttpTick tick, void *tick_arg,
								char **error, bool *unreachable);

#endif							/* EARMARK_PROVIDER_H */
