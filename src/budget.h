/*-------------------------------------------------------------------------
 *
 * budget.h
 *	  A cycle's budget row and the holds admitted into it (budget.c): the
 *	  operations that the gate (gate.c) and escrow's slow path (escrow.c)
 *	  both run under the budget row's lock.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_BUDGET_H
#define EARMARK_BUDGET_H

#include "postgres.h"

#include "common/int128.h"
#include "datatype/timestamp.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"

/* dead holds a reserve's reclaim expires at once */
#define EARMARK_RECLAIM_BATCH	1000

/* what an admission attempt came to */
typedef enum EmAdmit
{
	EM_ADMIT_NO_SLOT,			/* escrow's fast path found no slot: go slow */
	EM_ADMIT_OK,				/* the hold was taken */
	EM_ADMIT_KEY_TAKEN,			/* a concurrent reserve of the key won */
	EM_ADMIT_REFUSED			/* no room */
} EmAdmit;

/* the hold a reserve asks for */
typedef struct EmHold
{
	text	   *account;
	text	   *feature;
	text	   *key;
	int64		amount;
	Interval   *lease;
	TimestampTz now;
	TimestampTz lease_until;
	int64		job_id;			/* set when admitted */
} EmHold;

/* a locked budget row, as the reserve read it */
typedef struct EmBudget
{
	int64		budget_id;
	TimestampTz cycle_start;
	int64		used;			/* outside the escrow slots */
	int64		held;
	int			slots;
	bool		slot_lim_null;
	int64		slot_lim;
	int64		slot_gen;
	int64		slot_cut;		/* rebalances that cut room (escrow.c) */
	/* read after the lock */
	bool		unlimited;
	int64		lim;			/* the limit, less recorded usage for escrow */
	int64		raw_lim;		/* the account's limit itself (escrow's slot_lim) */
	int64		recorded;		/* usage recorded without a hold */
} EmBudget;

extern bool em_budget_lock(text *account, text *feature, TimestampTz start,
						   EmBudget *b);
extern bool em_budget_numbers(text *account, text *feature, TimestampTz start,
							  Snapshot snap, int64 *budget_id, int64 *used,
							  int64 *held);
extern bool em_budget_find(text *account, text *feature, TimestampTz start,
						   int64 *budget_id);
extern void em_budget_create(text *account, text *feature, TimestampTz start,
							 TimestampTz end);
extern void em_budget_write(text *account, int64 budget_id, int64 used,
							int64 held);
extern bool em_budget_release(text *account, int64 budget_id, int64 released,
							  int64 charged);
extern EmAdmit em_budget_admit(EmHold *h, EmBudget *b);
extern int64 em_bigint_sum(INT128 sum);
extern int64 em_budget_recorded(text *account, int64 budget_id, Snapshot snap);
extern int64 em_budget_expire(text *account, int64 budget_id, TimestampTz now,
							  int max, bool wait, int64 *released,
							  int64 *charged);
extern int64 em_budget_reclaim(text *account, int64 budget_id, TimestampTz now,
							   int max, int64 *released, int64 *charged);
extern bool em_budget_none_dead(int64 budget_id, TimestampTz now, uint64 *gen);
extern bool em_budget_floor_unmoved(int64 budget_id, uint64 gen);

/* the cycle's mark lock (see budget.c) */
extern void em_mark_lock(int64 budget_id);
extern bool em_mark_seen(text *account, int64 budget_id);
extern bool em_mark_try_lock(int64 budget_id);
extern bool em_mark_try_lock_exclusive(int64 budget_id);
extern void em_mark_cycle(text *account, int64 budget_id);


/* limit - used - held, at least 0; unlimited reads as PG_INT64_MAX */
extern int64 em_room_left(bool unlimited, int64 lim, int64 used, int64 held);

#endif							/* EARMARK_BUDGET_H */
