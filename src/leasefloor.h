/*-------------------------------------------------------------------------
 *
 * leasefloor.h
 *	  A budget's lease floor: a time before which none of its open holds'
 *	  leases ends, in shared memory (leasefloor.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_LEASEFLOOR_H
#define EARMARK_LEASEFLOOR_H

#include "postgres.h"

#include "utils/timestamp.h"

/* what a search for dead holds read before its snapshot (em_floor_begin) */
typedef struct EmFloorToken
{
	bool		valid;			/* false: the search may not store */
	int			set;
	uint64		gen;
} EmFloorToken;

extern Size em_floor_shmem_size(void);
extern void em_floor_shmem_init(void);
extern void em_floor_note_hold(int64 budget_id, TimestampTz lease_until);
extern bool em_floor_none_dead(Oid jobnode, int64 budget_id, TimestampTz now, uint64 *gen);
extern bool em_floor_gen_unmoved(int64 budget_id, uint64 gen);
extern void em_floor_begin(int64 budget_id, EmFloorToken *token);
extern void em_floor_store(const EmFloorToken *token, Oid jobnode, int64 budget_id,
						   TimestampTz floor);

#endif							/* EARMARK_LEASEFLOOR_H */
