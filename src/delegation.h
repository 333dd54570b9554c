/*-------------------------------------------------------------------------
 *
 * delegation.h
 *	  The fence in front of Citus's function call delegation: a planner
 *	  hook (delegation.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_DELEGATION_H
#define EARMARK_DELEGATION_H

extern void em_install_delegation_fence(void);

#endif							/* EARMARK_DELEGATION_H */
