/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The earmark background worker: one per cluster, connected to
 *	  earmark.database, started when earmark is in shared_preload_libraries
 *	  and restarted by the postmaster if it dies.
 *
 *	  It wakes every earmark.sweep_interval, settles the holds whose lease
 *	  has passed (em_sweep), in short transactions of at most SWEEP_BATCH
 *	  jobs so that no lock is held for long, then applies the inbox events
 *	  that have a handler (em_inbox_claim, em_inbox_apply: one transaction
 *	  to claim, one per event to apply it with its mark), reads the limits
 *	  admissions asked for and reports marked cycles.  The locks are
 *	  those of gate.c and inbox.c: the sweep waits for no job row and no
 *	  budget row (an application's open transaction delays only its own
 *	  budget's sweep, never the worker); claims skip locked
 *	  events.  A report pass holds the send lock (meter.c) for the
 *	  session, from before its claim to after its finish, and is skipped
 *	  while another sender has it.  Once a minute it checks whether the cached JWKS is older than
 *	  earmark.jwks_refresh and fetches it again (the HTTP call holds no
 *	  earmark row lock).
 *
 *	  Each of its transactions takes the database's distribution lock
 *	  (cluster.c) shared before any table, so that earmark_distribute and
 *	  each transaction of the worker wait for each other whole, never
 *	  deadlock.
 *
 *	  In a Citus cluster only the coordinator's worker works; the workers
 *	  of the other nodes idle, before earmark_distribute as after it
 *	  (node_works).  Once earmark is distributed, the coordinator's worker
 *	  finds work with reads over the cluster, and does each account's part
 *	  in a call of its own (earmark.sweep_account, earmark.report_cycle,
 *	  earmark.store_limits) that Citus runs on the account's node, where
 *	  that account's writers take their locks.
 *
 *	  HTTP to the provider (the reporter's sends, the limit reads, the
 *	  Kinde token) runs outside any transaction, and between two polls the
 *	  worker sweeps whenever earmark.sweep_interval has passed: a slow or
 *	  hanging provider never holds up the settling of dead holds.
 *
 *	  Memory: each wake-up's passes run in one context (round_cxt), reset
 *	  at the next wake-up; a commit or an abort leaves TopMemoryContext
 *	  current, so run_pass makes its caller's context current again after
 *	  every transaction (and http.c after every tick).  Nothing a pass
 *	  allocates outlives its round, except the cached Kinde token.
 *
 *	  Transactions: every one is READ COMMITTED and READ WRITE whatever the
 *	  defaults (a session SET by a handler, ALTER DATABASE or ALTER ROLE
 *	  ... SET); settings a pass changes for the session (a handler's
 *	  set_config(..., false)) are undone when the pass ends; and the
 *	  settings that would change how the worker runs (search_path, lock
 *	  and statement timeouts, exit_on_error, session_replication_role) are
 *	  pinned over the database's and role's.
 *
 *	  Signals: SIGHUP rereads the configuration, SIGTERM ends the worker at
 *	  the next CHECK_FOR_INTERRUPTS.  An error in a pass is logged, its
 *	  transaction is rolled back and the next pass runs on schedule; an
 *	  error outside a pass (none is expected: a provider's failure or
 *	  hostile answer is a failed request, never an error) is logged and the
 *	  worker goes on after a second.  One bad pass or answer does not put
 *	  the worker in a crash loop.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "catalog/pg_type.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "cluster.h"
#include "gate.h"
#include "inbox.h"
#include "intake.h"
#include "launcher.h"
#include "limit_cache.h"
#include "meter.h"
#include "provider.h"
#include "settings.h"
#include "spi.h"
#include "version.h"
#include "worker.h"

/* the worker's database */
static char *dbname = NULL;

/* jobs settled in one transaction of the worker */
#define SWEEP_BATCH		1000

/* accounts whose limits are read in one pass */
#define LIMIT_BATCH		20


typedef int (*PassFn) (void *arg);

/* the memory of one wake-up's passes, reset at the next wake-up */
static MemoryContext round_cxt = NULL;

static TimestampTz last_sweep = 0;
static TimestampTz last_report = 0;
static TimestampTz last_jwks_check = 0;

/*
 * Settings the worker runs with whatever the database or the role set:
 * pinned with the highest source a default can have (PGC_S_OVERRIDE), so
 * that ALTER DATABASE ... SET and ALTER ROLE ... SET do not reach it.  A
 * session SET during a pass is undone when the pass ends (run_pass).
 */
static const char *const pinned_settings[][2] = {
	/* everything the worker runs names its schema; nothing in public is ever resolved */
	{"search_path", "pg_catalog, pg_temp"},
	/* a snapshot per statement, read-write (run_pass sets both per transaction too) */
	{"default_transaction_isolation", "read committed"},
	{"default_transaction_read_only", "off"},
	{"default_transaction_deferrable", "off"},
	/* the worker's waits are its own to bound (the sweep never waits) */
	{"lock_timeout", "0"},
	{"statement_timeout", "0"},
	{"idle_in_transaction_session_timeout", "0"},
	/* an error is one failed pass, not the end of the worker */
	{"exit_on_error", "off"},
	/* triggers fire as for every other session */
	{"session_replication_role", "origin"},

	/*
	 * no JIT: the worker's statements are short, and a plan estimated above
	 * jit_above_cost (the worker's claim is, while inbox_handler has never
	 * been analyzed, as small tables are not) was compiled again at every
	 * pass, with nothing to do (test/bench/inbox_worker.sh)
	 */
	{"jit", "off"},
};

static void
pin_settings(void)
{
	int			i;

	for (i = 0; i < lengthof(pinned_settings); i++)
		SetConfigOption(pinned_settings[i][0], pinned_settings[i][1], PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("application_name", "earmark worker", PGC_USERSET, PGC_S_OVERRIDE);
}

/*
 * The library works on the schema of its own version only.  Between a
 * server restart with a new library and ALTER EXTENSION earmark UPDATE the
 * worker waits (one warning, not one error a pass).
 */
static EmStatement extension_version = {
	"SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'earmark'",
	0, {InvalidOid}
};

static bool
schema_is_current(void)
{
	static bool warned = false;
	bool		isnull;
	char	   *version;

	/* a saved plan: this runs before every pass */
	em_exec(&extension_version, NULL, NULL, 1);
	if (SPI_processed != 1)
		return false;
	version = TextDatumGetCString(em_get(0, 1, &isnull));
	if (strcmp(version, EARMARK_VERSION) == 0)
	{
		warned = false;
		return true;
	}
	if (!warned)
		ereport(WARNING,
				(errmsg("earmark worker waits: the extension in database \"%s\" is version %s, the library is %s",
						dbname, version, EARMARK_VERSION),
				 errhint("Run ALTER EXTENSION earmark UPDATE in that database.")));
	warned = true;
	return false;
}

/*
 * In a Citus cluster only the coordinator's worker works: once earmark is
 * distributed it finds the work with reads over the cluster and does each
 * account's part in a call of its own that Citus runs on the account's
 * node (em_sweep, the reporter's last step).  A worker node's worker
 * waits, before the distribution too: its passes would go over the same
 * cluster again, its own tables hold nothing to do (earmark_distribute
 * refuses rows in them), and a pass there that straddled the
 * distribution's commit would fail, as the distribution lock orders only
 * the coordinator's worker.  The group is read every pass: a node gets it
 * from citus_add_node, which may come after the worker started.
 */
static bool
node_works(void)
{
	static int32 idle_group = 0;
	int32		group = em_read_node_group();

	if (group != idle_group && group != 0)
		ereport(LOG,
				(errmsg("earmark worker idles: database \"%s\" is on a worker node (group %d) of a Citus cluster",
						dbname, group),
				 errdetail("The coordinator's earmark worker does the work of the whole cluster.")));
	else if (group != idle_group)
		ereport(LOG,
				(errmsg("earmark worker works again: database \"%s\" is no longer on a worker node of a Citus cluster",
						dbname),
				 errhint("If this node was removed from the cluster, drop earmark here: its metadata may still name the cluster's tables.")));
	idle_group = group;
	return group == 0;
}

/*
 * Start a transaction of the worker: READ COMMITTED and READ WRITE, set
 * before its first snapshot, whatever the defaults say.  The reporter and
 * the reconciler need a snapshot per statement (meter.c), and every pass
 * writes.
 */
static void
start_pass_transaction(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	XactIsoLevel = XACT_READ_COMMITTED;
	XactReadOnly = false;
	XactDeferrable = false;
}

/*
 * Run fn in a transaction of its own, with the earmark extension present.
 * Returns fn's result, or -1 when the extension is not installed in this
 * database or the pass failed: the error is logged (and, if error is not
 * NULL, its message copied there, in the caller's context) and rolled
 * back, and the worker carries on at the next pass instead of exiting.
 * The caller's memory context is current again when it returns.
 */
/* a pass found no earmark in this database (DROP EXTENSION) */
static bool extension_gone = false;

static int
run_pass(const char *activity, PassFn fn, void *arg, char **error)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile int n = -1;

	start_pass_transaction();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);

	PG_TRY();
	{
		/* what the pass sets for the session (a handler's SET) ends with it */
		int			nestlevel = NewGUCNestLevel();

		/*
		 * Before any table: an earmark_distribute() that runs holds the
		 * pass here until it ends, and one that starts waits for the pass
		 * (cluster.c, em_distribution_lock)
		 */
		em_distribution_lock(ShareLock);
		if (OidIsValid(get_extension_oid("earmark", true)))
		{
			SPI_connect();
			if (schema_is_current() && node_works())
				n = fn(arg);
			SPI_finish();
		}
		else
			extension_gone = true;
		AtEOXact_GUC(false, nestlevel);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller);
		if (error)
		{
			ErrorData  *edata = CopyErrorData();

			*error = edata->message;
		}
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		n = -1;
	}
	PG_END_TRY();

	/* a commit or an abort leaves TopMemoryContext current */
	MemoryContextSwitchTo(caller);
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return n;
}

