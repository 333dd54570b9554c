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
 *	  em_direct_statement_snapshot locks the tables the caller names, as a
 *	  statement's plan locks its tables first, advances the command counter
 *	  and takes the snapshot as SPI does for each statement (a new one under
 *	  READ COMMITTED, the transaction's under REPEATABLE READ and
 *	  SERIALIZABLE), so that a read that waited for an operator's ALTER
 *	  TABLE sees the rows it rewrote; the locking reads and the write lock
 *	  their table before they take their snapshot for the same reason;
 *	  the index and heap access methods take the same predicate locks under
 *	  SERIALIZABLE as the executor's index scans.  One locking read,
 *	  em_direct_lock, locks the row it finds as SELECT ... FOR UPDATE does
 *	  (ExecLockRows: the newest version and a re-check of the keys under
 *	  READ COMMITTED, 40001 under REPEATABLE READ); another,
 *	  em_direct_lock_skip, the first row from a key on that a condition
 *	  accepts, as ... ORDER BY LIMIT 1 FOR UPDATE SKIP LOCKED locks it
 *	  (escrow's free slots).
 *
 *	  One look without a lock, em_direct_unclaimed: whether a row's newest
 *	  version is free of any running transaction's lock or update
 *	  (HeapTupleSatisfiesUpdate, as heap_lock_tuple asks before it waits),
 *	  for escrow's fast path, which must not wait on the budget row.  And
 *	  em_direct_inserted_here: whether this transaction wrote the version
 *	  of a row it sees, at or after a given command id, by the tuple
 *	  header's xmin, which tells a frozen version from a running
 *	  transaction's (the inbox's check of which receipt is a delivery's).
 *	  Both read heap tuples only (heap_rows).  One question about a table
 *	  rather than its rows, em_direct_insert_stores: whether an INSERT
 *	  stores each row it is given (no rule, no BEFORE INSERT row trigger),
 *	  kept with the table's other resolved facts.
 *
 *	  One write, em_direct_update: an UPDATE of one row's columns by its
 *	  keys, as ExecUpdate makes it: the version the statement's snapshot
 *	  sees, a new version by table_tuple_update (HOT when no indexed
 *	  column changed and the page has room), READ COMMITTED's re-check on
 *	  the newest version after a concurrent update (EvalPlanQual's), 40001
 *	  under REPEATABLE READ, and index entries when it is not HOT (a
 *	  partial index's predicate and an index's expressions evaluated as
 *	  ExecInsertIndexTuples evaluates them).  The caller's function is the
 *	  statement's WHERE clause beyond the keys and its SET clause.  Only for
 *	  a table where the executor would do nothing more: no trigger that an
 *	  UPDATE of those columns fires, no rule, row security, CHECK
 *	  constraint, stored generated column, exclusion constraint or
 *	  deferred uniqueness (writable(); otherwise the caller runs its SQL).
 *
 *	  The lock and the write look first where this transaction last found
 *	  or wrote the row by the same unique index (RowHint): a transaction
 *	  that writes one row many times would otherwise walk, at each look-up,
 *	  every version it made before.  The version there is taken only when
 *	  the snapshot sees it and it has the keys: then it is the one the index
 *	  scan would return.
 *
 *	  Only for a single node's own tables: on Citus the tables are shells
 *	  and the rows are in shards, so the callers read by SPI there
 *	  (em_distributed, cluster.c), and em_direct_update sends them to
 *	  their SQL.
 *
 *	  Locks: AccessShareLock on the table and the index, held to the end of
 *	  the transaction, as a SELECT takes them (RowShareLock on the table
 *	  and the row lock for em_direct_lock, as SELECT ... FOR UPDATE;
 *	  RowExclusiveLock on the table and the indexes it writes for
 *	  em_direct_update, and the row lock an UPDATE that changes no key
 *	  column takes, FOR NO KEY UPDATE, only when a concurrent update makes
 *	  it re-check; the new version's xmax otherwise).  em_direct_unclaimed
 *	  holds the row's buffer content lock shared while it reads the
 *	  version's xmax, and takes no row lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/index.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_trigger.h"
#include "common/hashfn.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "nodes/primnodes.h"
#include "parser/parse_coerce.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "cluster.h"
#include "direct.h"

/* every read resolved so far, for the invalidation callback */
static EmDirect *resolved_reads = NULL;
static bool callback_registered = false;

/*
 * earmark's tables by name, with the oid each had when last looked up:
 * open_table and the locks a statement's snapshot takes first
 * (em_direct_statement_snapshot) look a name up once a session, not at
 * each call.  Forgotten with the reads (forget_reads).
 */
typedef struct NamedTable
{
	const char *name;
	Oid			relid;
} NamedTable;

#define EM_NAMED_TABLES 32
static NamedTable named_tables[EM_NAMED_TABLES];
static int	nnamed = 0;

static void
forget_named(Oid relid)
{
	int			i;

	for (i = 0; i < nnamed; i++)
		if (relid == InvalidOid || named_tables[i].relid == relid)
			named_tables[i].relid = InvalidOid;
}

/* earmark.<name>'s oid (InvalidOid: none), by the session's list */
static Oid
named_table(const char *name)
{
	NamedTable *t = NULL;
	int			i;

	for (i = 0; i < nnamed && t == NULL; i++)
		if (strcmp(named_tables[i].name, name) == 0)
			t = &named_tables[i];
	if (t == NULL && nnamed < EM_NAMED_TABLES)
	{
		t = &named_tables[nnamed++];
		t->name = name;
		t->relid = InvalidOid;
	}
	if (t == NULL)
		return get_relname_relid(name, get_namespace_oid("earmark", false));
	if (!OidIsValid(t->relid))
		t->relid = get_relname_relid(name, get_namespace_oid("earmark", false));
	return t->relid;
}

/*
 * earmark.<name>'s file node, InvalidOid when there is none: it changes
 * with a TRUNCATE, a VACUUM FULL, and a table made again.  *written: this
 * transaction holds a lock on it that a write takes (RowExclusiveLock or
 * stronger: an INSERT, UPDATE, DELETE or TRUNCATE of it, also from C, in
 * this transaction or a subtransaction that was not rolled back).  Takes
 * the table's AccessShareLock.
 */
Oid
em_direct_table_node(const char *name, bool *written)
{
	Oid			relid = named_table(name);
	Relation	rel;
	Oid			node;

	*written = false;
	if (!OidIsValid(relid))
		return InvalidOid;
	rel = table_open(relid, AccessShareLock);
	node = rel->rd_node.relNode;
	*written = CheckRelationLockedByMe(rel, RowExclusiveLock, true);
	table_close(rel, NoLock);
	return node;
}

static void
forget_reads(Datum arg, Oid relid)
{
	EmDirect   *d;

	for (d = resolved_reads; d != NULL; d = d->next)
	{
		if (relid == InvalidOid || relid == d->relid || relid == d->indexid)
			d->resolved = false;
	}
	forget_named(relid);
}

/*
 * Whether a partial index's predicate is d's (EmDirect.pred): printed as
 * pg_get_expr prints it, with only pg_catalog in the search path and
 * quote_all_identifiers off, so that the text does not depend on the
 * caller's session.
 */
static bool
predicate_is(EmDirect *d, Relation rel, Relation idx)
{
	OverrideSearchPath path;
	HeapTuple	tuple;
	Datum		pred;
	bool		isnull;
	bool		same = false;

	if (d->pred == NULL)
		return false;
	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(RelationGetRelid(idx)));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "earmark: cache lookup failed for index %u", RelationGetRelid(idx));
	pred = SysCacheGetAttr(INDEXRELID, tuple, Anum_pg_index_indpred, &isnull);
	if (!isnull)
	{
		bool		save_quote = quote_all_identifiers;

		memset(&path, 0, sizeof(path));
		path.schemas = list_make1_oid(PG_CATALOG_NAMESPACE);
		PushOverrideSearchPath(&path);
		/* the session's quote_all_identifiers would quote "status", "text" */
		quote_all_identifiers = false;
		PG_TRY();
		{
			same = strcmp(TextDatumGetCString(DirectFunctionCall2(pg_get_expr, pred,
																  ObjectIdGetDatum(RelationGetRelid(rel)))),
						  d->pred) == 0;
		}
		PG_FINALLY();
		{
			quote_all_identifiers = save_quote;
		}
		PG_END_TRY();
		PopOverrideSearchPath();
		list_free(path.schemas);
	}
	ReleaseSysCache(tuple);
	return same;
}

/*
 * Whether the index has every row that "keys = values" can match: it is
 * not partial, or its predicate is "key IS NOT NULL" for one of the keys
 * (as earmark.ledger_entry's key index: equality never matches a NULL), or
 * it is d's own (predicate_is: the read's condition implies it).
 */
static bool
index_has_key_rows(EmDirect *d, Relation rel, Relation idx, AttrNumber *keyatts,
				   int nkeys)
{
	List	   *pred;
	NullTest   *nt;
	int			i;

	if (heap_attisnull(idx->rd_indextuple, Anum_pg_index_indpred, NULL))
		return true;
	if (predicate_is(d, rel, idx))
		return true;
	pred = RelationGetIndexPredicate(idx);
	if (list_length(pred) != 1 || !IsA(linitial(pred), NullTest))
		return false;
	nt = (NullTest *) linitial(pred);
	if (nt->nulltesttype != IS_NOT_NULL || nt->argisrow || !IsA(nt->arg, Var))
		return false;
	for (i = 0; i < nkeys; i++)
	{
		if (((Var *) nt->arg)->varattno == keyatts[i])
			return true;
	}
	return false;
}

/*
 * A valid B-tree index whose leading columns are the keys, each compared
 * as the statement's "column = $n" compares them: in the column's own
 * collation and by the default B-tree operator family of its type, and
 * that has every row the keys can match (index_has_key_rows).  An index an
 * operator added on the same columns in another collation (a
 * case-insensitive one, say) would match other rows.  Each key column in
 * ascending order, NULLs last (the default): a range read
 * (em_direct_lock_skip) walks the keys in the statement's ORDER BY.
 */
static bool
index_fits(EmDirect *d, Relation rel, Relation idx, AttrNumber *keyatts, int nkeys)
{
	Form_pg_index form = idx->rd_index;
	int			i;

	if (idx->rd_rel->relam != BTREE_AM_OID || !form->indisvalid ||
		form->indnkeyatts < nkeys || !index_has_key_rows(d, rel, idx, keyatts, nkeys))
		return false;
	for (i = 0; i < nkeys; i++)
	{
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), keyatts[i] - 1);
		Oid			opclass = GetDefaultOpClass(att->atttypid, BTREE_AM_OID);

		if (form->indkey.values[i] != keyatts[i] ||
			idx->rd_indoption[i] != 0 ||
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
		if (i == d->nkeys - 1)
		{
			d->geproc = get_opcode(get_opfamily_member(idx->rd_opfamily[i], opcintype,
													   opcintype, BTGreaterEqualStrategyNumber));
			d->ltproc = get_opcode(get_opfamily_member(idx->rd_opfamily[i], opcintype,
													   opcintype, BTLessStrategyNumber));
		}
	}
}

