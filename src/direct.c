/*-------------------------------------------------------------------------
 *
 * direct.c
 *	  Reads by index from C, where an SPI statement would cost more than
 *	  the read: executor start-up of a small SPI statement (its plan state,
 *	  tuple descriptors and expressions) is most of its cost, more than
 *	  the index look-up itself (docs/benchmarks.md).  As PostgreSQL's own
 *	  catalog code does (systable scans), a read here opens the table and
 *	  the index, scans the index with equality keys under a snapshot the
 *	  caller gives, and reads the visible rows.
 *
 *	  What a read sees is what the SPI statement it replaces would see:
 *	  em_direct_statement_snapshot advances the command counter and takes
 *	  the snapshot as SPI does for each statement (a new one under READ
 *	  COMMITTED, the transaction's under REPEATABLE READ and SERIALIZABLE);
 *	  the index and heap access methods take the same predicate locks under
 *	  SERIALIZABLE as the executor's index scans.  One locking read,
 *	  em_direct_lock, locks the row it finds as SELECT ... FOR UPDATE does
 *	  (ExecLockRows: the newest version and a re-check of the keys under
 *	  READ COMMITTED, 40001 under REPEATABLE READ).  No writes.
 *
 *	  Only for a single node's own tables: on Citus the tables are shells
 *	  and the rows are in shards, so the callers use SPI there
 *	  (em_distributed, cluster.c).
 *
 *	  Locks: AccessShareLock on the table and the index, held to the end of
 *	  the transaction, as a SELECT takes them (RowShareLock on the table
 *	  and the row lock for em_direct_lock, as SELECT ... FOR UPDATE).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "nodes/pg_list.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "direct.h"

/* every read resolved so far, for the invalidation callback */
static EmDirect *resolved_reads = NULL;
static bool callback_registered = false;

static void
forget_reads(Datum arg, Oid relid)
{
	EmDirect   *d;

	for (d = resolved_reads; d != NULL; d = d->next)
	{
		if (relid == InvalidOid || relid == d->relid || relid == d->indexid)
			d->resolved = false;
	}
}

/*
 * A non-partial valid B-tree index whose leading columns are the keys, each
 * compared as the statement's "column = $n" compares them: in the column's
 * own collation and by the default B-tree operator family of its type.  An
 * index an operator added on the same columns in another collation (a
 * case-insensitive one, say) would match other rows.
 */
static bool
index_fits(Relation rel, Relation idx, AttrNumber *keyatts, int nkeys)
{
	Form_pg_index form = idx->rd_index;
	int			i;

	if (idx->rd_rel->relam != BTREE_AM_OID || !form->indisvalid ||
		form->indnkeyatts < nkeys || idx->rd_indpred != NIL ||
		!heap_attisnull(idx->rd_indextuple, Anum_pg_index_indpred, NULL))
		return false;
	for (i = 0; i < nkeys; i++)
	{
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), keyatts[i] - 1);
		Oid			opclass = GetDefaultOpClass(att->atttypid, BTREE_AM_OID);

		if (form->indkey.values[i] != keyatts[i] ||
			idx->rd_indcollation[i] != att->attcollation ||
			!OidIsValid(opclass) ||
			idx->rd_opfamily[i] != get_opclass_family(opclass))
			return false;
	}
	return true;
}

static void
resolve_keys(EmDirect *d, Relation idx)
{
	int			i;

	for (i = 0; i < d->nkeys; i++)
	{
		Oid			opcintype = idx->rd_opcintype[i];
		Oid			op = get_opfamily_member(idx->rd_opfamily[i], opcintype,
											 opcintype, BTEqualStrategyNumber);

		if (!OidIsValid(op))
			elog(ERROR, "earmark: no equality operator for index column %d of earmark.%s",
				 i + 1, d->table);
		d->eqproc[i] = get_opcode(op);
		d->collation[i] = idx->rd_indcollation[i];
	}
}

static AttrNumber
column(EmDirect *d, const char *name)
{
	AttrNumber	att = get_attnum(d->relid, name);

	if (att == InvalidAttrNumber)
		elog(ERROR, "earmark: table earmark.%s has no column \"%s\"", d->table, name);
	return att;
}

