/*
 * earmark_lab.c: the Concurrency Lab and a small load run, side by side.
 *
 * Every run compares two ways of enforcing one usage limit:
 *
 *   plain check  the usual code: read what is left from a plain table, start
 *                the job if it fits, add the usage with an UPDATE when the
 *                job has run.  The table is the lab's own
 *                (earmark_lab.plain_budget), not earmark's.
 *   earmark      earmark_reserve (check and hold in one step), then
 *                earmark_charge per step and earmark_settle.
 *
 * Modes:
 *   lab   5 jobs of 40000 against a plan of 100000, started at the same
 *         moment from 5 connections (all connected first, then a barrier).
 *         A second barrier after every job has checked (or reserved) models
 *         jobs that run for a while: nobody charges before everyone decided.
 *   load  120 jobs of 1000, 50 at a time (50 connections pulling from one
 *         job counter), against room for exactly 100 (limit 100000).  The
 *         latency of every check/reserve call is measured.
 *   all   both.
 *
 * Every number printed is what the program observed or read back from the
 * database; --check compares the earmark side with what the limit allows
 * (admitted = min(jobs, limit / amount), nothing held, nothing failed).
 *
 * Build:
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -I$(pg_config --includedir) \
 *       earmark_lab.c -L$(pg_config --libdir) -lpq -lpthread
 *
 * Connects with the usual libpq environment (PGHOST, PGPORT, PGUSER, ...);
 * --db names the database, which must have the earmark extension.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define ERRLEN		512
#define REASONLEN	160
#define MAX_REASONS 6
#define LAB_STEPS	4

/* ------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------
 */
typedef struct Options
{
	const char *mode;
	const char *db;
	const char *prefix;
	long long	jobs;			/* -1: the mode's default */
	long long	amount;
	long long	limit;
	long long	concurrency;
	long long	rate_limit;		/* -1: leave earmark.rate_limit alone */
	long long	work_ms;		/* simulated work inside a load job */
	bool		check;
	bool		kv;
} Options;

typedef enum Side
{
	PLAIN,
	EARMARK
} Side;

static const char *const side_name[] = {"plain", "earmark"};

/* one experiment: a mode, a side, its account and its numbers */
typedef struct Run
{
	const Options *opt;
	Side		side;
	const char *mode;			/* "lab" or "load" */
	char		account[300];
	long long	jobs;
	long long	amount;
	long long	limit;
	int			concurrency;

	pthread_barrier_t start;	/* all connected: go */
	pthread_barrier_t decided;	/* lab: every job has checked/reserved */
	atomic_llong next;			/* load: the shared job counter */

	/* outcomes: every job ends admitted (started), refused or failed */
	atomic_llong admitted;
	atomic_llong refused;
	atomic_llong failed;
	double	   *latency_ms;		/* per job; < 0 when the call failed */

	pthread_mutex_t mu;			/* guards the fields below */
	char		first_error[ERRLEN];
	int			nreasons;
	char		reasons[MAX_REASONS][REASONLEN];
	long long	reason_count[MAX_REASONS];

	/* timing and read back */
	double		wall_ms;
	bool		readback_ok;
	long long	lim_read;
	long long	used;
	long long	held;			/* earmark only */
	long long	remaining;		/* earmark only */
} Run;

/* one lab job (one thread, one connection) */
typedef struct LabJob
{
	Run		   *run;
	PGconn	   *conn;
	int			index;			/* 1-based */
	bool		failed;
	char		error[ERRLEN];
	/* the decision */
	bool		go;
	long long	seen_left;		/* plain: what the check read */
	long long	job_id;			/* earmark */
	char		reason[REASONLEN];
	/* the run */
	long long	charged;
	bool		capped;
	char		status[32];
} LabJob;

/* one load worker (one thread, one connection) */
typedef struct Worker
{
	Run		   *run;
	PGconn	   *conn;
} Worker;

/* ------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------
 */
static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec * 1000.0 + (double) ts.tv_nsec / 1e6;
}

