/*-------------------------------------------------------------------------
 *
 * entries.h
 *	  The ledger's rows (entries.c): every statement that writes
 *	  earmark.ledger, for the gate, the budget's expiry, the usage ledger
 *	  and the batch forms.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_ENTRIES_H
#define EARMARK_ENTRIES_H

#include "postgres.h"

#include "datatype/timestamp.h"

/* a job's row: what a settlement or an expiry charged */
extern void em_entry_job(text *account, int64 budget_id, int64 units,
						 int64 job_id, TimestampTz at);

/* a key's row (recorded usage); false when the key had written it already */
extern bool em_entry_key(text *account, int64 budget_id, int64 units, text *key,
						 TimestampTz occurred_at, TimestampTz recorded_at);

/*
 * n keys' rows, one counter row per cycle in shard and the cycles' marks,
 * in one statement; written[i] tells whether row i was written (its key
 * was not taken).  The arrays hold Datums of bigint, bigint, text and
 * timestamptz.
 */
extern void em_entry_keys(text *account, int n, Datum *budget_ids, Datum *units,
						  Datum *keys, Datum *occurred_at, int32 shard,
						  TimestampTz recorded_at, bool *written);

/*
 * A settlement into the budget row on a single node: the release, the
 * job's row (when it charged something) and the cycle's mark, in one
 * statement.
 */
extern void em_entry_settle_local(text *account, int64 budget_id, int64 amount,
								  int64 charged, int64 job_id, TimestampTz at);

#endif							/* EARMARK_ENTRIES_H */
