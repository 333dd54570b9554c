/*-------------------------------------------------------------------------
 *
 * earmark.h
 *	  Declarations shared by earmark's C files: GUCs, SQLSTATEs, the SPI
 *	  statement cache, argument checks and the cycle arithmetic.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_H
#define EARMARK_H

#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/*
 * earmark's own SQLSTATEs (class "EM").  Standard codes are used where one
 * fits: 22004 for a NULL argument, 22023 for an invalid value, 22001 for a
 * name or key that is too long, 22003 for an amount that would overflow.
 */
#define ERRCODE_EARMARK_IDEMPOTENCY_CONFLICT	MAKE_SQLSTATE('E','M','0','0','1')
#define ERRCODE_EARMARK_ANCHOR_LOCKED			MAKE_SQLSTATE('E','M','0','0','2')
#define ERRCODE_EARMARK_UNKNOWN_JOB				MAKE_SQLSTATE('E','M','0','0','3')
#define ERRCODE_EARMARK_UNKNOWN_EVENT			MAKE_SQLSTATE('E','M','0','0','4')
#define ERRCODE_EARMARK_EVENT_STATE				MAKE_SQLSTATE('E','M','0','0','5')
#define ERRCODE_EARMARK_NOT_YOUR_EVENT			MAKE_SQLSTATE('E','M','0','0','6')
#define ERRCODE_EARMARK_UNKNOWN_ACCOUNT			MAKE_SQLSTATE('E','M','0','0','7')
#define ERRCODE_EARMARK_SCHEMA_VERSION			MAKE_SQLSTATE('E','M','0','0','8')
#define ERRCODE_EARMARK_PROVIDER				MAKE_SQLSTATE('E','M','2','0','1')
#define ERRCODE_EARMARK_READ_BACK_DIFFERS		MAKE_SQLSTATE('E','M','2','0','2')

#include "version.h"

/* first key of the advisory locks earmark takes ("earm") */
#define EARMARK_ADVISORY_CLASS	0x6561726d
/* first key of the meter mark locks ("emmk"), see ledger.c */
#define EARMARK_MARK_CLASS		0x656d6d6b

#include "spi.h"

/*
 * A cycle's total as SQL, for a budget row aliased b: the settled jobs
 * (the budget row and its escrow slots) and the recorded usage (its
 * shards).  Equal to the sum of the cycle's ledger rows; the reconciler
 * proves it.  For readers of many cycles; one cycle's total is
 * em_cycle_total (ledger.c).
 */
#define EM_CYCLE_TOTAL_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.account = b.account AND s.budget_id = b.budget_id), 0)::bigint " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.account = b.account AND u.budget_id = b.budget_id), 0)::bigint)"

/*
 * The same as numeric, which cannot overflow: for readers of many cycles
 * (the reporter), where one cycle past bigint must not fail the rest.
 */
#define EM_CYCLE_TOTAL_NUMERIC_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.account = b.account AND s.budget_id = b.budget_id), 0) " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.account = b.account AND u.budget_id = b.budget_id), 0))"

#include "account.h"
#include "budget.h"
#include "cluster.h"
#include "escrow.h"
#include "gate.h"
#include "ledger.h"

/* inbox (inbox.c) */
extern TimestampTz em_parse_event_time(const char *s);
extern void em_inbox_store(text *source, text *dedupe_key, text *event_type,
						   Jsonb *payload, bool has_occurred_at,
						   TimestampTz occurred_at, text *account,
						   int64 *event_id, bool *inserted);
extern void em_return_event_id(FunctionCallInfo fcinfo, int64 event_id, bool inserted);
extern uint64 em_inbox_claim(int max_events, Interval *lease, bool with_handler);
extern const char *em_inbox_fail(int64 event_id, const char *error);
extern const char *em_inbox_apply(int64 event_id, int attempts);

/* webhook intake (intake.c): refresh the cached JWKS, in SPI */
extern int	em_jwks_refresh(void);
extern int	em_jwks_refresh_if_older(TimestampTz cutoff);

/* worker (worker.c) */
PGDLLEXPORT void earmark_worker_main(Datum main_arg);

#endif							/* EARMARK_H */
