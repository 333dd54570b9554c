/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The earmark worker of one database (worker.c), started by the
 *	  launcher by its name.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_WORKER_H
#define EARMARK_WORKER_H

#include "postgres.h"

PGDLLEXPORT void earmark_worker_main(Datum main_arg);

#endif							/* EARMARK_WORKER_H */