static int
sweep_fn(void *arg)
{
	/*
	 * Never wait for a budget row: an application transaction that keeps
	 * one locked would stop every other sweep, the inbox and the reporter.
	 * A skipped budget is swept on a later pass (or reclaimed by the next
	 * reserve that needs its room).
	 */
	return em_sweep(SWEEP_BATCH, false);
}

/* events claimed for the handlers in one pass */
#define INBOX_BATCH		10

typedef struct ClaimedEvents
{
	int			n;
	int64		event_id[INBOX_BATCH];
	int			attempts[INBOX_BATCH];
} ClaimedEvents;

/*
 * Claim due events whose type has a handler, and commit the claim before
 * applying them: an event whose handler kills the process has used up an
 * attempt, and is dead after the last one instead of looping for ever.
 */
static int
claim_fn(void *arg)
{
	ClaimedEvents *claimed = (ClaimedEvents *) arg;
	Interval	lease;
	uint64		i;
	uint64		n;

	memset(&lease, 0, sizeof(lease));
	lease.time = (int64) earmark_inbox_lease_s * USECS_PER_SEC;
	n = em_inbox_claim(INBOX_BATCH, &lease, true);
	claimed->n = 0;
	for (i = 0; i < n && i < INBOX_BATCH; i++)
	{
		bool		isnull;

		claimed->event_id[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc,
														   SPI_fnumber(SPI_tuptable->tupdesc, "event_id"),
														   &isnull));
		claimed->attempts[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc,
														   SPI_fnumber(SPI_tuptable->tupdesc, "attempts"),
														   &isnull));
		claimed->n++;
	}
	return claimed->n;
}

