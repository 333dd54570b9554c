/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The launcher: one background worker, registered when earmark is in
 *	  shared_preload_libraries, that runs an earmark worker (worker.c) in
 *	  every database where the extension is installed.
 *
 *	  Every earmark.launcher_naptime it lists the databases that accept
 *	  connections (not templates; only earmark.database when that is set)
 *	  and starts a worker for each that has none.  A worker that finds no
 *	  extension in its database says so and exits; its slot is freed at
 *	  once (slots are for databases with earmark: many databases without
 *	  it must not leave none for one with it), and the launcher keeps, in
 *	  its own memory, not to try that database again before
 *	  NO_EXTENSION_RETRY, unless CREATE EXTENSION earmark runs there (the
 *	  install script wakes the launcher and takes a slot).  A worker that
 *	  dies is started again after a backoff that doubles up to
 *	  BACKOFF_MAX; one that has finished a round starts the count again.
 *	  The launcher sleeps until the next retry is due, at most
 *	  earmark.launcher_naptime.  A database that is dropped loses its
 *	  worker (see the utility hook below), and its slot is freed.
 *
 *	  DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE, and
 *	  CREATE DATABASE from a template all refuse while another session is
 *	  connected to that database; an earmark worker is one.  A utility hook
 *	  stops the database's worker first (SIGTERM, then waits up to 5 s)
 *	  and pauses its restart for PAUSE.
 *
 *	  Shared state (EmLauncherShared): a slot per database, under one
 *	  spinlock held for a few instructions: the worker's pid, its state,
 *	  when it may start again, and whether CREATE EXTENSION asked for it.
 *	  The launcher alone starts workers and frees slots; a worker writes
 *	  its pid and its reason to exit into its own slot; the utility hook
 *	  and earmark.wake_launcher() write the pause and the wake.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "launcher.h"
#include "settings.h"

PG_FUNCTION_INFO_V1(earmark_wake_launcher);

#define NO_EXTENSION_RETRY	(5 * 60 * USECS_PER_SEC)
#define BACKOFF_MAX			(60 * USECS_PER_SEC)
#define PAUSE				(10 * USECS_PER_SEC)

typedef enum DbState
{
	DB_FREE = 0,
	DB_RUNNING,					/* a worker was started */
	DB_FAILED,					/* its worker died: backoff */
	DB_PAUSED					/* a DROP or ALTER DATABASE stopped it */
} DbState;

typedef struct EmDbSlot
{
	Oid			dboid;
	DbState		state;
	pid_t		pid;			/* 0 when no worker runs */
	bool		no_extension;	/* set by the worker before it exits */
	bool		wake;			/* CREATE EXTENSION asked for a worker */
	int			failures;		/* deaths since its last good round */
	TimestampTz retry_at;		/* no start before */
} EmDbSlot;

typedef struct EmLauncherShared
{
	slock_t		mutex;
	Latch	   *latch;			/* the launcher's, NULL while none runs */
	int			nslots;
	EmDbSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} EmLauncherShared;

static EmLauncherShared *launcher = NULL;
static ProcessUtility_hook_type prev_utility_hook = NULL;

/* the launcher's own: each slot's handle */
static BackgroundWorkerHandle **handles = NULL;

/*
 * The launcher's own: databases whose worker found no extension, and when
 * to look again.  Not in shared memory and not a slot: only the launcher
 * reads it, and a database without earmark must not hold a slot.
 */
typedef struct NoExtension
{
	Oid			dboid;
	TimestampTz retry_at;
} NoExtension;

static NoExtension *no_ext = NULL;
static int	no_ext_n = 0;
static int	no_ext_size = 0;

/* when the launcher must look again: the earliest retry of this round */
static TimestampTz next_due = 0;

static void
due_at(TimestampTz t)
{
	if (next_due == 0 || t < next_due)
		next_due = t;
}