/*
 * A column's number; of the system columns only xmin, the version's
 * writer, which a read may ask for (escrow's fast path compares it with
 * the one a rebalance saw) and a write never changes.
 */
static AttrNumber
column(EmDirect *d, const char *name)
{
	AttrNumber	att = get_attnum(d->relid, name);

	if (att == InvalidAttrNumber)
		elog(ERROR, "earmark: table earmark.%s has no column \"%s\"", d->table, name);
	if (att < 0 && att != MinTransactionIdAttributeNumber)
		elog(ERROR, "earmark: system column \"%s\" of earmark.%s cannot be read directly",
			 name, d->table);
	return att;
}

/* a column's value in slot, xmin included (a TransactionId, by value) */
static Datum
column_value(TupleTableSlot *slot, AttrNumber att, bool *isnull)
{
	if (att < 0)
		return slot_getsysattr(slot, att, isnull);
	return slot_getattr(slot, att, isnull);
}

/*
 * How well the index serves the read: 0 it does not (index_fits), 2 it is
 * a unique index (checked at once) of exactly the keys, as earmark's own
 * are, 1 any other that fits.  The best is taken, the first of those in
 * OID order: an index an operator added on the same leading columns (a
 * wider, non-unique one, say) must not take the place of earmark's own
 * after a REINDEX CONCURRENTLY or an upgrade gave that a higher OID.
 */
static int
index_rank(EmDirect *d, Relation rel, Relation idx, AttrNumber *keyatts, int nkeys)
{
	Form_pg_index form = idx->rd_index;

	if (!index_fits(d, rel, idx, keyatts, nkeys))
		return 0;
	/*
	 * A read with a predicate (d->pred) goes by its partial index before any
	 * other: one that fits without it has every row of the keys, also those
	 * the predicate leaves out (a settled job's), and the read would walk
	 * them all.
	 */
	if (d->pred != NULL && predicate_is(d, rel, idx))
		return 3;
	return form->indisunique && form->indimmediate && form->indnkeyatts == nkeys ? 2 : 1;
}

/*
 * The index the read goes by (index_rank's best), and its keys' equality
 * procedures and collations.
 */
static void
choose_index(EmDirect *d, Relation rel)
{
	AttrNumber	keyatts[EM_DIRECT_MAX_KEYS];
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	Relation	chosen;
	int			best_rank = 0;
	int			i;

	for (i = 0; i < d->nkeys; i++)
		keyatts[i] = column(d, d->keys[i]);
	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		int			rank = index_rank(d, rel, idx, keyatts, d->nkeys);

		index_close(idx, NoLock);
		if (rank > best_rank)
		{
			best_rank = rank;
			d->indexid = lfirst_oid(lc);
		}
	}
	list_free(indexes);
	/* a read by a partial index goes to its SQL without it (d->pred) */
	if (!OidIsValid(d->indexid) && d->pred != NULL)
		return;
	if (!OidIsValid(d->indexid))
		elog(ERROR, "earmark: no index of earmark.%s leads with the columns it is read by",
			 d->table);
	chosen = index_open(d->indexid, AccessShareLock);
	resolve_keys(d, chosen);
	index_close(chosen, NoLock);
}

/*
 * The table's and the index's oids and the columns, from the catalogs.  A
 * table named with no keys is only asked about (em_direct_insert_stores):
 * it needs no index, and an operator's table without the one a read would
 * take is not refused for it.
 */
