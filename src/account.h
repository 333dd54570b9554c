/*-------------------------------------------------------------------------
 *
 * account.h
 *	  Accounts, limits and billing cycles (account.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_ACCOUNT_H
#define EARMARK_ACCOUNT_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* the cycle that contains "at": a month from the anchor's day, in UTC */
extern void em_cycle_bounds(TimestampTz anchor, bool has_anchor, TimestampTz at,
							TimestampTz *start, TimestampTz *end);

/* the account's advisory lock, exclusive (inside SPI) */
extern void em_account_lock(text *account);

/* the account's advisory lock, shared, and its anchor; false if no account */
extern bool em_account_anchor_shared(text *account, bool *has_anchor,
									 TimestampTz *anchor);

/* the account's anchor in the latest snapshot; false if no account */
extern bool em_account_anchor_latest(text *account, bool *has_anchor,
									 TimestampTz *anchor);

#endif							/* EARMARK_ACCOUNT_H */