/* no worker for dboid before retry_at (0: forget it) */
static void
no_extension_until(Oid dboid, TimestampTz retry_at)
{
	int			i;

	for (i = 0; i < no_ext_n && no_ext[i].dboid != dboid; i++)
		;
	if (retry_at == 0)
	{
		if (i < no_ext_n)
			no_ext[i] = no_ext[--no_ext_n];
		return;
	}
	if (i == no_ext_n)
	{
		if (no_ext_n == no_ext_size)
		{
			no_ext_size = Max(16, no_ext_size * 2);
			no_ext = no_ext == NULL ?
				MemoryContextAlloc(TopMemoryContext, sizeof(NoExtension) * no_ext_size) :
				repalloc(no_ext, sizeof(NoExtension) * no_ext_size);
		}
		no_ext_n++;
	}
	no_ext[i].dboid = dboid;
	no_ext[i].retry_at = retry_at;
}

/* true while dboid is known to have no extension */
static bool
known_without_extension(Oid dboid, TimestampTz now)
{
	int			i;

	for (i = 0; i < no_ext_n; i++)
	{
		if (no_ext[i].dboid != dboid)
			continue;
		if (now < no_ext[i].retry_at)
		{
			due_at(no_ext[i].retry_at);
			return true;
		}
		no_extension_until(dboid, 0);
		return false;
	}
	return false;
}

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
Size
em_launcher_shmem_size(void)
{
	return add_size(offsetof(EmLauncherShared, slots),
					mul_size(earmark_max_databases, sizeof(EmDbSlot)));
}

/* in the shmem_startup_hook, under AddinShmemInitLock */
void
em_launcher_shmem_init(void)
{
	bool		found;

	launcher = ShmemInitStruct("earmark launcher", em_launcher_shmem_size(), &found);
	if (found)
		return;
	memset(launcher, 0, em_launcher_shmem_size());
	SpinLockInit(&launcher->mutex);
	launcher->nslots = earmark_max_databases;
}

/* the database's slot, under the mutex; NULL when it has none */
static EmDbSlot *
slot_of(Oid dboid)
{
	int			i;

	for (i = 0; i < launcher->nslots; i++)
	{
		if (launcher->slots[i].state != DB_FREE && launcher->slots[i].dboid == dboid)
			return &launcher->slots[i];
	}
	return NULL;
}

/* ---------------------------------------------------------------------
 * Registration
 * ---------------------------------------------------------------------
 */
void
em_register_launcher(void)
{
	BackgroundWorker w;

	memset(&w, 0, sizeof(w));
	w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w.bgw_start_time = BgWorkerStart_RecoveryFinished;
	w.bgw_restart_time = 5;
	snprintf(w.bgw_library_name, BGW_MAXLEN, "earmark");
	snprintf(w.bgw_function_name, BGW_MAXLEN, "earmark_launcher_main");
	snprintf(w.bgw_name, BGW_MAXLEN, "earmark launcher");
	snprintf(w.bgw_type, BGW_MAXLEN, "earmark launcher");
	RegisterBackgroundWorker(&w);

	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = em_launcher_utility;
}

/* a worker for one database; false when no background worker slot is free */
static bool
start_worker(int i, Oid dboid)
{
	BackgroundWorker w;

	memset(&w, 0, sizeof(w));
	w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w.bgw_start_time = BgWorkerStart_RecoveryFinished;
	w.bgw_restart_time = BGW_NEVER_RESTART;	/* the launcher restarts it */
	snprintf(w.bgw_library_name, BGW_MAXLEN, "earmark");
	snprintf(w.bgw_function_name, BGW_MAXLEN, "earmark_worker_main");
	snprintf(w.bgw_name, BGW_MAXLEN, "earmark worker %u", dboid);
	snprintf(w.bgw_type, BGW_MAXLEN, "earmark worker");
	w.bgw_main_arg = ObjectIdGetDatum(dboid);
	w.bgw_notify_pid = MyProcPid;
	return RegisterDynamicBackgroundWorker(&w, &handles[i]);
}

/* ---------------------------------------------------------------------
 * The launcher
 * ---------------------------------------------------------------------
 */

/*
 * earmark.database names no database that accepts connections: no worker
 * runs anywhere, which must not be silent.  Once per value.
 */
