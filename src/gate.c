/*-------------------------------------------------------------------------
 *
 * gate.c
 *	  The gate: earmark_reserve, earmark_charge, earmark_heartbeat,
 *	  earmark_settle and earmark_sweep.
 *
 *	  Tables: earmark.job (the holds), earmark.budget (through budget.c,
 *	  and a settlement's held and used), earmark.budget_slot (a settlement
 *	  of a hold taken from a slot) and earmark.meter_mark (the cycle's
 *	  mark, by a settlement that charged something and saw the cycle
 *	  unmarked, budget.c; the settled job row itself is its ledger entry,
 *	  see the view earmark.ledger).
 *
 *	  Locks, and why they cannot deadlock among themselves:
 *	  - reserve locks the budget row FOR UPDATE (check and hold in one
 *	    transaction), then may expire that budget's dead holds, taking their
 *	    job rows FOR UPDATE SKIP LOCKED: it never waits for a job row.  Nor
 *	    in its insert of the job: the unique check of the key waits for any
 *	    transaction that wrote a job row with the key, a settle of a
 *	    committed job included, so a job with the key that committed after
 *	    the reserve's first read is looked for again once the budget row is
 *	    locked, and answers the reserve (lock_cycle).  The
 *	    rate limit then updates the account row: budget before account, as
 *	    in earmark_set_account.  Creating a cycle's budget row first takes
 *	    the account's advisory lock shared (see account.c).  Escrow's fast
 *	    path locks one slot, never waiting (escrow.c).  Automatic escrow
 *	    gives slots to the budget row reserve holds (contention.c counts
 *	    the reserves queued on it, under a spinlock, no lock).  A reserve
 *	    on a budget this backend saw refused first reads its room without
 *	    a lock, and refuses there when the whole budget lacks room and its
 *	    lease floor says no hold is dead (refused_unlocked): no lock at all.
 *	  - sweep locks a budget row (earmark_sweep waits only for the first
 *	    budget of a call, the worker for none: SKIP LOCKED, from C so that
 *	    it never waits), then its dead job rows with SKIP LOCKED.
 *	  - charge and heartbeat lock one job row and nothing else.
 *	  - settle locks the job row, then updates (and so locks) its budget.
 *	    A job taken from a slot is not written before its release's target
 *	    is locked: the job row FOR UPDATE, then a free slot (SKIP LOCKED:
 *	    nobody waits for a slot) or else the budget row, then the job's
 *	    write.  A reserve of the job's key that holds the budget row waits
 *	    in its insert for a transaction that wrote the job row, not for one
 *	    that only locked it (settle_target).  Into a free slot, a settlement
 *	    that charges marks the cycle before the job's write too (the mark's
 *	    insert may wait for that reserve's own mark).  (The hot tables have
 *	    no foreign keys: a key-share lock taken by an FK check before the
 *	    budget update would have to be upgraded, a deadlock with any
 *	    reserve waiting for the row.)
 *	  Only settle waits for a budget while holding a job, and nobody waits
 *	  for a job while holding a budget, so no cycle can form.  A settle that
 *	  waits on a job held by a long application transaction therefore holds
 *	  no budget lock meanwhile, and admissions go on.
 *
 *	  Every statement names the account (account = $1 on every relation),
 *	  so that on Citus it runs on the account's shard alone; the one
 *	  statement of several writes (a settlement's budget and
 *	  mark, em_entry_settle_local) runs only on a single node, and not
 *	  under SERIALIZABLE (write_settlement).  A lease end
 *	  computed from a column is done in UTC timestamps, which Citus accepts
 *	  in an UPDATE (timestamptz + interval is only STABLE).
 *
 *	  On a single node the charge that fits (charge_fits), the charge past
 *	  the hold (write_charge), the heartbeat (heartbeat_job) and the
 *	  settlement (settle_job) update the job row from C (direct.c,
 *	  em_direct_update), as those statements would, with their locks: the
 *	  statement's WHERE clause and SET clause are charge_fit, heartbeat_fit
 *	  and settle_fit below; on Citus, or where the table has something the
 *	  executor would run, the statements run.  The calls' other reads and
 *	  locks of a row go by key from C too: a planned statement on a small
 *	  table runs as a sequential scan, which under SERIALIZABLE is a
 *	  predicate lock on every account's rows, so that two accounts that
 *	  share no row would fail each other with 40001
 *	  (sql/serializable_reads.sql, isolation spec serializable_small).
 *
 *	  Time is the wall clock (GetCurrentTimestamp), not the transaction
 *	  start: a lease that passes inside a long transaction has passed.
 *
 *	  earmark_reserve, earmark_charge, earmark_heartbeat and earmark_settle
 *	  have no SET search_path clause: each runs its body through
 *	  em_call_pinned (spi.c), which pins the search path for the call.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "account.h"
#include "budget.h"
#include "cluster.h"
#include "contention.h"
#include "direct.h"
#include "earmark.h"
#include "entries.h"
#include "escrow.h"
#include "gate.h"
#include "limit_cache.h"
#include "ratelimit.h"
#include "settings.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_reserve);
PG_FUNCTION_INFO_V1(earmark_charge);
PG_FUNCTION_INFO_V1(earmark_heartbeat);
PG_FUNCTION_INFO_V1(earmark_settle);
PG_FUNCTION_INFO_V1(earmark_sweep);
PG_FUNCTION_INFO_V1(earmark_sweep_account);

/*
 * A renewed lease end: the clock ($n, read when the call came) plus the
 * job's own lease, computed in UTC, and never earlier than the stored end
 * (the call may have waited for the row while another renewal set a
 * later one: isolation spec renewal_order).
 */
#define LEASE_FROM(param) \
	"GREATEST(lease_until, " EM_SQL_PLUS_UTC(param, "lease") ")"

/*
 * The status tests of the statements that name a job by (account, job_id).
 * Written so that the planner cannot match them with job_open's predicate
 * (status IN ('running', 'capped')): otherwise it may plan the look-up on
 * job_open (it does on a table not analyzed yet), which reads every open
 * hold of the account to find one, instead of the primary key's one entry.
 * (status || '' is status; the planner does not see through it.)
 */
#define JOB_OPEN "(status || '') IN ('running', 'capped')"
#define JOB_RUNNING "(status || '') = 'running'"

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
static bool
is_open(const char *status)
{
	return strcmp(status, "running") == 0 || strcmp(status, "capped") == 0;
}

/*
 * A job status as a string constant, so that it outlives SPI's memory and
 * can be returned after SPI_finish.
 */
static const char *
status_const(const char *s)
{
	static const char *const statuses[] = {
		"running", "capped", "completed", "failed", "cancelled", "expired"
	};
	int			i;

	for (i = 0; i < (int) lengthof(statuses); i++)
	{
		if (strcmp(s, statuses[i]) == 0)
			return statuses[i];
	}
	elog(ERROR, "earmark: unknown job status \"%s\"", s);
	return NULL;				/* keep compiler quiet */
}

/*
 * A text column's value is s: compared by bytes, as the statements' = on
 * a deterministic collation (direct.c's writable() checks the column's).
 */
static bool
text_is(Datum t, const char *s)
{
	text	   *v = DatumGetTextPP(t);
	size_t		len = strlen(s);

	return VARSIZE_ANY_EXHDR(v) == len && memcmp(VARDATA_ANY(v), s, len) == 0;
}

static void
check_positive(int64 v, const char *what)
{
	if (v <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be greater than zero", what),
				 errdetail("The value given was " INT64_FORMAT ".", v)));
}

static void
unknown_job(text *account, int64 job_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_EARMARK_UNKNOWN_JOB),
			 errmsg("earmark job " INT64_FORMAT " of account \"%s\" does not exist",
					job_id, text_to_cstring(account)),
			 errhint("Use the account and the job_id that earmark_reserve returned.")));
}

/*
 * A write of an open job's row (what: its settlement, charge or
 * heartbeat) that wrote nothing though nothing else could have kept it:
 * an operator's trigger or rule on earmark.job kept the row as it was.
 * Answering as if it had been written would be wrong, and a settle would
 * try for ever.
 */
static void
job_write_kept(text *account, int64 job_id, const char *what, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("the %s of job " INT64_FORMAT " of account \"%s\" was not written",
					what, job_id, text_to_cstring(account)),
			 errdetail("%s", detail),
			 errhint("A BEFORE UPDATE trigger or a rule on earmark.job must let earmark's update through.")));
}

/* ---------------------------------------------------------------------
 * earmark_reserve(account, amount, idempotency_key, feature, lease)
 *	  RETURNS TABLE (job_id, admitted, remaining, reason)
 * ---------------------------------------------------------------------
 */

/* the answer */
typedef struct Admission
{
	bool		admitted;
	int64		job_id;
	bool		unlimited;
	int64		remaining;
	const char *reason;			/* NULL, a constant, or reason_buf */
	char		reason_buf[128];
	bool		want_limits;	/* the limit is stale: ask the worker */
} Admission;

/* the same key's job, if there is one */
typedef struct KeyJob
{
	bool		found;
	int64		job_id;
	int64		amount;
	char	   *feature;
	int64		budget_id;
} KeyJob;

/* a reserve in progress */
typedef struct Reserve
{
	EmHold		h;
	bool		has_anchor;
	TimestampTz anchor;
	int			escrow_slots;
	bool		auto_escrow;	/* no own number: contention may give slots */
	EmBudget	b;
	Admission  *result;
	bool		rate_counted;	/* the rate limit counted this call */
	int64		no_budget_remaining;	/* the limit, before the cycle's first use */
	KeyJob		locked_key;		/* the key's job once the budget row is locked */
	uint64		start_completions;	/* transactions ended before the first read */
} Reserve;

/*
 * The account, its limit's source and age, and the same key's job if
 * there is one: one statement before any lock.  No row: the account does
 * not exist (so its limit is unknown).
 */
static EmStatement reserve_start = {
	"SELECT a.cycle_anchor, a.escrow_slots, a.limits_fetched_at, "
	"       a.limits_wanted_at IS NOT NULL, l.account IS NOT NULL, l.source, "
	"       j.job_id, j.amount, j.feature, j.budget_id, l.lim "
	"FROM earmark.account a "
	"LEFT JOIN earmark.account_limit l ON l.account = a.account AND l.feature = $3 "
	"LEFT JOIN earmark.job j ON j.account = a.account AND j.idempotency_key = $2 "
	"WHERE a.account = $1",
	3, {TEXTOID, TEXTOID, TEXTOID}
};
enum
{
	RS_ANCHOR = 1, RS_ESCROW_SLOTS, RS_FETCHED_AT, RS_WANTED, RS_HAS_LIMIT,
	RS_SOURCE, RS_JOB_ID, RS_AMOUNT, RS_FEATURE, RS_BUDGET_ID, RS_LIM
};

static EmStatement job_by_key = {
	"SELECT job_id, amount, feature, budget_id FROM earmark.job "
	"WHERE account = $1 AND idempotency_key = $2",
	2, {TEXTOID, TEXTOID}
};
enum
{
	JK_JOB_ID = 1, JK_AMOUNT, JK_FEATURE, JK_BUDGET_ID
};

/*
 * a budget's totals, its escrow slots and recorded usage included (the
 * slots' two sums from one walk of their rows, as escrow.c's fast_numbers)
 */
static EmStatement budget_numbers = {
	"SELECT b.used, b.held, l.lim, l.account IS NOT NULL, "
	"       (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint FROM earmark.usage_shard u "
	"         WHERE u.account = $1 AND u.budget_id = $2), "
	"       s.used, s.held "
	"FROM earmark.budget b "
	"LEFT JOIN earmark.account_limit l ON l.account = b.account AND l.feature = b.feature "
	"CROSS JOIN (SELECT coalesce(pg_catalog.sum(t.used), 0)::bigint AS used, "
	"                   coalesce(pg_catalog.sum(t.held), 0)::bigint AS held "
	"              FROM earmark.budget_slot t WHERE t.account = $1 AND t.budget_id = $2) s "
	"WHERE b.account = $1 AND b.budget_id = $2",
	2, {TEXTOID, INT8OID}
};
enum
{
	BN_USED = 1, BN_HELD, BN_LIM, BN_KNOWN, BN_RECORDED, BN_SLOTS_USED, BN_SLOTS_HELD
};

/* what start_reserve reads: the account, its limit and the key's job */
typedef struct StartRow
{
	bool		has_anchor;
	TimestampTz anchor;
	bool		has_escrow;
	int32		escrow_slots;
	bool		has_fetched;
	TimestampTz fetched_at;
	bool		wanted;
	bool		has_limit;
	bool		provider_row;
	bool		unlimited;
	int64		lim;
	KeyJob		job;
} StartRow;

/*
 * The same reads by index from C (direct.c), on a single node: the
 * account's row, its limit's row and the key's job, in one snapshot taken
 * as the SPI statement takes it (reserve_start, kept for Citus, whose
 * tables here are shells).  An SPI statement's executor start-up costs
 * more than these three look-ups (docs/benchmarks.md).
 */