typedef struct ApplyArg
{
	int64		event_id;
	int			attempts;
} ApplyArg;

static int
apply_fn(void *arg)
{
	ApplyArg   *a = (ApplyArg *) arg;
	const char *status = em_inbox_apply(a->event_id, a->attempts);

	if (status != NULL)
		elog(DEBUG1, "earmark: inbox event " INT64_FORMAT " %s", a->event_id, status);
	return status != NULL;
}

/*
 * Keep the cached key set fresh: fetch it again once it is older than
 * earmark.jwks_refresh, so that a key the provider rotated in is usually
 * known before the first webhook signed with it arrives.  A failed fetch
 * keeps the old set (the intake still refetches on an unknown kid).
 */
static int
jwks_fn(void *arg)
{
	return em_jwks_refresh_if_older(GetCurrentTimestamp() -
									(int64) earmark_jwks_refresh_s * USECS_PER_SEC);
}

/* ---------------------------------------------------------------------
 * Reporter (meter.c) and limit refresh (limit_cache.c)
 * ---------------------------------------------------------------------
 */
typedef struct ReportPass
{
	MemoryContext cxt;			/* survives the claim's transaction */
	EmMeterOp  *ops;
	int			n;
	int			sent;
	int			failed;
} ReportPass;

static int
report_claim_fn(void *arg)
{
	ReportPass *p = (ReportPass *) arg;

	p->n = em_report_claim(earmark_report_batch, GetCurrentTimestamp(), &p->ops, p->cxt);
	return p->n;
}

