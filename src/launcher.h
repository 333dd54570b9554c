/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The launcher that runs an earmark worker in every database with the
 *	  extension (launcher.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_LAUNCHER_H
#define EARMARK_LAUNCHER_H

#include "postgres.h"

#include "tcop/utility.h"

extern Size em_launcher_shmem_size(void);
extern void em_launcher_shmem_init(void);
extern void em_register_launcher(void);
extern void em_launcher_worker_started(void);
extern void em_launcher_worker_ran(void);
extern void em_launcher_no_extension(void);
extern void em_launcher_utility(PlannedStmt *pstmt, const char *queryString,
								bool readOnlyTree, ProcessUtilityContext context,
								ParamListInfo params, QueryEnvironment *queryEnv,
								DestReceiver *dest, QueryCompletion *qc);

PGDLLEXPORT void earmark_launcher_main(Datum main_arg);

#endif							/* EARMARK_LAUNCHER_H */
