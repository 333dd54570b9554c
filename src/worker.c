/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The earmark background worker: one per cluster, connected to
 *	  earmark.database, started when earmark is in shared_preload_libraries
 *	  and restarted by the postmaster if it dies.
 *
 *	  It wakes every earmark.sweep_interval and settles the holds whose
 *	  lease has passed (em_sweep), in short transactions of at most
 *	  SWEEP_BATCH jobs, so that no lock is held for long.  The locks are
 *	  em_sweep's (see gate.c): it never waits for a job row and waits for at
 *	  most one budget row per transaction.
 *
 *	  Signals: SIGHUP rereads the configuration, SIGTERM ends the worker at
 *	  the next CHECK_FOR_INTERRUPTS.  An error in a pass is logged, its
 *	  transaction is rolled back and the next pass runs on schedule: one bad
 *	  pass does not put the worker in a crash loop.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "earmark.h"

/* jobs settled in one transaction of the worker */
#define SWEEP_BATCH		1000

void
em_register_worker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "earmark");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "earmark_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "earmark worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "earmark worker");
	worker.bgw_main_arg = (Datum) 0;
	worker.bgw_notify_pid = 0;
	RegisterBackgroundWorker(&worker);
}

/*
 * One transaction of sweeping.  Returns the number of holds settled, or -1
 * when the extension is not installed in this database (or the pass failed).
 */
static int
sweep_pass(void)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	volatile int n = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "earmark: sweeping expired holds");

	PG_TRY();
	{
		if (OidIsValid(get_extension_oid("earmark", true)))
		{
			SPI_connect();
			n = em_sweep(SWEEP_BATCH);
			SPI_finish();
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		n = -1;
	}
	PG_END_TRY();

	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return n;
}

void
earmark_worker_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(earmark_database, NULL, 0);

	/*
	 * Everything the worker runs names its schema, but pin the path anyway
	 * so that nothing a database owner puts in public is ever resolved.
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("application_name", "earmark worker", PGC_USERSET, PGC_S_OVERRIDE);

	ereport(LOG,
			(errmsg("earmark worker started in database \"%s\"", earmark_database)));

	for (;;)
	{
		int			n;

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 earmark_sweep_interval_ms,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		/* a full batch means there may be more: go on without sleeping */
		do
		{
			n = sweep_pass();
			if (n > 0)
				elog(DEBUG1, "earmark: swept %d expired holds", n);
			CHECK_FOR_INTERRUPTS();
		} while (n == SWEEP_BATCH);
	}
}
