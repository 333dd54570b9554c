/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  Every earmark.* setting (GUC) in one place: its variable, name,
 *	  default, range, context, flags and descriptions.  _PG_init calls
 *	  em_define_settings once; the files that read a setting include
 *	  settings.h.
 *
 *	  The settings are plain per-backend variables.  Three are fixed at
 *	  server start when earmark is preloaded (earmark.database,
 *	  earmark.max_databases, earmark.rate_accounts): the worker connects
 *	  once, and shared memory is sized once.  A postmaster-only setting may
 *	  only be defined while preloading, so when the library is loaded later
 *	  (no worker and no shared memory then) they are reloadable instead,
 *	  and loading is not an error.
 *
 *	  Takes no locks; calls nothing of earmark's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "settings.h"

/* the launcher and the worker */
char	   *earmark_database = NULL;
int			earmark_max_databases = 16;
int			earmark_launcher_naptime_ms = 10000;
int			earmark_sweep_interval_ms = 1000;
int			earmark_inbox_lease_s = 30;
int			earmark_jwks_refresh_s = 3600;

/* admissions */
int			earmark_lease_s = 120;
int			earmark_rate_limit = 120;
int			earmark_rate_accounts = 65536;
int			earmark_debug_rate_clock_shift_s = 0;
int			earmark_escrow_slots = 0;
int			earmark_auto_escrow_slots = 64;
int			earmark_auto_escrow_contenders = 3;
bool		earmark_lease_floors = true;

/* webhooks */
int			earmark_webhook_tolerance_s = 300;
char	   *earmark_kinde_domain = NULL;
char	   *earmark_jwks_path = NULL;
int			earmark_jwks_refetch_cooldown_s = 30;

/* the billing provider */
int			earmark_http_timeout_ms = 5000;
int			earmark_provider = EM_PROVIDER_LOCAL;
char	   *earmark_provider_url = NULL;
char	   *earmark_provider_client_id = NULL;
char	   *earmark_provider_secrets_file = NULL;
int			earmark_report_interval_s = 60;
int			earmark_report_batch = 100;
int			earmark_report_parallel = 10;
int			earmark_limit_fresh_s = 60;
int			earmark_limit_stale_s = 600;

static const struct config_enum_entry provider_options[] = {
	{"local", EM_PROVIDER_LOCAL, false},
	{"kinde", EM_PROVIDER_KINDE, false},
	{"http", EM_PROVIDER_HTTP, false},
	{NULL, 0, false}
};

/*
 * The launcher and the worker: which databases, how often, how long an
 * inbox event is held, when the key set is fetched again.
 */
