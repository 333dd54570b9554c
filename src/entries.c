/*-------------------------------------------------------------------------
 *
 * entries.c
 *	  The ledger's rows and their SQL: every statement that writes
 *	  earmark.ledger_entry.  A key's row (earmark_record_usage, ledger.c),
 *	  many keys' rows (earmark_record_usage_many, batch.c), and a
 *	  settlement on a single node (gate.c).  A settled job writes no row
 *	  here: since 0.3.0 its own job row, which its settlement writes, is its
 *	  ledger entry (the view earmark.ledger, earmark.sql).  What a row
 *	  means, and when one is written, is its caller's; the statements are
 *	  here, so that the ledger's columns and its key's conflict rule are
 *	  written once.
 *
 *	  Tables: earmark.ledger_entry (append-only); in the statements that write a
 *	  row with what goes with it, earmark.usage_shard and earmark.meter_mark
 *	  (the batch's counters and marks) and earmark.budget (a settlement's
 *	  held and used).
 *
 *	  Locks: none of its own.  A key's row waits, on the ledger's unique
 *	  index, for a concurrent writer of the same key; the single-node
 *	  settlement updates (and so locks) the budget row.  The callers hold
 *	  what the rows need: the cycle's mark lock, shared, taken before any
 *	  row is written (budget.c: the reporter never deletes a mark whose
 *	  usage it has not seen).
 *
 *	  Every statement names the account (account = $1 on every relation),
 *	  so that on Citus each write reaches the account's shard alone.  A
 *	  statement of one write runs there as it is; Citus runs key_rows, a
 *	  statement of several, as steps whose intermediate results it sends
 *	  to the workers; the settlement's runs only on a single node.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "entries.h"
#include "spi.h"

/*
 * Nothing when the key is already taken (a concurrent writer of the same
 * key is waited for by the unique index, then conflicts).
 */
