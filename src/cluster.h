/*-------------------------------------------------------------------------
 *
 * cluster.h
 *	  The schema version check, the READ COMMITTED check, this node's
 *	  place in a Citus cluster, earmark's ids and the distribution lock
 *	  (cluster.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_CLUSTER_H
#define EARMARK_CLUSTER_H

#include "postgres.h"

#include "storage/lockdefs.h"

/* ids carry the node's Citus group in their top bits, above this one */
#define EM_NODE_ID_SHIFT	48

extern void em_require_schema(void);
extern int32 em_node_group(void);
extern int32 em_read_node_group(void);
extern bool em_citus_installed(void);
extern bool em_account_table_distributed(void);
extern bool em_distributed(void);
extern void em_require_account_local(text *account);
extern void em_require_coordinator(const char *what);
extern void em_require_read_committed(const char *what);
extern void em_distribution_lock(LOCKMODE mode);

#endif							/* EARMARK_CLUSTER_H */
