/*-------------------------------------------------------------------------
 *
 * limit_cache.h
 *	  The cache of limits read from the provider (limit_cache.c): how old a
 *	  cached limit is, the accounts whose limits an admission asked for,
 *	  and the worker's reads.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_LIMIT_CACHE_H
#define EARMARK_LIMIT_CACHE_H

#include "postgres.h"

#include "nodes/pg_list.h"
#include "utils/timestamp.h"

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
extern int	em_store_limits_read(const char *account, List *limits, const char *error);

#endif							/* EARMARK_LIMIT_CACHE_H */