static void
sleep_ms(long long ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = (time_t) (ms / 1000);
	ts.tv_nsec = (long) ((ms % 1000) * 1000000L);
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void
copy_trimmed(char *dst, size_t len, const char *src)
{
	size_t		n;

	snprintf(dst, len, "%s", src ? src : "");
	n = strlen(dst);
	while (n > 0 && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
		dst[--n] = '\0';
}

/* the first line of a message, for a table cell or a one-line report */
static const char *
first_line(const char *msg, char *buf, size_t len)
{
	size_t		n = strcspn(msg, "\n");

	if (n >= len)
		n = len - 1;
	memcpy(buf, msg, n);
	buf[n] = '\0';
	return buf;
}

static bool
parse_ll(const char *s, long long min, long long *out)
{
	char	   *end;
	long long	v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min)
		return false;
	*out = v;
	return true;
}

static long long
get_ll(const PGresult *res, int row, int col)
{
	return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/*
 * Run one statement with text parameters.  Returns the result, or NULL with
 * the server's message in err; the caller PQclear()s a result.
 */
static PGresult *
run_sql(PGconn *conn, const char *sql, int nparams, const char *const *params,
		char *err, size_t errlen)
{
	PGresult   *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return res;
	if (res != NULL && PQresultErrorMessage(res)[0] != '\0')
		copy_trimmed(err, errlen, PQresultErrorMessage(res));
	else
		copy_trimmed(err, errlen, PQerrorMessage(conn));
	PQclear(res);
	return NULL;
}

/* run a statement whose result is not needed; false on error */
static bool
exec_ok(PGconn *conn, const char *sql, int nparams, const char *const *params,
		char *err, size_t errlen)
{
	PGresult   *res = run_sql(conn, sql, nparams, params, err, errlen);

	if (res == NULL)
		return false;
	PQclear(res);
	return true;
}

static PGconn *
connect_db(const Options *opt, char *err, size_t errlen)
{
	const char *keys[3];
	const char *vals[3];
	int			n = 0;
	PGconn	   *conn;

	if (opt->db != NULL)
	{
		keys[n] = "dbname";
		vals[n++] = opt->db;
	}
	keys[n] = "application_name";
	vals[n++] = "earmark_lab";
	keys[n] = NULL;
	vals[n] = NULL;

	conn = PQconnectdbParams(keys, vals, 0);
	if (conn == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (PQstatus(conn) != CONNECTION_OK)
	{
		copy_trimmed(err, errlen, PQerrorMessage(conn));
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

static void
note_error(Run *r, const char *msg)
{
	pthread_mutex_lock(&r->mu);
	if (r->first_error[0] == '\0')
		copy_trimmed(r->first_error, sizeof(r->first_error), msg);
	pthread_mutex_unlock(&r->mu);
}

static void
note_reason(Run *r, const char *reason)
{
	int			i;

	pthread_mutex_lock(&r->mu);
	for (i = 0; i < r->nreasons; i++)
	{
		if (strcmp(r->reasons[i], reason) == 0)
			break;
	}
	if (i == r->nreasons && r->nreasons < MAX_REASONS)
		copy_trimmed(r->reasons[r->nreasons++], REASONLEN, reason);
	if (i < MAX_REASONS)
		r->reason_count[i]++;
	pthread_mutex_unlock(&r->mu);
}

/* ------------------------------------------------------------------------
 * The calls each side makes
 * ------------------------------------------------------------------------
 */
static const char SQL_PLAIN_LEFT[] =
	"SELECT lim - used FROM earmark_lab.plain_budget WHERE account = $1";
static const char SQL_PLAIN_ADD[] =
	"UPDATE earmark_lab.plain_budget SET used = used + $2::bigint WHERE account = $1";
static const char SQL_RESERVE[] =
	"SELECT job_id, admitted, remaining, reason FROM earmark_reserve($1, $2::bigint, $3)";
static const char SQL_CHARGE[] =
	"SELECT charged, capped, room, status FROM earmark_charge($1, $2::bigint, $3::bigint, $4::bigint)";
static const char SQL_SETTLE[] =
	"SELECT charged, released, status FROM earmark_settle($1, $2::bigint)";

/* plain: what is left; false on error */
static bool
plain_left(PGconn *conn, const char *account, long long *left, char *err, size_t errlen)
{
	const char *p[1] = {account};
	PGresult   *res = run_sql(conn, SQL_PLAIN_LEFT, 1, p, err, errlen);

	if (res == NULL)
		return false;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "account %s has no row in earmark_lab.plain_budget", account);
		PQclear(res);
		return false;
	}
	*left = get_ll(res, 0, 0);
	PQclear(res);
	return true;
}

static bool
plain_add(PGconn *conn, const char *account, long long units, char *err, size_t errlen)
{
	char		u[32];
	const char *p[2] = {account, u};

	snprintf(u, sizeof(u), "%lld", units);
	return exec_ok(conn, SQL_PLAIN_ADD, 2, p, err, errlen);
}

typedef struct Reserve
{
	bool		admitted;
	long long	job_id;
	char		reason[REASONLEN];
} Reserve;

static bool
em_reserve(PGconn *conn, const char *account, long long amount, const char *key,
		   Reserve *out, char *err, size_t errlen)
{
	char		a[32];
	const char *p[3] = {account, a, key};
	PGresult   *res;

	snprintf(a, sizeof(a), "%lld", amount);
	res = run_sql(conn, SQL_RESERVE, 3, p, err, errlen);
	if (res == NULL)
		return false;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "earmark_reserve returned %d rows", PQntuples(res));
		PQclear(res);
		return false;
	}
	out->admitted = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	out->job_id = PQgetisnull(res, 0, 0) ? 0 : get_ll(res, 0, 0);
	copy_trimmed(out->reason, sizeof(out->reason),
				 PQgetisnull(res, 0, 3) ? "" : PQgetvalue(res, 0, 3));
	PQclear(res);
	if (out->admitted && out->job_id <= 0)
	{
		snprintf(err, errlen, "earmark_reserve admitted without a job_id");
		return false;
	}
	return true;
}

/* a charge of the job reserved for account (earmark 0.3.0: account first) */
static bool
em_charge(PGconn *conn, const char *account, long long job_id, long long tokens, long long step,
		  long long *charged, bool *capped, char *status, size_t statuslen,
		  char *err, size_t errlen)
{
	char		j[32],
				t[32],
				s[32];
	const char *p[4] = {account, j, t, s};
	PGresult   *res;

	snprintf(j, sizeof(j), "%lld", job_id);
	snprintf(t, sizeof(t), "%lld", tokens);
	snprintf(s, sizeof(s), "%lld", step);
	res = run_sql(conn, SQL_CHARGE, 4, p, err, errlen);
	if (res == NULL)
		return false;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "earmark_charge returned %d rows", PQntuples(res));
		PQclear(res);
		return false;
	}
	*charged = get_ll(res, 0, 0);
	*capped = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	copy_trimmed(status, statuslen, PQgetvalue(res, 0, 3));
	PQclear(res);
	return true;
}