static EmDirect account_row = {
	.table = "account", .nkeys = 1, .keys = {"account"},
	.ncols = 4, .cols = {"cycle_anchor", "escrow_slots", "limits_fetched_at", "limits_wanted_at"}
};
static EmDirect limit_row = {
	.table = "account_limit", .nkeys = 2, .keys = {"account", "feature"},
	.ncols = 2, .cols = {"lim", "source"}
};
static EmDirect job_of_key = {
	.table = "job", .nkeys = 2, .keys = {"account", "idempotency_key"},
	.ncols = 4, .cols = {"job_id", "amount", "feature", "budget_id"}
};

static void
key_job_from(KeyJob *k, Datum *v, bool *n)
{
	k->found = true;
	k->job_id = DatumGetInt64(v[0]);
	k->amount = DatumGetInt64(v[1]);
	k->feature = TextDatumGetCString(v[2]);
	k->budget_id = DatumGetInt64(v[3]);
}

/* the key's job in the last SPI result, columns c .. c + 3 */
static void
key_job_from_spi(KeyJob *k, int c)
{
	bool		isnull;

	(void) em_get(0, c, &isnull);
	k->found = !isnull;
	if (isnull)
		return;
	k->job_id = em_get_int64(0, c, 0);
	k->amount = em_get_int64(0, c + 1, 0);
	k->feature = TextDatumGetCString(em_get(0, c + 2, &isnull));
	k->budget_id = em_get_int64(0, c + 3, 0);
}

static void
read_key_job_direct(Reserve *r, Snapshot snap, KeyJob *k)
{
	Datum		keys[2];
	Datum		v[4];
	bool		n[4];

	keys[0] = PointerGetDatum(r->h.account);
	keys[1] = PointerGetDatum(r->h.key);
	k->found = false;
	if (em_direct_get(&job_of_key, keys, snap, v, n))
		key_job_from(k, v, n);
}

static const char *const key_tables[] = {"job"};

/* the key's job now (a new snapshot under READ COMMITTED) */
static void
read_key_job(Reserve *r, KeyJob *k)
{
	Datum		args[2];
	Snapshot	snap;

	if (!em_distributed())
	{
		snap = em_direct_statement_snapshot(key_tables, lengthof(key_tables));
		read_key_job_direct(r, snap, k);
		em_direct_release(snap);
		return;
	}
	args[0] = PointerGetDatum(r->h.account);
	args[1] = PointerGetDatum(r->h.key);
	em_exec(&job_by_key, args, NULL, 1);
	k->found = SPI_processed == 1;
	if (k->found)
		key_job_from_spi(k, JK_JOB_ID);
}

/*
 * The account's row and its limit's row for the feature, read by index
 * from C (direct.c) in snap: what the reserve's first read and its limit
 * read after the budget lock both need.
 */
typedef struct AccountLimit
{
	Datum		account[4];		/* account_row's columns */
	bool		account_null[4];
	bool		has_anchor;
	TimestampTz anchor;
	bool		has_limit;		/* the feature has a limit row */
	bool		unlimited;		/* no limit row, or its lim is NULL */
	int64		lim;
	bool		provider_row;	/* the limit row came from the provider */
} AccountLimit;

/* false when the account has no row (then nothing else is read) */
static bool
read_account_limit_direct(Reserve *r, Snapshot snap, AccountLimit *a)
{
	Datum		keys[2];
	Datum		v[2];
	bool		n[2];
	text	   *source;

	keys[0] = PointerGetDatum(r->h.account);
	if (!em_direct_get(&account_row, keys, snap, a->account, a->account_null))
		return false;
	a->has_anchor = !a->account_null[0];
	a->anchor = a->has_anchor ? DatumGetTimestampTz(a->account[0]) : 0;
	keys[1] = PointerGetDatum(r->h.feature);
	a->has_limit = em_direct_get(&limit_row, keys, snap, v, n);
	a->unlimited = !a->has_limit || n[0];
	a->lim = a->unlimited ? 0 : DatumGetInt64(v[0]);
	source = a->has_limit ? DatumGetTextPP(v[1]) : NULL;
	a->provider_row = source != NULL && VARSIZE_ANY_EXHDR(source) == strlen("provider") &&
		memcmp(VARDATA_ANY(source), "provider", strlen("provider")) == 0;
	return true;
}

/* read_account_limit_direct's and read_key_job_direct's */
static const char *const start_tables[] = {"account", "account_limit", "job"};

static bool
read_start_direct(Reserve *r, StartRow *s)
{
	Snapshot	snap = em_direct_statement_snapshot(start_tables, lengthof(start_tables));
	AccountLimit a;
	bool		found;

	r->start_completions = em_direct_completions();
	found = read_account_limit_direct(r, snap, &a);

	if (found)
	{
		s->has_anchor = a.has_anchor;
		s->anchor = a.anchor;
		s->has_escrow = !a.account_null[1];
		s->escrow_slots = a.account_null[1] ? 0 : DatumGetInt32(a.account[1]);
		s->has_fetched = !a.account_null[2];
		s->fetched_at = a.account_null[2] ? 0 : DatumGetTimestampTz(a.account[2]);
		s->wanted = !a.account_null[3];
		s->has_limit = a.has_limit;
		s->unlimited = a.unlimited;
		s->lim = a.lim;
		s->provider_row = a.provider_row;
		read_key_job_direct(r, snap, &s->job);
	}
	em_direct_release(snap);
	return found;
}

/* the same through SPI (reserve_start), on Citus */
static bool
read_start_spi(Reserve *r, StartRow *s)
{
	Datum		args[3];
	bool		isnull;
	Datum		d;

	args[0] = PointerGetDatum(r->h.account);
	args[1] = PointerGetDatum(r->h.key);
	args[2] = PointerGetDatum(r->h.feature);
	em_exec(&reserve_start, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	d = em_get(0, RS_ANCHOR, &isnull);
	s->has_anchor = !isnull;
	s->anchor = isnull ? 0 : DatumGetTimestampTz(d);
	d = em_get(0, RS_ESCROW_SLOTS, &isnull);
	s->has_escrow = !isnull;
	s->escrow_slots = isnull ? 0 : DatumGetInt32(d);
	d = em_get(0, RS_FETCHED_AT, &isnull);
	s->has_fetched = !isnull;
	s->fetched_at = isnull ? 0 : DatumGetTimestampTz(d);
	s->wanted = DatumGetBool(em_get(0, RS_WANTED, &isnull));
	s->has_limit = DatumGetBool(em_get(0, RS_HAS_LIMIT, &isnull));
	d = em_get(0, RS_SOURCE, &isnull);
	s->provider_row = s->has_limit && strcmp(TextDatumGetCString(d), "provider") == 0;
	d = em_get(0, RS_LIM, &isnull);
	s->unlimited = isnull;
	s->lim = isnull ? 0 : DatumGetInt64(d);
	key_job_from_spi(&s->job, RS_JOB_ID);
	return true;
}

/*
 * The same key again: the same job, or an error if the parameters differ.
 * Returns the job's budget.
 */
static int64
existing_job(Reserve *r, KeyJob *k)
{
	Admission  *result = r->result;
	char	   *new_feature = text_to_cstring(r->h.feature);

	if (k->amount != r->h.amount || strcmp(k->feature, new_feature) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_IDEMPOTENCY_CONFLICT),
				 errmsg("idempotency key \"%s\" of account \"%s\" was used for a different job",
						text_to_cstring(r->h.key), text_to_cstring(r->h.account)),
				 errdetail("Job " INT64_FORMAT " holds " INT64_FORMAT " of feature \"%s\"; this call asks for " INT64_FORMAT " of feature \"%s\".",
						   k->job_id, k->amount, k->feature, r->h.amount, new_feature),
				 errhint("Use a new key for a new job, or repeat the first call's amount and feature.")));

	result->admitted = true;
	result->job_id = k->job_id;
	result->reason = "already admitted";
	return k->budget_id;
}

/*
 * budget_numbers by index from C on a single node, in one snapshot taken
 * as the SQL's: a planned statement would read small tables whole, which
 * under SERIALIZABLE is a predicate lock on every account's rows
 * (sql/serializable_reads.sql).  The limit's row is limit_row's.
 */
static EmDirect budget_totals = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 3, .cols = {"used", "held", "feature"}
};

/* remaining_of_budget_direct's, in its order: the budget row, the recorded usage, the slots, the limit */
static const char *const remaining_tables[] = {"budget", "usage_shard", "budget_slot", "account_limit"};

/*
 * Add to a budget row's used and held, read in snap, the usage recorded
 * in its cycle and its escrow slots' sums in the same snapshot: what the
 * whole budget has used and holds.  False when a sum passes a bigint.
 */
static bool
budget_sums(text *account, int64 budget_id, Snapshot snap, int64 *used, int64 *held)
{
	int64		slots_used;
	int64		slots_held;

	em_escrow_slot_totals(account, budget_id, snap, &slots_used, &slots_held);
	return !pg_add_s64_overflow(*used, em_budget_recorded(account, budget_id, snap), used) &&
		!pg_add_s64_overflow(*used, slots_used, used) &&
		!pg_add_s64_overflow(*held, slots_held, held);
}

static void
remaining_of_budget_direct(text *account, int64 budget_id, Admission *result)
{
	Snapshot	snap = em_direct_statement_snapshot(remaining_tables, lengthof(remaining_tables));
	Datum		keys[2];
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];
	int64		used;
	int64		held;
	bool		summed;
	bool		known;

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(budget_id);
	if (!em_direct_get(&budget_totals, keys, snap, v, n))
	{
		em_direct_release(snap);
		return;
	}
	used = DatumGetInt64(v[0]);
	held = DatumGetInt64(v[1]);
	summed = budget_sums(account, budget_id, snap, &used, &held);
	keys[1] = v[2];				/* the budget's feature */
	known = em_direct_get(&limit_row, keys, snap, v, n);
	em_direct_release(snap);
	result->unlimited = known && n[0];
	/* sums past a bigint leave no room under any limit */
	result->remaining = known && (summed || result->unlimited) ?
		em_room_left(result->unlimited, n[0] ? 0 : DatumGetInt64(v[0]), used, held) : 0;
}

/* "remaining" of the existing job's budget */
static void
remaining_of_budget(text *account, int64 budget_id, Admission *result)
{
	Datum		args[2];
	bool		isnull;

	if (!em_distributed())
	{
		remaining_of_budget_direct(account, budget_id, result);
		return;
	}
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	em_exec(&budget_numbers, args, NULL, 1);
	if (SPI_processed == 1)
	{
		int64		used = em_get_int64(0, BN_USED, 0) + em_get_int64(0, BN_RECORDED, 0) +
			em_get_int64(0, BN_SLOTS_USED, 0);
		int64		held = em_get_int64(0, BN_HELD, 0) + em_get_int64(0, BN_SLOTS_HELD, 0);
		bool		known = DatumGetBool(em_get(0, BN_KNOWN, &isnull));
		bool		no_lim;
		Datum		lim = em_get(0, BN_LIM, &no_lim);

		result->unlimited = known && no_lim;
		result->remaining = known ?
			em_room_left(result->unlimited, no_lim ? 0 : DatumGetInt64(lim), used, held) : 0;
	}
}

/*
 * Before a refusal: did a concurrent reserve with the same key commit while
 * we waited?  Then the answer is that job, not a refusal.  (Only refusals
 * pay for this look-up; an admission finds the key through its insert.)
 */
static bool
key_taken_meanwhile(Reserve *r)
{
	KeyJob		k;

	read_key_job(r, &k);
	if (!k.found)
		return false;
	remaining_of_budget(r->h.account, existing_job(r, &k), r->result);
	return true;
}

/*
 * Step 1: the same key again returns the same job and holds nothing new;
 * step 2: an account without a known limit is refused (fail closed).
 * True when the reserve is answered.
 */
static bool
start_reserve(Reserve *r)
{
	Admission  *result = r->result;
	StartRow	s;
	EmLimitAge	age;

	memset(&s, 0, sizeof(s));
	if (!(em_distributed() ? read_start_spi(r, &s) : read_start_direct(r, &s)))
	{
		result->reason = "limit unknown";
		return true;
	}
	if (s.job.found)
	{
		remaining_of_budget(r->h.account, existing_job(r, &s.job), result);
		return true;
	}

	/* the limit cache (limit_cache.c): a provider's limit ages */
	age = em_limit_age(s.has_limit, s.provider_row, s.has_fetched, s.fetched_at, r->h.now);
	if (age == EM_LIMIT_UNKNOWN || age == EM_LIMIT_UNKNOWN_WANTED)
	{
		/* no lock is held yet, and none is taken after this one */
		if (age == EM_LIMIT_UNKNOWN_WANTED && !s.wanted)
			em_want_limits(r->h.account);
		result->reason = "limit unknown";
		return true;
	}
	/* flagged after the budget row, in earmark_reserve */
	result->want_limits = age == EM_LIMIT_STALE && !s.wanted;

	r->has_anchor = s.has_anchor;
	r->anchor = s.anchor;
	/* the account's own number (0 included) wins over automatic escrow */
	r->escrow_slots = s.has_escrow ? s.escrow_slots : earmark_escrow_slots;
	r->auto_escrow = !s.has_escrow && earmark_auto_escrow_slots > 0;
	result->unlimited = s.unlimited;
	r->no_budget_remaining = s.lim;
	return false;
}

