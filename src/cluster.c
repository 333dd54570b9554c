/*-------------------------------------------------------------------------
 *
 * cluster.c
 *	  Where this backend stands: the schema version installed in its
 *	  database (every SQL-callable function checks it before it reads its
 *	  arguments), whether its transaction may run a call that must see
 *	  what others committed since it began (em_require_read_committed),
 *	  this node's place in a Citus cluster, the ids that follow from it
 *	  (earmark.next_id), and the distribution lock.
 *
 *	  Tables: reads pg_extension and, when Citus is installed,
 *	  pg_dist_local_group and pg_dist_partition; writes nothing but the id
 *	  sequences.
 *
 *	  Locks: the catalog reads' AccessShareLock and the sequences' own,
 *	  and the database's distribution lock (em_distribution_lock): a
 *	  transaction-level advisory lock in earmark's own key space that each
 *	  transaction of the worker takes shared and earmark_distribute
 *	  exclusive, each before any table.
 *
 *	  Why a version check: between a server restart with a new library and
 *	  ALTER EXTENSION earmark UPDATE, the functions of the old install
 *	  script call into the new library, whose arguments and tables may
 *	  differ (0.3.0 added the account to earmark_charge's arguments).  The
 *	  check runs once per transaction, before any argument is read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "cluster.h"
#include "earmark.h"
#include "version.h"

PG_FUNCTION_INFO_V1(earmark_next_id);
PG_FUNCTION_INFO_V1(earmark_distribution_lock);

/* the installed version as this transaction saw it */
static LocalTransactionId schema_checked_lxid = InvalidLocalTransactionId;

/* whether earmark is distributed, as this transaction saw it */
static LocalTransactionId distributed_lxid = InvalidLocalTransactionId;
static bool distributed = false;

/* this node's Citus group (0: the coordinator, or no Citus); -1 unknown */
static int32 node_group = -1;

/*
 * Where the pg_extension row this backend last found to be earmark at this
 * library's version is (its TID), or invalid.  A later transaction reads
 * that one tuple again instead of searching the index: if it is still
 * visible in the catalog snapshot and is earmark's row at this version, it
 * is the row the index would find (extname is unique among the visible
 * rows), so the answer is the same.  ALTER EXTENSION ... UPDATE and DROP
 * EXTENSION make a new version of the row or delete it, and the old tuple
 * stops being visible; if its slot is reused, the contents are checked.
 * (No invalidation would do: pg_extension has no catalog cache, and an
 * update whose script changes nothing cached sends none.)
 */
static ItemPointerData checked_tid;

/* whether tup is earmark's row at this library's version */
static bool
row_matches(Relation rel, HeapTuple tup, char **version)
{
	Form_pg_extension ext = (Form_pg_extension) GETSTRUCT(tup);
	bool		isnull;
	Datum		d;
	text	   *v;

	if (strcmp(NameStr(ext->extname), "earmark") != 0)
		return false;
	d = heap_getattr(tup, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);
	if (isnull)
		return false;
	v = DatumGetTextPP(d);
	if (version)
		*version = text_to_cstring(v);
	return VARSIZE_ANY_EXHDR(v) == strlen(EARMARK_VERSION) &&
		memcmp(VARDATA_ANY(v), EARMARK_VERSION, strlen(EARMARK_VERSION)) == 0;
}

/* the tuple at checked_tid is visible in snap and is still what we accepted */
static bool
checked_row_current(Relation rel, Snapshot snap)
{
	HeapTupleData tup;
	Buffer		buf;
	bool		current;

	if (!ItemPointerIsValid(&checked_tid) ||
		ItemPointerGetBlockNumber(&checked_tid) >= RelationGetNumberOfBlocks(rel))
		return false;
	tup.t_self = checked_tid;
	if (!heap_fetch(rel, snap, &tup, &buf, false))
		return false;
	current = row_matches(rel, &tup, NULL);
	ReleaseBuffer(buf);
	return current;
}

