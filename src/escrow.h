/*-------------------------------------------------------------------------
 *
 * escrow.h
 *	  Escrow for hot budgets (escrow.c): the fast path that admits from a
 *	  slot without the budget row, and the slow path's rebalance.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_ESCROW_H
#define EARMARK_ESCROW_H

#include "postgres.h"

#include "utils/snapshot.h"

#include "budget.h"

/* a budget's numbers as the fast path saw them, before its hold */
typedef struct EscrowNumbers
{
	int64		used;			/* slots and recorded usage included */
	int64		held;
	int64		lim;
	bool		unlimited;
} EscrowNumbers;

/* the slot em_escrow_lock_slot looks for */
typedef struct EmSlotWant
{
	int64		gen;			/* of this generation */
	bool		taking;			/* for an admission, and then also: */
	int32		slots;			/* below the budget's slot count */
	int64		amount;			/* with this much room */
	int64		cut;			/* last cut no later than this stamp */
} EmSlotWant;

extern EmAdmit em_escrow_fast(EmHold *h, TimestampTz cycle_start,
							  EscrowNumbers *numbers);
extern int32 em_escrow_lock_slot(text *account, int64 budget_id, int32 start,
								 const EmSlotWant *w);
extern bool em_escrow_slot_move(text *account, int64 budget_id, int32 slot,
								int64 room, int64 held, int64 used);
extern EmAdmit em_escrow_rebalance(EmHold *h, EmBudget *b, int64 *remaining);
extern int	em_random_slot(int slots);
extern void em_escrow_set_slots(text *account, int64 budget_id, int slots);
extern void em_escrow_slot_totals(text *account, int64 budget_id, Snapshot snap,
								  int64 *used, int64 *held);

#endif							/* EARMARK_ESCROW_H */