/*
 * Step 3, escrow's fast path: take room from a free slot without touching
 * the budget row.  Not under REPEATABLE READ or SERIALIZABLE: the fast path
 * reads the limit and the recorded usage without a lock, in the
 * transaction's snapshot, which may be older than a lower limit or usage
 * committed before this call; the slow path checks them.  Only for a
 * budget with slots: the account's number, or automatic escrow's flag
 * (contention.c), so that a budget without slots pays no statement here.
 * True when the reserve is answered.
 */
static bool
fast_path(Reserve *r)
{
	TimestampTz start;
	TimestampTz end;
	EscrowNumbers n;
	int64		held;

	if (IsolationUsesXactSnapshot())
		return false;
	if (r->escrow_slots <= 0 &&
		!(r->auto_escrow && em_contention_escrowed(r->h.account, r->h.feature)))
		return false;
	em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
	switch (em_escrow_fast(&r->h, start, &n))
	{
		case EM_ADMIT_OK:
			r->result->admitted = true;
			r->result->job_id = r->h.job_id;
			r->result->unlimited = n.unlimited;
			/* the numbers are from before this hold */
			if (pg_add_s64_overflow(n.held, r->h.amount, &held))
				held = PG_INT64_MAX;
			r->result->remaining = n.unlimited ? 0 : em_room_left(false, n.lim, n.used, held);
			return true;
		case EM_ADMIT_KEY_TAKEN:
			if (!key_taken_meanwhile(r))
				elog(ERROR, "earmark: job with key \"%s\" vanished", text_to_cstring(r->h.key));
			return true;
		default:
			return false;
	}
}

/*
 * Creating a cycle's budget row: hold the account's advisory lock shared
 * so that earmark_set_account cannot change the anchor under us, read the
 * anchor again under it, create the row and lock it.
 */
static void
create_cycle_budget(Reserve *r)
{
	TimestampTz start;
	TimestampTz end;

	(void) em_account_anchor_shared(r->h.account, &r->has_anchor, &r->anchor);
	em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
	em_budget_create(r->h.account, r->h.feature, start, end);
	if (!em_budget_lock(r->h.account, r->h.feature, start, &r->b))
		elog(ERROR, "earmark: budget row of account \"%s\" vanished",
			 text_to_cstring(r->h.account));
}

/*
 * Read after the budget lock, in a new snapshot: a limit or anchor change
 * committed before the lock was granted applies to this admission.  Usage
 * recorded without a hold (the cycle's counters) counts against the limit.
 * And the key's job: one that committed while this reserve waited for the
 * budget row answers it (lock_cycle).
 */
static EmStatement read_limit = {
	"SELECT l.lim, l.account IS NOT NULL, a.cycle_anchor, "
	"       (SELECT coalesce(pg_catalog.sum(u.units), 0)::bigint FROM earmark.usage_shard u "
	"         WHERE u.account = $1 AND u.budget_id = $3), "
	"       j.job_id, j.amount, j.feature, j.budget_id "
	"FROM earmark.account a "
	"LEFT JOIN earmark.account_limit l ON l.account = a.account AND l.feature = $2 "
	"LEFT JOIN earmark.job j ON j.account = a.account AND j.idempotency_key = $4 "
	"WHERE a.account = $1",
	4, {TEXTOID, TEXTOID, INT8OID, TEXTOID}
};
enum
{
	RL_LIM = 1, RL_KNOWN, RL_ANCHOR, RL_RECORDED, RL_JOB_ID
};

/* what read_limit reads; !known: no account, or no limit for the feature */
typedef struct LimitRow
{
	bool		known;
	bool		unlimited;
	int64		lim;
	bool		has_anchor;
	TimestampTz anchor;
	int64		recorded;
	KeyJob		job;			/* the key's job (only when known) */
} LimitRow;

/* read_limit by index from C (direct.c), on a single node */
static void
read_limit_direct(Reserve *r, Snapshot snap, uint64 completions, LimitRow *l)
{
	AccountLimit a;

	if (!read_account_limit_direct(r, snap, &a))
		return;
	l->has_anchor = a.has_anchor;
	l->anchor = a.anchor;
	l->known = a.has_limit;
	if (!l->known)
		return;
	l->unlimited = a.unlimited;
	l->lim = a.lim;
	l->recorded = em_budget_recorded(r->h.account, r->b.budget_id, snap);
	/*
	 * The key's job, when it may have committed since start_reserve's read:
	 * not under REPEATABLE READ (the snapshot is that read's), nor when no
	 * transaction has ended since that read's snapshot was taken (the count
	 * GetSnapshotData keeps to reuse a snapshot: the same count, the same
	 * transactions visible).
	 */
	if (!IsolationUsesXactSnapshot() &&
		(r->start_completions == 0 || completions != r->start_completions))
		read_key_job_direct(r, snap, &l->job);
}

/* read_limit_direct's: the account, its limit, the recorded usage, the key's job */
static const char *const limit_tables[] = {"account", "account_limit", "usage_shard", "job"};

/*
 * The limit, the anchor and the cycle's recorded usage, in a new snapshot
 * (a statement's, or with latest the latest whatever the isolation level),
 * by index from C on a single node, through SPI on Citus.
 */
static void
read_limit_now(Reserve *r, bool latest, LimitRow *l)
{
	Datum		args[4];
	bool		isnull;
	Datum		d;

	memset(l, 0, sizeof(*l));
	if (!em_distributed())
	{
		Snapshot	snap = latest ?
			em_direct_latest_snapshot(limit_tables, lengthof(limit_tables)) :
			em_direct_statement_snapshot(limit_tables, lengthof(limit_tables));

		read_limit_direct(r, snap, em_direct_completions(), l);
		em_direct_release(snap);
		return;
	}
	args[0] = PointerGetDatum(r->h.account);
	args[1] = PointerGetDatum(r->h.feature);
	args[2] = Int64GetDatum(r->b.budget_id);
	args[3] = PointerGetDatum(r->h.key);
	if (latest)
		em_exec_latest(&read_limit, args, NULL, 1);
	else
		em_exec(&read_limit, args, NULL, 1);
	if (SPI_processed == 0 || !DatumGetBool(em_get(0, RL_KNOWN, &isnull)))
		return;
	l->known = true;
	d = em_get(0, RL_LIM, &l->unlimited);
	l->lim = l->unlimited ? 0 : DatumGetInt64(d);
	d = em_get(0, RL_ANCHOR, &isnull);
	l->has_anchor = !isnull;
	l->anchor = isnull ? 0 : DatumGetTimestampTz(d);
	l->recorded = em_get_int64(0, RL_RECORDED, 0);
	key_job_from_spi(&l->job, RL_JOB_ID);
}

/*
 * Under REPEATABLE READ and SERIALIZABLE, read_limit saw the limit, the
 * cycle's recorded usage and the account's cycle anchor in the
 * transaction's snapshot.  None is locked (usage is recorded without the
 * budget row, so that many writers do not queue on it; an anchor change
 * locks the budget rows but need not change them), so a lower limit,
 * usage or a new anchor committed after that snapshot, even before this
 * call, would be invisible.  Read them again in a snapshot that sees every
 * commit: if anything differs, fail with 40001, as the budget row's lock
 * does when the row changed after the snapshot.
 */
static void
check_limit_current(Reserve *r)
{
	LimitRow	now;

	read_limit_now(r, true, &now);
	if (now.known && now.unlimited == r->b.unlimited && (r->b.unlimited || now.lim == r->b.lim) &&
		now.recorded == r->b.recorded && now.has_anchor == r->has_anchor &&
		(!now.has_anchor || now.anchor == r->anchor))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to a concurrent change of the limit, usage or cycle anchor of account \"%s\"",
					text_to_cstring(r->h.account)),
			 errdetail("The limit, the recorded usage or the cycle anchor changed after this transaction's snapshot was taken."),
			 errhint("Retry the transaction.")));
}

/*
 * Step 4: lock the cycle's budget row (creating it on first use), then
 * read the limit, the anchor and the recorded usage as they are now that
 * we hold it.  earmark_set_account may have moved the anchor while we
 * waited for an existing budget row: then this row is of the old cycles
 * and the hold belongs in the new anchor's cycle.  False when the limit
 * turned out unknown (answered).
 *
 * The same read gives the key's job as it is now (r->locked_key): a job
 * with the key that committed after start_reserve's read, typically while
 * this reserve waited for the budget row behind the reserve that made it.
 * do_reserve answers with it instead of inserting: the insert's unique
 * check would wait, with the budget row held, for any transaction that
 * updated that job's row, such as a settle of it, which waits for the
 * budget row next (a deadlock; isolation spec same_key_vs_settle).
 */
static bool
lock_cycle(Reserve *r)
{
	LimitRow	l;
	int			attempt;

	for (attempt = 0;; attempt++)
	{
		TimestampTz start;
		TimestampTz end;

		em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
		if (!em_budget_lock(r->h.account, r->h.feature, start, &r->b))
			create_cycle_budget(r);
		read_limit_now(r, false, &l);
		if (!l.known)
		{
			r->result->reason = "limit unknown";
			return false;
		}
		r->has_anchor = l.has_anchor;
		r->anchor = l.anchor;
		em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
		if (start == r->b.cycle_start)
			break;
		if (attempt >= 3)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("cycle anchor of account \"%s\" keeps changing",
							text_to_cstring(r->h.account)),
					 errhint("Retry the transaction.")));
	}
	r->b.lim = l.lim;
	r->b.raw_lim = l.lim;
	r->b.unlimited = l.unlimited;
	r->b.recorded = l.recorded;
	r->locked_key = l.job;
	r->result->unlimited = r->b.unlimited;
	if (IsolationUsesXactSnapshot())
		check_limit_current(r);
	return true;
}

/*
 * Steps 5-9 without escrow: a hold whose lease has passed never causes a
 * refusal (reclaim), then the hold in the budget row.
 * *remaining is what is left after it.
 */
static EmAdmit
admit_plain(Reserve *r, int64 *remaining)
{
	EmBudget   *b = &r->b;
	int64		used = b->used + b->recorded;
	EmAdmit		a;

	*remaining = em_room_left(b->unlimited, b->lim, used, b->held);
	if (r->h.amount > *remaining)
	{
		int64		released;
		int64		charged;

		if (em_budget_reclaim(r->h.account, b->budget_id, r->h.now, EARMARK_RECLAIM_BATCH,
							  &released, &charged) > 0)
		{
			b->held -= released;
			b->used += charged;
			em_budget_write(r->h.account, b->budget_id, b->used, b->held);
			*remaining = em_room_left(b->unlimited, b->lim, b->used + b->recorded, b->held);
		}
	}
	if (r->h.amount > *remaining)
		return EM_ADMIT_REFUSED;
	a = em_budget_admit(&r->h, b);
	if (a == EM_ADMIT_OK)
		*remaining = b->unlimited ? 0 : *remaining - r->h.amount;
	return a;
}

/* the answer of a refusal: the room the job did not fit in */
static void
refuse(Reserve *r, int64 remaining)
{
	Admission  *result = r->result;

	result->remaining = remaining;
	snprintf(result->reason_buf, sizeof(result->reason_buf),
			 "the job needs " INT64_FORMAT " and " INT64_FORMAT " is left",
			 r->h.amount, remaining);
	result->reason = result->reason_buf;
}

/* ---------------------------------------------------------------------
 * A refusal without the budget row
 * ---------------------------------------------------------------------
 */

/*
 * The budgets this backend saw refused (contention.c's key of their
 * account and feature, and the budget row's id): only a reserve on one of
 * them tries refused_unlocked first, so that an admission pays nothing for
 * it.  A hint, never a reason: a stale or colliding entry costs one read.
 */
#define REFUSED_HINTS 64
typedef struct RefusedHint
{
	uint64		key;			/* 0: empty */
	int64		budget_id;
} RefusedHint;
static RefusedHint refused_hints[REFUSED_HINTS];

/* the budget refused (budget_id), or seen with room (0) */
static void
note_refused(Reserve *r, int64 budget_id)
{
	uint64		key = em_contention_key(r->h.account, r->h.feature);
	RefusedHint *entry = &refused_hints[key % REFUSED_HINTS];

	if (budget_id != 0)
	{
		entry->key = key;
		entry->budget_id = budget_id;
	}
	else if (entry->key == key)
		entry->key = 0;
}