/*
 * Whether earmark is installed in this database at this library's version;
 * if not, *version is the installed one (palloc'd), or NULL when earmark
 * is not installed.
 */
static bool
installed_version_matches(char **version)
{
	Relation	rel;
	Snapshot	snap;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	bool		matches;

	*version = NULL;
	rel = table_open(ExtensionRelationId, AccessShareLock);
	snap = RegisterSnapshot(GetCatalogSnapshot(ExtensionRelationId));
	matches = checked_row_current(rel, snap);
	if (!matches)
	{
		ItemPointerSetInvalid(&checked_tid);
		ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
					F_NAMEEQ, CStringGetDatum("earmark"));
		scan = systable_beginscan(rel, ExtensionNameIndexId, true, snap, 1, &key);
		tup = systable_getnext(scan);
		if (HeapTupleIsValid(tup) && row_matches(rel, tup, version))
		{
			matches = true;
			checked_tid = tup->t_self;
		}
		systable_endscan(scan);
	}
	UnregisterSnapshot(snap);
	table_close(rel, AccessShareLock);
	return matches;
}

/*
 * Fail with EM008 unless the database has the schema of this library's
 * version.  Once per transaction (a new lxid); never while CREATE or ALTER
 * EXTENSION runs a script.
 */
void
em_require_schema(void)
{
	char	   *version;

	if (MyProc->lxid == schema_checked_lxid || creating_extension)
		return;
	if (!installed_version_matches(&version))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_SCHEMA_VERSION),
				 errmsg("earmark's library is version %s, but this database has earmark %s installed",
						EARMARK_VERSION, version ? version : "(none)"),
				 errdetail("The server was restarted with a new earmark library and the extension was not updated yet."),
				 errhint("Run ALTER EXTENSION earmark UPDATE in this database.")));
	schema_checked_lxid = MyProc->lxid;
}

/*
 * A read-only query of this file, planned without parallelism.  SPI_execute
 * and SPI_execute_with_args allow a parallel plan, and a parallel worker
 * takes the caller's search_path setting rather than the search path the
 * hot entry points pin for their call (spi.c, em_call_pinned), while it
 * runs as earmark's owner: none of earmark's statements may run in one
 * (docs/security.md).  The plan is freed by SPI_finish.
 */
static int
exec_serial(const char *sql, int nargs, Oid *argtypes, Datum *args, long count)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "earmark: could not prepare statement: %s",
			 SPI_result_code_string(SPI_result));
	return SPI_execute_plan(plan, args, NULL, true, count);
}

/*
 * This node's Citus group id, read once per backend (for earmark.next_id):
 * 0 on the coordinator and without Citus.  (A node keeps its group for as
 * long as it is in the cluster; the worker reads it every pass,
 * em_read_node_group.)
 */
int32
em_node_group(void)
{
	if (node_group >= 0)
		return node_group;
	return em_read_node_group();
}

/*
 * This node's Citus group id read again, for the worker: its backend lives
 * across the citus_add_node that gives a node its group.
 */
int32
em_read_node_group(void)
{
	int32		group = 0;

	if (OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
	{
		SPI_connect();
		if (exec_serial("SELECT groupid FROM pg_catalog.pg_dist_local_group", 0, NULL, NULL, 1) == SPI_OK_SELECT &&
			SPI_processed == 1)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull)
				group = DatumGetInt32(d);
		}
		SPI_finish();
	}
	/* cached only once read: a read that failed leaves no group 0 behind */
	node_group = group;
	return group;
}

/*
 * earmark.next_id(sequence): the sequence's next value with this node's
 * group id in the top 16 bits, so that ids written on different nodes of a
 * Citus cluster never meet, also after an account's shard moves to another
 * node.  Without Citus it is the sequence's value.
 */