static bool
em_settle(PGconn *conn, const char *account, long long job_id, char *status, size_t statuslen,
		  char *err, size_t errlen)
{
	char		j[32];
	const char *p[2] = {account, j};
	PGresult   *res;

	snprintf(j, sizeof(j), "%lld", job_id);
	res = run_sql(conn, SQL_SETTLE, 2, p, err, errlen);
	if (res == NULL)
		return false;
	if (PQntuples(res) != 1)
	{
		snprintf(err, errlen, "earmark_settle returned %d rows", PQntuples(res));
		PQclear(res);
		return false;
	}
	copy_trimmed(status, statuslen, PQgetvalue(res, 0, 2));
	PQclear(res);
	return true;
}

/* ------------------------------------------------------------------------
 * Set-up and read back (on the main thread's own connection)
 * ------------------------------------------------------------------------
 */
static bool
prepare_database(PGconn *conn, char *err, size_t errlen)
{
	PGresult   *res;
	bool		have;

	res = run_sql(conn,
				  "SELECT pg_catalog.to_regprocedure('earmark_reserve(text,bigint,text,text,interval)') IS NOT NULL",
				  0, NULL, err, errlen);
	if (res == NULL)
		return false;
	have = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (!have)
	{
		snprintf(err, errlen,
				 "earmark_reserve is not visible in database \"%s\" (run CREATE EXTENSION earmark there)",
				 PQdb(conn));
		return false;
	}
	/* the plain check's own table; quiet about "already exists" */
	return exec_ok(conn, "SET client_min_messages = warning", 0, NULL, err, errlen) &&
		exec_ok(conn, "CREATE SCHEMA IF NOT EXISTS earmark_lab", 0, NULL, err, errlen) &&
		exec_ok(conn,
				"CREATE TABLE IF NOT EXISTS earmark_lab.plain_budget ("
				" account text PRIMARY KEY, lim bigint NOT NULL, used bigint NOT NULL DEFAULT 0)",
				0, NULL, err, errlen);
}

static bool
setup_account(PGconn *conn, Run *r, char *err, size_t errlen)
{
	char		lim[32];
	const char *p[2] = {r->account, lim};

	snprintf(lim, sizeof(lim), "%lld", r->limit);
	if (r->side == PLAIN)
		return exec_ok(conn,
					   "INSERT INTO earmark_lab.plain_budget (account, lim, used) VALUES ($1, $2::bigint, 0)",
					   2, p, err, errlen);
	return exec_ok(conn, "SELECT earmark_set_limit($1, $2::bigint)", 2, p, err, errlen);
}

static bool
read_back(PGconn *conn, Run *r, char *err, size_t errlen)
{
	const char *p[1] = {r->account};
	PGresult   *res;

	if (r->side == PLAIN)
		res = run_sql(conn, "SELECT lim, used, 0, lim - used FROM earmark_lab.plain_budget WHERE account = $1",
					  1, p, err, errlen);
	else
		res = run_sql(conn, "SELECT lim, used, held, remaining FROM earmark_budget($1)",
					  1, p, err, errlen);
	if (res == NULL)
		return false;
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0) || PQgetisnull(res, 0, 1))
	{
		snprintf(err, errlen, "reading back account %s returned %d rows", r->account, PQntuples(res));
		PQclear(res);
		return false;
	}
	r->lim_read = get_ll(res, 0, 0);
	r->used = get_ll(res, 0, 1);
	r->held = PQgetisnull(res, 0, 2) ? 0 : get_ll(res, 0, 2);
	r->remaining = PQgetisnull(res, 0, 3) ? 0 : get_ll(res, 0, 3);
	r->readback_ok = true;
	PQclear(res);
	return true;
}

static bool
set_rate_limit(PGconn *conn, const Options *opt, char *err, size_t errlen)
{
	char		sql[96];

	if (opt->rate_limit < 0)
		return true;
	snprintf(sql, sizeof(sql), "SET earmark.rate_limit = %lld", opt->rate_limit);
	return exec_ok(conn, sql, 0, NULL, err, errlen);
}

/* connect n sessions; on failure close what was opened */
static PGconn **
connect_all(const Options *opt, int n, char *err, size_t errlen)
{
	PGconn	  **conns = calloc((size_t) n, sizeof(PGconn *));
	int			i;

	if (conns == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (i = 0; i < n; i++)
	{
		conns[i] = connect_db(opt, err, errlen);
		if (conns[i] == NULL || !set_rate_limit(conns[i], opt, err, errlen))
		{
			int			k;

			for (k = 0; k <= i; k++)
				PQfinish(conns[k]);	/* PQfinish(NULL) is a no-op */
			free(conns);
			return NULL;
		}
	}
	return conns;
}

static void
finish_all(PGconn **conns, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		PQfinish(conns[i]);
	free(conns);
}

static bool
run_init(Run *r, const Options *opt, const char *mode, Side side, const char *base,
		 long long jobs, long long amount, long long limit, long long concurrency)
{
	memset(r, 0, sizeof(*r));
	r->opt = opt;
	r->side = side;
	r->mode = mode;
	snprintf(r->account, sizeof(r->account), "%s-%s-%s", base, mode, side_name[side]);
	r->jobs = jobs;
	r->amount = amount;
	r->limit = limit;
	r->concurrency = (int) concurrency;
	atomic_init(&r->next, 0);
	atomic_init(&r->admitted, 0);
	atomic_init(&r->refused, 0);
	atomic_init(&r->failed, 0);
	r->latency_ms = calloc((size_t) jobs, sizeof(double));
	if (r->latency_ms == NULL)
		return false;
	pthread_mutex_init(&r->mu, NULL);
	return true;
}

static void
run_free(Run *r)
{
	free(r->latency_ms);
	r->latency_ms = NULL;
	pthread_mutex_destroy(&r->mu);
}

/* start n threads; a thread that cannot be started leaves the barriers
 * short, so that is fatal */
static void
start_threads(pthread_t *th, int n, void *(*fn) (void *), void *args, size_t argsize)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		int			rc = pthread_create(&th[i], NULL, fn, (char *) args + (size_t) i * argsize);

		if (rc != 0)
		{
			fprintf(stderr, "earmark_lab: cannot start thread %d: %s\n", i + 1, strerror(rc));
			exit(2);
		}
	}
}

