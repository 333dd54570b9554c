/*-------------------------------------------------------------------------
 *
 * earmark.h
 *	  What every part of earmark shares: its own SQLSTATEs and the first
 *	  keys of the advisory locks it takes.  Nothing else lives here; each
 *	  file's functions are declared in its own header.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_H
#define EARMARK_H

#include "postgres.h"

/*
 * earmark's own SQLSTATEs (class "EM").  Standard codes are used where one
 * fits: 22004 for a NULL argument, 22023 for an invalid value, 22001 for a
 * name or key that is too long, 22003 for an amount that would overflow.
 */
#define ERRCODE_EARMARK_IDEMPOTENCY_CONFLICT	MAKE_SQLSTATE('E','M','0','0','1')
#define ERRCODE_EARMARK_ANCHOR_LOCKED			MAKE_SQLSTATE('E','M','0','0','2')
#define ERRCODE_EARMARK_UNKNOWN_JOB				MAKE_SQLSTATE('E','M','0','0','3')
#define ERRCODE_EARMARK_UNKNOWN_EVENT			MAKE_SQLSTATE('E','M','0','0','4')
#define ERRCODE_EARMARK_EVENT_STATE				MAKE_SQLSTATE('E','M','0','0','5')
#define ERRCODE_EARMARK_NOT_YOUR_EVENT			MAKE_SQLSTATE('E','M','0','0','6')
#define ERRCODE_EARMARK_UNKNOWN_ACCOUNT			MAKE_SQLSTATE('E','M','0','0','7')
#define ERRCODE_EARMARK_SCHEMA_VERSION			MAKE_SQLSTATE('E','M','0','0','8')
#define ERRCODE_EARMARK_PROVIDER				MAKE_SQLSTATE('E','M','2','0','1')
#define ERRCODE_EARMARK_READ_BACK_DIFFERS		MAKE_SQLSTATE('E','M','2','0','2')

/*
 * The signed intake's SQLSTATEs (intake.c, inbox.c).  Every verification
 * error has its own so that an HTTP endpoint in front of earmark can
 * answer with the right status; the status each one maps to is noted
 * beside it.  Nothing is stored when any of them is raised.
 */
/* no signature matched, or a JWT's alg is not RS256 (401) */
#define ERRCODE_EARMARK_INVALID_SIGNATURE	MAKE_SQLSTATE('E','M','1','0','1')
/* webhook-timestamp outside earmark.webhook_tolerance (401) */
#define ERRCODE_EARMARK_STALE_TIMESTAMP		MAKE_SQLSTATE('E','M','1','0','2')
/* malformed signature header, timestamp, token, base64 or JSON (400) */
#define ERRCODE_EARMARK_MALFORMED_WEBHOOK	MAKE_SQLSTATE('E','M','1','0','3')
/* the JWT's kid is not in the key set, even after a refetch (401) */
#define ERRCODE_EARMARK_UNKNOWN_KEY			MAKE_SQLSTATE('E','M','1','0','4')
/* the key set cannot be fetched, or is not one (503) */
#define ERRCODE_EARMARK_JWKS_UNAVAILABLE	MAKE_SQLSTATE('E','M','1','0','5')
/* the JWT's exp has passed (401) */
#define ERRCODE_EARMARK_TOKEN_EXPIRED		MAKE_SQLSTATE('E','M','1','0','6')
/* no webhook secret is configured for the source (401) */
#define ERRCODE_EARMARK_NO_SECRET			MAKE_SQLSTATE('E','M','1','0','7')
/* the event's time is further ahead of now than earmark.webhook_tolerance (400) */
#define ERRCODE_EARMARK_EVENT_IN_FUTURE		MAKE_SQLSTATE('E','M','1','0','8')

/* first key of the meter mark locks ("emmk"), see budget.c */
#define EARMARK_MARK_CLASS		0x656d6d6b
/* first key of the database's send lock ("emsd"), see meter.c */
#define EARMARK_SEND_CLASS		0x656d7364
/*
 * fourth keys of earmark's own advisory locks: no SQL function makes them
 * (PostgreSQL's advisory lock functions use 1 and 2, Citus 4 to 15), so no
 * role can take such a lock by hand and make earmark's writers or its
 * worker wait.  The account's lock ("en", account.c em_account_key_lock),
 * which orders anchor changes with the creation of budget rows; its limit
 * refresh lock ("em", limit_cache.c); a cycle's mark lock ("ek", budget.c);
 * the database's send lock (3, meter.c); the database's distribution lock
 * ("ed", cluster.c).
 */
#define EARMARK_ACCOUNT_LOCKTAG	0x656e
#define EARMARK_REFRESH_LOCKTAG	0x656d
#define EARMARK_MARK_LOCKTAG		0x656b
#define EARMARK_SEND_LOCKTAG		3
#define EARMARK_DISTRIBUTE_LOCKTAG	0x6564

#endif							/* EARMARK_H */