Datum
earmark_next_id(PG_FUNCTION_ARGS)
{
	Oid			seq;
	int64		v;
	int64		group;

	/* not STRICT: a constant NULL would be folded without a privilege check */
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("earmark.next_id: the sequence must not be NULL")));
	seq = PG_GETARG_OID(0);
	/* earmark's own sequences only: it is no general nextval */
	if (get_rel_relkind(seq) != RELKIND_SEQUENCE ||
		get_rel_namespace(seq) != get_namespace_oid("earmark", true))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("earmark.next_id takes one of earmark's id sequences"),
				 errdetail("It is the default of the id columns of earmark's tables.")));
	v = nextval_internal(seq, true);
	group = em_node_group();

	/* a sequence that already counts in this node's range is left so */
	if (group != 0 && (v >> EM_NODE_ID_SHIFT) != group)
	{
		if (v >= (INT64CONST(1) << EM_NODE_ID_SHIFT))
			ereport(ERROR,
					(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
					 errmsg("earmark's id sequence %s passed 2^%d on this node",
							get_rel_name(seq), EM_NODE_ID_SHIFT)));
		v |= group << EM_NODE_ID_SHIFT;
	}
	PG_RETURN_INT64(v);
}

/* Citus's pg_dist_partition, or InvalidOid: a catalog cache lookup */
static Oid
dist_partition_relid(void)
{
	return get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
}

/* whether Citus is installed in this database */
bool
em_citus_installed(void)
{
	return OidIsValid(dist_partition_relid());
}

/*
 * Whether earmark.account is in Citus's pg_dist_partition (earmark_distribute
 * ran), read now.  A direct scan, not SPI: it checks no privilege of the
 * caller (earmark's planner hook asks it for any role's statement, and
 * earmark_user has no USAGE on schema earmark) and resolves no name through
 * the caller's search_path.  Without Citus it costs one catalog cache
 * lookup.
 */
bool
em_account_table_distributed(void)
{
	Oid			dist = dist_partition_relid();
	Oid			nsp;
	Oid			account;
	Oid			index;
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		found;

	if (!OidIsValid(dist))
		return false;
	nsp = get_namespace_oid("earmark", true);
	account = OidIsValid(nsp) ? get_relname_relid("account", nsp) : InvalidOid;
	if (!OidIsValid(account))
		return false;
	/* pg_dist_partition's first column is logicalrelid (regclass) */
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(account));
	index = get_relname_relid("pg_dist_partition_logical_relid_index", PG_CATALOG_NAMESPACE);
	rel = table_open(dist, AccessShareLock);
	scan = systable_beginscan(rel, index, OidIsValid(index), NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * Whether earmark's tables are distributed with Citus, as this transaction
 * first saw it (em_account_table_distributed, read once per transaction).
 */
bool
em_distributed(void)
{
	if (MyProc->lxid == distributed_lxid)
		return distributed;
	distributed = em_account_table_distributed();
	distributed_lxid = MyProc->lxid;
	return distributed;
}

/*
 * On a distributed install, fail unless this node holds the account's
 * shard.  Citus runs an earmark call on the account's node only when it is
 * called bare (SELECT * FROM earmark_reserve(...)); any other form runs it
 * on the node it was sent to, where its advisory locks (the account's, the
 * cycle's mark lock) and node-local state would not exclude the calls
 * that do run on the account's node.
 */
void
em_require_account_local(text *account)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		local = true;

	if (!em_distributed())
		return;
	args[0] = PointerGetDatum(account);
	SPI_connect();
	if (exec_serial("SELECT p.groupid FROM pg_catalog.pg_dist_placement p "
					"WHERE p.shardid = pg_catalog.get_shard_id_for_distribution_column("
					"'earmark.account'::regclass, $1)",
					1, argtypes, args, 0) == SPI_OK_SELECT)
	{
		uint64		i;

		local = false;
		for (i = 0; i < SPI_processed; i++)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull && DatumGetInt32(d) == em_node_group())
				local = true;
		}
	}
	SPI_finish();
	if (!local)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("earmark call for account \"%s\" ran on a node that does not hold the account",
						text_to_cstring(account)),
				 errdetail("On a distributed install an earmark call runs on the account's node only when it is called on its own."),
				 errhint("Call it in a statement of its own, SELECT * FROM earmark_...(account, ...) (in PL/pgSQL: PERFORM * FROM earmark_...(...)), not inside an expression, a WHERE, a join or a CTE.")));
}