/* the budget row's id this backend saw refused, 0 when none */
static int64
hinted_refused(Reserve *r)
{
	uint64		key = em_contention_key(r->h.account, r->h.feature);
	RefusedHint *entry = &refused_hints[key % REFUSED_HINTS];

	return entry->key == key ? entry->budget_id : 0;
}

/* what refused_unlocked reads, in one snapshot, in the reserve's lock order */
static const char *const refusal_tables[] =
{"account", "account_limit", "budget", "usage_shard", "budget_slot"};

/*
 * The room the cycle's budget has left, without its lock: the budget row,
 * the recorded usage, the slots (budget_sums) and the limit, in one
 * snapshot.  False when anything would need
 * the locked path: no budget row yet, no limit, a cycle anchor other than
 * start_reserve's, an unlimited budget, or sums past a bigint.
 */
static bool
room_unlocked(Reserve *r, int64 *budget_id, int64 *remaining)
{
	Snapshot	snap = em_direct_statement_snapshot(refusal_tables, lengthof(refusal_tables));
	AccountLimit a;
	TimestampTz start;
	TimestampTz end;
	int64		used;
	int64		held;
	bool		ok;

	em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
	ok = read_account_limit_direct(r, snap, &a) && a.has_limit && !a.unlimited &&
		a.has_anchor == r->has_anchor && (!a.has_anchor || a.anchor == r->anchor) &&
		em_budget_numbers(r->h.account, r->h.feature, start, snap, budget_id, &used, &held) &&
		budget_sums(r->h.account, *budget_id, snap, &used, &held);
	if (ok)
		*remaining = em_room_left(false, a.lim, used, held);
	em_direct_release(snap);
	return ok;
}

/*
 * Whether a job with the key exists, committed or not: read with a dirty
 * snapshot, so that a reserve of the same key still in progress is seen.
 */
static bool
key_exists_or_in_progress(Reserve *r)
{
	SnapshotData dirty;
	Datum		keys[2];
	Datum		v[4];
	bool		n[4];

	InitDirtySnapshot(dirty);
	keys[0] = PointerGetDatum(r->h.account);
	keys[1] = PointerGetDatum(r->h.key);
	return em_direct_get(&job_of_key, keys, &dirty, v, n);
}

/*
 * Step 3b: a reserve that the whole budget has no room for, refused
 * without locking the budget row.  A full account's refusals then neither
 * queue on that row, nor make its settlements wait, nor write: no row
 * lock, no transaction id, no commit to flush.  The refusal is the one the
 * locked path would give at the moment of this snapshot, because:
 * - the snapshot is taken under READ COMMITTED after the call began, and
 *   sums every hold, the recorded usage and the limit as committed then
 *   (with this transaction's own writes), as the locked path sums them
 *   as committed when its lock is granted;
 * - no hold it counts can be dead at now: the budget's lease floor, read
 *   before the snapshot, is later than now, and no hold of its set reached
 *   PRE_COMMIT, COMMIT or PREPARE between that read and the snapshot's
 *   use (its generation), so every hold the snapshot sees was open, or
 *   committing, with its floor lowered, when the floor was read
 *   (leasefloor.c; the transaction's own holds are checked there).  Read
 *   after the snapshot, the floor bounds only the holds open then: a dead
 *   hold the snapshot counts may have been expired since (a sweep,
 *   another reserve's reclaim) and a search have stored a later floor
 *   (test/integration/review_refusal_floor_after_snapshot.sh);
 * - no job with the key exists or is being written: otherwise the locked
 *   path answers with that job (it waits for the budget row behind the
 *   reserve that made it, or for the key's insert), so that path runs.
 * Not under REPEATABLE READ or SERIALIZABLE (the snapshot is the
 * transaction's, older than this call), nor in a read-only transaction
 * (whose reserve must fail as it always did), nor on Citus (no floors).
 * Only for a budget this backend saw refused (note_refused).  True when
 * the reserve is answered.
 */
static bool
refused_unlocked(Reserve *r)
{
	int64		hinted = hinted_refused(r);
	int64		budget_id;
	int64		remaining;
	uint64		gen;

	if (hinted == 0 || IsolationUsesXactSnapshot() || XactReadOnly || em_distributed())
		return false;
	/* the floor of the budget the hint names, before the snapshot */
	if (!em_budget_none_dead(hinted, r->h.now, &gen))
		return false;
	if (!room_unlocked(r, &budget_id, &remaining) || r->h.amount <= remaining)
	{
		note_refused(r, 0);
		return false;
	}
	if (budget_id != hinted || !em_budget_floor_unmoved(budget_id, gen) ||
		key_exists_or_in_progress(r))
		return false;
	r->result->unlimited = false;
	refuse(r, remaining);
	return true;
}

/*
 * The answer of the budget row's path, and its one refusal exit: a
 * refusal first looks the key up again, since a reserve with the same key
 * may have committed while this one waited for the budget row.
 */
static void
answer(Reserve *r, EmAdmit a, int64 remaining)
{
	Admission  *result = r->result;

	switch (a)
	{
		case EM_ADMIT_OK:
			result->admitted = true;
			result->job_id = r->h.job_id;
			result->reason = NULL;
			result->remaining = result->unlimited ? 0 : remaining;
			return;
		case EM_ADMIT_KEY_TAKEN:
			if (!key_taken_meanwhile(r))
				elog(ERROR, "earmark: job with key \"%s\" vanished", text_to_cstring(r->h.key));
			return;
		default:
			break;
	}
	if (key_taken_meanwhile(r))
		return;
	refuse(r, remaining);
	note_refused(r, r->b.budget_id);
}

/*
 * The rate limit (ratelimit.c), before any room is looked at, so that the
 * fast path may take a slot with the rate limit on: it counts the
 * admission now, and the reserve gives it back when it admits nothing new.
 * Over the rate, the answer is "rate limited" with what the cycle has left.
 * True when answered.
 */
static bool
rate_limited(Reserve *r)
{
	TimestampTz start;
	TimestampTz end;
	int64		budget_id;

	if (em_rate_conforms(r->h.account, r->h.now))
	{
		r->rate_counted = earmark_rate_limit > 0;
		return false;
	}
	r->result->reason = "rate limited";
	em_cycle_bounds(r->anchor, r->has_anchor, r->h.now, &start, &end);
	if (em_budget_find(r->h.account, r->h.feature, start, &budget_id))
		remaining_of_budget(r->h.account, budget_id, r->result);
	else
		r->result->remaining = r->no_budget_remaining;
	return true;
}

/*
 * Automatic escrow, with the budget row locked: when enough reserves are
 * queued on it (this one included, contention.c), give the budget slots,
 * as earmark_set_escrow would; the rebalance below cuts them under this
 * lock, so the limit stays as exact as with slots given by hand.  Also
 * tells the fast path whether the budget has slots.
 */
static EmStatement own_escrow_number = {
	"SELECT escrow_slots IS NOT NULL FROM earmark.account WHERE account = $1",
	1, {TEXTOID}
};

/*
 * Whether the account has its own number of slots now: read in a new
 * snapshot, after the budget row's lock was granted, because
 * start_reserve read it before this reserve waited, and an
 * earmark_set_escrow that committed meanwhile must win.
 */
static bool
own_escrow_number_now(Reserve *r)
{
	Datum		args[1];
	bool		isnull;

	args[0] = PointerGetDatum(r->h.account);
	em_exec(&own_escrow_number, args, NULL, 1);
	return SPI_processed == 1 && DatumGetBool(em_get(0, 1, &isnull));
}

static void
auto_escrow(Reserve *r)
{
	bool		escrowed = r->b.slots > 0;
	int			inside = em_contention_inside(escrowed);

	if (escrowed || inside < earmark_auto_escrow_contenders)
		return;

	/*
	 * Not under REPEATABLE READ or SERIALIZABLE: the account's number would
	 * be read in the transaction's snapshot, older than an
	 * earmark_set_escrow it must not undo (and the fast path, which the
	 * slots are for, does not run there).
	 */
	if (IsolationUsesXactSnapshot() || own_escrow_number_now(r))
		return;
	em_escrow_set_slots(r->h.account, r->b.budget_id, earmark_auto_escrow_slots);
	r->b.slots = earmark_auto_escrow_slots;
	(void) em_contention_inside(true);
}

static void
do_reserve(Reserve *r)
{
	int64		remaining = 0;
	EmAdmit		a;

	if (start_reserve(r) || rate_limited(r) || refused_unlocked(r) || fast_path(r))
		return;
	if (r->auto_escrow)
		em_contention_enter(r->h.account, r->h.feature);
	if (!lock_cycle(r))
		return;
	if (r->locked_key.found)
	{
		/* the key's job committed while we waited: the same key again */
		remaining_of_budget(r->h.account, existing_job(r, &r->locked_key), r->result);
		return;
	}
	if (r->auto_escrow)
		auto_escrow(r);
	if (r->b.slots > 0 || r->b.slot_gen > 0)
	{
		/* an escrow budget: the slow path rebalances its slots */
		if (!r->b.unlimited)
			r->b.lim = Max(r->b.lim - r->b.recorded, 0);
		a = em_escrow_rebalance(&r->h, &r->b, &remaining);
	}
	else
		a = admit_plain(r, &remaining);
	answer(r, a, remaining);
}

/*
 * do_reserve, and the rate limit's count given back unless it admitted a
 * new job: also when it raises (an amount that would pass the largest
 * bigint, a serialization failure), or bad input would use up the rate.
 * The slow path's contention count is taken back either way.
 */
static void
reserve_counted(Reserve *r)
{
	PG_TRY();
	{
		do_reserve(r);
	}
	PG_CATCH();
	{
		em_contention_leave();
		if (r->rate_counted)
			em_rate_give_back(r->h.account);
		PG_RE_THROW();
	}
	PG_END_TRY();
	em_contention_leave();
	if (r->rate_counted && !(r->result->admitted && r->result->reason == NULL))
		em_rate_give_back(r->h.account);
}

/* the lease argument, or earmark.lease (also earmark_reserve_many's) */
Interval *
em_arg_lease(FunctionCallInfo fcinfo, int argno, TimestampTz now)
{
	Interval   *lease;

	if (PG_ARGISNULL(argno))
	{
		lease = palloc0(sizeof(Interval));
		lease->time = (int64) earmark_lease_s * USECS_PER_SEC;
		return lease;
	}
	lease = PG_GETARG_INTERVAL_P(argno);
	if (em_plus_utc(now, lease) <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be longer than zero")));
	return lease;
}

static Datum reserve_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_reserve(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, reserve_body);
}

