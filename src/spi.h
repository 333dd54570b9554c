/*-------------------------------------------------------------------------
 *
 * spi.h
 *	  Cached SPI statements, result access and argument checks (spi.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_SPI_H
#define EARMARK_SPI_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"

/* the longest account, feature or idempotency key accepted, in characters */
#define EARMARK_MAX_NAME_LEN	255

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
extern int	em_exec_generic(EmStatement *stmt, Datum *values, const char *nulls,
							long count);
extern int	em_exec_custom(EmStatement *stmt, Datum *values, const char *nulls,
						   long count);
extern int	em_exec_lookup(EmStatement *stmt, Datum *values, const char *nulls,
						   long count);
extern void em_forget_plan(EmStatement *stmt);

/* a plan prepared with these cursor options and kept (SPI_keepplan) */
extern SPIPlanPtr em_prepare_kept(const char *sql, int nargs, Oid *argtypes,
								  int cursor_options);

/* call a SQL function's body under earmark's own search path */
extern Datum em_call_pinned(FunctionCallInfo fcinfo, PGFunction body);

/* result access for the last em_exec */
extern Datum em_get(int row, int col, bool *isnull);
extern int64 em_get_int64(int row, int col, int64 if_null);

extern void em_require_no_writes(const char *what);

/* argument checks: they raise the documented SQLSTATE or return the value */
extern text *em_arg_name(FunctionCallInfo fcinfo, int argno, const char *what);
extern int64 em_arg_int64(FunctionCallInfo fcinfo, int argno, const char *what);
extern text *em_check_name(text *t, const char *what);

/*
 * Texts ordered and compared byte for byte.  Keys, accounts and features
 * are columns of the database's deterministic collation, where equal means
 * the same bytes, so these answer texteq without a collation lookup; the
 * order is memcmp's, not the collation's (for a sort that only groups).
 */
extern int	em_text_cmp(text *a, text *b);
extern bool em_text_eq(text *a, text *b);

/*
 * t + i on the UTC calendar: every lease end (a job's, an inbox claim's)
 * is the same instant whatever the caller's TimeZone.  timestamptz +
 * interval would add a day or a month in the session's time zone, an hour
 * more or less across its daylight-saving change (regress lease_calendar,
 * review_inbox_claim_calendar).  The C function and the SQL expression
 * compute the same.
 */
extern TimestampTz em_plus_utc(TimestampTz t, Interval *i);
#define EM_SQL_PLUS_UTC(t, i) "(((" t ") AT TIME ZONE 'UTC') + (" i ")) AT TIME ZONE 'UTC'"

/* hand back one row of a RETURNS TABLE function */
extern void em_return_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls);

#endif							/* EARMARK_SPI_H */