/*
 * On a distributed install, fail unless this is the coordinator: the
 * inbox, the key set cache and the reporter's state are tables of the
 * coordinator's own (earmark_distribute leaves them there), and a worker
 * node's copies of them are not the install's.
 */
void
em_require_coordinator(const char *what)
{
	if (!em_distributed() || em_node_group() == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("%s runs on the Citus coordinator", what),
			 errdetail("On a distributed install the inbox, the key set cache and the reporter's state are the coordinator's tables."),
			 errhint("Connect to the coordinator and call it there.")));
}

/*
 * The reporter and the reconciler compare totals with what concurrent
 * writers committed a moment ago: that needs a snapshot per statement.
 * Under REPEATABLE READ a mark could be deleted for usage the report never
 * saw, so they refuse to run there.  So do earmark_set_account with an
 * anchor and earmark_set_escrow, which must see every budget row of the
 * account, also one a reserve created after the caller's snapshot, and
 * earmark.store_limits, the worker's limit store that Citus runs on the
 * account's node: Citus sends such a call on its own, so it runs at the
 * node's default_transaction_isolation, not at the worker's READ
 * COMMITTED.  So does earmark_distribute (earmark.distribution_lock): its
 * snapshot is taken before it waits for the distribution lock, and would
 * hide what the distribution or the worker's transaction it waited for
 * committed.  (earmark.report_cycle reads its total in the latest
 * snapshot instead: a refusal there would stop every later cycle's
 * report.)
 */
void
em_require_read_committed(const char *what)
{
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("%s must run in a READ COMMITTED transaction", what),
				 errdetail("It reads what other sessions committed since it started (totals, budget rows); "
						   "a transaction snapshot would hide that."),
				 errhint("Call it outside a REPEATABLE READ or SERIALIZABLE transaction.")));
}

/*
 * The database's distribution lock, in mode, until the transaction ends:
 * an advisory lock whose fourth key no SQL advisory lock function makes
 * (EARMARK_DISTRIBUTE_LOCKTAG), so no role can take it by hand and hold
 * the worker up.  The worker takes it shared first in each of its
 * transactions (worker.c, run_pass) and earmark_distribute exclusive first
 * (earmark.distribution_lock()), so neither holds a table when it waits
 * for the other.  Without it, a sweep that had read the job and budget
 * tables and then locked a budget row waited for the distribution, which
 * keeps each table it distributed locked against writes, while the
 * distribution waited for the sweep's read to empty the coordinator's copy
 * of that table (ACCESS EXCLUSIVE): one of them failed with 40P01
 * (test/citus/distribute_pass.sh).
 */
void
em_distribution_lock(LOCKMODE mode)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, EARMARK_DISTRIBUTE_LOCKTAG);
	(void) LockAcquire(&tag, mode, false, false);
}

/*
 * earmark.distribution_lock(): the lock, exclusive (earmark_distribute's
 * first step).  At READ COMMITTED only: the caller's snapshot is taken
 * before the wait, and at REPEATABLE READ or SERIALIZABLE it would hide
 * what the distribution or the worker's transaction it waited for
 * committed (a second earmark_distribute() would read pg_dist_partition
 * as it was and try to distribute the tables again;
 * test/citus/review_distribute_callers.sh).
 */
Datum
earmark_distribution_lock(PG_FUNCTION_ARGS)
{
	em_require_schema();
	em_require_read_committed("earmark_distribute");
	em_distribution_lock(ExclusiveLock);
	PG_RETURN_VOID();
}
