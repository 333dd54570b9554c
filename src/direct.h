/*-------------------------------------------------------------------------
 *
 * direct.h
 *	  Reads by index from C, in place of small SPI look-ups, and the
 *	  update of one row's columns without the executor (direct.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_DIRECT_H
#define EARMARK_DIRECT_H

#include "postgres.h"

#include "access/attnum.h"
#include "utils/snapshot.h"

#define EM_DIRECT_MAX_KEYS 3
#define EM_DIRECT_MAX_COLS 10

/*
 * A read of a table of schema earmark by the leading columns of one of its
 * B-tree indexes (found by its columns, not by its name: an upgraded
 * install may name it otherwise; in each column's own collation and its
 * type's default operator family, so that its equality is the SQL
 * statement's "column = $n"): equality on keys[0 .. nkeys - 1], the
 * columns cols[0 .. ncols - 1] of each row the snapshot sees (xmin, the
 * version's writer, is the one system column a read may name).  The rest is
 * resolved once per backend and forgotten on any relcache invalidation of
 * the table or the index.
 */
typedef struct EmDirect
{
	const char *table;
	int			nkeys;
	const char *keys[EM_DIRECT_MAX_KEYS];
	int			ncols;
	const char *cols[EM_DIRECT_MAX_COLS];
	int			nwrite;			/* a write changes cols[0 .. nwrite - 1] */
	/*
	 * A partial index the read may go by: its predicate as PostgreSQL
	 * prints it (pg_get_expr, with pg_catalog first in the search path).
	 * Only for a read whose condition beyond the keys (the caller's fn)
	 * implies it, so that the index has every row the read can match; and
	 * only for em_direct_lock_skip_all, which runs no read without that
	 * index (the caller's SQL runs instead).
	 */
	const char *pred;
	/* a write's: every column's type, and which may be NULL */
	Oid			types[EM_DIRECT_MAX_COLS];
	bool		nullok[EM_DIRECT_MAX_COLS];
	/* resolved */
	bool		resolved;
	bool		listed;			/* in direct.c's list */
	Oid			relid;
	Oid			indexid;
	AttrNumber	attnums[EM_DIRECT_MAX_COLS];
	bool		write_checked;	/* writable is known */
	bool		writable;		/* em_direct_update may write it (direct.c) */
	bool		insert_checked; /* insert_stores is known */
	bool		insert_stores;	/* em_direct_insert_stores' answer */
	RegProcedure eqproc[EM_DIRECT_MAX_KEYS];
	Oid			collation[EM_DIRECT_MAX_KEYS];
	RegProcedure geproc;		/* the last key's >= (em_direct_lock_skip) */
	RegProcedure ltproc;		/* and its < */
	struct EmDirect *next;
} EmDirect;

/* called for each visible row; false stops the scan */
typedef bool (*EmDirectRow) (Datum *values, bool *nulls, void *arg);

/*
 * The snapshot an SPI statement would take now (a new one under READ
 * COMMITTED, the transaction's otherwise), or the latest one, taken after
 * earmark's tables named (those the caller reads in it) are locked, as a
 * statement locks its tables before its snapshot; registered: give it back
 * with em_direct_release.
 */
extern Snapshot em_direct_statement_snapshot(const char *const *tables, int ntables);
extern Snapshot em_direct_latest_snapshot(const char *const *tables, int ntables);
extern void em_direct_release(Snapshot snap);
extern Oid	em_direct_table_node(const char *name, bool *written);
extern uint64 em_direct_completions(void);

extern int	em_direct_scan(EmDirect *d, Datum *keys, Snapshot snap,
						   EmDirectRow fn, void *arg);
extern bool em_direct_get(EmDirect *d, Datum *keys, Snapshot snap,
						  Datum *values, bool *nulls);
extern bool em_direct_lock(EmDirect *d, Datum *keys, Datum *values, bool *nulls);
extern bool em_direct_unclaimed(EmDirect *d, Datum *keys, Datum *values,
								bool *nulls);
extern bool em_direct_inserted_here(EmDirect *d, Datum *keys, Snapshot snap,
									CommandId since);
extern bool em_direct_insert_stores(EmDirect *d);
extern bool em_direct_lock_skip(EmDirect *d, Datum *keys, bool below,
								EmDirectRow fn, void *arg, Datum *values,
								bool *nulls);
extern int	em_direct_lock_skip_all(EmDirect *d, Datum *keys, EmDirectRow fn,
									void *arg, int max, EmDirectRow take,
									void *take_arg);
extern bool em_direct_any_row(Datum *values, bool *nulls, void *arg);

/*
 * A write of one row's columns cols[0 .. nwrite - 1] (an UPDATE without
 * the executor, direct.c): fn is given all of cols[] of the row's version
 * and sets the written ones' new values in place; false when the version
 * does not match the statement's WHERE clause (nothing is written).
 */
typedef bool (*EmDirectChange) (Datum *values, bool *nulls, void *arg);

typedef enum EmDirectWrite
{
	EM_DIRECT_UNWRITABLE,		/* the executor would do more: run the SQL */
	EM_DIRECT_NO_ROW,			/* no row, or none that matched (an UPDATE of 0 rows) */
	EM_DIRECT_WRITTEN
} EmDirectWrite;

extern EmDirectWrite em_direct_update(EmDirect *d, Datum *keys, EmDirectChange fn,
									  void *arg);

#endif							/* EARMARK_DIRECT_H */
