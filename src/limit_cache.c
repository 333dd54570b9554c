/*-------------------------------------------------------------------------
 *
 * limit_cache.c
 *	  The limit cache: limits read from the provider (kinde or http), how
 *	  old they may be, and their refresh.  A provider's limit is used as it
 *	  is for earmark.limit_fresh (60 s); older, it is still used up to
 *	  earmark.limit_stale (10 min) while the admission asks the worker to
 *	  read it again; older still, admissions are refused with "limit
 *	  unknown" until a read succeeds (fail closed).  Reserve never waits on
 *	  HTTP: it only sets earmark.account.limits_wanted_at.  Manual limits
 *	  (earmark_set_limit) never age.
 *
 *	  The worker reads in three steps, like the reporter: which accounts
 *	  (a transaction), the provider's answer (no transaction: the worker
 *	  keeps sweeping between polls), then the account's limits or its
 *	  failure are stored (a transaction per account).  A failed read, a
 *	  hostile answer included, is recorded on the account (limits_tried_at,
 *	  limits_error), so the next pass moves on to the others.
 *	  earmark_refresh_limits runs the same steps in the caller's
 *	  transaction.
 *
 *	  Tables: earmark.account (limits_* columns) and earmark.account_limit.
 *	  Locks: the account row, updated after a read (or by the flag, which
 *	  reserve sets only where it takes no further lock, or after its budget
 *	  row, the order of gate.c); the HTTP read itself holds no lock.  The
 *	  account's limit rows before its account row, one feature at a time
 *	  in feature order (C), as the built-in plan change takes them.  Before
 *	  those, the account's refresh lock: a transaction-level advisory lock,
 *	  exclusive, that only limit reads take, in a key space no SQL function
 *	  reaches (EARMARK_REFRESH_LOCKTAG, with a 64-bit hash of the account).
 *	  Two reads of one account store one after the other: the second reads
 *	  the provider limits the first stored and drops those its answer
 *	  lacks, so the answer stored last is the account's provider limits
 *	  (the reads themselves are not ordered: an older answer stored later
 *	  wins, until the next read).  Under REPEATABLE READ the second fails
 *	  with 40001 on a row the first wrote (its account row at the latest).
 *	  A transaction that wrote one of the account's limit rows before it
 *	  reads the limits (earmark_set_limit, then earmark_refresh_limits) can
 *	  deadlock with another read of the account that waits for that row.
 *	  The lock is the node's: on Citus the worker stores on the account's
 *	  node through a call of its own (earmark.store_limits), which Citus
 *	  runs there, where earmark_refresh_limits takes the lock too.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "account.h"
#include "cluster.h"
#include "earmark.h"
#include "limit_cache.h"
#include "provider.h"
#include "settings.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_refresh_limits);
PG_FUNCTION_INFO_V1(earmark_store_limits);

/* a failed read is tried again no sooner than this */
#define LIMIT_RETRY_S	Min(earmark_limit_fresh_s, 10)

static EmStatement want_limits = {
	"UPDATE earmark.account SET limits_wanted_at = pg_catalog.now() "
	"WHERE account = $1 AND limits_wanted_at IS NULL",
	1, {TEXTOID}
};

static EmStatement account_customer = {
	"SELECT provider_customer FROM earmark.account WHERE account = $1",
	1, {TEXTOID}
};

static EmStatement store_limit = {
	"INSERT INTO earmark.account_limit AS l (account, feature, lim, source, updated_at) "
	"VALUES ($1, $2, $3, 'provider', pg_catalog.now()) "
	"ON CONFLICT (account, feature) DO UPDATE SET lim = excluded.lim, source = 'provider', "
	"  updated_at = excluded.updated_at "
	"WHERE l.lim IS DISTINCT FROM excluded.lim OR l.source <> 'provider'",
	3, {TEXTOID, TEXTOID, INT8OID}
};

/* the account's provider limits, in the order their rows are written */
static EmStatement provider_features = {
	"SELECT feature FROM earmark.account_limit "
	"WHERE account = $1 AND source = 'provider' ORDER BY feature COLLATE \"C\"",
	1, {TEXTOID}
};

/* a provider limit of a feature the provider no longer lists */
static EmStatement drop_limit = {
	"DELETE FROM earmark.account_limit "
	"WHERE account = $1 AND feature = $2 AND source = 'provider'",
	2, {TEXTOID, TEXTOID}
};

