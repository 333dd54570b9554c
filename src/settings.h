/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  Every earmark.* setting (GUC): the variables that hold them, defined
 *	  and registered in settings.c.  A file that reads a setting includes
 *	  this header; none defines a setting of its own.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_SETTINGS_H
#define EARMARK_SETTINGS_H

#include "postgres.h"

/* register every earmark.* setting; called once, from _PG_init */
extern void em_define_settings(void);

/* ---------------------------------------------------------------------
 * The launcher and the worker (launcher.c, worker.c)
 * ---------------------------------------------------------------------
 */
extern char *earmark_database;	/* fixed at server start when preloaded */
extern int	earmark_max_databases;	/* fixed at server start when preloaded */
extern int	earmark_launcher_naptime_ms;
extern int	earmark_sweep_interval_ms;
extern int	earmark_inbox_lease_s;
extern int	earmark_jwks_refresh_s;

/* ---------------------------------------------------------------------
 * Admissions (gate.c, ratelimit.c, budget.c, escrow.c)
 * ---------------------------------------------------------------------
 */

/* the most escrow slots a budget may have (earmark.escrow_slots, earmark_set_escrow) */
#define EARMARK_MAX_SLOTS	256

extern int	earmark_lease_s;
extern int	earmark_rate_limit;
extern int	earmark_rate_accounts;	/* fixed at server start when preloaded */
extern int	earmark_debug_rate_clock_shift_s;
extern int	earmark_escrow_slots;	/* the default slots of a new budget */
extern int	earmark_auto_escrow_slots;	/* slots of a contended budget */
extern int	earmark_auto_escrow_contenders; /* reserves queued: contended */
extern bool earmark_lease_floors;	/* a refusal may trust a lease floor */

/* ---------------------------------------------------------------------
 * Webhooks (intake.c, inbox.c)
 * ---------------------------------------------------------------------
 */
extern int	earmark_webhook_tolerance_s;
extern char *earmark_kinde_domain;
extern char *earmark_jwks_path;
extern int	earmark_jwks_refetch_cooldown_s;

/* ---------------------------------------------------------------------
 * The billing provider (provider.c, limit_cache.c, meter.c, worker.c)
 * ---------------------------------------------------------------------
 */

/* earmark.provider's values */
typedef enum EmProviderKind
{
	EM_PROVIDER_LOCAL,
	EM_PROVIDER_KINDE,
	EM_PROVIDER_HTTP
} EmProviderKind;

extern int	earmark_http_timeout_ms;
extern int	earmark_provider;	/* EmProviderKind */
extern char *earmark_provider_url;
extern char *earmark_provider_client_id;
extern char *earmark_provider_secrets_file;
extern int	earmark_report_interval_s;
extern int	earmark_report_batch;
extern int	earmark_report_parallel;
extern int	earmark_limit_fresh_s;
extern int	earmark_limit_stale_s;

#endif							/* EARMARK_SETTINGS_H */
