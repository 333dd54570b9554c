/*-------------------------------------------------------------------------
 *
 * entries.h
 *	  The ledger's rows (entries.c): every statement that writes
 *	  earmark.ledger_entry, for the usage ledger and the batch forms, and
 *	  the gate's single-node settlement.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_ENTRIES_H
#define EARMARK_ENTRIES_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* a key's row (recorded usage); false when the key had written it already */
extern bool em_entry_key(text *account, int64 budget_id, int64 units, text *key,
						 TimestampTz occurred_at, TimestampTz recorded_at);

/*
 * n keys' rows, one counter row per cycle in shard and the cycles' marks
 * (but for the nmarked cycles in marked, which the caller saw marked), in
 * one statement; written[i] tells whether row i was written (its key was
 * not taken).  The arrays hold Datums of bigint, bigint, text and
 * timestamptz; marked of bigint.
 */
extern void em_entry_keys(text *account, int n, Datum *budget_ids, Datum *units,
						  Datum *keys, Datum *occurred_at, int nmarked, Datum *marked,
						  int32 shard, TimestampTz recorded_at, bool *written);

/*
 * A settlement into the budget row on a single node: the release and
 * (when it charged something) the cycle's mark, in one statement.
 */
extern void em_entry_settle_local(text *account, int64 budget_id, int64 amount,
								  int64 charged);

#endif							/* EARMARK_ENTRIES_H */