/* the table's and the index's oids and the columns, from the catalogs */
static void
resolve(EmDirect *d, Relation rel)
{
	AttrNumber	keyatts[EM_DIRECT_MAX_KEYS];
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	int			i;

	for (i = 0; i < d->nkeys; i++)
		keyatts[i] = column(d, d->keys[i]);
	for (i = 0; i < d->ncols; i++)
		d->attnums[i] = column(d, d->cols[i]);
	d->indexid = InvalidOid;
	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		bool		fits = index_fits(rel, idx, keyatts, d->nkeys);

		if (fits)
		{
			d->indexid = RelationGetRelid(idx);
			resolve_keys(d, idx);
		}
		index_close(idx, NoLock);
		if (fits)
			break;
	}
	list_free(indexes);
	if (!OidIsValid(d->indexid))
		elog(ERROR, "earmark: no index of earmark.%s leads with the columns it is read by",
			 d->table);
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_reads, (Datum) 0);
		callback_registered = true;
	}
	if (!d->listed)
	{
		d->next = resolved_reads;
		resolved_reads = d;
		d->listed = true;
	}
	d->resolved = true;
}

/*
 * The table, locked, with *d resolved for it.  A table dropped and made
 * again (DROP and CREATE EXTENSION) has a new oid: the lock's invalidation
 * tells, and the name is looked up again.
 */
static Relation
open_table(EmDirect *d, LOCKMODE mode)
{
	int			attempt;

	for (attempt = 0; attempt < 3; attempt++)
	{
		Relation	rel;
		Oid			relid = d->resolved ? d->relid :
			get_relname_relid(d->table, get_namespace_oid("earmark", false));

		if (!OidIsValid(relid))
			elog(ERROR, "earmark: table earmark.%s does not exist", d->table);
		rel = try_table_open(relid, mode);
		if (rel == NULL)
		{
			d->resolved = false;
			continue;
		}
		if (!d->resolved)
		{
			d->relid = relid;
			resolve(d, rel);
		}
		if (d->resolved && d->relid == relid)
			return rel;
		table_close(rel, NoLock);
	}
	elog(ERROR, "earmark: table earmark.%s keeps changing", d->table);
	return NULL;				/* keep compiler quiet */
}

Snapshot
em_direct_statement_snapshot(void)
{
	/* as SPI does before each statement that is not read-only */
	CommandCounterIncrement();
	return RegisterSnapshot(GetTransactionSnapshot());
}

Snapshot
em_direct_latest_snapshot(void)
{
	return RegisterSnapshot(GetLatestSnapshot());
}

void
em_direct_release(Snapshot snap)
{
	UnregisterSnapshot(snap);
}