static Datum
reserve_body(PG_FUNCTION_ARGS)
{
	Reserve		r;
	Admission	result;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	em_require_schema();
	memset(&r, 0, sizeof(r));
	memset(&result, 0, sizeof(result));
	r.h.account = em_arg_name(fcinfo, 0, "account");
	r.h.amount = em_arg_int64(fcinfo, 1, "amount");
	r.h.key = em_arg_name(fcinfo, 2, "idempotency_key");
	r.h.feature = em_arg_name(fcinfo, 3, "feature");
	r.h.now = GetCurrentTimestamp();
	check_positive(r.h.amount, "amount");
	r.h.lease = em_arg_lease(fcinfo, 4, r.h.now);
	r.h.lease_until = em_plus_utc(r.h.now, r.h.lease);
	r.result = &result;
	em_require_account_local(r.h.account);

	SPI_connect();
	reserve_counted(&r);		/* the rate limit counts new admissions only */
	if (result.want_limits)
		em_want_limits(r.h.account);	/* after the budget row: gate.c's order */
	SPI_finish();

	values[0] = Int64GetDatum(result.job_id);
	nulls[0] = !result.admitted;
	values[1] = BoolGetDatum(result.admitted);
	values[2] = Int64GetDatum(result.remaining);
	nulls[2] = result.unlimited;
	if (result.reason)
		values[3] = CStringGetTextDatum(result.reason);
	nulls[3] = result.reason == NULL;
	em_return_row(fcinfo, values, nulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * The job row
 * ---------------------------------------------------------------------
 */
static EmStatement lock_job = {
	"SELECT budget_id, amount, used, status, lease_until, lease, last_step, slot, gen "
	"FROM earmark.job WHERE account = $1 AND job_id = $2 FOR UPDATE",
	2, {TEXTOID, INT8OID}
};
enum
{
	LJ_BUDGET_ID = 1, LJ_AMOUNT, LJ_USED, LJ_STATUS, LJ_LEASE_UNTIL, LJ_LEASE,
	LJ_LAST_STEP, LJ_SLOT, LJ_GEN
};

/* a job row as lock_job read it */
typedef struct Job
{
	int64		budget_id;
	int64		amount;
	int64		used;
	const char *status;
	TimestampTz lease_until;
	Interval   *lease;
	bool		has_last_step;
	int64		last_step;
	bool		has_slot;
	bool		has_gen;
	int64		gen;
} Job;

/* a job's slot and generation, from the SPI result's columns slot_col and gen_col */
static void
job_slot_from_spi(Job *j, int slot_col, int gen_col)
{
	bool		isnull;
	Datum		d;

	(void) em_get(0, slot_col, &isnull);
	j->has_slot = !isnull;
	d = em_get(0, gen_col, &isnull);
	j->has_gen = !isnull;
	j->gen = isnull ? 0 : DatumGetInt64(d);
}

/*
 * lock_job by index from C on a single node (direct.c: the lock as SELECT
 * ... FOR UPDATE takes it, READ COMMITTED's newest version and REPEATABLE
 * READ's 40001 included): a planned statement would read a small job table
 * whole, which under SERIALIZABLE is a predicate lock on every account's
 * jobs (sql/serializable_reads.sql).
 */
static EmDirect job_row = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 9, .cols = {"budget_id", "amount", "used", "status", "lease_until", "lease",
	"last_step", "slot", "gen"}
};

static void
job_from_direct(Datum *v, bool *n, Job *j)
{
	j->budget_id = DatumGetInt64(v[0]);
	j->amount = DatumGetInt64(v[1]);
	j->used = DatumGetInt64(v[2]);
	j->status = status_const(TextDatumGetCString(v[3]));
	j->lease_until = DatumGetTimestampTz(v[4]);
	j->lease = DatumGetIntervalP(v[5]);
	j->has_last_step = !n[6];
	j->last_step = n[6] ? 0 : DatumGetInt64(v[6]);
	j->has_slot = !n[7];
	j->has_gen = !n[8];
	j->gen = n[8] ? 0 : DatumGetInt64(v[8]);
}

static void
read_job(text *account, int64 job_id, Job *j)
{
	Datum		args[2];
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];
	bool		isnull;
	Datum		d;

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	if (!em_distributed())
	{
		if (!em_direct_lock(&job_row, args, v, n))
			unknown_job(account, job_id);
		job_from_direct(v, n, j);
		return;
	}
	em_exec(&lock_job, args, NULL, 1);
	if (SPI_processed == 0)
		unknown_job(account, job_id);
	j->budget_id = em_get_int64(0, LJ_BUDGET_ID, 0);
	j->amount = em_get_int64(0, LJ_AMOUNT, 0);
	j->used = em_get_int64(0, LJ_USED, 0);
	j->status = status_const(TextDatumGetCString(em_get(0, LJ_STATUS, &isnull)));
	j->lease_until = DatumGetTimestampTz(em_get(0, LJ_LEASE_UNTIL, &isnull));
	j->lease = DatumGetIntervalP(SPI_datumTransfer(em_get(0, LJ_LEASE, &isnull), false, 16));
	d = em_get(0, LJ_LAST_STEP, &isnull);
	j->has_last_step = !isnull;
	j->last_step = isnull ? 0 : DatumGetInt64(d);
	job_slot_from_spi(j, LJ_SLOT, LJ_GEN);
}

/* ---------------------------------------------------------------------
 * earmark_charge(account, job_id, tokens, step)
 *	  RETURNS TABLE (charged, capped, room, status)
 * ---------------------------------------------------------------------
 */

/*
 * A charge that changes nothing but the use, the step and the lease (the
 * job is running, its lease has not passed, the tokens fit, the step is
 * new): one UPDATE, which takes the row lock itself, instead of a locking
 * read and an update (a statement and a WAL record fewer).  Under READ
 * COMMITTED a concurrent settle makes the UPDATE re-check its conditions
 * on the settled row, so it finds nothing and the caller takes the general
 * path.  "$3 <= amount - used" cannot overflow as "used + $3" could.
 */
static EmStatement charge_fits = {
	"UPDATE earmark.job SET used = used + $3, last_step = coalesce($4, last_step), "
	"       lease_until = " LEASE_FROM("$5") " "
	"WHERE account = $1 AND job_id = $2 AND " JOB_RUNNING " AND lease_until >= $5 "
	"  AND $3 <= amount - used AND ($4 IS NULL OR last_step IS NULL OR $4 > last_step) "
	"RETURNING amount - used",
	5, {TEXTOID, INT8OID, INT8OID, INT8OID, TIMESTAMPTZOID}
};

static EmStatement write_charge = {
	"UPDATE earmark.job SET used = $3, last_step = coalesce($4, last_step), "
	"status = $5, lease_until = GREATEST(lease_until, $6) WHERE account = $1 AND job_id = $2",
	6, {TEXTOID, INT8OID, INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID}
};

typedef struct Charge
{
	int64		charged;
	bool		capped;
	int64		room;
	const char *status;
} Charge;

/*
 * charge_fits from C on a single node (direct.c): its WHERE clause is
 * tested in charge_fit on the version the UPDATE would update (and on the
 * newest one after a concurrent update), and its SET clause computed
 * there.  The first three columns are written.
 */
static EmDirect job_charge = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 6, .cols = {"used", "last_step", "lease_until", "status", "amount", "lease"},
	.nwrite = 3, .types = {INT8OID, INT8OID, TIMESTAMPTZOID, TEXTOID, INT8OID, INTERVALOID},
	.nullok = {[1] = true}
};

typedef struct ChargeFit
{
	int64		tokens;
	bool		has_step;
	int64		step;
	TimestampTz now;
	int64		room;			/* amount - used after the charge */
} ChargeFit;

static bool
charge_fit(Datum *v, bool *n, void *arg)
{
	ChargeFit  *c = (ChargeFit *) arg;
	int64		used = DatumGetInt64(v[0]);
	TimestampTz lease_until = DatumGetTimestampTz(v[2]);
	int64		amount = DatumGetInt64(v[4]);
	TimestampTz renewed;

	if (!text_is(v[3], "running") || lease_until < c->now || c->tokens > amount - used ||
		(c->has_step && !n[1] && c->step <= DatumGetInt64(v[1])))
		return false;
	v[0] = Int64GetDatum(used + c->tokens);
	if (c->has_step)
	{
		v[1] = Int64GetDatum(c->step);
		n[1] = false;
	}
	renewed = em_plus_utc(c->now, DatumGetIntervalP(v[5]));
	v[2] = TimestampTzGetDatum(Max(lease_until, renewed));
	c->room = amount - (used + c->tokens);
	return true;
}

/* a job row's write from C (direct.c); EM_DIRECT_UNWRITABLE on Citus */
static EmDirectWrite
job_write_direct(EmDirect *d, text *account, int64 job_id, EmDirectChange fn,
				 void *arg)
{
	Datum		keys[2];

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(job_id);
	return em_direct_update(d, keys, fn, arg);
}

/*
 * The charge that fits, in one write: from C on a single node, else
 * charge_fits; false when the job does not match (the general path
 * follows).
 */
static bool
charge_fitting(text *account, int64 job_id, int64 tokens, bool has_step,
			   int64 step, TimestampTz now, Charge *c)
{
	ChargeFit	fit = {tokens, has_step, step, now, 0};
	EmDirectWrite w = job_write_direct(&job_charge, account, job_id, charge_fit, &fit);
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	if (w != EM_DIRECT_UNWRITABLE)
	{
		c->room = fit.room;
		return w == EM_DIRECT_WRITTEN;
	}
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	args[2] = Int64GetDatum(tokens);
	args[3] = Int64GetDatum(step);
	nulls[3] = has_step ? ' ' : 'n';
	args[4] = TimestampTzGetDatum(now);
	em_exec(&charge_fits, args, nulls, 1);
	if (SPI_processed != 1)
		return false;
	c->room = em_get_int64(0, 1, 0);
	return true;
}

/*
 * write_charge on the job row charge_locked holds: from C on a single
 * node (the same columns, job_charge_write), else the SQL.
 */
static EmDirect job_charge_write = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 4, .cols = {"used", "last_step", "status", "lease_until"},
	.nwrite = 4, .types = {INT8OID, INT8OID, TEXTOID, TIMESTAMPTZOID},
	.nullok = {[1] = true}
};

typedef struct ChargeWrite
{
	int64		used;
	bool		has_step;
	int64		step;
	const char *status;
	TimestampTz renewed;
} ChargeWrite;

static bool
charge_write_fit(Datum *v, bool *n, void *arg)
{
	ChargeWrite *w = (ChargeWrite *) arg;

	v[0] = Int64GetDatum(w->used);
	if (w->has_step)
	{
		v[1] = Int64GetDatum(w->step);
		n[1] = false;
	}
	v[2] = CStringGetTextDatum(w->status);
	v[3] = TimestampTzGetDatum(Max(DatumGetTimestampTz(v[3]), w->renewed));
	return true;
}

static void
write_charge_locked(text *account, int64 job_id, Job *j, bool has_step,
					int64 step, const char *status, TimestampTz renewed)
{
	ChargeWrite cw = {j->used, has_step, step, status, renewed};
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	if (job_write_direct(&job_charge_write, account, job_id, charge_write_fit, &cw) !=
		EM_DIRECT_UNWRITABLE)
		return;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	args[2] = Int64GetDatum(j->used);
	args[3] = Int64GetDatum(step);
	nulls[3] = has_step ? ' ' : 'n';
	args[4] = CStringGetTextDatum(status);
	args[5] = TimestampTzGetDatum(renewed);
	em_exec(&write_charge, args, nulls, 0);
	/* the row is locked: only a trigger or a rule can have kept it */
	if (SPI_processed != 1)
		job_write_kept(account, job_id, "charge", "The job's update wrote no row.");
}

/*
 * The general path: capped, a repeated step, a dead lease, settled, or
 * unknown; the job row locked.
 */
static void
charge_locked(text *account, int64 job_id, int64 tokens, bool has_step,
			  int64 step, TimestampTz now, Charge *c)
{
	Job			j;

	read_job(account, job_id, &j);
	c->status = j.status;
	if (!is_open(j.status))
		;
	else if (j.lease_until < now)
		c->status = "expired";	/* dead before the sweeper gets to it */
	else if (strcmp(j.status, "capped") == 0)
		c->capped = tokens > 0; /* a capped job charges nothing more */
	else if (!(has_step && j.has_last_step && step <= j.last_step))
	{
		c->charged = Min(tokens, j.amount - j.used);
		c->capped = c->charged < tokens;
		j.used += c->charged;
		if (c->capped)
			c->status = "capped";
		write_charge_locked(account, job_id, &j, has_step, step,
							c->status, em_plus_utc(now, j.lease));
	}
	c->room = j.amount - j.used;
}

static Datum charge_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_charge(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, charge_body);
}

static Datum
charge_body(PG_FUNCTION_ARGS)
{
	text	   *account;
	int64		job_id;
	int64		tokens;
	bool		has_step;
	int64		step;
	TimestampTz now = GetCurrentTimestamp();
	Charge		c = {0, false, 0, "running"};
	Datum		values[4];
	bool		rnulls[4] = {false, false, false, false};

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	job_id = em_arg_int64(fcinfo, 1, "job_id");
	tokens = em_arg_int64(fcinfo, 2, "tokens");
	has_step = !PG_ARGISNULL(3);
	step = has_step ? PG_GETARG_INT64(3) : 0;
	if (tokens < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tokens must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", tokens)));
	if (has_step && step < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", step),
				 errhint("Number a job's steps from 0 or 1 upward.")));

	SPI_connect();
	if (charge_fitting(account, job_id, tokens, has_step, step, now, &c))
		c.charged = tokens;
	else
		charge_locked(account, job_id, tokens, has_step, step, now, &c);
	SPI_finish();

	values[0] = Int64GetDatum(c.charged);
	values[1] = BoolGetDatum(c.capped);
	values[2] = Int64GetDatum(c.room);
	values[3] = CStringGetTextDatum(c.status);
	em_return_row(fcinfo, values, rnulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_heartbeat(account, job_id) RETURNS timestamptz
 *	  The new lease end, or NULL when the job is no longer running.
 * ---------------------------------------------------------------------
 */
static EmStatement heartbeat_job = {
	"UPDATE earmark.job SET lease_until = " LEASE_FROM("$3") " "
	"WHERE account = $1 AND job_id = $2 AND " JOB_OPEN " AND lease_until >= $3 "
	"RETURNING lease_until",
	3, {TEXTOID, INT8OID, TIMESTAMPTZOID}
};

/* the job as heartbeat_job left it: gone, closed, dead, or kept by a trigger */
static EmStatement job_lease = {
	"SELECT status, lease_until FROM earmark.job WHERE account = $1 AND job_id = $2",
	2, {TEXTOID, INT8OID}
};

/*
 * heartbeat_job from C on a single node (direct.c), as job_charge is for
 * the charge: its WHERE clause tested in heartbeat_fit on the version the
 * UPDATE would update (the newest after a concurrent update, under READ
 * COMMITTED), its SET clause computed there.  A planned statement would
 * read a small job table whole, which under SERIALIZABLE is a predicate
 * lock on every account's jobs (sql/serializable_reads.sql).
 */
static EmDirect job_heartbeat = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 3, .cols = {"lease_until", "status", "lease"},
	.nwrite = 1, .types = {TIMESTAMPTZOID, TEXTOID, INTERVALOID}
};

typedef struct HeartbeatFit
{
	TimestampTz now;
	TimestampTz lease_until;	/* the new lease end */
} HeartbeatFit;

static bool
heartbeat_fit(Datum *v, bool *n, void *arg)
{
	HeartbeatFit *h = (HeartbeatFit *) arg;
	TimestampTz lease_until = DatumGetTimestampTz(v[0]);
	TimestampTz renewed;

	if (!(text_is(v[1], "running") || text_is(v[1], "capped")) || lease_until < h->now)
		return false;
	renewed = em_plus_utc(h->now, DatumGetIntervalP(v[2]));
	h->lease_until = Max(lease_until, renewed);
	v[0] = TimestampTzGetDatum(h->lease_until);
	return true;
}

/*
 * The row of (account, key) by d's index from C, in the snapshot the SQL
 * statement would take; its columns into v and n.  False when none is
 * visible.
 */
static bool
row_of_key(EmDirect *d, text *account, int64 key, Datum *v, bool *n)
{
	Snapshot	snap = em_direct_statement_snapshot(&d->table, 1);
	Datum		keys[2];
	bool		found;

	keys[0] = PointerGetDatum(account);
	keys[1] = Int64GetDatum(key);
	found = em_direct_get(d, keys, snap, v, n);
	em_direct_release(snap);
	return found;
}

/* whether the job exists, in the statement's snapshot, by index from C */
static bool
job_found_direct(text *account, int64 job_id)
{
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];

	return row_of_key(&job_heartbeat, account, job_id, v, n);
}