/* ------------------------------------------------------------------------
 * Lab: N jobs at the same moment, one connection each
 * ------------------------------------------------------------------------
 */
static void
lab_decide(LabJob *j)
{
	Run		   *r = j->run;

	if (r->side == PLAIN)
	{
		if (!plain_left(j->conn, r->account, &j->seen_left, j->error, sizeof(j->error)))
			j->failed = true;
		else
			j->go = j->seen_left >= r->amount;
	}
	else
	{
		char		key[32];
		Reserve		res;

		snprintf(key, sizeof(key), "job-%d", j->index);
		if (!em_reserve(j->conn, r->account, r->amount, key, &res, j->error, sizeof(j->error)))
			j->failed = true;
		else
		{
			j->go = res.admitted;
			j->job_id = res.job_id;
			copy_trimmed(j->reason, sizeof(j->reason), res.reason);
		}
	}
}

static void
lab_work(LabJob *j)
{
	Run		   *r = j->run;
	long long	per_step = r->amount / LAB_STEPS;
	int			step;

	for (step = 1; step <= LAB_STEPS && !j->failed; step++)
	{
		long long	units = step < LAB_STEPS ? per_step : r->amount - per_step * (LAB_STEPS - 1);

		if (r->side == PLAIN)
		{
			if (!plain_add(j->conn, r->account, units, j->error, sizeof(j->error)))
				j->failed = true;
			else
				j->charged += units;
		}
		else
		{
			long long	charged;
			bool		capped;

			if (!em_charge(j->conn, r->account, j->job_id, units, step, &charged, &capped,
						   j->status, sizeof(j->status), j->error, sizeof(j->error)))
				j->failed = true;
			else
			{
				j->charged += charged;
				j->capped = j->capped || capped;
			}
		}
	}
	if (r->side == EARMARK && !j->failed &&
		!em_settle(j->conn, r->account, j->job_id, j->status, sizeof(j->status), j->error,
				   sizeof(j->error)))
		j->failed = true;
}

static void *
lab_thread(void *arg)
{
	LabJob	   *j = arg;
	Run		   *r = j->run;

	/* every thread passes both barriers, whatever happens in between */
	pthread_barrier_wait(&r->start);
	lab_decide(j);
	pthread_barrier_wait(&r->decided);
	if (!j->failed && j->go)
		lab_work(j);

	if (j->failed)
	{
		atomic_fetch_add(&r->failed, 1);
		note_error(r, j->error);
	}
	else if (j->go)
		atomic_fetch_add(&r->admitted, 1);
	else
	{
		atomic_fetch_add(&r->refused, 1);
		if (j->reason[0] != '\0')
			note_reason(r, j->reason);
	}
	return NULL;
}

/* returns the jobs (caller frees) or NULL after printing why */
static LabJob *
lab_run(PGconn *admin, Run *r)
{
	char		err[ERRLEN];
	int			n = (int) r->jobs;
	PGconn	  **conns;
	LabJob	   *jobs;
	pthread_t  *th;
	double		t0;
	int			i;

	if (!setup_account(admin, r, err, sizeof(err)))
	{
		fprintf(stderr, "earmark_lab: %s %s: set-up failed: %s\n", r->mode, side_name[r->side], err);
		return NULL;
	}
	conns = connect_all(r->opt, n, err, sizeof(err));
	if (conns == NULL)
	{
		fprintf(stderr, "earmark_lab: cannot connect: %s\n", err);
		return NULL;
	}
	jobs = calloc((size_t) n, sizeof(LabJob));
	th = calloc((size_t) n, sizeof(pthread_t));
	if (jobs == NULL || th == NULL)
	{
		fprintf(stderr, "earmark_lab: out of memory\n");
		free(jobs);
		free(th);
		finish_all(conns, n);
		return NULL;
	}
	for (i = 0; i < n; i++)
	{
		jobs[i].run = r;
		jobs[i].conn = conns[i];
		jobs[i].index = i + 1;
	}
	/* the main thread joins both barriers: it times from the start */
	pthread_barrier_init(&r->start, NULL, (unsigned) n + 1);
	pthread_barrier_init(&r->decided, NULL, (unsigned) n + 1);
	start_threads(th, n, lab_thread, jobs, sizeof(LabJob));
	pthread_barrier_wait(&r->start);
	t0 = now_ms();
	pthread_barrier_wait(&r->decided);
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	r->wall_ms = now_ms() - t0;
	pthread_barrier_destroy(&r->start);
	pthread_barrier_destroy(&r->decided);
	free(th);
	finish_all(conns, n);
	for (i = 0; i < n; i++)
		jobs[i].conn = NULL;

	if (!read_back(admin, r, err, sizeof(err)))
		fprintf(stderr, "earmark_lab: %s %s: read back failed: %s\n", r->mode, side_name[r->side], err);
	return jobs;
}

/* ------------------------------------------------------------------------
 * Load: many jobs, a fixed number of connections pulling from one counter
 * ------------------------------------------------------------------------
 */