static void
warn_if_database_missing(int n)
{
	static char *warned = NULL;

	if (earmark_database == NULL || earmark_database[0] == '\0')
		return;
	if (n > 0)
	{
		if (warned != NULL)
			pfree(warned);
		warned = NULL;
		return;
	}
	if (warned != NULL && strcmp(warned, earmark_database) == 0)
		return;
	ereport(WARNING,
			(errmsg("earmark launcher: earmark.database is \"%s\", and no database of that name accepts connections",
					earmark_database),
			 errdetail("No earmark worker runs: nothing is swept, reported or applied."),
			 errhint("Correct earmark.database in postgresql.conf and restart, or leave it empty for a worker in every database with earmark.")));
	if (warned != NULL)
		pfree(warned);
	warned = MemoryContextStrdup(TopMemoryContext, earmark_database);
}

/* the databases a worker may run in: oids, in *n */
static Oid *
list_databases(int *n)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	Oid		   *dbs = palloc(sizeof(Oid) * 16);
	int			size = 16;

	*n = 0;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (!db->datallowconn || db->datistemplate)
			continue;
		if (earmark_database != NULL && earmark_database[0] != '\0' &&
			strcmp(NameStr(db->datname), earmark_database) != 0)
			continue;
		if (*n == size)
		{
			size *= 2;
			dbs = repalloc(dbs, sizeof(Oid) * size);
		}
		dbs[(*n)++] = db->oid;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();
	warn_if_database_missing(*n);
	return dbs;
}

/* a slot's worker has stopped: why, and when to try again */
static void
worker_stopped(int i, TimestampTz now)
{
	EmDbSlot   *s = &launcher->slots[i];

	pfree(handles[i]);
	handles[i] = NULL;
	SpinLockAcquire(&launcher->mutex);
	s->pid = 0;
	if (s->state == DB_PAUSED)
		;						/* the pause holds */
	else if (s->no_extension && s->wake)
	{
		/* CREATE EXTENSION committed while it looked: at once again */
		s->state = DB_FAILED;
		s->failures = 0;
		s->retry_at = 0;
	}
	else if (s->no_extension)
	{
		/* not a slot's business any more: see no_ext */
		no_extension_until(s->dboid, now + NO_EXTENSION_RETRY);
		memset(s, 0, sizeof(*s));
		SpinLockRelease(&launcher->mutex);
		return;
	}
	else
	{
		s->state = DB_FAILED;
		s->failures = Min(s->failures + 1, 16);
		s->retry_at = now + Min(BACKOFF_MAX, USECS_PER_SEC << (s->failures - 1));
	}
	s->no_extension = false;
	SpinLockRelease(&launcher->mutex);
}

/* free the slots of databases that are gone; notice stopped workers */
static void
check_slots(Oid *dbs, int n, TimestampTz now)
{
	int			i;
	int			j;

	for (i = 0; i < launcher->nslots; i++)
	{
		EmDbSlot   *s = &launcher->slots[i];
		pid_t		pid;
		bool		listed = false;

		if (s->state == DB_FREE)
			continue;
		if (handles[i] != NULL &&
			GetBackgroundWorkerPid(handles[i], &pid) == BGWH_STOPPED)
			worker_stopped(i, now);
		for (j = 0; j < n; j++)
			listed |= dbs[j] == s->dboid;
		if (!listed && handles[i] == NULL)
		{
			SpinLockAcquire(&launcher->mutex);
			memset(s, 0, sizeof(*s));
			SpinLockRelease(&launcher->mutex);
		}
	}
}