/*
 * The lease renewed: from C on a single node, else heartbeat_job; false
 * when the job is not open or its lease has passed (an unknown job is an
 * error).
 */
static bool
heartbeat_write(text *account, int64 job_id, TimestampTz now,
				TimestampTz *lease_until)
{
	HeartbeatFit fit = {now, 0};
	EmDirectWrite w = job_write_direct(&job_heartbeat, account, job_id, heartbeat_fit, &fit);
	Datum		args[3];
	bool		isnull;

	if (w == EM_DIRECT_WRITTEN)
		*lease_until = fit.lease_until;
	if (w == EM_DIRECT_NO_ROW && !job_found_direct(account, job_id))
		unknown_job(account, job_id);
	if (w != EM_DIRECT_UNWRITABLE)
		return w == EM_DIRECT_WRITTEN;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	args[2] = TimestampTzGetDatum(now);
	em_exec(&heartbeat_job, args, NULL, 1);
	if (SPI_processed == 1)
	{
		*lease_until = DatumGetTimestampTz(em_get(0, 1, &isnull));
		return true;
	}
	em_exec(&job_lease, args, NULL, 1);
	if (SPI_processed == 0)
		unknown_job(account, job_id);
	/*
	 * Open and alive, yet not written: an operator's trigger or rule kept
	 * the row (a job never opens again, and only a write renews a lease).
	 */
	if (is_open(TextDatumGetCString(em_get(0, 1, &isnull))) &&
		DatumGetTimestampTz(em_get(0, 2, &isnull)) >= now)
		job_write_kept(account, job_id, "heartbeat",
					   "The job is open and its lease has not passed, and its update wrote no row.");
	return false;
}

static Datum heartbeat_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_heartbeat(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, heartbeat_body);
}

static Datum
heartbeat_body(PG_FUNCTION_ARGS)
{
	text	   *account;
	int64		job_id;
	TimestampTz result = 0;
	bool		found;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	job_id = em_arg_int64(fcinfo, 1, "job_id");

	SPI_connect();
	found = heartbeat_write(account, job_id, GetCurrentTimestamp(), &result);
	SPI_finish();

	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(result);
}

/* ---------------------------------------------------------------------
 * earmark_settle(account, job_id, used, outcome)
 *	  RETURNS TABLE (charged, released, status)
 * ---------------------------------------------------------------------
 */

/*
 * A settlement: the job, the budget (or a slot), its ledger row and the
 * cycle's meter mark, one single-table statement after another, each
 * naming the account, so that on Citus each runs on the account's shard
 * alone (a statement of several writes is planned in steps whose
 * intermediate results go to every node).  The job row is written, and
 * so locked, first (settle_job, below), then the budget: the ledger row and the mark
 * come only after its update, whose lock they depend on; a mark inserted
 * before the budget lock was granted would be held, uncommitted, while
 * waiting for it (a deadlock with any holder of the budget row that
 * settles too).  The ledger row is written only when the budget (or
 * slot) row was, and the mark only when the ledger row was.
 *
 * A hold taken from an escrow slot settles into whichever slot of the
 * budget is free and of the generation the hold was taken in (held to
 * used, the rest to room; the first free one from a random start, as
 * escrow.c's fast path searches), so that it never queues behind the
 * admissions using the slot it came from; when no such slot is free it
 * settles into the budget row, as an expiry does.  Either way no slot's
 * allocation (room + held + used) changes, which is what the limit's
 * books rest on (escrow.c); a row's own held may go below zero, only the
 * sums count.  The generation matters: slots are cut again in a new
 * generation when the allocations no longer fit the limit less the usage
 * recorded against it, and the new cut counts the old holds as taken; a hold of the old
 * generation released into a slot of the new one would add room the new
 * cut never gave, while the budget may be over its new limit (in the
 * budget row, the release only lowers held, and a rebalance hands it out
 * again only if the limit has room).
 */

/* a free slot of the hold's generation ($4), from $3 up, or below $3 */
static EmStatement settle_slot_from = {
	"SELECT slot FROM earmark.budget_slot WHERE account = $1 AND budget_id = $2 "
	"   AND slot >= $3 AND gen = $4 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
	4, {TEXTOID, INT8OID, INT4OID, INT8OID}
};

static EmStatement settle_slot_below = {
	"SELECT slot FROM earmark.budget_slot WHERE account = $1 AND budget_id = $2 "
	"   AND slot < $3 AND gen = $4 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
	4, {TEXTOID, INT8OID, INT4OID, INT8OID}
};

static EmStatement budget_slot_count = {
	"SELECT slots FROM earmark.budget WHERE account = $1 AND budget_id = $2",
	2, {TEXTOID, INT8OID}
};

typedef struct Settle
{
	int64		charged;
	int64		released;
	const char *status;
} Settle;

/* the terms of a settle (its arguments and the clock), and what settle_fit found */
typedef struct SettleFit
{
	TimestampTz now;
	const char *outcome;
	bool		has_used;
	int64		used;
	bool		slot_first;		/* leave a slot job alone (settle_job's $6) */
	bool		slot_job;		/* and it was one: only j is filled */
	Job			j;				/* RETURNING's budget_id, amount, slot, gen */
	Settle		s;				/* and its status, charged, released */
} SettleFit;

/*
 * settle_job's SET clause for an open job whose lease ends at lease_until,
 * with use recorded and hold amount: a lease that has passed settles as
 * the sweeper would, at the recorded use; otherwise at f->used, or at the
 * recorded use without one; never more than the hold.
 */
static void
settlement_of(const SettleFit *f, TimestampTz lease_until, int64 used,
			  int64 amount, Settle *s)
{
	bool		dead = lease_until < f->now;
	int64		charged = (dead || !f->has_used) ? used : f->used;

	charged = Min(charged, amount);
	s->status = status_const(dead ? "expired" : f->outcome);
	s->charged = charged;
	s->released = amount - charged;
}

/*
 * A slot job's row, then (no free slot) its budget row, locked before the
 * job's write (settle_target): from C on a single node, else SQL.
 */
static EmDirect job_lock = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 4, .cols = {"status", "lease_until", "used", "amount"}
};

static EmStatement lock_job_status = {
	"SELECT status, lease_until, used, amount FROM earmark.job "
	"WHERE account = $1 AND job_id = $2 FOR UPDATE",
	2, {TEXTOID, INT8OID}
};

static EmDirect budget_lock = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"held"}
};

static EmStatement lock_budget_row = {
	"SELECT held FROM earmark.budget WHERE account = $1 AND budget_id = $2 FOR UPDATE",
	2, {TEXTOID, INT8OID}
};

/* the budget's slot count, read by index from C on a single node */
static EmDirect budget_slots = {
	.table = "budget", .nkeys = 2, .keys = {"account", "budget_id"},
	.ncols = 1, .cols = {"slots"}
};

/* settle_find_slot by index from C (direct.c, escrow.c) */
static int32
settle_find_slot_direct(text *account, Job *j)
{
	EmSlotWant	w = {j->gen, false, 0, 0, 0};
	Datum		v[1];
	bool		n[1];
	int			slots = 0;

	if (row_of_key(&budget_slots, account, j->budget_id, v, n))
		slots = DatumGetInt32(v[0]);
	return em_escrow_lock_slot(account, j->budget_id, em_random_slot(slots), &w);
}

/*
 * Lock a free slot of the hold's generation for its release, searching
 * from a random start as escrow.c's fast path does; -1 when none is free.
 * Through SQL on Citus.
 */
static int32
settle_find_slot(text *account, Job *j)
{
	Datum		args[4];

	if (!em_distributed())
		return settle_find_slot_direct(account, j);
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(j->budget_id);
	em_exec(&budget_slot_count, args, NULL, 1);
	args[2] = Int32GetDatum(em_random_slot(SPI_processed == 1 ?
										   (int) em_get_int64(0, 1, 0) : 0));
	args[3] = Int64GetDatum(j->gen);
	em_exec(&settle_slot_from, args, NULL, 1);
	if (SPI_processed == 0)
		em_exec(&settle_slot_below, args, NULL, 1);
	return SPI_processed == 1 ? (int32) em_get_int64(0, 1, -1) : -1;
}

/*
 * The row of (account, key) locked FOR UPDATE as SELECT ... FOR UPDATE
 * locks it (the newest version under READ COMMITTED), its columns d->cols
 * (sql's, in the same order) into v and n.  False when there is no such
 * row.
 */