/* the scan of em_direct_scan and em_direct_get; copy: the first row only, copied */
static int
scan_rows(EmDirect *d, Datum *keys, Snapshot snap, EmDirectRow fn, void *arg,
		  Datum *copy_values, bool *copy_nulls)
{
	Relation	rel = open_table(d, AccessShareLock);
	Relation	idx = index_open(d->indexid, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	ScanKeyData skeys[EM_DIRECT_MAX_KEYS];
	IndexScanDesc scan;
	Datum		values[EM_DIRECT_MAX_COLS];
	bool		nulls[EM_DIRECT_MAX_COLS];
	int			n = 0;
	int			i;

	for (i = 0; i < d->nkeys; i++)
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, d->collation[i], d->eqproc[i], keys[i]);
	scan = index_beginscan(rel, idx, snap, d->nkeys, 0);
	index_rescan(scan, skeys, d->nkeys, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		n++;
		for (i = 0; i < d->ncols; i++)
			values[i] = slot_getattr(slot, d->attnums[i], &nulls[i]);
		if (copy_values)
		{
			TupleDesc	desc = RelationGetDescr(rel);

			for (i = 0; i < d->ncols; i++)
			{
				Form_pg_attribute att = TupleDescAttr(desc, d->attnums[i] - 1);

				copy_nulls[i] = nulls[i];
				copy_values[i] = nulls[i] ? (Datum) 0 :
					datumCopy(values[i], att->attbyval, att->attlen);
			}
			break;
		}
		if (!fn(values, nulls, arg))
			break;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	return n;
}

/* each visible row to fn; how many were read */
int
em_direct_scan(EmDirect *d, Datum *keys, Snapshot snap, EmDirectRow fn, void *arg)
{
	return scan_rows(d, keys, snap, fn, arg, NULL, NULL);
}

/*
 * The first visible row's columns, copied into the current memory context
 * (by a unique index: the row); false when none is visible.
 */
bool
em_direct_get(EmDirect *d, Datum *keys, Snapshot snap, Datum *values, bool *nulls)
{
	return scan_rows(d, keys, snap, NULL, NULL, values, nulls) > 0;
}

/* the locked version still has the keys the scan matched (EvalPlanQual's re-check) */
static bool
keys_hold(EmDirect *d, TupleTableSlot *slot, AttrNumber *keyatts, Datum *keys)
{
	int			i;

	for (i = 0; i < d->nkeys; i++)
	{
		bool		isnull;
		Datum		v = slot_getattr(slot, keyatts[i], &isnull);

		if (isnull || !DatumGetBool(OidFunctionCall2Coll(d->eqproc[i], d->collation[i], v, keys[i])))
			return false;
	}
	return true;
}

/*
 * The first row the statement's snapshot sees by the index, locked FOR
 * UPDATE as SELECT ... FOR UPDATE locks it (ExecLockRows): RowShareLock on
 * the table; the row lock waits for a concurrent writer; under READ
 * COMMITTED it locks the row's newest version (following its update
 * chain) and returns it if the keys still match; under REPEATABLE READ and
 * SERIALIZABLE a row changed or deleted after the snapshot fails with
 * 40001.  False when no row is visible, or (READ COMMITTED) it was
 * deleted, or its newest version no longer matches.  The columns of the
 * locked version are copied into the current memory context.
 */
bool
em_direct_lock(EmDirect *d, Datum *keys, Datum *values, bool *nulls)
{
	Snapshot	snap = em_direct_statement_snapshot();
	Relation	rel = open_table(d, RowShareLock);
	Relation	idx = index_open(d->indexid, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	ScanKeyData skeys[EM_DIRECT_MAX_KEYS];
	AttrNumber	keyatts[EM_DIRECT_MAX_KEYS];
	IndexScanDesc scan;
	ItemPointerData tid;
	TM_FailureData tmfd;
	TM_Result	test;
	bool		found;
	int			i;

	for (i = 0; i < d->nkeys; i++)
	{
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, d->collation[i], d->eqproc[i], keys[i]);
		keyatts[i] = idx->rd_index->indkey.values[i];
	}
	scan = index_beginscan(rel, idx, snap, d->nkeys, 0);
	index_rescan(scan, skeys, d->nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
		tid = slot->tts_tid;
	ExecClearTuple(slot);		/* the lock fills it with the version it locks */
	index_endscan(scan);
	if (found)
	{
		test = table_tuple_lock(rel, &tid, snap, slot, GetCurrentCommandId(true),
								LockTupleExclusive, LockWaitBlock,
								TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS |
								(IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION),
								&tmfd);
		switch (test)
		{
			case TM_Ok:
				found = !tmfd.traversed || keys_hold(d, slot, keyatts, keys);
				break;
			case TM_SelfModified:
				found = false;	/* as ExecLockRows: treated as deleted */
				break;
			case TM_Updated:
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent update")));
				if (test == TM_Updated)
					elog(ERROR, "earmark: unexpected table_tuple_lock status: %u", test);
				found = false;
				break;
			default:
				elog(ERROR, "earmark: unexpected table_tuple_lock status: %u", test);
		}
	}
	if (found)
	{
		TupleDesc	desc = RelationGetDescr(rel);

		for (i = 0; i < d->ncols; i++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, d->attnums[i] - 1);
			Datum		v = slot_getattr(slot, d->attnums[i], &nulls[i]);

			values[i] = nulls[i] ? (Datum) 0 : datumCopy(v, att->attbyval, att->attlen);
		}
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	em_direct_release(snap);
	return found;
}
