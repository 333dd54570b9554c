/*-------------------------------------------------------------------------
 *
 * provider.h
 *	  The provider's meter and limits (provider.c) and the HTTP batch they
 *	  run on (http.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_PROVIDER_H
#define EARMARK_PROVIDER_H

#include "postgres.h"

#include "nodes/pg_list.h"
#include "utils/timestamp.h"

/* ---------------------------------------------------------------------
 * HTTP (http.c)
 * ---------------------------------------------------------------------
 */
#define EM_HTTP_MAX_HEADERS 4

typedef struct EmHttpRequest
{
	/* in */
	const char *method;			/* GET, POST or PUT */
	const char *url;
	const char *body;			/* NULL: none */
	const char *content_type;	/* of the body */
	const char *headers[EM_HTTP_MAX_HEADERS + 1];	/* "Name: value", NULL-ended */
	char	   *auth_header;	/* "Authorization: ...", palloc'd, or NULL: a
								 * secret, zeroed and freed by em_http_run */
	size_t		max_bytes;		/* 0: 1 MB */
	bool		discard_body;	/* the answer's body is not kept */
	/* out */
	long		status;			/* 0 when no answer arrived */
	char	   *body_out;		/* palloc'd, NUL-terminated */
	size_t		body_len;
	const char *error;			/* transport error, NULL if none */
	long		retry_after;	/* RateLimit-Reset / Retry-After seconds, or -1 */
	double		elapsed_ms;
} EmHttpRequest;

/* called between polls of a batch, with libcurl off the stack */
typedef void (*EmHttpTick) (void *arg);

extern void em_http_run(EmHttpRequest *reqs, int n, int parallel, int timeout_ms,
						EmHttpTick tick, void *tick_arg);

/* zero a secret (a token, a key, an answer that carried one) and free it */
extern void em_forget(char *s, size_t len);

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
	long		retry_after;	/* seconds, -1 if none */
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

/* ---------------------------------------------------------------------
 * Limit cache (limits.c)
 * ---------------------------------------------------------------------
 */
typedef enum EmLimitAge
{
	EM_LIMIT_FRESH,				/* use it */
	EM_LIMIT_STALE,				/* use it, and ask the worker to read it again */
	EM_LIMIT_UNKNOWN,			/* refuse */
	EM_LIMIT_UNKNOWN_WANTED		/* refuse, and ask the worker to read it */
} EmLimitAge;

/* an account whose limits an admission asked for */
typedef struct EmWantedLimits
{
	char	   *account;
	char	   *customer;		/* provider_customer, may be NULL */
} EmWantedLimits;

extern EmLimitAge em_limit_age(bool has_row, bool provider_row, bool has_fetched,
							   TimestampTz fetched_at, TimestampTz now);
extern void em_want_limits(text *account);
extern int	em_refresh_account_limits(const char *account, char **error);
extern List *em_wanted_limit_accounts(int max, MemoryContext cxt);
extern int	em_store_account_limits(const char *account, List *limits);
extern void em_limits_read_failed(const char *account, const char *error);

/* ---------------------------------------------------------------------
 * Reporter (meter.c)
 * ---------------------------------------------------------------------
 */
extern int	em_report_claim(int max_cycles, TimestampTz now, EmMeterOp **ops_out,
							MemoryContext cxt);
extern void em_report_send(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg);
extern int	em_report_finish(EmMeterOp *ops, int n, TimestampTz now, int *failed);
extern void em_log_send(EmMeterOp *op, const char *origin);

#endif							/* EARMARK_PROVIDER_H */
