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
#define ERRCODE_EARMARK_PROVIDER				MAKE_SQLSTATE('E','M','2','0','1')
#define ERRCODE_EARMARK_READ_BACK_DIFFERS		MAKE_SQLSTATE('E','M','2','0','2')

#include "version.h"

/* the longest account, feature or idempotency key accepted, in characters */
#define EARMARK_MAX_NAME_LEN	255

/* first key of the advisory locks earmark takes ("earm") */
#define EARMARK_ADVISORY_CLASS	0x6561726d
/* first key of the meter mark locks ("emmk"), see ledger.c */
#define EARMARK_MARK_CLASS		0x656d6d6b

/*
 * The most units one earmark_record_usage call records (10^15): far past
 * any real usage, and small enough that a cycle's counters stay far from
 * bigint's end.
 */
#define EARMARK_MAX_UNITS		INT64CONST(1000000000000000)

/* counter rows per cycle for recorded usage */
#define EARMARK_USAGE_SHARDS	64

/* GUCs (earmark.c) */
extern char *earmark_database;
extern int	earmark_lease_s;
extern int	earmark_sweep_interval_ms;
extern int	earmark_rate_limit;
extern int	earmark_inbox_lease_s;
extern int	earmark_jwks_refresh_s;

/*
 * A SQL statement run through SPI whose plan is prepared once per backend
 * and kept (SPI_keepplan).  The plan cache revalidates it after DDL, so a
 * dropped and re-created extension is picked up.
 */
typedef struct EmStatement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[16];
	SPIPlanPtr	plan;
} EmStatement;

extern int	em_exec(EmStatement *stmt, Datum *values, const char *nulls,
					long count);
extern int	em_exec_latest(EmStatement *stmt, Datum *values, const char *nulls,
						   long count);

/* result access for the last em_exec */
extern Datum em_get(int row, int col, bool *isnull);
extern int64 em_get_int64(int row, int col, int64 if_null);

extern void em_require_read_committed(const char *what);

/* argument checks: they raise the documented SQLSTATE or return the value */
extern text *em_arg_name(FunctionCallInfo fcinfo, int argno, const char *what);
extern int64 em_arg_int64(FunctionCallInfo fcinfo, int argno, const char *what);

/* hand back one row of a RETURNS TABLE function */
extern void em_return_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls);

/* cycles (account.c) */
extern void em_cycle_bounds(TimestampTz anchor, bool has_anchor, TimestampTz at,
							TimestampTz *start, TimestampTz *end);

/* gate (gate.c) */
extern int	em_sweep(int max_jobs, bool wait_first);
#define EARMARK_RECLAIM_BATCH	1000
extern int64 em_expire_budget_jobs(int64 budget_id, TimestampTz now, int max,
								   bool wait, int64 *released, int64 *charged);

/*
 * A cycle's total as SQL, for a budget row aliased b: the settled jobs
 * (the budget row and its escrow slots) and the recorded usage (its
 * shards).  Equal to the sum of the cycle's ledger rows; the reconciler
 * proves it.
 */
#define EM_CYCLE_TOTAL_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.budget_id = b.budget_id), 0)::bigint " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.budget_id = b.budget_id), 0)::bigint)"

/*
 * The same as numeric, which cannot overflow: for readers of many cycles
 * (the reporter), where one cycle past bigint must not fail the rest.
 */
#define EM_CYCLE_TOTAL_NUMERIC_SQL \
	"(b.used + coalesce((SELECT pg_catalog.sum(s.used) FROM earmark.budget_slot s " \
	"                     WHERE s.budget_id = b.budget_id), 0) " \
	"        + coalesce((SELECT pg_catalog.sum(u.units) FROM earmark.usage_shard u " \
	"                     WHERE u.budget_id = b.budget_id), 0))"

/* ledger (ledger.c) */
extern void em_mark_lock(int64 budget_id);
extern bool em_mark_try_lock(int64 budget_id);
extern bool em_mark_try_lock_exclusive(int64 budget_id);
extern int64 em_cycle_total(int64 budget_id, bool *found);

/* escrow (escrow.c) */
#define EARMARK_MAX_SLOTS	256

typedef enum EscrowResult
{
	ESCROW_NO_SLOT,
	ESCROW_ADMITTED,
	ESCROW_KEY_TAKEN,
	ESCROW_REFUSED,
	ESCROW_RATE_LIMITED
} EscrowResult;

/* a locked escrow budget, as reserve's slow path sees it */
typedef struct EscrowBudget
{
	int64		budget_id;
	int64		used;			/* outside the slots */
	int64		held;
	int64		lim;
	bool		unlimited;
	int			slots;
	int64		slot_lim;
	bool		slot_lim_null;
	int64		slot_gen;
} EscrowBudget;

typedef struct EscrowOutcome
{
	EscrowResult result;
	int64		remaining;		/* of the whole budget, after this job */
} EscrowOutcome;

typedef EscrowResult (*EscrowAdmitFn) (void *arg, EscrowBudget *b, int64 amount);

/* a budget's numbers as escrow's fast path saw them (em_escrow_fast) */
typedef struct EscrowNumbers
{
	int64		used;
	int64		held;
	int64		lim;
	bool		unlimited;
} EscrowNumbers;

extern EscrowResult em_escrow_fast(text *account, text *feature,
								   TimestampTz cycle_start, text *key,
								   int64 amount, Interval *lease,
								   TimestampTz lease_until, TimestampTz now,
								   int slots, int64 *job_id,
								   EscrowNumbers *numbers);
extern int	em_random_slot(int slots);
extern void em_escrow_rebalance(EscrowBudget *b, int64 amount, TimestampTz now,
								EscrowAdmitFn admit_outside, void *admit_arg,
								EscrowOutcome *out);
extern int	earmark_escrow_slots;

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
extern void em_register_worker(void);
PGDLLEXPORT void earmark_worker_main(Datum main_arg);

#endif							/* EARMARK_H */