static void
resolve(EmDirect *d, Relation rel)
{
	int			i;

	for (i = 0; i < d->ncols; i++)
	{
		d->attnums[i] = column(d, d->cols[i]);
		/*
		 * A read that names its columns' types (a write's are checked by
		 * writable(), which sends the write to its SQL) is refused for a
		 * column an operator gave another type: its caller takes the datum
		 * as the type it made (DatumGetInt64 of a numeric's pointer would
		 * be a number), where its SQL statement summed or cast it.  A type
		 * that is binary coercible to it (varchar to text, a domain over
		 * bigint) reads as it.
		 */
		if (d->nwrite == 0 && OidIsValid(d->types[i]) && d->attnums[i] > 0)
		{
			Oid			typid = TupleDescAttr(RelationGetDescr(rel), d->attnums[i] - 1)->atttypid;

			if (typid != d->types[i] && !IsBinaryCoercible(typid, d->types[i]))
				ereport(ERROR,
						(errcode(ERRCODE_DATATYPE_MISMATCH),
						 errmsg("earmark: column \"%s\" of earmark.%s is of type %s, not %s",
								d->cols[i], d->table, format_type_be(typid),
								format_type_be(d->types[i]))));
		}
	}
	d->indexid = InvalidOid;
	d->write_checked = false;
	d->insert_checked = false;
	if (d->nkeys > 0)
		choose_index(d, rel);
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
		Oid			relid = d->resolved ? d->relid : named_table(d->table);

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

/*
 * Whether rel's rows are heap tuples (its access method is heap's, under
 * whatever name it was created): the readers of the tuple header below
 * (its xmin, cmin and lock bits) need them.  For a table an operator moved
 * to another access method (ALTER TABLE ... SET ACCESS METHOD) they give
 * the answer that is safe for their callers: false.
 */
static bool
heap_rows(Relation rel)
{
	return rel->rd_tableam == GetHeapamTableAmRoutine();
}

/* the last snapshot's count of ended transactions (em_direct_completions) */
static uint64 last_completions = 0;

/*
 * A snapshot's count of ended transactions, read before it is registered:
 * the registered copy does not keep it (CopySnapshot).
 */
static Snapshot
register_counted(Snapshot snap)
{
	last_completions = snap->snapXactCompletionCount;
	return RegisterSnapshot(snap);
}

/*
 * AccessShareLock on each of earmark's tables named, as a statement's plan
 * takes them before its snapshot (SPI: GetCachedPlan, then the snapshot):
 * a caller that takes its snapshot after this and waited here for an
 * operator's lock (LOCK TABLE, an ALTER TABLE that rewrites the table:
 * every row then has the ALTER's xid) reads what that transaction
 * committed, not a snapshot older than the rewrite, in which the rewritten
 * table has no rows.  A name that is not a table is left to open_table's
 * error.  A lock this transaction holds already costs a look-up in its
 * local lock table.
 */
static void
lock_tables(const char *const *tables, int ntables)
{
	int			i;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_reads, (Datum) 0);
		callback_registered = true;
	}
	for (i = 0; i < ntables; i++)
	{
		Oid			relid = named_table(tables[i]);
		int			attempt;

		/*
		 * The lock takes in the invalidations that came before it: a table
		 * dropped and made again (DROP and CREATE EXTENSION) is looked up
		 * again by its name.
		 */
		for (attempt = 0; attempt < 3 && OidIsValid(relid); attempt++)
		{
			Oid			now;

			LockRelationOid(relid, AccessShareLock);
			now = named_table(tables[i]);
			if (now == relid)
				break;
			relid = now;
		}
	}
}

Snapshot
em_direct_statement_snapshot(const char *const *tables, int ntables)
{
	lock_tables(tables, ntables);
	/* as SPI does before each statement that is not read-only */
	CommandCounterIncrement();
	return register_counted(GetTransactionSnapshot());
}

Snapshot
em_direct_latest_snapshot(const char *const *tables, int ntables)
{
	lock_tables(tables, ntables);
	return register_counted(GetLatestSnapshot());
}

/*
 * How many transactions (with an xid) had ended when the last of the two
 * functions above took its snapshot: GetSnapshotData's count, by which it
 * reuses a snapshot when no transaction ended since.  Two snapshots with
 * the same count see the same transactions as committed.  0: not known
 * (a snapshot taken earlier in the transaction and copied, as REPEATABLE
 * READ's).
 */
uint64
em_direct_completions(void)
{
	return last_completions;
}

void
em_direct_release(Snapshot snap)
{
	UnregisterSnapshot(snap);
}

/*
 * A read in a snapshot its caller took must find its table locked by this
 * transaction already: named in em_direct_statement_snapshot's list, or
 * locked earlier.  Otherwise the read's own lock may have waited for an
 * operator's rewrite that the older snapshot does not see, and the read
 * finds no rows (a limit read as 0 recorded usage let escrow's fast path
 * admit past the limit: isolation spec ddl_wait).  A caller whose list
 * misses a table it reads fails here at every call, whatever the
 * operator does, so the tests find it.  Snapshots that are not MVCC ones
 * (SnapshotSelf) see what is committed when they read.
 */
static void
check_locked(EmDirect *d, Snapshot snap)
{
	Oid			relid;
	LOCKTAG		tag;
	LOCKMODE	mode;

	if (!IsMVCCSnapshot(snap))
		return;
	relid = d->resolved ? d->relid : named_table(d->table);
	if (!OidIsValid(relid))
		return;					/* open_table's error */
	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	for (mode = AccessShareLock; mode <= MaxLockMode; mode++)
		if (LockHeldByMe(&tag, mode))
			return;
	elog(ERROR, "earmark: earmark.%s read in a snapshot taken before it was locked",
		 d->table);
}

/* a scan of d's index for the rows whose keys equal keys, under snap */
static IndexScanDesc
begin_scan(EmDirect *d, Relation rel, Relation idx, Snapshot snap, Datum *keys)
{
	ScanKeyData skeys[EM_DIRECT_MAX_KEYS];
	IndexScanDesc scan;
	int			i;

	for (i = 0; i < d->nkeys; i++)
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, d->collation[i], d->eqproc[i], keys[i]);
	scan = index_beginscan(rel, idx, snap, d->nkeys, 0);
	index_rescan(scan, skeys, d->nkeys, NULL, 0);
	return scan;
}

/* d's columns of the row in slot, copied into the current memory context */
static void
copy_columns(EmDirect *d, Relation rel, TupleTableSlot *slot, Datum *values, bool *nulls)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < d->ncols; i++)
	{
		Datum		v = column_value(slot, d->attnums[i], &nulls[i]);
		Form_pg_attribute att;

		if (nulls[i] || d->attnums[i] < 0)
		{
			values[i] = nulls[i] ? (Datum) 0 : v;
			continue;
		}
		att = TupleDescAttr(desc, d->attnums[i] - 1);
		values[i] = datumCopy(v, att->attbyval, att->attlen);
	}
}