static EmStatement key_row = {
	"INSERT INTO earmark.ledger_entry (account, budget_id, units, entry_key, occurred_at, recorded_at) "
	"VALUES ($1, $2, $3, $4, $5, $6) "
	"ON CONFLICT (account, entry_key) WHERE entry_key IS NOT NULL DO NOTHING",
	6, {TEXTOID, INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

/*
 * The keys' rows, one counter row per cycle and the cycles' marks, in one
 * statement: key_row for many rows.  It returns the key of each row it
 * wrote (em_entry_keys finds its position in the arrays); a key another
 * transaction wrote meanwhile is waited for and skipped.  A cycle's mark is inserted unless the
 * caller saw it marked ($9: em_mark_seen, on a single node) or the
 * statement's snapshot shows a mark ($8, under READ COMMITTED: that
 * snapshot is taken after the caller's mark locks, while a transaction's
 * snapshot may be older and still show a mark the reporter deleted since;
 * then the mark is inserted, and the reporter deletes every mark of a
 * cycle).
 */
static EmStatement key_rows = {
	"WITH e AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::bigint[]), "
	"                                    pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::timestamptz[])) "
	"           WITH ORDINALITY AS e (budget_id, units, entry_key, occurred_at, n)),"
	" l AS (INSERT INTO earmark.ledger_entry (account, budget_id, units, entry_key, occurred_at, recorded_at)"
	"       SELECT $1, e.budget_id, e.units, e.entry_key, e.occurred_at, $7 FROM e ORDER BY e.n"
	"       ON CONFLICT (account, entry_key) WHERE entry_key IS NOT NULL DO NOTHING"
	"       RETURNING budget_id, units, entry_key),"
	" c AS (INSERT INTO earmark.usage_shard AS u (account, budget_id, shard, units)"
	"       SELECT $1, l.budget_id, $6, pg_catalog.sum(l.units)::bigint FROM l GROUP BY l.budget_id"
	"       ON CONFLICT (account, budget_id, shard) DO UPDATE SET units = u.units + excluded.units"
	"       RETURNING budget_id),"
	" m AS (INSERT INTO earmark.meter_mark (account, budget_id)"
	"       SELECT $1, c.budget_id FROM c WHERE c.budget_id <> ALL ($9) AND NOT ($8 AND EXISTS ("
	"         SELECT 1 FROM earmark.meter_mark x WHERE x.account = $1 AND x.budget_id = c.budget_id))) "
	"SELECT l.entry_key FROM l",
	9, {TEXTOID, INT8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, INT4OID,
	TIMESTAMPTZOID, BOOLOID, INT8ARRAYOID}
};

/*
 * A settlement of a hold in the budget row, on a single node: the
 * release and the mark in one statement (a statement fewer than gate.c's
 * one after another).  The mark is written only after the budget row's
 * update, which it depends on: the main statement reads b, so b runs
 * first; the caller runs it when it saw no mark (em_mark_seen).  (The job
 * row, which the caller's settlement wrote, is the ledger entry.)  Not on
 * Citus, which plans a statement of several writes
 * in steps whose intermediate results go to every node; nor under
 * SERIALIZABLE, where the plan's read of the budget table (a sequential
 * scan of a small one) would be a predicate lock on every account's
 * budgets (gate.c's write_settlement).
 */
static EmStatement settle_local = {
	"WITH b AS (UPDATE earmark.budget SET held = held - $3, used = used + $4 "
	"           WHERE account = $1 AND budget_id = $2 RETURNING 1) "
	"INSERT INTO earmark.meter_mark (account, budget_id) "
	"SELECT $1, $2 WHERE $4 > 0 AND EXISTS (SELECT 1 FROM b)",
	4, {TEXTOID, INT8OID, INT8OID, INT8OID}
};

bool
em_entry_key(text *account, int64 budget_id, int64 units, text *key,
			 TimestampTz occurred_at, TimestampTz recorded_at)
{
	Datum		args[6];

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int64GetDatum(units);
	args[3] = PointerGetDatum(key);
	args[4] = TimestampTzGetDatum(occurred_at);
	args[5] = TimestampTzGetDatum(recorded_at);
	em_exec(&key_row, args, NULL, 0);
	return SPI_processed > 0;
}

/*
 * Mark the position of each key key_rows returned as written.  The keys
 * of one call are distinct (batch.c sends a repeated key through the
 * single call's steps), and the rows come back in the order they were
 * inserted, which is the arrays' order: each search starts after the last
 * key found, and goes round once whatever the order.  A key an operator's
 * trigger changed (or set to NULL) matches no position, as it matched no
 * event in the join this replaces: that event's row is then looked for by
 * its own key (batch.c).
 */
static void
mark_written(int n, Datum *keys, bool *written)
{
	uint64		r;
	int			next = 0;
	int			i;

	for (i = 0; i < n; i++)
		written[i] = false;
	for (r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		Datum		d = em_get((int) r, 1, &isnull);
		text	   *key;
		int			k;

		if (isnull)
			continue;
		key = DatumGetTextPP(d);
		for (k = 0; k < n; k++)
		{
			i = (next + k) % n;
			if (!written[i] && em_text_eq(key, DatumGetTextPP(keys[i])))
			{
				written[i] = true;
				next = i + 1;
				break;
			}
		}
	}
}

/* a one-dimensional array of n Datums of a fixed-length, by-value type */
static Datum
int8_like_array(Datum *values, int n, Oid type)
{
	return PointerGetDatum(construct_array(values, n, type, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

void
em_entry_keys(text *account, int n, Datum *budget_ids, Datum *units,
			  Datum *keys, Datum *occurred_at, int nmarked, Datum *marked,
			  int32 shard, TimestampTz recorded_at, bool *written)
{
	Datum		args[9];

	args[0] = PointerGetDatum(account);
	args[1] = int8_like_array(budget_ids, n, INT8OID);
	args[2] = int8_like_array(units, n, INT8OID);
	args[3] = PointerGetDatum(construct_array(keys, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[4] = int8_like_array(occurred_at, n, TIMESTAMPTZOID);
	args[5] = Int32GetDatum(shard);
	args[6] = TimestampTzGetDatum(recorded_at);
	args[7] = BoolGetDatum(!IsolationUsesXactSnapshot());
	args[8] = int8_like_array(marked, nmarked, INT8OID);
	em_exec(&key_rows, args, NULL, 0);
	mark_written(n, keys, written);
}

void
em_entry_settle_local(text *account, int64 budget_id, int64 amount,
					  int64 charged)
{
	Datum		args[4];

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	args[2] = Int64GetDatum(amount);
	args[3] = Int64GetDatum(charged);
	em_exec(&settle_local, args, NULL, 0);
}