/* start the workers that are due */
static void
start_due(Oid *dbs, int n, TimestampTz now)
{
	static bool warned = false;
	int			j;

	for (j = 0; j < n; j++)
	{
		EmDbSlot   *s;
		int			i;
		bool		due;

		SpinLockAcquire(&launcher->mutex);
		s = slot_of(dbs[j]);
		if (s == NULL && known_without_extension(dbs[j], now))
		{
			SpinLockRelease(&launcher->mutex);
			continue;
		}
		for (i = 0; s == NULL && i < launcher->nslots; i++)
		{
			if (launcher->slots[i].state == DB_FREE)
			{
				s = &launcher->slots[i];
				s->dboid = dbs[j];
				s->state = DB_FAILED;	/* not running: due at once */
				s->retry_at = 0;
			}
		}
		i = s ? (int) (s - launcher->slots) : -1;
		/* a worker without a handle is one an earlier launcher started */
		due = s != NULL && handles[i] == NULL && s->pid == 0 &&
			(s->wake || now >= s->retry_at);
		if (due)
		{
			s->wake = false;
			s->state = DB_RUNNING;
		}
		else if (s != NULL && handles[i] == NULL && s->pid == 0)
			due_at(s->retry_at);
		SpinLockRelease(&launcher->mutex);

		if (s == NULL && !warned)
			ereport(WARNING,
					(errmsg("earmark launcher: more databases than earmark.max_databases (%d)",
							earmark_max_databases),
					 errhint("Raise earmark.max_databases, or set earmark.database.")));
		warned |= s == NULL;
		if (due && !start_worker(i, dbs[j]))
		{
			handles[i] = NULL;
			SpinLockAcquire(&launcher->mutex);
			s->state = DB_FAILED;
			s->retry_at = now + BACKOFF_MAX;
			SpinLockRelease(&launcher->mutex);
			due_at(now + BACKOFF_MAX);
			ereport(WARNING,
					(errmsg("earmark launcher: no background worker slot for the worker of database %u",
							dbs[j]),
					 errhint("Raise max_worker_processes.")));
		}
	}
}

/* until the next retry is due, at most earmark.launcher_naptime */
static long
sleep_ms(TimestampTz now)
{
	long		ms = earmark_launcher_naptime_ms;

	if (next_due != 0)
		ms = Min(ms, Max(10, (long) ((next_due - now) / 1000) + 1));
	return ms;
}

static void
launcher_exit(int code, Datum arg)
{
	SpinLockAcquire(&launcher->mutex);
	launcher->latch = NULL;
	SpinLockRelease(&launcher->mutex);
}

void
earmark_launcher_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* no database: it reads pg_database only */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	handles = MemoryContextAllocZero(TopMemoryContext,
									 sizeof(BackgroundWorkerHandle *) * launcher->nslots);
	SpinLockAcquire(&launcher->mutex);
	launcher->latch = MyLatch;
	SpinLockRelease(&launcher->mutex);
	before_shmem_exit(launcher_exit, (Datum) 0);
	ereport(LOG, (errmsg("earmark launcher started")));

	for (;;)
	{
		MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "earmark launcher round",
												  ALLOCSET_SMALL_SIZES);
		MemoryContext old = MemoryContextSwitchTo(cxt);
		TimestampTz now = GetCurrentTimestamp();
		int			n;
		Oid		   *dbs;

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		pgstat_report_activity(STATE_RUNNING, "earmark launcher: looking at the databases");
		next_due = 0;
		dbs = list_databases(&n);
		check_slots(dbs, n, now);
		start_due(dbs, n, now);
		pgstat_report_activity(STATE_IDLE, NULL);
		MemoryContextSwitchTo(old);
		MemoryContextDelete(cxt);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms(now), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* ---------------------------------------------------------------------
 * What workers, CREATE EXTENSION and DDL tell the launcher
 * ---------------------------------------------------------------------
 */

/* a worker exits (also on an error): its slot no longer has a pid */
static void
worker_exit(int code, Datum arg)
{
	EmDbSlot   *s;

	SpinLockAcquire(&launcher->mutex);
	s = slot_of(MyDatabaseId);
	if (s != NULL && s->pid == MyProcPid)
		s->pid = 0;
	SpinLockRelease(&launcher->mutex);
}

/* a worker starts: its pid in its database's slot */
void
em_launcher_worker_started(void)
{
	EmDbSlot   *s;

	if (launcher == NULL)
		return;
	SpinLockAcquire(&launcher->mutex);
	s = slot_of(MyDatabaseId);
	if (s != NULL)
		s->pid = MyProcPid;
	SpinLockRelease(&launcher->mutex);
	before_shmem_exit(worker_exit, (Datum) 0);
}

/*
 * The worker finished a round: its database's backoff starts again from
 * the shortest wait the next time it dies.  Once per worker.
 */
void
em_launcher_worker_ran(void)
{
	static bool done = false;
	EmDbSlot   *s;

	if (launcher == NULL || done)
		return;
	SpinLockAcquire(&launcher->mutex);
	s = slot_of(MyDatabaseId);
	if (s != NULL && s->pid == MyProcPid)
		s->failures = 0;
	SpinLockRelease(&launcher->mutex);
	done = true;
}