/* the scan of em_direct_scan and em_direct_get; copy: the first row only, copied */
static int
scan_rows(EmDirect *d, Datum *keys, Snapshot snap, EmDirectRow fn, void *arg,
		  Datum *copy_values, bool *copy_nulls)
{
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	IndexScanDesc scan;
	Datum		values[EM_DIRECT_MAX_COLS];
	bool		nulls[EM_DIRECT_MAX_COLS];
	int			n = 0;
	int			i;

	check_locked(d, snap);
	rel = open_table(d, AccessShareLock);
	idx = index_open(d->indexid, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	scan = begin_scan(d, rel, idx, snap, keys);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		n++;
		if (copy_values)
		{
			copy_columns(d, rel, slot, copy_values, copy_nulls);
			break;
		}
		for (i = 0; i < d->ncols; i++)
			values[i] = column_value(slot, d->attnums[i], &nulls[i]);
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

/*
 * An index scan of d's table for callers that read the tuple header of
 * each version it returns (em_direct_inserted_here, em_direct_unclaimed).
 */
typedef struct HeaderScan
{
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	IndexScanDesc scan;
} HeaderScan;

/*
 * Open d's table for a header scan: false, with the table closed again,
 * when its rows are not heap tuples (heap_rows).
 */
static bool
header_scan_open(EmDirect *d, HeaderScan *hs)
{
	hs->rel = open_table(d, AccessShareLock);
	if (heap_rows(hs->rel))
		return true;
	table_close(hs->rel, NoLock);
	return false;
}

/* start the scan for the rows whose keys equal keys, under snap */
static void
header_scan_begin(EmDirect *d, HeaderScan *hs, Snapshot snap, Datum *keys)
{
	hs->idx = index_open(d->indexid, AccessShareLock);
	hs->slot = table_slot_create(hs->rel, NULL);
	hs->scan = begin_scan(d, hs->rel, hs->idx, snap, keys);
}

static Buffer
header_buffer(HeaderScan *hs)
{
	return ((BufferHeapTupleTableSlot *) hs->slot)->buffer;
}

/*
 * The next version the scan returns, with its buffer's content lock held
 * shared (the caller releases it) while its header is read; NULL at the
 * end of the scan.
 */
static HeapTuple
header_scan_next(HeaderScan *hs)
{
	HeapTuple	tuple;

	if (!index_getnext_slot(hs->scan, ForwardScanDirection, hs->slot))
		return NULL;
	Assert(TTS_IS_BUFFERTUPLE(hs->slot));
	tuple = ExecFetchSlotHeapTuple(hs->slot, false, NULL);
	LockBuffer(header_buffer(hs), BUFFER_LOCK_SHARE);
	return tuple;
}

static void
header_scan_end(HeaderScan *hs)
{
	index_endscan(hs->scan);
	ExecDropSingleTupleTableSlot(hs->slot);
	index_close(hs->idx, NoLock);
	table_close(hs->rel, NoLock);
}

/*
 * Whether the version that snap sees of a row with the keys was written
 * (inserted, or made by an update) by this transaction or one of its
 * subtransactions at command id since or later.  By the xmin the tuple
 * header gives (HeapTupleHeaderGetXmin), which is FrozenTransactionId for
 * a frozen version.  The system column xmin is the raw one, kept when the
 * row is frozen, and 2^32 transactions later the same number is a running
 * transaction's id again; a version that old is frozen, or VACUUM would
 * have stopped new transaction ids first.  The command id tells a version
 * written by the caller's statement from one an earlier statement of the
 * transaction wrote.  False for a table whose rows are not heap tuples
 * (heap_rows).
 */
bool
em_direct_inserted_here(EmDirect *d, Datum *keys, Snapshot snap, CommandId since)
{
	HeaderScan	hs;
	HeapTuple	tuple;
	bool		here = false;

	check_locked(d, snap);
	if (!header_scan_open(d, &hs))
		return false;
	header_scan_begin(d, &hs, snap, keys);
	while (!here && (tuple = header_scan_next(&hs)) != NULL)
	{
		here = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)) &&
			HeapTupleHeaderGetCmin(tuple->t_data) >= since;
		LockBuffer(header_buffer(&hs), BUFFER_LOCK_UNLOCK);
	}
	header_scan_end(&hs);
	return here;
}

/*
 * The row's newest committed version, as a snapshot taken now sees it by
 * d's index, when no transaction that is still running (another's, or
 * this one's own lock) locks or updates it and none that committed after
 * the snapshot did: its columns into values and nulls.  False otherwise,
 * or when no version is visible, or the table's rows are not heap tuples
 * (heap_rows).  A read, not a lock: it leaves the row
 * free for the next writer, and it may set hint bits, as any read does.
 * Locks: AccessShareLock on the table and the index, and the buffer's
 * content lock shared while HeapTupleSatisfiesUpdate reads the version's
 * xmax (as heap_lock_tuple reads it, without taking the row lock).  The
 * snapshot is taken once the table is locked, so that it sees what a
 * TRUNCATE or ALTER it waited for did.
 */
bool
em_direct_unclaimed(EmDirect *d, Datum *keys, Datum *values, bool *nulls)
{
	HeaderScan	hs;
	HeapTuple	tuple;
	Snapshot	snap;
	bool		unclaimed = false;

	if (!header_scan_open(d, &hs))
		return false;
	snap = em_direct_latest_snapshot(NULL, 0);
	header_scan_begin(d, &hs, snap, keys);
	if ((tuple = header_scan_next(&hs)) != NULL)
	{
		unclaimed = HeapTupleSatisfiesUpdate(tuple, GetCurrentCommandId(false),
											 header_buffer(&hs)) == TM_Ok;
		LockBuffer(header_buffer(&hs), BUFFER_LOCK_UNLOCK);
		if (unclaimed)
			copy_columns(d, hs.rel, hs.slot, values, nulls);
	}
	header_scan_end(&hs);
	em_direct_release(snap);
	return unclaimed;
}

/* the locked version still has the keys the scan matched (EvalPlanQual's re-check) */
static bool
keys_hold(EmDirect *d, TupleTableSlot *slot, AttrNumber *keyatts, Datum *keys, int nkeys)
{
	int			i;

	for (i = 0; i < nkeys; i++)
	{
		bool		isnull;
		Datum		v = slot_getattr(slot, keyatts[i], &isnull);

		if (isnull || !DatumGetBool(OidFunctionCall2Coll(d->eqproc[i], d->collation[i], v, keys[i])))
			return false;
	}
	return true;
}

/*
 * Where a row's version was last found or written by this transaction, by
 * index: a hint that spares the index walk to the row.  A transaction that
 * writes one row many times (reserves of one account: the budget row)
 * leaves versions that cannot be pruned before it ends, and an index scan
 * walks all of them each time (heap_hot_search_buffer), so each look-up
 * would cost more than the one before.  A hint is only a place to look:
 * the version there is used only when it is visible to the snapshot and
 * has the keys (checked by the index's own equality), and a unique index
 * lets one snapshot see at most one version with those keys, the one the
 * index scan would find; otherwise the index is scanned.  Kept for the
 * transaction (lxid) and the table's file (a first TRUNCATE, a CLUSTER or
 * VACUUM FULL in it gives the table a new one); the hinted block must
 * still be in the file (recall_row).  Only by an immediate unique index:
 * a deferred one lets the transaction see two rows with the keys.  Not
 * under SERIALIZABLE, where the index scan's predicate lock on the key
 * matters.  Tests: regress direct_write section 8, review_direct_hint;
 * isolation review_hint_vacuum.
 */
#define EM_DIRECT_HINTS 4

typedef struct RowHint
{
	Oid			indexid;
	RelFileNode node;
	LocalTransactionId lxid;
	uint32		keyhash;
	ItemPointerData tid;
} RowHint;

static RowHint hints[EM_DIRECT_HINTS];
static int	next_hint = 0;

/* the index is unique on exactly the keys: one visible row at most */
static bool
hint_usable(EmDirect *d, Relation idx, Snapshot snap)
{
	return idx->rd_index->indisunique && idx->rd_index->indimmediate &&
		idx->rd_index->indnkeyatts == d->nkeys &&
		IsMVCCSnapshot(snap) && !IsolationIsSerializable();
}

static uint32
key_hash(EmDirect *d, Relation rel, AttrNumber *keyatts, Datum *keys)
{
	uint32		h = 0;
	int			i;

	for (i = 0; i < d->nkeys; i++)
	{
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), keyatts[i] - 1);

		h = hash_combine(h, datum_image_hash(keys[i], att->attbyval, att->attlen));
	}
	return h;
}

static RowHint *
find_hint(Oid indexid)
{
	int			i;

	for (i = 0; i < EM_DIRECT_HINTS; i++)
	{
		if (hints[i].indexid == indexid)
			return &hints[i];
	}
	return NULL;
}

static void
remember_row(Oid indexid, Relation rel, uint32 keyhash, ItemPointer tid)
{
	RowHint    *h = find_hint(indexid);

	if (h == NULL)
	{
		h = &hints[next_hint];
		next_hint = (next_hint + 1) % EM_DIRECT_HINTS;
	}
	h->indexid = indexid;
	h->node = rel->rd_node;
	h->lxid = MyProc->lxid;
	h->keyhash = keyhash;
	h->tid = *tid;
}

