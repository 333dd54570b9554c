/*-------------------------------------------------------------------------
 *
 * delegation.h
 *	  The planner hook that keeps Citus from planning an earmark call it
 *	  would crash on (delegation.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_DELEGATION_H
#define EARMARK_DELEGATION_H

extern void em_install_delegation_guard(void);

#endif							/* EARMARK_DELEGATION_H */
