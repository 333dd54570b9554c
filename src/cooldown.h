/*-------------------------------------------------------------------------
 *
 * cooldown.h
 *	  Cooldowns every backend sees (cooldown.c): "the last time anyone did
 *	  X" for a few keys, and a copy of what the last taker got, in shared
 *	  memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_COOLDOWN_H
#define EARMARK_COOLDOWN_H

#include "postgres.h"

#include "datatype/timestamp.h"

typedef enum EmCooldownResult
{
	EM_COOLDOWN_TAKEN,			/* not taken within the cooldown: now it is */
	EM_COOLDOWN_WAIT,			/* taken less than the cooldown ago */
	EM_COOLDOWN_NO_SHMEM		/* earmark is not in shared_preload_libraries */
} EmCooldownResult;

extern EmCooldownResult em_cooldown_take(uint64 key, TimestampTz now,
										 int64 cooldown_us, TimestampTz *last);

/* what the taker got, for every backend (the newest of each name) */
extern void em_cooldown_share(const char *name, TimestampTz at, const void *data, Size len);
extern void *em_cooldown_shared(const char *name, TimestampTz after, TimestampTz *at);

/* the area, asked for and made by _PG_init's shared memory hooks */
extern void em_cooldown_shmem_request(void);
extern void em_cooldown_shmem_init(void);

#endif							/* EARMARK_COOLDOWN_H */
