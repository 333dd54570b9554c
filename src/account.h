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
#include "storage/lockdefs.h"
#include "utils/snapshot.h"

/* the cycle that contains "at": a month from the anchor's day, in UTC */
extern void em_cycle_bounds(TimestampTz anchor, bool has_anchor, TimestampTz at,
							TimestampTz *start, TimestampTz *end);

/* one of the account's own locks (EARMARK_*_LOCKTAG), until commit */
extern void em_account_key_lock(const char *account, int len, uint16 kind,
								LOCKMODE mode);

/* the account's lock, exclusive */
extern void em_account_lock(text *account);

/* the account's lock, shared, and its anchor (inside SPI); false if no account */
extern bool em_account_anchor_shared(text *account, bool *has_anchor,
									 TimestampTz *anchor);

/* the account's anchor in snap, by index from C (a single node); false if no account */
extern bool em_account_anchor_in(text *account, Snapshot snap, bool *has_anchor,
								 TimestampTz *anchor);

/* the account's anchor in the latest snapshot; false if no account */
extern bool em_account_anchor_latest(text *account, bool *has_anchor,
									 TimestampTz *anchor);

#endif							/* EARMARK_ACCOUNT_H */