static EmStatement limits_read = {
	"UPDATE earmark.account SET limits_fetched_at = $2, limits_tried_at = $2, "
	"  limits_wanted_at = NULL, limits_error = NULL WHERE account = $1",
	2, {TEXTOID, TIMESTAMPTZOID}
};

static EmStatement limits_failed = {
	"UPDATE earmark.account SET limits_tried_at = $2, limits_error = $3 WHERE account = $1",
	3, {TEXTOID, TIMESTAMPTZOID, TEXTOID}
};

/* the columns of wanted_accounts */
enum
{
	WA_ACCOUNT = 1, WA_CUSTOMER
};

static EmStatement wanted_accounts = {
	"SELECT account, provider_customer FROM earmark.account "
	"WHERE limits_wanted_at IS NOT NULL "
	"  AND (limits_tried_at IS NULL OR limits_tried_at < $1) "
	"ORDER BY limits_wanted_at LIMIT $2",
	2, {TIMESTAMPTZOID, INT4OID}
};

EmLimitAge
em_limit_age(bool has_row, bool provider_row, bool has_fetched,
			 TimestampTz fetched_at, TimestampTz now)
{
	int64		age;

	if (earmark_provider == EM_PROVIDER_LOCAL)
		return has_row ? EM_LIMIT_FRESH : EM_LIMIT_UNKNOWN;
	if (has_row && !provider_row)
		return EM_LIMIT_FRESH;	/* manual */
	if (!has_fetched)
		return EM_LIMIT_UNKNOWN_WANTED;
	age = now - fetched_at;
	if (!has_row)
		/* read, and the provider lists no such feature: ask again later */
		return age > (int64) earmark_limit_fresh_s * USECS_PER_SEC ?
			EM_LIMIT_UNKNOWN_WANTED : EM_LIMIT_UNKNOWN;
	if (age <= (int64) earmark_limit_fresh_s * USECS_PER_SEC)
		return EM_LIMIT_FRESH;
	if (age <= (int64) earmark_limit_stale_s * USECS_PER_SEC)
		return EM_LIMIT_STALE;
	return EM_LIMIT_UNKNOWN_WANTED;
}

void
em_want_limits(text *account)
{
	Datum		arg = PointerGetDatum(account);

	em_exec(&want_limits, &arg, NULL, 0);
}

/* features in byte order: the order every writer of limit rows keeps */
static int
limit_cmp(const ListCell *a, const ListCell *b)
{
	return strcmp(((EmLimit *) lfirst(a))->feature, ((EmLimit *) lfirst(b))->feature);
}

static void
drop_provider_limit(Datum account, const char *feature)
{
	Datum		args[2];

	args[0] = account;
	args[1] = CStringGetTextDatum(feature);
	em_exec(&drop_limit, args, NULL, 0);
}

