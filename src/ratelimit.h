/*-------------------------------------------------------------------------
 *
 * ratelimit.h
 *	  The admission rate limit, per account, in shared memory
 *	  (ratelimit.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_RATELIMIT_H
#define EARMARK_RATELIMIT_H

#include "postgres.h"

#include "datatype/timestamp.h"

extern Size em_rate_shmem_size(void);
extern void em_rate_shmem_init(void);
extern TimestampTz em_gcra(TimestampTz tat, TimestampTz now, int64 step,
						   int64 tolerance);
extern bool em_rate_conforms(text *account, TimestampTz now);
extern void em_rate_give_back(text *account);

#endif							/* EARMARK_RATELIMIT_H */
