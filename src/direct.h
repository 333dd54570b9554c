/*-------------------------------------------------------------------------
 *
 * direct.h
 *	  Reads by index from C, in place of small SPI look-ups (direct.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_DIRECT_H
#define EARMARK_DIRECT_H

#include "postgres.h"

#include "access/attnum.h"
#include "utils/snapshot.h"

#define EM_DIRECT_MAX_KEYS 3
#define EM_DIRECT_MAX_COLS 6

/*
 * A read of a table of schema earmark by the leading columns of one of its
 * B-tree indexes (found by its columns, not by its name: an upgraded
 * install may name it otherwise; in each column's own collation and its
 * type's default operator family, so that its equality is the SQL
 * statement's "column = $n"): equality on keys[0 .. nkeys - 1], the
 * columns cols[0 .. ncols - 1] of each row the snapshot sees.  The rest is
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
	/* resolved */
	bool		resolved;
	bool		listed;			/* in direct.c's list */
	Oid			relid;
	Oid			indexid;
	AttrNumber	attnums[EM_DIRECT_MAX_COLS];
	RegProcedure eqproc[EM_DIRECT_MAX_KEYS];
	Oid			collation[EM_DIRECT_MAX_KEYS];
	struct EmDirect *next;
} EmDirect;

/* called for each visible row; false stops the scan */
typedef bool (*EmDirectRow) (Datum *values, bool *nulls, void *arg);

/*
 * The snapshot an SPI statement would take now (a new one under READ
 * COMMITTED, the transaction's otherwise), or the latest one; registered:
 * give it back with em_direct_release.
 */
extern Snapshot em_direct_statement_snapshot(void);
extern Snapshot em_direct_latest_snapshot(void);
extern void em_direct_release(Snapshot snap);

extern int	em_direct_scan(EmDirect *d, Datum *keys, Snapshot snap,
						   EmDirectRow fn, void *arg);
extern bool em_direct_get(EmDirect *d, Datum *keys, Snapshot snap,
						  Datum *values, bool *nulls);
extern bool em_direct_lock(EmDirect *d, Datum *keys, Datum *values, bool *nulls);

#endif							/* EARMARK_DIRECT_H */