static void
load_job(Worker *w, long long i)
{
	Run		   *r = w->run;
	char		err[ERRLEN];
	double		t0;

	r->latency_ms[i] = -1.0;
	if (r->side == PLAIN)
	{
		long long	left;

		t0 = now_ms();
		if (!plain_left(w->conn, r->account, &left, err, sizeof(err)))
			goto failed;
		r->latency_ms[i] = now_ms() - t0;
		if (left < r->amount)
		{
			char		reason[REASONLEN];

			snprintf(reason, sizeof(reason), "read less than %lld left", r->amount);
			atomic_fetch_add(&r->refused, 1);
			note_reason(r, reason);
			return;
		}
		sleep_ms(r->opt->work_ms);	/* the job */
		if (!plain_add(w->conn, r->account, r->amount, err, sizeof(err)))
			goto failed;
		atomic_fetch_add(&r->admitted, 1);
	}
	else
	{
		char		key[32];
		char		status[32];
		Reserve		res;
		long long	charged;
		bool		capped;

		snprintf(key, sizeof(key), "job-%lld", i + 1);
		t0 = now_ms();
		if (!em_reserve(w->conn, r->account, r->amount, key, &res, err, sizeof(err)))
			goto failed;
		r->latency_ms[i] = now_ms() - t0;
		if (!res.admitted)
		{
			atomic_fetch_add(&r->refused, 1);
			note_reason(r, res.reason);
			return;
		}
		sleep_ms(r->opt->work_ms);	/* the job */
		if (!em_charge(w->conn, r->account, res.job_id, r->amount, 1, &charged, &capped,
					   status, sizeof(status), err, sizeof(err)))
			goto failed;
		if (charged != r->amount)
		{
			snprintf(err, sizeof(err), "job %lld charged %lld of %lld (status %s)",
					 res.job_id, charged, r->amount, status);
			goto failed;
		}
		if (!em_settle(w->conn, r->account, res.job_id, status, sizeof(status), err, sizeof(err)))
			goto failed;
		if (strcmp(status, "completed") != 0)
		{
			snprintf(err, sizeof(err), "job %lld settled as %s", res.job_id, status);
			goto failed;
		}
		atomic_fetch_add(&r->admitted, 1);
	}
	return;

failed:
	atomic_fetch_add(&r->failed, 1);
	note_error(r, err);
}

static void *
load_thread(void *arg)
{
	Worker	   *w = arg;
	Run		   *r = w->run;

	pthread_barrier_wait(&r->start);
	for (;;)
	{
		long long	i = atomic_fetch_add(&r->next, 1);

		if (i >= r->jobs)
			break;
		load_job(w, i);
	}
	return NULL;
}

static bool
load_run(PGconn *admin, Run *r)
{
	char		err[ERRLEN];
	int			n = r->concurrency;
	PGconn	  **conns;
	Worker	   *ws;
	pthread_t  *th;
	double		t0;
	int			i;

	if (!setup_account(admin, r, err, sizeof(err)))
	{
		fprintf(stderr, "earmark_lab: %s %s: set-up failed: %s\n", r->mode, side_name[r->side], err);
		return false;
	}
	conns = connect_all(r->opt, n, err, sizeof(err));
	if (conns == NULL)
	{
		fprintf(stderr, "earmark_lab: cannot connect: %s\n", err);
		return false;
	}
	ws = calloc((size_t) n, sizeof(Worker));
	th = calloc((size_t) n, sizeof(pthread_t));
	if (ws == NULL || th == NULL)
	{
		fprintf(stderr, "earmark_lab: out of memory\n");
		free(ws);
		free(th);
		finish_all(conns, n);
		return false;
	}
	for (i = 0; i < n; i++)
	{
		ws[i].run = r;
		ws[i].conn = conns[i];
	}
	pthread_barrier_init(&r->start, NULL, (unsigned) n + 1);
	start_threads(th, n, load_thread, ws, sizeof(Worker));
	pthread_barrier_wait(&r->start);
	t0 = now_ms();
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	r->wall_ms = now_ms() - t0;
	pthread_barrier_destroy(&r->start);
	free(th);
	free(ws);
	finish_all(conns, n);

	if (!read_back(admin, r, err, sizeof(err)))
		fprintf(stderr, "earmark_lab: %s %s: read back failed: %s\n", r->mode, side_name[r->side], err);
	return true;
}

/* ------------------------------------------------------------------------
 * Reporting
 * ------------------------------------------------------------------------
 */
#define TROWS 24
#define TCELL 96

typedef struct Table
{
	int			nrows;
	char		cell[TROWS][3][TCELL];
} Table;

static void
tadd(Table *t, const char *metric, const char *plain, const char *em)
{
	if (t->nrows >= TROWS)
		return;
	snprintf(t->cell[t->nrows][0], TCELL, "%s", metric);
	snprintf(t->cell[t->nrows][1], TCELL, "%s", plain);
	snprintf(t->cell[t->nrows][2], TCELL, "%s", em);
	t->nrows++;
}

static void
tadd_ll(Table *t, const char *metric, long long plain, long long em)
{
	char		a[32],
				b[32];

	snprintf(a, sizeof(a), "%lld", plain);
	snprintf(b, sizeof(b), "%lld", em);
	tadd(t, metric, a, b);
}

static void
print_dashes(int n)
{
	while (n-- > 0)
		putchar('-');
}

