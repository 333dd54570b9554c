/*-------------------------------------------------------------------------
 *
 * contention.h
 *	  Automatic escrow's detector: reserves on a budget's slow path, in
 *	  shared memory (contention.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_CONTENTION_H
#define EARMARK_CONTENTION_H

#include "postgres.h"

extern Size em_contention_shmem_size(void);
extern void em_contention_shmem_init(void);
extern void em_contention_enter(text *account, text *feature);
extern int	em_contention_inside(bool escrowed);
extern void em_contention_leave(void);
extern bool em_contention_escrowed(text *account, text *feature);
extern uint64 em_contention_key(text *account, text *feature);

#endif							/* EARMARK_CONTENTION_H */