/*
 * An update replaced the version at old by the one at new: the hints of
 * other indexes that pointed at it follow (the budget row is locked by one
 * unique index and written by another).
 */
static void
row_moved(Relation rel, ItemPointer old, ItemPointer new)
{
	int			i;

	for (i = 0; i < EM_DIRECT_HINTS; i++)
	{
		if (hints[i].lxid == MyProc->lxid && RelFileNodeEquals(hints[i].node, rel->rd_node) &&
			ItemPointerEquals(&hints[i].tid, old))
			hints[i].tid = *new;
	}
}

/* the hinted version, into slot, when it is the one the index would find */
static bool
recall_row(EmDirect *d, Relation rel, uint32 keyhash, Snapshot snap,
		   TupleTableSlot *slot, AttrNumber *keyatts, Datum *keys)
{
	RowHint    *h = find_hint(d->indexid);
	ItemPointerData tid;

	if (h == NULL || h->lxid != MyProc->lxid || h->keyhash != keyhash ||
		!RelFileNodeEquals(h->node, rel->rd_node))
		return false;
	tid = h->tid;

	/*
	 * The hinted block may be gone while the file is the same: a TRUNCATE
	 * of a file made in the same subtransaction truncates it in place, and
	 * a lock taken in a subtransaction that rolled back no longer keeps
	 * VACUUM from truncating the table.  The lock open_table took keeps it
	 * from shrinking from here on.
	 */
	if (ItemPointerGetBlockNumber(&tid) >= RelationGetNumberOfBlocks(rel))
		return false;
	if (table_tuple_fetch_row_version(rel, &tid, snap, slot) &&
		keys_hold(d, slot, keyatts, keys, d->nkeys))
		return true;
	ExecClearTuple(slot);
	return false;
}

/* the row a look-up found: its keys' columns, and its hint if it takes one */
typedef struct FoundRow
{
	AttrNumber	keyatts[EM_DIRECT_MAX_KEYS];
	bool		hinted;
	uint32		keyhash;
} FoundRow;

/* the version of the row a lock or an update ends on, for the next look-up */
static void
found_at(EmDirect *d, Relation rel, FoundRow *row, ItemPointer tid)
{
	if (row->hinted)
		remember_row(d->indexid, rel, row->keyhash, tid);
}

/*
 * The first row snap sees by d's index, into slot, and its tid into *tid;
 * *row gets the table's columns of the keys and the row's hint.
 */
static bool
scan_first_row(EmDirect *d, Relation rel, Datum *keys, Snapshot snap,
			   TupleTableSlot *slot, ItemPointer tid, FoundRow *row)
{
	Relation	idx = index_open(d->indexid, AccessShareLock);
	bool		found;
	int			i;

	for (i = 0; i < d->nkeys; i++)
		row->keyatts[i] = idx->rd_index->indkey.values[i];
	row->hinted = hint_usable(d, idx, snap);
	row->keyhash = row->hinted ? key_hash(d, rel, row->keyatts, keys) : 0;
	found = row->hinted &&
		recall_row(d, rel, row->keyhash, snap, slot, row->keyatts, keys);
	if (!found)
	{
		IndexScanDesc scan = begin_scan(d, rel, idx, snap, keys);

		found = index_getnext_slot(scan, ForwardScanDirection, slot);
		index_endscan(scan);
	}
	if (found)
	{
		*tid = slot->tts_tid;	/* the slot keeps its own pin of the page */
		found_at(d, rel, row, tid);
	}
	index_close(idx, NoLock);
	return found;
}

/*
 * A row lock that did not succeed, as ExecLockRows takes it: a row this
 * transaction changed since the snapshot (treated as deleted), one another
 * transaction holds (SKIP LOCKED) or one deleted meanwhile is passed over
 * (the caller returns false); a row changed or deleted after the snapshot
 * is 40001 under REPEATABLE READ; anything else is an error.
 */
static void
lock_failed(TM_Result test)
{
	switch (test)
	{
		case TM_SelfModified:
		case TM_WouldBlock:
			return;
		case TM_Updated:
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			if (test == TM_Updated)
				elog(ERROR, "earmark: unexpected table_tuple_lock status: %u", test);
			return;
		default:
			elog(ERROR, "earmark: unexpected table_tuple_lock status: %u", test);
	}
}

/*
 * Lock the first row snap sees by d's index as SELECT ... FOR UPDATE locks
 * it (ExecLockRows); the locked version is left in slot.  False when no
 * row is visible, or (READ COMMITTED) it was deleted, or its newest
 * version no longer has the keys.
 */
static bool
lock_first_row(EmDirect *d, Relation rel, Datum *keys, Snapshot snap,
			   TupleTableSlot *slot)
{
	FoundRow	row;
	ItemPointerData tid;
	TM_FailureData tmfd;
	TM_Result	test;

	if (!scan_first_row(d, rel, keys, snap, slot, &tid, &row))
		return false;
	ExecClearTuple(slot);		/* the lock fills it with the version it locks */
	test = table_tuple_lock(rel, &tid, snap, slot, GetCurrentCommandId(true),
							LockTupleExclusive, LockWaitBlock,
							TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS |
							(IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION),
							&tmfd);
	switch (test)
	{
		case TM_Ok:
			if (tmfd.traversed && !keys_hold(d, slot, row.keyatts, keys, d->nkeys))
				return false;
			found_at(d, rel, &row, &slot->tts_tid);
			return true;
		default:
			lock_failed(test);
			return false;
	}
}

/*
 * A row lock, as SELECT ... FOR UPDATE takes it, is refused where the
 * executor refuses the statement (ExecCheckXactReadOnly: it needs UPDATE
 * rights, so a read-only transaction may not), before it takes an xid.
 */
static void
locking_allowed(void)
{
	if (XactReadOnly)
		PreventCommandIfReadOnly("SELECT FOR UPDATE");
	PreventCommandIfParallelMode("SELECT FOR UPDATE");
}

/*
 * Under REPEATABLE READ and SERIALIZABLE, when the transaction's snapshot
 * sees no row with the keys: 40001 if the latest snapshot sees one made by
 * another transaction.  The table was rewritten after the snapshot (ALTER
 * TABLE ... SET ACCESS METHOD, ALTER COLUMN TYPE: every row gets the
 * ALTER's xid; PostgreSQL's rewrites are not MVCC-safe), or the row was
 * committed after it.  A statement would find no row and go on; earmark's
 * callers would then act on a row they cannot see (a settlement released
 * no hold from a rewritten budget table, and the books were wrong:
 * isolation spec ddl_wait).  The transaction's own rows look the same to
 * both snapshots (the same command id: em_direct_statement_snapshot's
 * CommandCounterIncrement sets it in the transaction's snapshot, and
 * GetLatestSnapshot takes the current one), so a row only the latest
 * snapshot sees is another transaction's, whatever the table's access
 * method.
 */
static void
check_unseen(EmDirect *d, Relation rel, Datum *keys)
{
	Snapshot	latest;
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		unseen;

	if (!IsolationUsesXactSnapshot())
		return;
	latest = RegisterSnapshot(GetLatestSnapshot());
	idx = index_open(d->indexid, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	scan = begin_scan(d, rel, idx, latest, keys);
	unseen = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	UnregisterSnapshot(latest);
	if (unseen)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("A row of earmark.%s this call needs was made, or its table rewritten, after the transaction's snapshot.",
						   d->table),
				 errhint("Retry the transaction.")));
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
	Snapshot	snap;
	Relation	rel;
	TupleTableSlot *slot;
	bool		found;

	locking_allowed();
	/* the table's lock first: the snapshot sees what a rewrite it waited for did */
	rel = open_table(d, RowShareLock);
	snap = em_direct_statement_snapshot(NULL, 0);
	slot = table_slot_create(rel, NULL);
	found = lock_first_row(d, rel, keys, snap, slot);
	if (found)
		copy_columns(d, rel, slot, values, nulls);
	else
		check_unseen(d, rel, keys);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	em_direct_release(snap);
	return found;
}