static void
tprint(const Table *t)
{
	static const char *const head[3] = {"metric", "plain check", "earmark"};
	int			w[3];
	int			c,
				i;

	for (c = 0; c < 3; c++)
	{
		w[c] = (int) strlen(head[c]);
		for (i = 0; i < t->nrows; i++)
			if ((int) strlen(t->cell[i][c]) > w[c])
				w[c] = (int) strlen(t->cell[i][c]);
	}
	printf("| %-*s | %*s | %*s |\n", w[0], head[0], w[1], head[1], w[2], head[2]);
	printf("|");
	print_dashes(w[0] + 2);
	printf("|");
	print_dashes(w[1] + 1);
	printf(":|");
	print_dashes(w[2] + 1);
	printf(":|\n");
	for (i = 0; i < t->nrows; i++)
		printf("| %-*s | %*s | %*s |\n", w[0], t->cell[i][0], w[1], t->cell[i][1],
			   w[2], t->cell[i][2]);
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

/* nearest-rank percentiles of the calls that answered */
static void
percentiles(const Run *r, double *p50, double *p95, double *p99, long long *n_out)
{
	double	   *v = malloc(sizeof(double) * (size_t) (r->jobs > 0 ? r->jobs : 1));
	long long	n = 0,
				i;
	const double ps[3] = {50.0, 95.0, 99.0};
	double	   *out[3] = {p50, p95, p99};

	*p50 = *p95 = *p99 = 0.0;
	*n_out = 0;
	if (v == NULL)
		return;
	for (i = 0; i < r->jobs; i++)
		if (r->latency_ms[i] >= 0.0)
			v[n++] = r->latency_ms[i];
	if (n > 0)
	{
		int			k;

		qsort(v, (size_t) n, sizeof(double), cmp_double);
		for (k = 0; k < 3; k++)
		{
			long long	rank = (long long) ((ps[k] / 100.0) * (double) n + 0.999999999);

			if (rank < 1)
				rank = 1;
			if (rank > n)
				rank = n;
			*out[k] = v[rank - 1];
		}
	}
	*n_out = n;
	free(v);
}

static void
fmt_ll_or_dash(char *buf, size_t len, bool ok, long long v)
{
	if (ok)
		snprintf(buf, len, "%lld", v);
	else
		snprintf(buf, len, "?");
}

/* rows shared by lab and load: outcomes and the read back */
static void
outcome_rows(Table *t, const Run *p, const Run *e)
{
	char		a[48],
				b[48];

	tadd_ll(t, "jobs started (plain) / admitted (earmark)",
			atomic_load(&p->admitted), atomic_load(&e->admitted));
	tadd_ll(t, "refused", atomic_load(&p->refused), atomic_load(&e->refused));
	tadd_ll(t, "failed (errors)", atomic_load(&p->failed), atomic_load(&e->failed));
	fmt_ll_or_dash(a, sizeof(a), p->readback_ok, p->used);
	fmt_ll_or_dash(b, sizeof(b), e->readback_ok, e->used);
	tadd(t, "spent (read back)", a, b);
	snprintf(a, sizeof(a), "-");
	fmt_ll_or_dash(b, sizeof(b), e->readback_ok, e->held);
	tadd(t, "held afterwards", a, b);
	fmt_ll_or_dash(a, sizeof(a), p->readback_ok, p->used > p->lim_read ? p->used - p->lim_read : 0);
	fmt_ll_or_dash(b, sizeof(b), e->readback_ok,
				   e->used + e->held > e->lim_read ? e->used + e->held - e->lim_read : 0);
	tadd(t, "over the limit", a, b);
}

static void
print_reasons(const Run *r)
{
	int			i;

	for (i = 0; i < r->nreasons; i++)
		printf("  %s refusals: %lld x \"%s\"\n", side_name[r->side], r->reason_count[i], r->reasons[i]);
	if (r->first_error[0] != '\0')
	{
		char		line[ERRLEN];

		printf("  %s first error: %s\n", side_name[r->side],
			   first_line(r->first_error, line, sizeof(line)));
	}
}

static void
kv_run(const Run *r)
{
	printf("%s.%s.admitted=%lld\n", r->mode, side_name[r->side], (long long) atomic_load(&r->admitted));
	printf("%s.%s.refused=%lld\n", r->mode, side_name[r->side], (long long) atomic_load(&r->refused));
	printf("%s.%s.failed=%lld\n", r->mode, side_name[r->side], (long long) atomic_load(&r->failed));
	if (r->readback_ok)
	{
		printf("%s.%s.spent=%lld\n", r->mode, side_name[r->side], r->used);
		printf("%s.%s.held=%lld\n", r->mode, side_name[r->side], r->held);
	}
}

static void
print_lab(const Run *p, const Run *e, const LabJob *pj, const LabJob *ej)
{
	Table		t;
	long long	i;

	printf("## Concurrency Lab: %lld jobs of %lld against a plan of %lld, all at once\n\n",
		   e->jobs, e->amount, e->limit);
	printf("| job | plain check | earmark |\n|---|---|---|\n");
	for (i = 0; i < e->jobs; i++)
	{
		char		a[ERRLEN + 64],
					b[ERRLEN + 64],
					line[ERRLEN];

		if (pj[i].failed)
			snprintf(a, sizeof(a), "error: %s", first_line(pj[i].error, line, sizeof(line)));
		else if (pj[i].go)
			snprintf(a, sizeof(a), "read %lld left, started, spent %lld", pj[i].seen_left, pj[i].charged);
		else
			snprintf(a, sizeof(a), "read %lld left, did not start", pj[i].seen_left);
		if (ej[i].failed)
			snprintf(b, sizeof(b), "error: %s", first_line(ej[i].error, line, sizeof(line)));
		else if (ej[i].go)
			snprintf(b, sizeof(b), "admitted (job %lld), charged %lld in %d steps%s, %s",
					 ej[i].job_id, ej[i].charged, LAB_STEPS, ej[i].capped ? " (capped)" : "",
					 ej[i].status);
		else
			snprintf(b, sizeof(b), "refused: %s", ej[i].reason);
		printf("| %lld | %s | %s |\n", i + 1, a, b);
	}
	printf("\n");
	memset(&t, 0, sizeof(t));
	tadd_ll(&t, "limit (read back)", p->lim_read, e->lim_read);
	outcome_rows(&t, p, e);
	tprint(&t);
	if (p->first_error[0] != '\0' || e->first_error[0] != '\0')
	{
		print_reasons(p);
		print_reasons(e);
	}
	printf("\n");
}

static void
print_load(const Run *p, const Run *e, long long rate_limit)
{
	Table		t;
	char		a[48],
				b[48];
	double		pp[3],
				ee[3];
	long long	pn,
				en;
	int			k;
	static const char *const names[3] = {"p50", "p95", "p99"};

	printf("## Load: %lld jobs of %lld, %d at a time, limit %lld (room for %lld)\n\n",
		   e->jobs, e->amount, e->concurrency, e->limit, e->limit / e->amount);
	memset(&t, 0, sizeof(t));
	outcome_rows(&t, p, e);
	snprintf(a, sizeof(a), "%.1f", p->wall_ms);
	snprintf(b, sizeof(b), "%.1f", e->wall_ms);
	tadd(&t, "wall time (ms)", a, b);
	snprintf(a, sizeof(a), "%.0f", p->wall_ms > 0 ? (double) p->jobs * 1000.0 / p->wall_ms : 0.0);
	snprintf(b, sizeof(b), "%.0f", e->wall_ms > 0 ? (double) e->jobs * 1000.0 / e->wall_ms : 0.0);
	tadd(&t, "throughput (jobs/s)", a, b);
	percentiles(p, &pp[0], &pp[1], &pp[2], &pn);
	percentiles(e, &ee[0], &ee[1], &ee[2], &en);
	for (k = 0; k < 3; k++)
	{
		char		m[64];

		snprintf(m, sizeof(m), "%s check / reserve latency (ms)", names[k]);
		snprintf(a, sizeof(a), "%.2f", pp[k]);
		snprintf(b, sizeof(b), "%.2f", ee[k]);
		tadd(&t, m, a, b);
	}
	tprint(&t);
	print_reasons(p);
	print_reasons(e);
	if (rate_limit > 0)
		printf("  earmark.rate_limit is %lld admissions a minute per account (a superuser may SET it; --rate-limit)\n",
			   rate_limit);
	printf("\n");
}

/* ------------------------------------------------------------------------
 * --check: the earmark side must be exactly what the limit allows
 * ------------------------------------------------------------------------
 */
static int
check_run(const Run *r)
{
	long long	fit = r->limit / r->amount;
	long long	want_admitted = fit < r->jobs ? fit : r->jobs;
	int			bad = 0;

#define EXPECT(what, got, want) \
	do { \
		if ((long long) (got) != (long long) (want)) \
		{ \
			printf("check failed: %s earmark %s is %lld, expected %lld\n", \
					r->mode, what, (long long) (got), (long long) (want)); \
			bad++; \
		} \
	} while (0)

	if (!r->readback_ok)
	{
		printf("check failed: %s earmark: budget not read back\n", r->mode);
		return 1;
	}
	EXPECT("admitted", atomic_load(&r->admitted), want_admitted);
	EXPECT("refused", atomic_load(&r->refused), r->jobs - want_admitted);
	EXPECT("failed", atomic_load(&r->failed), 0);
	EXPECT("spent", r->used, want_admitted * r->amount);
	EXPECT("held", r->held, 0);
	EXPECT("remaining", r->remaining, r->limit - want_admitted * r->amount);
#undef EXPECT
	return bad;
}

/* ------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------
 */
static void
usage(FILE *f)
{
	fprintf(f,
			"usage: earmark_lab [--mode lab|load|all] [--db NAME] [--account-prefix P]\n"
			"                   [--jobs N] [--amount N] [--limit N] [--concurrency N]\n"
			"                   [--work-ms N] [--rate-limit N] [--check] [--kv]\n"
			"  defaults: lab 5 jobs of 40000, limit 100000, all at once;\n"
			"            load 120 jobs of 1000, limit 100000, 50 at a time, no work time\n"
			"  --jobs/--amount/--limit override the defaults of every mode run;\n"
			"  --concurrency and --work-ms apply to load.  --rate-limit sets\n"
			"  earmark.rate_limit in the job sessions (superuser).  --check exits 1\n"
			"  unless the earmark side admitted exactly min(jobs, limit/amount), refused\n"
			"  the rest, failed none, spent admitted*amount and holds nothing.\n"
			"  --kv also prints key=value lines.  Connection: PGHOST, PGPORT, PGUSER...\n");
}

int
main(int argc, char **argv)
{
	Options		opt;
	char		err[ERRLEN];
	char		base[256];
	PGconn	   *admin;
	bool		do_lab,
				do_load;
	long long	rate_limit = 0;
	int			bad = 0;
	int			status = 0;
	int			i;

	memset(&opt, 0, sizeof(opt));
	opt.mode = "all";
	opt.prefix = "lab";
	opt.jobs = opt.amount = opt.limit = opt.concurrency = opt.rate_limit = -1;
	opt.work_ms = 0;

	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		long long  *target = NULL;
		long long	min = 1;

		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
		{
			usage(stdout);
			return 0;
		}
		if (strcmp(a, "--check") == 0)
		{
			opt.check = true;
			continue;
		}
		if (strcmp(a, "--kv") == 0)
		{
			opt.kv = true;
			continue;
		}
		if (v == NULL)
		{
			fprintf(stderr, "earmark_lab: unknown option or missing value: %s\n", a);
			usage(stderr);
			return 2;
		}
		if (strcmp(a, "--mode") == 0)
			opt.mode = v;
		else if (strcmp(a, "--db") == 0)
			opt.db = v;
		else if (strcmp(a, "--account-prefix") == 0)
			opt.prefix = v;
		else if (strcmp(a, "--jobs") == 0)
			target = &opt.jobs;
		else if (strcmp(a, "--amount") == 0)
			target = &opt.amount;
		else if (strcmp(a, "--limit") == 0)
			target = &opt.limit, min = 0;
		else if (strcmp(a, "--concurrency") == 0)
			target = &opt.concurrency;
		else if (strcmp(a, "--work-ms") == 0)
			target = &opt.work_ms, min = 0;
		else if (strcmp(a, "--rate-limit") == 0)
			target = &opt.rate_limit, min = 0;
		else
		{
			fprintf(stderr, "earmark_lab: unknown option: %s\n", a);
			usage(stderr);
			return 2;
		}
		if (target != NULL && !parse_ll(v, min, target))
		{
			fprintf(stderr, "earmark_lab: %s needs an integer >= %lld, not \"%s\"\n", a, min, v);
			return 2;
		}
		i++;
	}
	do_lab = strcmp(opt.mode, "lab") == 0 || strcmp(opt.mode, "all") == 0;
	do_load = strcmp(opt.mode, "load") == 0 || strcmp(opt.mode, "all") == 0;
	if (!do_lab && !do_load)
	{
		fprintf(stderr, "earmark_lab: --mode must be lab, load or all\n");
		return 2;
	}
	if (opt.prefix[0] == '\0' || strlen(opt.prefix) > 200)
	{
		fprintf(stderr, "earmark_lab: --account-prefix must be 1 to 200 characters\n");
		return 2;
	}
	if (opt.concurrency > 1000 || (do_lab && opt.jobs > 1000))
	{
		fprintf(stderr, "earmark_lab: at most 1000 connections (lab: one per job)\n");
		return 2;
	}
	if (opt.jobs > 10000000)
	{
		fprintf(stderr, "earmark_lab: --jobs is at most 10000000\n");
		return 2;
	}

	/* unique accounts per run: prefix, pid, time */
	snprintf(base, sizeof(base), "%s-%ld-%lld", opt.prefix, (long) getpid(), (long long) time(NULL));

	admin = connect_db(&opt, err, sizeof(err));
	if (admin == NULL)
	{
		fprintf(stderr, "earmark_lab: cannot connect: %s\n", err);
		return 2;
	}
	if (!prepare_database(admin, err, sizeof(err)))
	{
		fprintf(stderr, "earmark_lab: %s\n", err);
		PQfinish(admin);
		return 2;
	}
	{
		PGresult   *res;

		if (!set_rate_limit(admin, &opt, err, sizeof(err)) ||
			(res = run_sql(admin, "SELECT pg_catalog.current_setting('earmark.rate_limit')::bigint",
						   0, NULL, err, sizeof(err))) == NULL)
		{
			fprintf(stderr, "earmark_lab: earmark.rate_limit: %s\n", err);
			PQfinish(admin);
			return 2;
		}
		rate_limit = get_ll(res, 0, 0);
		PQclear(res);
	}
	printf("accounts: %s-*\n\n", base);

	if (do_lab)
	{
		long long	jobs = opt.jobs > 0 ? opt.jobs : 5;
		long long	amount = opt.amount > 0 ? opt.amount : 40000;
		long long	limit = opt.limit >= 0 ? opt.limit : 100000;
		Run			p,
					e;
		LabJob	   *pj,
				   *ej = NULL;

		if (!run_init(&p, &opt, "lab", PLAIN, base, jobs, amount, limit, jobs) ||
			!run_init(&e, &opt, "lab", EARMARK, base, jobs, amount, limit, jobs))
		{
			fprintf(stderr, "earmark_lab: out of memory\n");
			PQfinish(admin);
			return 2;
		}
		pj = lab_run(admin, &p);
		if (pj != NULL)
			ej = lab_run(admin, &e);
		if (pj == NULL || ej == NULL)
			status = 2;
		else
		{
			print_lab(&p, &e, pj, ej);
			if (opt.kv)
			{
				kv_run(&p);
				kv_run(&e);
			}
			if (opt.check)
				bad += check_run(&e);
		}
		free(pj);
		free(ej);
		run_free(&p);
		run_free(&e);
	}

	if (do_load && status == 0)
	{
		long long	jobs = opt.jobs > 0 ? opt.jobs : 120;
		long long	amount = opt.amount > 0 ? opt.amount : 1000;
		long long	limit = opt.limit >= 0 ? opt.limit : 100000;
		long long	conc = opt.concurrency > 0 ? opt.concurrency : 50;
		Run			p,
					e;

		if (conc > jobs)
			conc = jobs;
		if (!run_init(&p, &opt, "load", PLAIN, base, jobs, amount, limit, conc) ||
			!run_init(&e, &opt, "load", EARMARK, base, jobs, amount, limit, conc))
		{
			fprintf(stderr, "earmark_lab: out of memory\n");
			PQfinish(admin);
			return 2;
		}
		if (!load_run(admin, &p) || !load_run(admin, &e))
			status = 2;
		else
		{
			print_load(&p, &e, rate_limit);
			if (opt.kv)
			{
				kv_run(&p);
				kv_run(&e);
			}
			if (opt.check)
				bad += check_run(&e);
		}
		run_free(&p);
		run_free(&e);
	}

	PQfinish(admin);
	if (status != 0)
		return status;
	if (opt.check)
	{
		printf("check: %s\n", bad == 0 ? "pass" : "FAIL");
		if (opt.kv)
			printf("check=%s\n", bad == 0 ? "pass" : "fail");
		return bad == 0 ? 0 : 1;
	}
	return 0;
}