static int
report_finish_fn(void *arg)
{
	ReportPass *p = (ReportPass *) arg;

	/* the local provider's meter is a table: written in this transaction */
	if (earmark_provider == EM_PROVIDER_LOCAL)
		em_report_send(p->ops, p->n, NULL, NULL);
	p->sent = em_report_finish(p->ops, p->n, GetCurrentTimestamp(), &p->failed);
	return p->sent;
}

static void sweep_pass(void);

/*
 * Between the polls of a provider call (arg: the activity to show again):
 * sweeping stays on schedule while the provider is slow, so a provider
 * that hangs delays no settlement.
 */
static void
sweep_tick(void *arg)
{
	if (TimestampDifferenceExceeds(last_sweep, GetCurrentTimestamp(),
								   earmark_sweep_interval_ms))
	{
		sweep_pass();
		pgstat_report_activity(STATE_RUNNING, (const char *) arg);
	}
}

#define SENDING		"earmark: sending totals to the meter"
#define READING		"earmark: reading limits from the provider"

/*
 * One report pass: claim (a transaction), send (none: no transaction and
 * no lock but the send lock is held while the provider answers), finish
 * (a transaction), all under the database's send lock (meter.c), held for
 * the session from before the claim to after the finish's commit.
 * Returns false, having done nothing, while another sender (an
 * earmark_report() or a repair of earmark_reconcile) has that lock: the
 * worker never waits for it, and tries again at its next wake-up.
 */
static bool
report_pass(void)
{
	ReportPass	p;
	MemoryContext old;

	if (!em_send_try_lock_session())
	{
		elog(DEBUG1, "earmark: another sender holds the send lock; the report pass waits for the next round");
		return false;
	}
	memset(&p, 0, sizeof(p));
	p.cxt = AllocSetContextCreate(CurrentMemoryContext, "earmark report pass",
								  ALLOCSET_DEFAULT_SIZES);
	/* a pass with nothing to send is still recorded (worker_status) */
	if (run_pass("earmark: claiming marked cycles", report_claim_fn, &p, NULL) >= 0)
	{
		if (earmark_provider != EM_PROVIDER_LOCAL)
		{
			pgstat_report_activity(STATE_RUNNING, SENDING);
			old = MemoryContextSwitchTo(p.cxt);
			em_report_send(p.ops, p.n, sweep_tick, SENDING);
			MemoryContextSwitchTo(old);
			pgstat_report_activity(STATE_IDLE, NULL);
		}
		if (run_pass("earmark: recording the report", report_finish_fn, &p, NULL) >= 0)
			elog(DEBUG1, "earmark: reported %d cycles, %d failed", p.sent, p.failed);
	}
	MemoryContextDelete(p.cxt);
	em_send_unlock_session();
	return true;
}

typedef struct LimitAccounts
{
	MemoryContext cxt;
	List	   *accounts;		/* EmWantedLimits */
} LimitAccounts;

static int
wanted_limits_fn(void *arg)
{
	LimitAccounts *l = (LimitAccounts *) arg;

	l->accounts = em_wanted_limit_accounts(LIMIT_BATCH, l->cxt);
	return list_length(l->accounts);
}

/* an account's read, to store: its limits, or why they could not be read */
typedef struct LimitsRead
{
	const char *account;
	List	   *limits;
	char	   *error;
} LimitsRead;

static int
store_limits_fn(void *arg)
{
	LimitsRead *r = (LimitsRead *) arg;

	return em_store_limits_read(r->account, r->limits, r->error);
}