/*
 * A scan of d's index for the rows whose keys but the last equal keys and
 * whose last key is at least keys[nkeys - 1] (below: less than it), in
 * the index's order.
 */
static IndexScanDesc
begin_range_scan(EmDirect *d, Relation rel, Relation idx, Snapshot snap, Datum *keys,
				 bool below)
{
	ScanKeyData skeys[EM_DIRECT_MAX_KEYS];
	IndexScanDesc scan;
	int			last = d->nkeys - 1;
	int			i;

	for (i = 0; i < last; i++)
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, d->collation[i], d->eqproc[i], keys[i]);
	ScanKeyEntryInitialize(&skeys[last], 0, last + 1,
						   below ? BTLessStrategyNumber : BTGreaterEqualStrategyNumber,
						   InvalidOid, d->collation[last],
						   below ? d->ltproc : d->geproc, keys[last]);
	scan = index_beginscan(rel, idx, snap, d->nkeys, 0);
	index_rescan(scan, skeys, d->nkeys, NULL, 0);
	return scan;
}

/* fn accepts the row in slot, given d's columns */
static bool
row_accepted(EmDirect *d, TupleTableSlot *slot, EmDirectRow fn, void *arg)
{
	Datum		values[EM_DIRECT_MAX_COLS];
	bool		nulls[EM_DIRECT_MAX_COLS];
	int			i;

	for (i = 0; i < d->ncols; i++)
		values[i] = column_value(slot, d->attnums[i], &nulls[i]);
	return fn(values, nulls, arg);
}

/*
 * What a locking probe's rows must match: the keys, all equal, or (range)
 * all but the last equal and the last at least keys[nkeys - 1] (below:
 * less than it); and fn, given d's columns.
 */
typedef struct Probe
{
	EmDirect   *d;
	Datum	   *keys;
	AttrNumber	keyatts[EM_DIRECT_MAX_KEYS];
	bool		range;
	bool		below;
	EmDirectRow fn;
	void	   *arg;
} Probe;

static void
probe_init(Probe *p, EmDirect *d, Relation idx, Datum *keys, bool range, bool below,
		   EmDirectRow fn, void *arg)
{
	int			i;

	p->d = d;
	p->keys = keys;
	for (i = 0; i < d->nkeys; i++)
		p->keyatts[i] = idx->rd_index->indkey.values[i];
	p->range = range;
	p->below = below;
	p->fn = fn;
	p->arg = arg;
}

/* the row in slot matches the probe (EvalPlanQual's re-check) */
static bool
probe_matches(Probe *p, TupleTableSlot *slot)
{
	EmDirect   *d = p->d;
	int			last = d->nkeys - 1;
	bool		isnull;
	Datum		v;

	if (!p->range)
		return keys_hold(d, slot, p->keyatts, p->keys, d->nkeys) &&
			row_accepted(d, slot, p->fn, p->arg);
	if (last > 0 && !keys_hold(d, slot, p->keyatts, p->keys, last))
		return false;
	v = slot_getattr(slot, p->keyatts[last], &isnull);
	if (isnull ||
		!DatumGetBool(OidFunctionCall2Coll(p->below ? d->ltproc : d->geproc,
										   d->collation[last], v, p->keys[last])))
		return false;
	return row_accepted(d, slot, p->fn, p->arg);
}

/*
 * Lock the version at *tid as ExecLockRows locks it for FOR UPDATE SKIP
 * LOCKED, into locked; true when it is locked and (after following its
 * update chain, READ COMMITTED) its newest version still matches.
 *
 * Without TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS, which ExecLockRows
 * passes: with it, heap_lock_tuple, having found the version's updater
 * ended by the time it asks (ConditionalXactLockTableWait), walks that
 * update's chain (heap_lock_updated_tuple) and waits there, whatever the
 * wait policy, for any running transaction that locks or updates a newer
 * version: SKIP LOCKED then waits, and a rebalance holding the budget row
 * waited for a fast path's admission that next wanted the budget row
 * (test/integration/review_slot_skip_chain.sh).  Without it the lock
 * returns TM_Updated there and table_tuple_lock's own walk to the newest
 * version (TUPLE_LOCK_FLAG_FIND_LAST_VERSION, as EvalPlanQual's lock in
 * ExecUpdate asks) passes a version another transaction holds over
 * (TM_WouldBlock).  For FOR UPDATE the chain's lock adds nothing under
 * READ COMMITTED (the newest version is locked either way), and under
 * REPEATABLE READ an updated version fails with 40001 either way.
 */
static bool
lock_or_skip(Probe *p, Relation rel, Snapshot snap, ItemPointer tid,
			 TupleTableSlot *locked)
{
	TM_FailureData tmfd;
	TM_Result	test;

	ExecClearTuple(locked);
	test = table_tuple_lock(rel, tid, snap, locked, GetCurrentCommandId(true),
							LockTupleExclusive, LockWaitSkip,
							IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
							&tmfd);
	switch (test)
	{
		case TM_Ok:
			/* EvalPlanQual's re-check of every condition on the newest version */
			return !tmfd.traversed || probe_matches(p, locked);
		default:
			lock_failed(test);
			return false;
	}
}

/*
 * The first row the statement's snapshot sees by d's index whose keys but
 * the last equal keys, whose last key is at least keys[nkeys - 1] (below:
 * less than it) and that fn accepts (given d's columns), locked as
 * "SELECT ... WHERE <those> ORDER BY <last key> LIMIT 1 FOR UPDATE SKIP
 * LOCKED" locks it (ExecLockRows): a row another transaction locks or
 * updates is passed over, never waited for; under READ COMMITTED its
 * newest version is locked and every condition checked again on it; under
 * REPEATABLE READ and SERIALIZABLE a row changed after the snapshot fails
 * with 40001.  The locked version's columns are copied into the current
 * memory context.  False when no row could be had.  Locks: RowShareLock on
 * the table, AccessShareLock on the index, and the row lock.  The snapshot
 * is taken before the table lock (the executor takes them the other way
 * round): a probe that waited for the table sees the rows as before the
 * wait, and the lock's re-check on the newest version decides, as it does
 * for a row updated after any snapshot (isolation spec
 * review_slot_lock_recheck drives that path through such a wait).
 */
