/*
 * pg_shim.h: the server functions pg_shim.c provides to the fuzz targets.
 * palloc, pfree and the elog machinery keep their declarations from the
 * PostgreSQL headers; this adds the reset between two inputs.
 */
#ifndef EARMARK_PG_SHIM_H
#define EARMARK_PG_SHIM_H

/* free everything palloc'd since the last reset (a memory context reset) */
extern void shim_reset(void);

/*
 * While on, pfree aborts on a chunk that still holds a nonzero byte: the
 * harness turns it on around code that decodes secrets.
 */
extern void shim_expect_wiped(bool on);

#endif