/*
 * One account: read its limits (no transaction; sweeping goes on between
 * polls), then store them or the failure (a transaction).  Any failure,
 * a hostile answer included, is recorded on the account, so that it waits
 * its retry time and the next pass reads the others.  Returns false when
 * the provider itself failed (no answer, a timeout, 429, 5xx).
 */
static bool
read_account_limits(EmWantedLimits *w)
{
	LimitsRead	r;
	bool		unreachable = false;
	char	   *store_error = NULL;

	r.account = w->account;
	r.error = NULL;
	pgstat_report_activity(STATE_RUNNING, READING);
	r.limits = em_provider_limits(w->account, w->customer, sweep_tick, READING,
								  &r.error, &unreachable);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (run_pass("earmark: storing limits", store_limits_fn, &r, &store_error) < 0)
	{
		r.error = psprintf("the limits could not be stored: %s",
						   store_error ? store_error : "an error");
		r.limits = NIL;
		(void) run_pass("earmark: storing limits", store_limits_fn, &r, NULL);
	}
	if (r.error)
		ereport(LOG,
				(errmsg("earmark: could not read the limits of account \"%s\"", w->account),
				 errdetail("%s", r.error)));
	return !unreachable;
}

/* read the limits that admissions found stale, one account at a time */
static void
limits_pass(void)
{
	LimitAccounts l;
	ListCell   *lc;
	MemoryContext account_cxt;
	MemoryContext old;

	if (earmark_provider == EM_PROVIDER_LOCAL)
		return;
	l.cxt = CurrentMemoryContext;
	l.accounts = NIL;
	if (run_pass("earmark: finding stale limits", wanted_limits_fn, &l, NULL) <= 0)
		return;
	/* an account's answers (up to 100 pages) are freed before the next */
	account_cxt = AllocSetContextCreate(CurrentMemoryContext, "earmark limits read",
										ALLOCSET_DEFAULT_SIZES);
	foreach(lc, l.accounts)
	{
		bool		provider_answers;

		old = MemoryContextSwitchTo(account_cxt);
		provider_answers = read_account_limits((EmWantedLimits *) lfirst(lc));
		MemoryContextSwitchTo(old);
		MemoryContextReset(account_cxt);

		/*
		 * A provider that is down or busy is not asked again this pass: each
		 * attempt may cost earmark.http_timeout, and the inbox and the
		 * reporter wait.  One account's bad answer does not stop the others.
		 */
		if (!provider_answers)
			break;
		CHECK_FOR_INTERRUPTS();
	}
	MemoryContextDelete(account_cxt);
}

static void
sweep_pass(void)
{
	int			n;

	/* a full batch means there may be more: go on without sleeping */
	do
	{
		last_sweep = GetCurrentTimestamp();
		n = run_pass("earmark: sweeping expired holds", sweep_fn, NULL, NULL);
		if (n > 0)
			elog(DEBUG1, "earmark: swept %d expired holds", n);
		CHECK_FOR_INTERRUPTS();
	} while (n == SWEEP_BATCH);
}

/* apply the events with handlers; returns how many were claimed */
static int
inbox_pass(void)
{
	ClaimedEvents claimed;
	int			i;

	memset(&claimed, 0, sizeof(claimed));
	if (run_pass("earmark: claiming inbox events", claim_fn, &claimed, NULL) <= 0)
		return 0;
	for (i = 0; i < claimed.n; i++)
	{
		ApplyArg	a;

		a.event_id = claimed.event_id[i];
		a.attempts = claimed.attempts[i];
		(void) run_pass("earmark: applying an inbox event", apply_fn, &a, NULL);
		CHECK_FOR_INTERRUPTS();
	}
	return claimed.n;
}

/*
 * Since when no report pass has run while other senders kept them out
 * (the last pass that ran began then, or the worker started): 0 while
 * they run.
 */
static TimestampTz kept_out_since = 0;
static bool kept_out_logged = false;

/*
 * A pass kept out, or one that ran: logged once when the passes have been
 * kept out for ten report intervals (a long earmark_report() or
 * earmark_reconcile, or a session that holds the send lock and does not
 * give it back: marked cycles are not sent, and one that closes meanwhile
 * goes to review), and once when they run again.
 */