bool
em_direct_lock_skip(EmDirect *d, Datum *keys, bool below, EmDirectRow fn, void *arg,
					Datum *values, bool *nulls)
{
	Snapshot	snap;
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	TupleTableSlot *locked;
	IndexScanDesc scan;
	Probe		probe;
	bool		found = false;

	locking_allowed();
	rel = open_table(d, RowShareLock);
	snap = em_direct_statement_snapshot(NULL, 0);
	idx = index_open(d->indexid, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	locked = table_slot_create(rel, NULL);
	scan = begin_range_scan(d, rel, idx, snap, keys, below);
	probe_init(&probe, d, idx, keys, true, below, fn, arg);

	while (!found && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		ItemPointerData tid = slot->tts_tid;

		/* the index scan checked the keys */
		if (row_accepted(d, slot, fn, arg))
			found = lock_or_skip(&probe, rel, snap, &tid, locked);
	}
	if (found)
		copy_columns(d, rel, locked, values, nulls);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(locked);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	em_direct_release(snap);
	return found;
}

/*
 * Up to max rows the statement's snapshot sees by d's index with the keys
 * that fn accepts, each locked as "SELECT ... WHERE <keys> AND <fn> LIMIT
 * max FOR UPDATE SKIP LOCKED" locks it (ExecLockRows, as
 * em_direct_lock_skip: a row another transaction locks or updates is
 * passed over, and under READ COMMITTED every condition is checked again
 * on the newest version), in the index's order; take is given each locked
 * version's columns, copied into the current memory context (false
 * stops).  Returns how many were locked; -1 when the table has no index
 * this read may go by (d->pred's partial index gone, or its predicate
 * changed): the caller runs its SQL.  Locks as em_direct_lock_skip.
 */
int
em_direct_lock_skip_all(EmDirect *d, Datum *keys, EmDirectRow fn, void *arg, int max,
						EmDirectRow take, void *take_arg)
{
	Snapshot	snap;
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	TupleTableSlot *locked;
	IndexScanDesc scan;
	Probe		probe;
	Datum		values[EM_DIRECT_MAX_COLS];
	bool		nulls[EM_DIRECT_MAX_COLS];
	int			n = 0;

	locking_allowed();
	rel = open_table(d, RowShareLock);
	if (!OidIsValid(d->indexid))
	{
		table_close(rel, NoLock);
		return -1;
	}
	snap = em_direct_statement_snapshot(NULL, 0);
	idx = index_open(d->indexid, AccessShareLock);

	/*
	 * An index built over broken HOT chains (indcheckxmin) has no entry for
	 * a version older than the chain's newest, which this transaction's
	 * snapshot may see: the planner does not use it until every snapshot is
	 * newer than the index (get_relation_info), and neither does this read
	 * (a partial index on status, rebuilt after status changed by HOT
	 * updates, misses a hold the snapshot sees as open).
	 */
	if (idx->rd_index->indcheckxmin &&
		!TransactionIdPrecedes(HeapTupleHeaderGetXmin(idx->rd_indextuple->t_data),
							   TransactionXmin))
	{
		index_close(idx, NoLock);
		table_close(rel, NoLock);
		em_direct_release(snap);
		return -1;
	}
	slot = table_slot_create(rel, NULL);
	locked = table_slot_create(rel, NULL);
	scan = begin_scan(d, rel, idx, snap, keys);
	probe_init(&probe, d, idx, keys, false, false, fn, arg);

	while (n < max && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		ItemPointerData tid = slot->tts_tid;

		/* the index scan checked the keys */
		if (!row_accepted(d, slot, fn, arg) ||
			!lock_or_skip(&probe, rel, snap, &tid, locked))
			continue;
		n++;
		copy_columns(d, rel, locked, values, nulls);
		if (!take(values, nulls, take_arg))
			break;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(locked);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	em_direct_release(snap);
	return n;
}

/* an EmDirectRow that accepts every row (and, as take, goes on) */
bool
em_direct_any_row(Datum *values, bool *nulls, void *arg)
{
	return true;
}

/* ---------------------------------------------------------------------
 * Writes
 * ---------------------------------------------------------------------
 */

/* attribute att is one of the columns a write of d changes */
static bool
written(EmDirect *d, AttrNumber att)
{
	int			i;

	for (i = 0; i < d->nwrite; i++)
		if (d->attnums[i] == att)
			return true;
	return false;
}

/*
 * An UPDATE trigger the executor would fire for d's write, or whose effect
 * it would need: anything but the immediate check of a foreign key of the
 * table whose columns the write leaves alone (RI_FKey_fk_upd_check_required
 * skips that check when the key is unchanged; for a row inserted by this
 * transaction, the insert's own check ran at the end of its statement,
 * since the constraint is not deferrable).
 */
static bool
update_trigger_matters(EmDirect *d, Relation rel, Trigger *t)
{
	List	   *fkeys;
	ListCell   *lc;

	if (!TRIGGER_FOR_UPDATE(t->tgtype))
		return false;
	if (RI_FKey_trigger_type(t->tgfoid) != RI_TRIGGER_FK || t->tgdeferrable)
		return true;
	fkeys = RelationGetFKeyList(rel);
	foreach(lc, fkeys)
	{
		ForeignKeyCacheInfo *fk = lfirst_node(ForeignKeyCacheInfo, lc);
		int			i;

		if (fk->conoid != t->tgconstraint)
			continue;
		for (i = 0; i < fk->nkeys; i++)
			if (written(d, fk->conkey[i]))
				return true;
		return false;
	}
	return true;
}

/*
 * Whether an UPDATE of d's columns by the executor would do nothing that
 * update_row does not: a plain table without rules, row security, CHECK
 * constraints, stored generated columns or UPDATE triggers that matter,
 * whose columns have the types the caller reads and writes (not a
 * domain, whose constraints would be checked, nor another type), are NOT
 * NULL where the caller does not look for a null, and compare by bytes
 * (a deterministic collation, as the caller's tests compare them), and
 * whose indexes have neither exclusion constraints nor deferred
 * uniqueness.  Computed on d's first write after it is resolved: any
 * change of these sends the relcache invalidation that resolves it again.
 * (A publication's change sends none that matters here: em_direct_update
 * checks the replica identity every time.)
 */
static bool
writable(EmDirect *d, Relation rel)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	List	   *indexes;
	ListCell   *lc;
	bool		ok = true;
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relrowsecurity ||
		rel->rd_rules != NULL)
		return false;
	if (constr != NULL && (constr->num_check > 0 || constr->has_generated_stored))
		return false;
	for (i = 0; i < d->ncols; i++)
	{
		Form_pg_attribute att;

		if (d->attnums[i] < 0)
			return false;		/* xmin: reads only, wherever it is named */
		att = TupleDescAttr(RelationGetDescr(rel), d->attnums[i] - 1);
		if (att->atttypid != d->types[i] || !(att->attnotnull || d->nullok[i]) ||
			(OidIsValid(att->attcollation) && !get_collation_isdeterministic(att->attcollation)))
			return false;
	}
	for (i = 0; rel->trigdesc != NULL && i < rel->trigdesc->numtriggers; i++)
		if (update_trigger_matters(d, rel, &rel->trigdesc->triggers[i]))
			return false;
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = idx->rd_index;

		if (ind->indisexclusion || (ind->indisunique && !ind->indimmediate))
			ok = false;
		index_close(idx, NoLock);
	}
	list_free(indexes);
	return ok;
}

/*
 * Whether an INSERT into d's table stores each row it is given, so that
 * its RETURNING returns one row for each: a plain table without rules and
 * without BEFORE INSERT row triggers, enabled or not (a disabled one may
 * fire under another session_replication_role, and the answer is kept
 * across transactions).  Such a trigger may skip the row or store it its
 * own way; a rule may do anything.  Computed once after d is resolved:
 * CREATE TRIGGER, CREATE RULE and ALTER TABLE send the relcache
 * invalidation that resolves it again.  The caller must hold a lock on the
 * table that those conflict with (an INSERT's RowExclusiveLock): the
 * invalidations were then taken in when it was acquired, and none can come
 * until the transaction ends, so the answer kept is the table's now.
 */
bool
em_direct_insert_stores(EmDirect *d)
{
	Relation	rel;

	if (d->resolved && d->insert_checked)
		return d->insert_stores;
	rel = open_table(d, AccessShareLock);
	d->insert_stores = rel->rd_rel->relkind == RELKIND_RELATION &&
		rel->rd_rules == NULL &&
		!(rel->trigdesc != NULL && rel->trigdesc->trig_insert_before_row);
	d->insert_checked = true;
	table_close(rel, NoLock);
	return d->insert_stores;
}

/*
 * The hint ExecInsertIndexTuples gives (index_unchanged_by_update): an
 * index's columns (INCLUDE ones too) are none of those d's write changes.
 */
