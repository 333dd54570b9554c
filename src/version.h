/*-------------------------------------------------------------------------
 *
 * version.h
 *	  The schema version this library works on (earmark.control's
 *	  default_version): the worker and every SQL function check the
 *	  installed extension against it, and the HTTP client names it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_VERSION_H
#define EARMARK_VERSION_H

#define EARMARK_VERSION			"0.3.0"

#endif							/* EARMARK_VERSION_H */