static void
note_report_pass(bool ran, TimestampTz now)
{
	if (ran)
	{
		if (kept_out_logged)
			ereport(LOG,
					(errmsg("earmark: the report passes run again after %ld s",
							(long) ((now - kept_out_since) / USECS_PER_SEC))));
		kept_out_since = 0;
		kept_out_logged = false;
		return;
	}
	if (kept_out_since == 0)
		kept_out_since = last_report != 0 ? last_report : now;
	else if (!kept_out_logged &&
			 TimestampDifferenceExceeds(kept_out_since, now,
										earmark_report_interval_s * 10 * 1000))
	{
		ereport(LOG,
				(errmsg("earmark: no report pass has run for %ld s: another sender holds the send lock",
						(long) ((now - kept_out_since) / USECS_PER_SEC)),
				 errdetail("Marked cycles are not sent meanwhile, and a cycle that closes goes to earmark.meter_review."),
				 errhint("See who holds it: SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 1701671780 AND objsubid = 3 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()).")));
		kept_out_logged = true;
	}
}

/* one wake-up: every duty whose time has come */
static void
run_round(void)
{
	sweep_pass();

	while (inbox_pass() == INBOX_BATCH)
		CHECK_FOR_INTERRUPTS();

	limits_pass();

	if (TimestampDifferenceExceeds(last_report, GetCurrentTimestamp(),
								   earmark_report_interval_s * 1000))
	{
		TimestampTz started = GetCurrentTimestamp();

		/* a pass another sender kept out is tried at the next wake-up */
		bool		ran = report_pass();

		if (ran)
			last_report = started;
		note_report_pass(ran, started);
	}

	if (earmark_jwks_refresh_s > 0 &&
		TimestampDifferenceExceeds(last_jwks_check, GetCurrentTimestamp(),
								   Min(60, earmark_jwks_refresh_s) * 1000))
	{
		last_jwks_check = GetCurrentTimestamp();
		(void) run_pass("earmark: refreshing the JWKS", jwks_fn, NULL, NULL);
	}
}

/*
 * An error outside a pass's own handling (none is expected): log it, drop
 * whatever the round had, and go on after a second instead of exiting (the
 * postmaster would restart the worker every 5 s, and the same error would
 * stop it again).
 */
static void
recover_from_error(void)
{
	error_context_stack = NULL;
	HOLD_INTERRUPTS();
	EmitErrorReport();
	AbortOutOfAnyTransaction();
	/* a report pass's session lock (meter.c), if the error cut one short */
	em_send_unlock_session();
	MemoryContextSwitchTo(TopMemoryContext);
	FlushErrorState();
	pgstat_report_activity(STATE_IDLE, NULL);
	RESUME_INTERRUPTS();
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 1000L, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
}

void
earmark_worker_main(Datum main_arg)
{
	sigjmp_buf	local_sigjmp_buf;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
	em_launcher_worker_started();
	pin_settings();

	round_cxt = AllocSetContextCreate(TopMemoryContext, "earmark worker round",
									  ALLOCSET_DEFAULT_SIZES);

	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext, get_database_name(MyDatabaseId));
	extension_gone = !OidIsValid(get_extension_oid("earmark", true));
	CommitTransactionCommand();
	if (extension_gone)
	{
		/*
		 * The launcher tries each database now and then: without earmark
		 * that is no news for the server log.
		 */
		ereport(DEBUG1,
				(errmsg("earmark worker: earmark is not installed in database \"%s\"", dbname)));
		em_launcher_no_extension();
		proc_exit(0);
	}
	ereport(LOG, (errmsg("earmark worker started in database \"%s\"", dbname)));
	last_jwks_check = GetCurrentTimestamp();

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		recover_from_error();
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
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

		/* whatever the last round allocated goes at once */
		MemoryContextReset(round_cxt);
		MemoryContextSwitchTo(round_cxt);
		run_round();
		MemoryContextSwitchTo(TopMemoryContext);
		if (!extension_gone)
			em_launcher_worker_ran();
		if (extension_gone)
		{
			/* the launcher starts one again when CREATE EXTENSION runs */
			ereport(LOG,
					(errmsg("earmark worker stops: earmark is not installed in database \"%s\"",
							dbname)));
			em_launcher_no_extension();
			proc_exit(0);
		}
	}
}