static bool
index_unchanged(EmDirect *d, Relation idx)
{
	int			i;

	for (i = 0; i < idx->rd_index->indnatts; i++)
	{
		AttrNumber	att = idx->rd_index->indkey.values[i];

		/* an expression's columns are not looked into: a change, maybe */
		if (att == 0 || written(d, att))
			return false;
	}
	return true;
}

/*
 * An entry for the new version in each index ready for inserts, as
 * ExecInsertIndexTuples makes them for a version that is not HOT: a
 * partial index's predicate and an index's expressions evaluated on the
 * new version (in an executor state of its own, made only when an index
 * needs one), the uniqueness check of a unique index (writable() allows
 * no deferred one, nor an exclusion constraint).  An index not ready for
 * inserts yet (the first phase of CREATE INDEX CONCURRENTLY, committed
 * while this write runs) is skipped, as the executor skips it.
 */
static void
insert_index_entries(EmDirect *d, Relation rel, TupleTableSlot *slot)
{
	List	   *indexes = RelationGetIndexList(rel);
	EState	   *estate = NULL;
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *ii = BuildIndexInfo(idx);
		Datum		values[INDEX_MAX_KEYS];
		bool		isnull[INDEX_MAX_KEYS];

		if (ii->ii_ReadyForInserts &&
			(ii->ii_Expressions != NIL || ii->ii_Predicate != NIL) && estate == NULL)
		{
			estate = CreateExecutorState();
			GetPerTupleExprContext(estate)->ecxt_scantuple = slot;
		}
		if (ii->ii_ReadyForInserts &&
			(ii->ii_Predicate == NIL ||
			 ExecQual(ExecPrepareQual(ii->ii_Predicate, estate), GetPerTupleExprContext(estate))))
		{
			FormIndexDatum(ii, slot, estate, values, isnull);
			index_insert(idx, values, isnull, &slot->tts_tid, rel,
						 idx->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
						 index_unchanged(d, idx), ii);
		}
		index_close(idx, NoLock);
	}
	if (estate != NULL)
		FreeExecutorState(estate);
	list_free(indexes);
}

/* the version in slot with d's columns set to values, in a slot of its own */
static TupleTableSlot *
new_version(EmDirect *d, Relation rel, TupleTableSlot *slot, Datum *values, bool *nulls)
{
	TupleDesc	desc = RelationGetDescr(rel);
	TupleTableSlot *newslot = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
	HeapTuple	old = ExecFetchSlotHeapTuple(slot, false, NULL);
	int			cols[EM_DIRECT_MAX_COLS];
	int			i;

	for (i = 0; i < d->nwrite; i++)
		cols[i] = d->attnums[i];
	ExecStoreHeapTuple(heap_modify_tuple_by_cols(old, desc, d->nwrite, cols, values, nulls),
					   newslot, true);
	return newslot;
}

/*
 * Replace the row version in slot (at *tid) by one whose columns fn
 * computes from it, unless fn finds that it does not match (the
 * statement's WHERE clause beyond the keys), as ExecUpdate does:
 * table_tuple_update waits for a concurrent writer of the row (a HOT
 * update when no indexed column changed and the page has room; otherwise
 * entries in the indexes follow).  When that writer updated the row:
 * 40001 under REPEATABLE READ; under READ COMMITTED the newest version is
 * locked, its keys and fn checked again (EvalPlanQual's re-check), and
 * the update is computed from it and made on it.  False when the row was
 * deleted meanwhile, its newest version no longer has the keys, or fn
 * found it does not match.  No lock is taken before the update (so no WAL
 * record of one) unless a concurrent update made it necessary.
 */
static bool
update_row(EmDirect *d, Relation rel, Snapshot snap, TupleTableSlot *slot,
		   ItemPointer tid, Datum *keys, FoundRow *row,
		   EmDirectChange fn, void *arg)
{
	CommandId	cid = GetCurrentCommandId(true);

	for (;;)
	{
		Datum		values[EM_DIRECT_MAX_COLS];
		bool		nulls[EM_DIRECT_MAX_COLS];
		TupleTableSlot *newslot;
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		bool		update_indexes;
		TM_Result	result;

		copy_columns(d, rel, slot, values, nulls);
		if (!fn(values, nulls, arg))
			return false;
		newslot = new_version(d, rel, slot, values, nulls);
		result = table_tuple_update(rel, tid, newslot, cid, snap, InvalidSnapshot, true,
									&tmfd, &lockmode, &update_indexes);
		if (result == TM_Ok && update_indexes)
			insert_index_entries(d, rel, newslot);
		if (result == TM_Ok)
		{
			row_moved(rel, tid, &newslot->tts_tid);
			found_at(d, rel, row, &newslot->tts_tid);
		}
		ExecDropSingleTupleTableSlot(newslot);
		if (result == TM_Ok)
			return true;
		if (result != TM_Updated && result != TM_Deleted)
			elog(ERROR, "earmark: unexpected table_tuple_update status: %u", result);
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 result == TM_Deleted ?
					 errmsg("could not serialize access due to concurrent delete") :
					 errmsg("could not serialize access due to concurrent update")));
		if (result == TM_Deleted)
			return false;
		ExecClearTuple(slot);	/* the lock fills it with the version it locks */
		result = table_tuple_lock(rel, tid, snap, slot, cid, lockmode, LockWaitBlock,
								  TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (result == TM_Deleted)
			return false;
		if (result != TM_Ok)
			elog(ERROR, "earmark: unexpected table_tuple_lock status: %u", result);
		if (!keys_hold(d, slot, row->keyatts, keys, d->nkeys))
			return false;
	}
}

/*
 * What "UPDATE earmark.<table> SET <cols> = ... WHERE <keys> = ..." does to
 * the one row the keys name, without the executor: the row the snapshot
 * the statement would take sees by the index, and update_row's update of
 * it (fn computes the new values of d's columns from the version's, in
 * place: the SET clause's expressions; READ COMMITTED's re-check on the
 * newest version, REPEATABLE READ's 40001, as the executor's).
 * RowExclusiveLock on the table and the indexes it writes, as an UPDATE.
 * EM_DIRECT_UNWRITABLE, before anything is locked or written, on Citus
 * (the rows are in shards), when the executor would do more (writable())
 * or when the transaction is read-only: the caller then runs its SQL.  A published table whose replica identity
 * cannot log the update fails as the executor's UPDATE fails.
 */
EmDirectWrite
em_direct_update(EmDirect *d, Datum *keys, EmDirectChange fn, void *arg)
{
	Snapshot	snap;
	Relation	rel;
	TupleTableSlot *slot;
	ItemPointerData tid;
	FoundRow	row;
	bool		found = false;

	if (em_distributed())
		return EM_DIRECT_UNWRITABLE;
	/* the table's lock first, as the UPDATE's plan takes it before its snapshot */
	rel = open_table(d, RowExclusiveLock);
	snap = em_direct_statement_snapshot(NULL, 0);
	if (!d->write_checked)
	{
		d->writable = writable(d, rel);
		d->write_checked = true;
	}
	/* a read-only transaction: the SQL statement raises the error */
	if (!d->writable || XactReadOnly)
	{
		table_close(rel, NoLock);
		em_direct_release(snap);
		return EM_DIRECT_UNWRITABLE;
	}
	/* as ExecInitModifyTable: a published table needs its replica identity */
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);
	slot = table_slot_create(rel, NULL);
	/* the statement's snapshot, for what the index expressions run */
	PushActiveSnapshot(snap);
	if (scan_first_row(d, rel, keys, snap, slot, &tid, &row))
		found = update_row(d, rel, snap, slot, &tid, keys, &row, fn, arg);
	else
		check_unseen(d, rel, keys);
	PopActiveSnapshot();
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	em_direct_release(snap);
	return found ? EM_DIRECT_WRITTEN : EM_DIRECT_NO_ROW;
}