static bool
lock_row(EmDirect *d, EmStatement *sql, text *account, int64 key, Datum *v,
		 bool *n)
{
	Datum		args[2];
	int			i;

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(key);
	if (!em_distributed())
		return em_direct_lock(d, args, v, n);
	em_exec(sql, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	for (i = 0; i < d->ncols; i++)
		v[i] = em_get(0, i + 1, &n[i]);
	return true;
}

/*
 * A job taken from a slot, before its row is written: the job row locked,
 * then where its hold will go back, a free slot of its generation (locked,
 * never waited for), else the budget row.  Both before the job row's
 * write: a reserve that holds the budget row and inserts a job with this
 * job's key waits in the key's unique check for any transaction that
 * wrote this job's row, and a settle that had written it and then waited
 * for the budget row would deadlock with that reserve (isolation spec
 * escrow_key_vs_settle).  A lock is not a write: the unique check does not
 * wait for it.  The job row is locked first, so that a settle that waits
 * for a job row held by a long application transaction holds no slot and
 * no budget row meanwhile (review_settle_parks_slot), and one that finds
 * the job closed locks nothing more (review_settle_noop_budget_lock).
 *
 * Into a slot, a settlement that charges also marks the cycle here, before
 * the job row's write.  While meter_mark had a unique key, the mark's
 * insert waited for a transaction that had inserted the mark and was still
 * open, such as a slow-path reserve that expired a dead hold with use,
 * which may be the reserve of this job's key
 * (review_slot_settle_mark_deadlock); a mark's insert waits for nobody
 * now (budget.c), and the order is kept because it costs nothing.  (Into
 * the budget row the mark comes after, as for any job.)
 *
 * False, with the status in *s, when the locked job is not open; else
 * *slot is the slot, or -1 for the budget row, and *marked says whether
 * the cycle was marked.
 */
static bool
settle_target(text *account, int64 job_id, const SettleFit *f, Job *j,
			  Settle *s, int32 *slot, bool *marked)
{
	Datum		v[4];
	bool		n[4];
	Settle		ahead;

	*marked = false;
	if (!lock_row(&job_lock, &lock_job_status, account, job_id, v, n))
		unknown_job(account, job_id);
	s->status = status_const(TextDatumGetCString(v[0]));
	if (!is_open(s->status))
		return false;
	*slot = settle_find_slot(account, j);
	if (*slot < 0)
	{
		(void) lock_row(&budget_lock, &lock_budget_row, account, j->budget_id, v, n);
		return true;
	}
	settlement_of(f, DatumGetTimestampTz(v[1]), DatumGetInt64(v[2]),
				  DatumGetInt64(v[3]), &ahead);
	if (ahead.charged > 0)
	{
		em_mark_lock(j->budget_id); /* see budget.c */
		em_mark_cycle(account, j->budget_id);
		*marked = true;
	}
	return true;
}

/*
 * The hold's release into the slot settle_target locked, else into the
 * budget row; whether a row was written.
 */
static bool
settle_release(text *account, Job *j, Settle *s, int32 slot)
{
	/* into the slot: held to used, the rest back to room */
	if (slot >= 0)
		return em_escrow_slot_move(account, j->budget_id, slot,
								   j->amount - s->charged, -j->amount, s->charged);
	/* by budget_pkey from C on a single node, budget.c's release_budget elsewhere */
	return em_budget_release(account, j->budget_id, j->amount, s->charged);
}

/*
 * What follows from a settlement written by settle_job (the job row is
 * locked): the release into the budget or the slot settle_target locked
 * (-1: the budget row), and the cycle's mark, unless settle_target made it
 * (marked).
 * The job row settle_job wrote (charged, budget_id, settled_at) is the
 * ledger entry itself: no ledger row is inserted (earmark.sql, the view
 * earmark.ledger).  A hold in the budget row on a single node settles in one
 * statement (em_entry_settle_local, entries.c: a statement fewer); not
 * on Citus, which plans a statement of several writes in steps whose
 * intermediate results go to every node: there the statements run one
 * after another; nor under SERIALIZABLE (below).
 */
static void
write_settlement(text *account, Job *j, Settle *s, int32 slot, bool marked)
{
	bool		wrote_budget;

	if (s->charged > 0 && !marked)
		em_mark_lock(j->budget_id); /* see budget.c */
	if (!(j->has_slot && j->has_gen) && !em_distributed())
	{
		/* a cycle marked already needs the release only (budget.c) */
		if (s->charged <= 0 || em_mark_seen(account, j->budget_id))
			em_budget_release(account, j->budget_id, j->amount, s->charged);
		else if (!IsolationIsSerializable())
			em_entry_settle_local(account, j->budget_id, j->amount, s->charged);
		else
		{
			/*
			 * The planned statement finds the budget row by the planner's
			 * choice: on a small table a sequential scan, whose predicate
			 * lock is the whole table, on a larger one budget_order, whose
			 * leaves cycles made together share; two accounts' first
			 * charged settles of a cycle would fail each other.  The
			 * release reads by budget_pkey from C (unless direct.c must
			 * leave the row to the SQL: a trigger, a rule, row security on
			 * earmark.budget); no mark for a row that was not written.
			 */
			if (em_budget_release(account, j->budget_id, j->amount, s->charged))
				em_mark_cycle(account, j->budget_id);
		}
		return;
	}
	wrote_budget = settle_release(account, j, s, slot);
	if (s->charged <= 0 || !wrote_budget || marked)
		return;

	em_mark_cycle(account, j->budget_id);
}

/*
 * The job's settlement in one UPDATE, which takes the row lock itself
 * instead of a locking read and an update (a statement and a WAL record
 * fewer): the status, the charge and the release are computed from the
 * row as the lock finds it.  A lease that has passed settles as the
 * sweeper would, at the recorded use; otherwise at $5, or at the recorded
 * use when $5 is NULL; never more than the hold.  Under READ COMMITTED an
 * UPDATE that waited for a concurrent charge, settle or expiry re-checks
 * its conditions on the row that transaction left (and computes from it):
 * a job settled meanwhile matches nothing, and settle_closed answers.
 * RETURNING gives the new row's numbers and what the release needs.  $6
 * leaves a job taken from a slot alone until its release's target is
 * locked (settle_target).
 */
static EmStatement settle_job = {
	"UPDATE earmark.job SET "
	"       status = CASE WHEN lease_until < $3 THEN 'expired' ELSE $4 END, "
	"       settled_at = $3, "
	"       charged = LEAST(CASE WHEN lease_until < $3 OR $5 IS NULL THEN used ELSE $5 END, amount), "
	"       released = amount - LEAST(CASE WHEN lease_until < $3 OR $5 IS NULL THEN used ELSE $5 END, amount) "
	"WHERE account = $1 AND job_id = $2 AND " JOB_OPEN " "
	"  AND NOT ($6 AND slot IS NOT NULL AND gen IS NOT NULL) "
	"RETURNING budget_id, amount, status, charged, released, slot, gen",
	6, {TEXTOID, INT8OID, TIMESTAMPTZOID, TEXTOID, INT8OID, BOOLOID}
};
enum
{
	SJ_BUDGET_ID = 1, SJ_AMOUNT, SJ_STATUS, SJ_CHARGED, SJ_RELEASED, SJ_SLOT, SJ_GEN
};

/*
 * A job settle_job did not match: settled already, unknown, or (when $6
 * kept it from matching) open and taken from a slot.
 */
static EmStatement job_status = {
	"SELECT status, budget_id, amount, slot, gen FROM earmark.job "
	"WHERE account = $1 AND job_id = $2",
	2, {TEXTOID, INT8OID}
};

/*
 * settle_job from C on a single node (direct.c): its WHERE clause (the job
 * open) is tested in settle_fit on the version the UPDATE would update
 * (and on the newest one after a concurrent update), its SET clause
 * computed there, and what its RETURNING gives is kept.  The first four
 * columns are written.
 */
static EmDirect job_settle = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 10, .cols = {"status", "settled_at", "charged", "released", "lease_until",
	"used", "amount", "budget_id", "slot", "gen"},
	.nwrite = 4, .types = {TEXTOID, TIMESTAMPTZOID, INT8OID, INT8OID, TIMESTAMPTZOID,
	INT8OID, INT8OID, INT8OID, INT4OID, INT8OID},
	.nullok = {[1] = true, [2] = true, [3] = true, [8] = true, [9] = true}
};


static bool
settle_fit(Datum *v, bool *n, void *arg)
{
	SettleFit  *f = (SettleFit *) arg;
	int64		amount = DatumGetInt64(v[6]);

	if (!text_is(v[0], "running") && !text_is(v[0], "capped"))
		return false;
	memset(&f->j, 0, sizeof(Job));
	f->j.budget_id = DatumGetInt64(v[7]);
	f->j.amount = amount;
	f->j.has_slot = !n[8];
	f->j.has_gen = !n[9];
	f->j.gen = n[9] ? 0 : DatumGetInt64(v[9]);
	f->slot_job = f->slot_first && f->j.has_slot && f->j.has_gen;
	if (f->slot_job)
		return false;
	settlement_of(f, DatumGetTimestampTz(v[4]), DatumGetInt64(v[5]), amount, &f->s);
	v[0] = CStringGetTextDatum(f->s.status);
	v[1] = TimestampTzGetDatum(f->now);
	v[2] = Int64GetDatum(f->s.charged);
	v[3] = Int64GetDatum(f->s.released);
	n[0] = n[1] = n[2] = n[3] = false;
	return true;
}

/* settle_job's RETURNING row into *j and *s */
static void
settled_from_spi(Job *j, Settle *s)
{
	bool		isnull;

	memset(j, 0, sizeof(Job));
	j->budget_id = em_get_int64(0, SJ_BUDGET_ID, 0);
	j->amount = em_get_int64(0, SJ_AMOUNT, 0);
	s->status = status_const(TextDatumGetCString(em_get(0, SJ_STATUS, &isnull)));
	s->charged = em_get_int64(0, SJ_CHARGED, 0);
	s->released = em_get_int64(0, SJ_RELEASED, 0);
	job_slot_from_spi(j, SJ_SLOT, SJ_GEN);
}

/* what settle_write did */
typedef enum SettleWrite
{
	SW_WRITTEN,					/* the job row settled: *j and *s filled */
	SW_UNMATCHED,				/* nothing matched: settle_job_now looks */
	SW_SLOT_FIRST				/* an open slot job left alone: *j filled */
} SettleWrite;

/*
 * The job's settlement in one write: from C on a single node, else
 * settle_job.  With slot_first, a job taken from a slot is not written
 * (settle_target first).
 */
static SettleWrite
settle_write(text *account, int64 job_id, SettleFit *fit, Job *j, Settle *s)
{
	EmDirectWrite w;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	fit->slot_job = false;
	w = job_write_direct(&job_settle, account, job_id, settle_fit, fit);
	if (w == EM_DIRECT_WRITTEN || fit->slot_job)
	{
		*j = fit->j;
		*s = fit->s;
		return fit->slot_job ? SW_SLOT_FIRST : SW_WRITTEN;
	}
	if (w != EM_DIRECT_UNWRITABLE)
		return SW_UNMATCHED;
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	args[2] = TimestampTzGetDatum(fit->now);
	args[3] = CStringGetTextDatum(fit->outcome);
	args[4] = Int64GetDatum(fit->used);
	nulls[4] = fit->has_used ? ' ' : 'n';
	args[5] = BoolGetDatum(fit->slot_first);
	em_exec(&settle_job, args, nulls, 1);
	if (SPI_processed != 1)
		return SW_UNMATCHED;
	settled_from_spi(j, s);
	return SW_WRITTEN;
}

/*
 * job_status by index from C on a single node, in the snapshot the SQL
 * would take (a planned statement would read a small job table whole,
 * which under SERIALIZABLE is a predicate lock on every account's jobs).
 */
static EmDirect job_state = {
	.table = "job", .nkeys = 2, .keys = {"account", "job_id"},
	.ncols = 5, .cols = {"status", "budget_id", "amount", "slot", "gen"}
};

static bool
settle_unmatched_direct(text *account, int64 job_id, Job *j, Settle *s)
{
	Datum		v[EM_DIRECT_MAX_COLS];
	bool		n[EM_DIRECT_MAX_COLS];

	if (!row_of_key(&job_state, account, job_id, v, n))
		unknown_job(account, job_id);
	s->status = status_const(TextDatumGetCString(v[0]));
	if (!is_open(s->status))
		return false;
	memset(j, 0, sizeof(Job));
	j->budget_id = DatumGetInt64(v[1]);
	j->amount = DatumGetInt64(v[2]);
	j->has_slot = !n[3];
	j->has_gen = !n[4];
	j->gen = n[4] ? 0 : DatumGetInt64(v[4]);
	return true;
}

/*
 * A job settle_write did not match, read (job_status): false, with its
 * status in *s, when it is closed; true when it is open, and then *j says
 * whether it was taken from a slot.
 */
static bool
settle_unmatched(text *account, int64 job_id, Job *j, Settle *s)
{
	Datum		args[2];
	bool		isnull;

	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(job_id);
	if (!em_distributed())
		return settle_unmatched_direct(account, job_id, j, s);
	em_exec(&job_status, args, NULL, 1);
	if (SPI_processed == 0)
		unknown_job(account, job_id);
	s->status = status_const(TextDatumGetCString(em_get(0, 1, &isnull)));
	if (!is_open(s->status))
		return false;
	memset(j, 0, sizeof(Job));
	j->budget_id = em_get_int64(0, 2, 0);
	j->amount = em_get_int64(0, 3, 0);
	job_slot_from_spi(j, 4, 5);
	return true;
}

/*
 * Settle the job (settle_write) and write what follows from it; *s is the
 * answer.  A job found closed answers its status, charging and releasing
 * nothing.  A job taken from a slot gets its release's target locked
 * first (settle_target), then is written.  (Its status never goes back to
 * open; the loop only covers a job that a concurrent reserve committed
 * between the two statements, under an id the caller cannot have been
 * given yet, and the slot job's second write.)
 */
static void
settle_job_now(text *account, int64 job_id, bool has_used, int64 used,
			   const char *outcome, TimestampTz now, Settle *s)
{
	SettleFit	fit = {now, outcome, has_used, used, true};
	int32		slot = -1;
	bool		marked = false;
	Job			j;
	SettleWrite w;
	int			passes = 0;

	while ((w = settle_write(account, job_id, &fit, &j, s)) != SW_WRITTEN)
	{
		if (w == SW_UNMATCHED && !settle_unmatched(account, job_id, &j, s))
			return;
		/* at most: not yet visible, then a slot job's target, then written */
		if (++passes > 3)
			job_write_kept(account, job_id, "settlement",
						   "The job is open, and its update wrote no row.");
		if (fit.slot_first && j.has_slot && j.has_gen)
		{
			if (!settle_target(account, job_id, &fit, &j, s, &slot, &marked))
				return;
			fit.slot_first = false;
		}
	}
	write_settlement(account, &j, s, slot, marked);
}

static Datum settle_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_settle(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, settle_body);
}