/* the worker found no extension in its database and exits */
void
em_launcher_no_extension(void)
{
	EmDbSlot   *s;

	if (launcher == NULL)
		return;
	SpinLockAcquire(&launcher->mutex);
	s = slot_of(MyDatabaseId);
	if (s != NULL)
		s->no_extension = true;
	SpinLockRelease(&launcher->mutex);
}

/* a wake this transaction asked for, done when it commits */
static bool wake_pending = false;
static bool wake_callback = false;

static void wake_now(void);

static void
wake_at_commit(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT && wake_pending)
		wake_now();
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT)
		wake_pending = false;
}

/*
 * earmark.wake_launcher(): CREATE EXTENSION earmark calls it, so that the
 * database gets its worker as soon as the extension is committed, not at
 * its next retry (a worker started before the commit would find no
 * extension).  Without shared_preload_libraries there is no launcher, and
 * it does nothing.
 */
Datum
earmark_wake_launcher(PG_FUNCTION_ARGS)
{
	if (launcher == NULL)
		PG_RETURN_VOID();
	if (!wake_callback)
	{
		RegisterXactCallback(wake_at_commit, NULL);
		wake_callback = true;
	}
	wake_pending = true;
	PG_RETURN_VOID();
}

static void
wake_now(void)
{
	EmDbSlot   *s;
	Latch	   *latch = NULL;
	int			i;

	SpinLockAcquire(&launcher->mutex);
	s = slot_of(MyDatabaseId);
	/* a database without earmark had no slot: it takes one now */
	for (i = 0; s == NULL && i < launcher->nslots; i++)
	{
		if (launcher->slots[i].state == DB_FREE)
		{
			s = &launcher->slots[i];
			s->dboid = MyDatabaseId;
			s->state = DB_FAILED;	/* not running: due at once */
			s->retry_at = 0;
		}
	}
	if (s != NULL)
	{
		s->wake = true;
		if (s->state == DB_PAUSED)
			s->state = DB_FAILED;
	}
	latch = launcher->latch;
	SpinLockRelease(&launcher->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Stop a database's worker before a command that needs the database to
 * itself, and pause its restart.  Waits up to 5 s for it to exit.
 */
static void
stop_worker_of(const char *dbname)
{
	Oid			dboid = get_database_oid(dbname, true);
	EmDbSlot   *s;
	pid_t		pid = 0;
	int			i;

	if (!OidIsValid(dboid) || launcher == NULL)
		return;
	SpinLockAcquire(&launcher->mutex);
	s = slot_of(dboid);
	if (s != NULL)
	{
		s->state = DB_PAUSED;
		s->retry_at = GetCurrentTimestamp() + PAUSE;
		pid = s->pid;
	}
	SpinLockRelease(&launcher->mutex);
	if (pid == 0)
		return;
	(void) kill(pid, SIGTERM);
	for (i = 0; i < 500 && kill(pid, 0) == 0; i++)
	{
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000L);
	}
}

/* the database a command needs to itself, or NULL */
static const char *
database_to_free(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, DropdbStmt))
		return ((DropdbStmt *) stmt)->dbname;
	if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		return ((RenameStmt *) stmt)->subname;
	if (IsA(stmt, AlterDatabaseStmt))
	{
		foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
		{
			if (strcmp(((DefElem *) lfirst(lc))->defname, "tablespace") == 0)
				return ((AlterDatabaseStmt *) stmt)->dbname;
		}
	}
	if (IsA(stmt, CreatedbStmt))
	{
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *d = (DefElem *) lfirst(lc);

			if (strcmp(d->defname, "template") == 0 && d->arg != NULL)
				return defGetString(d);
		}
	}
	return NULL;
}

void
em_launcher_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					ProcessUtilityContext context, ParamListInfo params,
					QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	const char *dbname = database_to_free(pstmt->utilityStmt);

	if (dbname != NULL)
		stop_worker_of(dbname);
	if (prev_utility_hook)
		prev_utility_hook(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}
