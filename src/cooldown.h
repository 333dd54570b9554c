/*-------------------------------------------------------------------------
 *
 * cooldown.h
 *	  Cooldowns every backend sees (cooldown.c): "the last time anyone did
 *	  X" for a few keys, in shared memory.
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

/* the area, asked for and made by _PG_init's shared memory hooks */
extern Size em_cooldown_shmem_size(void);
extern void em_cooldown_shmem_init(void);

#endif							/* EARMARK_COOLDOWN_H */