static void
em_define_worker_settings(void)
{
	/*
	 * The worker reads earmark.database once, at start.  A postmaster-only
	 * variable may only be defined while preloading; loaded later (no
	 * worker runs then) it is defined as reloadable so that loading the
	 * library is not an error.
	 */
	DefineCustomStringVariable("earmark.database",
							   "The one database an earmark worker runs in; empty: every database with the extension.",
							   "The launcher starts a worker in each database where earmark is installed, or only in this one.",
							   &earmark_database,
							   "",
							   process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.max_databases",
							"Databases the launcher can run an earmark worker in at once.",
							"Each worker is a background worker: max_worker_processes must have room for them.",
							&earmark_max_databases,
							16, 1, 1024,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.launcher_naptime",
							"How often the launcher looks for databases that need an earmark worker.",
							"CREATE EXTENSION earmark wakes it at once.",
							&earmark_launcher_naptime_ms,
							10000, 100, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.sweep_interval",
							"How often the background worker settles holds whose lease has passed.",
							NULL,
							&earmark_sweep_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.inbox_lease",
							"How long the worker holds an inbox event it applies before another claim may take it.",
							"An event whose worker died is claimed again once its lease passes.",
							&earmark_inbox_lease_s,
							30, 1, 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.jwks_refresh",
							"Age at which the worker fetches the provider's JSON Web Key Set again.",
							"The first fetch happens when a webhook needs a key; 0 turns the worker's refresh off.",
							&earmark_jwks_refresh_s,
							3600, 0, 7 * 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

/*
 * Admissions: a hold's lease, the rate limit, escrow slots.
 */
static void
em_define_admission_settings(void)
{
	DefineCustomIntVariable("earmark.lease",
							"Default lease of a hold; a charge or heartbeat renews it.",
							"A hold whose lease passes is dead: it charges nothing more and is settled as expired.",
							&earmark_lease_s,
							120, 1, 7 * 24 * 3600,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.rate_limit",
							"Most admissions a minute for one account, over all its features (0 turns the rate limit off).",
							NULL,
							&earmark_rate_limit,
							120, 0, 1000000000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.rate_accounts",
							"Accounts the admission rate limit tracks in shared memory at once.",
							"Only accounts ahead of their rate take an entry; when none is free, the one least ahead forgets.",
							&earmark_rate_accounts,
							65536, 8, 64 * 1024 * 1024,
							process_shared_preload_libraries_in_progress ? PGC_POSTMASTER : PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.debug_rate_clock_shift",
							"Shifts the clock the admission rate limit reads, for tests.",
							"A test makes an hour pass for the rate limit without waiting for it.",
							&earmark_debug_rate_clock_shift_s,
							0, -365 * 24 * 3600, 365 * 24 * 3600,
							PGC_SUSET,
							GUC_UNIT_S | GUC_NOT_IN_SAMPLE,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("earmark.lease_floors",
							 "Lets a reserve that finds no room trust the budget's lease floor instead of reading every open hold.",
							 "A floor does not see a lease_until written by hand; off, this session reads every open hold before a refusal.",
							 &earmark_lease_floors,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.escrow_slots",
							"Escrow slots of the budgets of accounts without their own setting (0: no escrow).",
							"Slots let admissions on one hot account run in parallel; see earmark_set_escrow.",
							&earmark_escrow_slots,
							0, 0, EARMARK_MAX_SLOTS,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.auto_escrow_slots",
							"Escrow slots a contended budget gets by itself, when its account has no number of its own (0: never).",
							"A budget is contended when earmark.auto_escrow_contenders reserves queue on its row; earmark_set_escrow wins.",
							&earmark_auto_escrow_slots,
							64, 0, EARMARK_MAX_SLOTS,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.auto_escrow_contenders",
							"Reserves on a budget row's lock at once (the holder included) that make the budget contended.",
							"Needs earmark in shared_preload_libraries; see earmark.auto_escrow_slots.",
							&earmark_auto_escrow_contenders,
							3, 1, 10000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
}

/*
 * Webhooks: the signatures' tolerance and the Kinde key set.
 */
static void
em_define_webhook_settings(void)
{
	DefineCustomIntVariable("earmark.webhook_tolerance",
							"How far a Standard Webhooks webhook-timestamp may be from now, in either direction.",
							"A delivery signed longer ago (a replay) or further ahead is refused.",
							&earmark_webhook_tolerance_s,
							300, 1, 24 * 3600,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("earmark.kinde_domain",
							   "Kinde business domain whose JSON Web Key Set verifies Kinde webhooks, e.g. https://acme.kinde.com.",
							   "Whoever sets it decides which tokens are genuine, so only superusers may.",
							   &earmark_kinde_domain,
							   "",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("earmark.jwks_path",
							   "Path of the JSON Web Key Set under earmark.kinde_domain.",
							   "Some tenants serve it at /.well-known/jwks.json.",
							   &earmark_jwks_path,
							   "/.well-known/jwks",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.jwks_refetch_cooldown",
							"Shortest time between two fetches of the key set caused by an unknown key id (0: no limit).",
							"Keeps tokens with made-up key ids from making every delivery call the provider.",
							&earmark_jwks_refetch_cooldown_s,
							30, 0, 3600,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

/*
 * The billing provider: where it is, how it is called, how often, and
 * how old a limit read from it may be.
 */
static void
em_define_provider_settings(void)
{
	DefineCustomIntVariable("earmark.http_timeout",
							"Longest one request to the provider may take: meter writes and reads, limits, tokens, the key set.",
							NULL,
							&earmark_http_timeout_ms,
							5000, 100, 60000,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("earmark.provider",
							 "The billing provider: where meter totals go and limits come from.",
							 "local keeps an in-database stand-in meter and manual limits; kinde and http call the provider.",
							 &earmark_provider,
							 EM_PROVIDER_LOCAL,
							 provider_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("earmark.provider_url",
							   "Base URL of the http provider, e.g. https://billing.example.com/earmark.",
							   NULL,
							   &earmark_provider_url,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("earmark.provider_client_id",
							   "OAuth2 client id of the kinde provider (client credentials).",
							   NULL,
							   &earmark_provider_client_id,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	/*
	 * Secrets are not settings: PostgreSQL logs every changed setting's new
	 * value on a reload.  They live in a file only the server's user can
	 * read; this setting only names it.
	 */
	DefineCustomStringVariable("earmark.provider_secrets_file",
							   "File with the provider's secrets: client_secret, token, hmac_secret (name = value lines).",
							   "It must belong to the server's user and be readable by no one else; it is read at each use.",
							   &earmark_provider_secrets_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.report_interval",
							"How often the worker sends marked cycles' totals to the provider's meter.",
							NULL,
							&earmark_report_interval_s,
							60, 1, 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.report_batch",
							"Most marked cycles one report pass sends.",
							NULL,
							&earmark_report_batch,
							100, 1, 10000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.report_parallel",
							"Most requests to the provider in flight at once.",
							NULL,
							&earmark_report_parallel,
							10, 1, 100,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.limit_fresh",
							"Age up to which a limit read from the provider is used as it is.",
							"An older limit is still used, and the worker is asked to read it again.",
							&earmark_limit_fresh_s,
							60, 1, 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("earmark.limit_stale",
							"Age after which a limit read from the provider is no longer used (fail closed).",
							"Admissions are then refused with \"limit unknown\" until a read succeeds.",
							&earmark_limit_stale_s,
							600, 1, 7 * 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
}

void
em_define_settings(void)
{
	em_define_worker_settings();
	em_define_admission_settings();
	em_define_webhook_settings();
	em_define_provider_settings();

	MarkGUCPrefixReserved("earmark");
}