/* the account's provider limits' features, in feature order (C) */
static char **
stored_provider_features(Datum account, int *n)
{
	char	  **features;
	uint64		i;

	em_exec(&provider_features, &account, NULL, 0);
	features = palloc(sizeof(char *) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
		features[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
	*n = (int) SPI_processed;
	return features;
}

/*
 * The account's refresh lock (see the file header), until the transaction
 * ends: one of the account's own locks (account.c).
 */
static void
refresh_lock(const char *account)
{
	em_account_key_lock(account, (int) strlen(account), EARMARK_REFRESH_LOCKTAG, ExclusiveLock);
}

/*
 * Store the limits read for an account (a List of EmLimit), in the
 * caller's SPI connection: the provider's limits replace the old ones, and
 * the account's read is recorded.  Returns the number of limits.  The rows
 * are written one feature at a time in feature order, a dropped one too,
 * as the plan change writes them: two writers of one account's limit rows
 * in different orders could deadlock.  The stored provider limits are read
 * under the refresh lock: read before another refresh's commit, they would
 * miss a limit it added that this answer lacks, and it would stay.
 */
static int
store_account_limits(const char *account, List *limits)
{
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	ListCell   *lc;
	char	  **old;
	int			nold;
	int			j = 0;

	args[0] = CStringGetTextDatum(account);
	list_sort(limits, limit_cmp);
	refresh_lock(account);
	old = stored_provider_features(args[0], &nold);
	foreach(lc, limits)
	{
		EmLimit    *l = (EmLimit *) lfirst(lc);

		/* the old provider limits before this feature, dropped first */
		for (; j < nold && strcmp(old[j], l->feature) <= 0; j++)
			if (strcmp(old[j], l->feature) < 0)
				drop_provider_limit(args[0], old[j]);
		args[1] = CStringGetTextDatum(l->feature);
		args[2] = Int64GetDatum(l->lim);
		nulls[2] = l->unlimited ? 'n' : ' ';
		em_exec(&store_limit, args, nulls, 0);
	}
	for (; j < nold; j++)
		drop_provider_limit(args[0], old[j]);
	nulls[2] = ' ';
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	em_exec(&limits_read, args, NULL, 0);
	return list_length(limits);
}

/* record a failed read: tried now, with its error; the flag stays */
static void
limits_read_failed(const char *account, const char *error)
{
	Datum		args[3];

	args[0] = CStringGetTextDatum(account);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[2] = CStringGetTextDatum(error);
	em_exec(&limits_failed, args, NULL, 0);
}

/*
 * The account's provider customer (NULL when it has none), in the caller's
 * SPI connection; EM007 for an account that does not exist, with every
 * provider.
 */
static char *
account_customer_of(const char *account)
{
	Datum		arg = CStringGetTextDatum(account);
	bool		isnull;
	Datum		d;

	em_exec(&account_customer, &arg, NULL, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_UNKNOWN_ACCOUNT),
				 errmsg("account \"%s\" does not exist", account)));
	d = em_get(0, 1, &isnull);
	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * Read one account's limits from the provider and store them, in the
 * caller's transaction.  Returns the number of limits read, or -1 with
 * *error set (the failure is recorded).  No earmark lock is held during the
 * read: the account row is updated after it.
 */
int
em_refresh_account_limits(const char *account, char **error)
{
	char	   *customer = account_customer_of(account);
	List	   *limits;

	limits = em_provider_limits(account, customer, NULL, NULL, error, NULL);
	if (*error)
	{
		limits_read_failed(account, *error);
		return -1;
	}
	return store_account_limits(account, limits);
}

/* on a distributed install: the worker's store, on the account's node */
static EmStatement call_store_limits = {
	"SELECT earmark.store_limits($1, $2, $3)",
	3, {TEXTOID, TEXTARRAYOID, INT8ARRAYOID}
};

/* the limits as the arrays of earmark.store_limits: a NULL is unlimited */
static void
limits_to_arrays(List *limits, Datum *features, Datum *lims)
{
	int			n = list_length(limits);
	int			dims[1] = {n};
	int			lbs[1] = {1};
	Datum	   *f = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *v = palloc(sizeof(Datum) * Max(n, 1));
	bool	   *vnull = palloc(sizeof(bool) * Max(n, 1));
	int			i = 0;
	ListCell   *lc;

	foreach(lc, limits)
	{
		EmLimit    *l = (EmLimit *) lfirst(lc);

		f[i] = CStringGetTextDatum(l->feature);
		v[i] = Int64GetDatum(l->lim);
		vnull[i] = l->unlimited;
		i++;
	}
	*features = PointerGetDatum(construct_array(f, n, TEXTOID, -1, false, TYPALIGN_INT));
	*lims = PointerGetDatum(construct_md_array(v, vnull, 1, dims, lbs, INT8OID,
											   sizeof(int64), FLOAT8PASSBYVAL,
											   TYPALIGN_DOUBLE));
}

/*
 * The worker's store of one account's read (its limits, or with error its
 * failure), in the caller's SPI connection.  On a distributed install the
 * limits are stored by a call of earmark.store_limits made on its own,
 * which Citus runs on the account's node: the account's refresh lock is
 * taken there, where earmark_refresh_limits takes it.
 */
int
em_store_limits_read(const char *account, List *limits, const char *error)
{
	Datum		args[3];

	/*
	 * A failure is recorded from here (on Citus the coordinator, which
	 * routes the account row's update to its node): it takes no refresh
	 * lock, and it must not depend on the call whose failure it may be.
	 */
	if (error != NULL)
	{
		limits_read_failed(account, error);
		return 0;
	}
	if (!em_distributed())
		return store_account_limits(account, limits);
	args[0] = CStringGetTextDatum(account);
	limits_to_arrays(limits, &args[1], &args[2]);
	em_exec(&call_store_limits, args, NULL, 1);
	return (int) em_get_int64(0, 1, 0);
}

/* the accounts whose limits an admission asked for: EmWantedLimits, in cxt */
List *
em_wanted_limit_accounts(int max, MemoryContext cxt)
{
	Datum		args[2];
	List	   *accounts = NIL;
	uint64		i;
	bool		isnull;
	MemoryContext old;

	args[0] = TimestampTzGetDatum(GetCurrentTimestamp() - (int64) LIMIT_RETRY_S * USECS_PER_SEC);
	args[1] = Int32GetDatum(max);
	em_exec(&wanted_accounts, args, NULL, 0);
	/* SPI leaves its own context current: the list outlives the call */
	old = MemoryContextSwitchTo(cxt);
	for (i = 0; i < SPI_processed; i++)
	{
		EmWantedLimits *w = palloc0(sizeof(EmWantedLimits));
		Datum		d;

		w->account = TextDatumGetCString(em_get((int) i, WA_ACCOUNT, &isnull));
		d = em_get((int) i, WA_CUSTOMER, &isnull);
		w->customer = isnull ? NULL : TextDatumGetCString(d);
		accounts = lappend(accounts, w);
	}
	MemoryContextSwitchTo(old);
	return accounts;
}

/*
 * earmark_refresh_limits(account): read the account's limits from the
 * provider now (for sign-up flows, before the first admission).  Returns
 * the number of limits read; 0 with the local provider, whose limits are
 * the manual ones.
 */
Datum
earmark_refresh_limits(PG_FUNCTION_ARGS)
{
	text	   *account = em_arg_name(fcinfo, 0, "account");
	char	   *error = NULL;
	int			n;

	em_require_account_local(account);
	SPI_connect();
	if (earmark_provider == EM_PROVIDER_LOCAL)
	{
		/* nothing to read, but an unknown account is an error everywhere */
		(void) account_customer_of(text_to_cstring(account));
		SPI_finish();
		PG_RETURN_INT32(0);
	}
	n = em_refresh_account_limits(text_to_cstring(account), &error);
	SPI_finish();
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_PROVIDER),
				 errmsg("could not read the limits of account \"%s\" from the %s provider",
						text_to_cstring(account), em_provider_name()),
				 errdetail("%s", error),
				 errhint("Admissions use the last limits read for up to earmark.limit_stale.")));
	PG_RETURN_INT32(n);
}