static Datum
settle_body(PG_FUNCTION_ARGS)
{
	text	   *account;
	int64		job_id;
	bool		has_used;
	int64		used_arg;
	char	   *outcome;
	TimestampTz now = GetCurrentTimestamp();
	Settle		s = {0, 0, NULL};
	Datum		values[3];
	bool		rnulls[3] = {false, false, false};

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	job_id = em_arg_int64(fcinfo, 1, "job_id");
	has_used = !PG_ARGISNULL(2);
	used_arg = has_used ? PG_GETARG_INT64(2) : 0;
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outcome must not be NULL")));
	outcome = text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (strcmp(outcome, "completed") != 0 && strcmp(outcome, "failed") != 0 &&
		strcmp(outcome, "cancelled") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown outcome \"%s\"", outcome),
				 errhint("Use 'completed', 'failed' or 'cancelled'.")));
	if (has_used && used_arg < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("used must not be negative"),
				 errdetail("The value given was " INT64_FORMAT ".", used_arg)));
	em_require_account_local(account);

	SPI_connect();
	settle_job_now(account, job_id, has_used, used_arg, outcome, now, &s);
	SPI_finish();

	values[0] = Int64GetDatum(s.charged);
	values[1] = Int64GetDatum(s.released);
	values[2] = CStringGetTextDatum(s.status);
	em_return_row(fcinfo, values, rnulls);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * earmark_sweep(max_jobs) RETURNS int
 * ---------------------------------------------------------------------
 */

/*
 * The budgets with dead holds, the longest dead first.  Only budgets that
 * still have their row: a deleted account's budget rows go with it (ON
 * DELETE CASCADE) and its job rows stay (no foreign keys on the hot
 * tables), and such a hold, never swept, would stay the longest dead and
 * take a place in the LIMIT at every pass; with max_jobs of them (the
 * worker's SWEEP_BATCH) no live budget would be swept again
 * (sql/review_sweep_orphans.sql).  On a single node the budget row is
 * joined once a budget, after the grouping: a MATERIALIZED CTE keeps the
 * planner from joining every dead hold to it, which made a sweep of
 * 100,000 dead holds 1.13 to 1.18 times slower in two A/B runs
 * ((account, budget_id) is the budget's primary key: one row a budget).
 * On Citus a CTE is planned on its own, over every node (a delegated
 * sweep_account then needs every node up), so there each dead hold is
 * matched to its row (DEAD_BUDGETS_DISTRIBUTED).
 */
/* the columns of expired_budgets */
enum
{
	EB_ACCOUNT = 1, EB_BUDGET_ID
};

#define DEAD_BUDGETS(where) \
	"WITH d AS MATERIALIZED (" \
	"  SELECT account, budget_id, pg_catalog.min(lease_until) AS dead_since FROM earmark.job " \
	"   WHERE status IN ('running', 'capped') AND " where " GROUP BY account, budget_id) " \
	"SELECT d.account, d.budget_id FROM d JOIN earmark.budget b " \
	"    ON b.account = d.account AND b.budget_id = d.budget_id " \
	" ORDER BY d.dead_since"
#define DEAD_BUDGETS_DISTRIBUTED(where) \
	"SELECT j.account, j.budget_id FROM earmark.job j " \
	" WHERE j.status IN ('running', 'capped') AND " where \
	"   AND EXISTS (SELECT 1 FROM earmark.budget b " \
	"                WHERE b.account = j.account AND b.budget_id = j.budget_id) " \
	" GROUP BY j.account, j.budget_id ORDER BY pg_catalog.min(j.lease_until)"

static EmStatement expired_budgets = {
	DEAD_BUDGETS("lease_until < $1") " LIMIT $2",
	2, {TIMESTAMPTZOID, INT4OID}
};

static EmStatement expired_budgets_distributed = {
	DEAD_BUDGETS_DISTRIBUTED("j.lease_until < $1") " LIMIT $2",
	2, {TIMESTAMPTZOID, INT4OID}
};

static EmStatement lock_budget_skip = {
	"SELECT 1 FROM earmark.budget WHERE account = $1 AND budget_id = $2 FOR UPDATE SKIP LOCKED",
	2, {TEXTOID, INT8OID}
};

/*
 * The budget row a sweep expires into, locked; false when it is gone or
 * (!wait) another transaction holds it.  Under REPEATABLE READ a row
 * changed after the snapshot fails with 40001, as the SQL statement does;
 * with wait (lock_row, em_direct_lock) also a row the snapshot does not
 * see but the latest one does (check_unseen: the table rewritten after
 * the snapshot), where the statement found no row (isolation spec
 * review_sweep_skip_lock).  Without waiting, from C on a
 * single node (direct.c, em_direct_lock_skip_all): the executor's FOR
 * UPDATE SKIP LOCKED waits for a transaction that holds the row's newest
 * version when the version its scan found was being updated by one that
 * ended meanwhile (direct.c, lock_or_skip), and a sweep holds the budget
 * rows it swept before; such a holder that then reserves on one of them
 * deadlocked with the sweep (test/integration/review_slot_skip_chain.sh,
 * its sweep case).  The statement remains on Citus, and where the key
 * index may not be read (-1: made again over a HOT chain while an older
 * transaction runs, indcheckxmin), and so does that wait there.
 */
static bool
lock_sweep_budget(text *account, int64 budget_id, bool wait)
{
	Datum		args[2];
	Datum		v[1];
	bool		n[1];
	int			got;

	if (wait)
		return lock_row(&budget_lock, &lock_budget_row, account, budget_id, v, n);
	args[0] = PointerGetDatum(account);
	args[1] = Int64GetDatum(budget_id);
	if (!em_distributed())
	{
		got = em_direct_lock_skip_all(&budget_lock, args, em_direct_any_row, NULL, 1,
									  em_direct_any_row, NULL);
		if (got >= 0)
			return got > 0;
	}
	em_exec(&lock_budget_skip, args, NULL, 1);
	return SPI_processed == 1;
}

/*
 * Expire up to max dead holds of one budget; 0 when its row (with wait:
 * false, or its mark lock) is held by another session.
 */
static int
sweep_budget(text *account, int64 budget_id, TimestampTz now, int max, bool wait)
{
	int64		released;
	int64		charged;
	int64		n;

	if (!lock_sweep_budget(account, budget_id, wait))
		return 0;
	n = em_budget_expire(account, budget_id, now, max, wait, &released, &charged);
	if (n > 0)
		em_budget_release(account, budget_id, released, charged);
	return (int) n;
}

/* one account's budgets with dead holds, the longest dead first */
static EmStatement expired_budgets_of = {
	DEAD_BUDGETS("account = $1 AND lease_until < $2") " LIMIT $3",
	3, {TEXTOID, TIMESTAMPTZOID, INT4OID}
};

static EmStatement expired_budgets_of_distributed = {
	DEAD_BUDGETS_DISTRIBUTED("j.account = $1 AND j.lease_until < $2") " LIMIT $3",
	3, {TEXTOID, TIMESTAMPTZOID, INT4OID}
};

/* on a distributed install: the account's sweep, on the account's node */
static EmStatement call_sweep_account = {
	"SELECT earmark.sweep_account($1, $2)",
	2, {TEXTOID, INT4OID}
};

/*
 * The dead holds of one account, up to max, never waiting for a budget row
 * or a mark lock: the worker's step per account.
 */
static int
sweep_account(text *account, TimestampTz now, int max)
{
	Datum		args[3];
	int64	   *budgets;
	int			nbudgets;
	int			i;
	int			done = 0;

	args[0] = PointerGetDatum(account);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int32GetDatum(max);
	em_exec(em_distributed() ? &expired_budgets_of_distributed : &expired_budgets_of,
			args, NULL, 0);
	nbudgets = (int) SPI_processed;
	budgets = palloc(sizeof(int64) * Max(nbudgets, 1));
	for (i = 0; i < nbudgets; i++)
		budgets[i] = em_get_int64(i, EB_BUDGET_ID, 0);
	for (i = 0; i < nbudgets && done < max; i++)
		done += sweep_budget(account, budgets[i], now, max - done, false);
	return done;
}

/*
 * earmark.sweep_account(account, max_jobs): one account's dead holds, for
 * the worker on a distributed install, which calls it on its own so that
 * Citus runs it on the account's node.
 */
Datum
earmark_sweep_account(PG_FUNCTION_ARGS)
{
	text	   *account;
	int32		max_jobs;
	int			n;

	em_require_schema();
	account = em_arg_name(fcinfo, 0, "account");
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_jobs must not be NULL")));
	max_jobs = PG_GETARG_INT32(1);
	check_positive(max_jobs, "max_jobs");
	em_require_account_local(account);
	SPI_connect();
	n = sweep_account(account, GetCurrentTimestamp(), max_jobs);
	SPI_finish();
	PG_RETURN_INT32(n);
}

/*
 * On a distributed install the worker sweeps account by account, each
 * account on its node: a call of earmark.sweep_account made on its own,
 * which Citus sends there.
 */
static int
sweep_distributed(text **accounts, int n, int max_jobs)
{
	Datum		args[2];
	int			i;
	int			done = 0;

	for (i = 0; i < n && done < max_jobs; i++)
	{
		if (i > 0 && accounts[i - 1] != NULL &&
			strcmp(text_to_cstring(accounts[i - 1]), text_to_cstring(accounts[i])) == 0)
			continue;
		args[0] = PointerGetDatum(accounts[i]);
		args[1] = Int32GetDatum(max_jobs - done);
		em_exec(&call_sweep_account, args, NULL, 1);
		done += (int) em_get_int64(0, 1, 0);
	}
	return done;
}

/*
 * Settle up to max_jobs holds whose lease has passed, as 'expired' at the
 * use they recorded.  Runs inside the caller's SPI connection.  With
 * wait_first (earmark_sweep) the first budget is waited for; every other
 * one (and with !wait_first, the worker's, every one) is skipped when
 * another session holds it, so a sweep never waits while it holds a
 * budget lock, and the worker never waits at all.
 */
int
em_sweep(int max_jobs, bool wait_first)
{
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[2];
	text	  **accounts;
	int64	   *budgets;
	int			nbudgets;
	int			i;
	int			done = 0;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(max_jobs);
	em_exec(em_distributed() ? &expired_budgets_distributed : &expired_budgets, args, NULL, 0);
	nbudgets = (int) SPI_processed;
	accounts = palloc(sizeof(text *) * Max(nbudgets, 1));
	budgets = palloc(sizeof(int64) * Max(nbudgets, 1));
	for (i = 0; i < nbudgets; i++)
	{
		bool		isnull;

		accounts[i] = DatumGetTextPCopy(em_get(i, EB_ACCOUNT, &isnull));
		budgets[i] = em_get_int64(i, EB_BUDGET_ID, 0);
	}
	if (em_distributed())
		return sweep_distributed(accounts, nbudgets, max_jobs);
	for (i = 0; i < nbudgets && done < max_jobs; i++)
		done += sweep_budget(accounts[i], budgets[i], now, max_jobs - done,
							 i == 0 && wait_first);
	return done;
}

Datum
earmark_sweep(PG_FUNCTION_ARGS)
{
	int32		max_jobs;
	int			n;

	em_require_schema();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_jobs must not be NULL")));
	max_jobs = PG_GETARG_INT32(0);
	check_positive(max_jobs, "max_jobs");
	if (em_distributed())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("earmark_sweep sweeps one node; earmark is distributed"),
				 errdetail("On a distributed install the background worker on the coordinator sweeps every account on its node."),
				 errhint("To sweep one account now, call SELECT earmark.sweep_account(account, max_jobs) on its own.")));

	SPI_connect();
	n = em_sweep(max_jobs, true);
	SPI_finish();
	PG_RETURN_INT32(n);
}

/* ---------------------------------------------------------------------
 * One reserve and one settle for batch.c (earmark_reserve_many,
 * earmark_settle_many): the single calls' work between SPI_connect and
 * SPI_finish, on arguments batch.c has checked as the single calls do.
 * ---------------------------------------------------------------------
 */
void
em_reserve_one(text *account, int64 amount, text *key, text *feature,
			   Interval *lease, TimestampTz now, EmReserveAnswer *out)
{
	Reserve		r;
	Admission	result;

	memset(&r, 0, sizeof(r));
	memset(&result, 0, sizeof(result));
	r.h.account = account;
	r.h.amount = amount;
	r.h.key = key;
	r.h.feature = feature;
	r.h.now = now;
	r.h.lease = lease;
	r.h.lease_until = em_plus_utc(now, lease);
	r.result = &result;
	reserve_counted(&r);
	if (result.want_limits)
		em_want_limits(account);
	out->admitted = result.admitted;
	out->job_id = result.job_id;
	out->unlimited = result.unlimited;
	out->remaining = result.remaining;
	out->has_reason = result.reason != NULL;
	strlcpy(out->reason, result.reason ? result.reason : "", sizeof(out->reason));
}

void
em_settle_one(text *account, int64 job_id, bool has_used, int64 used,
			  const char *outcome, TimestampTz now, EmSettleAnswer *out)
{
	Settle		s = {0, 0, NULL};

	settle_job_now(account, job_id, has_used, used, outcome, now, &s);
	out->charged = s.charged;
	out->released = s.released;
	out->status = s.status;
}