/* element i of an array argument, which must not be NULL */
static void
require_element(bool isnull, const char *what, int i)
{
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s[%d] must not be NULL", what, i + 1)));
}

/*
 * The limits of earmark.store_limits' arrays, checked as a provider's
 * answer is (provider.c, read_limit): a feature is a name (1 to
 * EARMARK_MAX_NAME_LEN characters), a limit >= 0 or NULL for unlimited.
 */
static List *
limits_from_arrays(ArrayType *features, ArrayType *lims)
{
	Datum	   *f;
	bool	   *fnull;
	Datum	   *v;
	bool	   *vnull;
	int			nf;
	int			nv;
	int			i;
	List	   *limits = NIL;

	if (ARR_NDIM(features) > 1 || ARR_NDIM(lims) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("features and limits must be one-dimensional arrays")));
	deconstruct_array(features, TEXTOID, -1, false, TYPALIGN_INT, &f, &fnull, &nf);
	deconstruct_array(lims, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &v, &vnull, &nv);
	if (nf != nv)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("features and limits must have the same length (%d and %d)", nf, nv)));
	for (i = 0; i < nf; i++)
	{
		EmLimit    *l = palloc(sizeof(EmLimit));

		require_element(fnull[i], "features", i);
		l->feature = text_to_cstring(em_check_name(DatumGetTextPP(f[i]),
												   psprintf("features[%d]", i + 1)));
		l->unlimited = vnull[i];
		l->lim = vnull[i] ? 0 : DatumGetInt64(v[i]);
		if (l->lim < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("limits[%d] must be >= 0 or NULL (unlimited)", i + 1)));
		limits = lappend(limits, l);
	}
	return limits;
}

/*
 * earmark.store_limits(account, features, limits): the worker's store of
 * one account's read on a distributed install, which Citus runs on the
 * account's node (em_store_limits_read).  Returns the number of limits
 * stored.
 */
Datum
earmark_store_limits(PG_FUNCTION_ARGS)
{
	text	   *account = em_arg_name(fcinfo, 0, "account");
	char	   *name = text_to_cstring(account);
	List	   *limits;
	int			n;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("features and limits must not be NULL")));
	limits = limits_from_arrays(PG_GETARG_ARRAYTYPE_P(1), PG_GETARG_ARRAYTYPE_P(2));
	em_require_account_local(account);
	/* the provider limits stored are read after the refresh lock's wait */
	em_require_read_committed("earmark.store_limits");
	SPI_connect();
	(void) account_customer_of(name);
	n = store_account_limits(name, limits);
	SPI_finish();
	PG_RETURN_INT32(n);
}
