/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The webhook inbox (inbox.c): storing an event, claiming events, and
 *	  applying one.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_INBOX_H
#define EARMARK_INBOX_H

#include "postgres.h"

#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* earmark.inbox_event.verified_by: how the event's source was verified */
#define EM_VERIFIED_STANDARD_WEBHOOKS	"standard_webhooks"
#define EM_VERIFIED_KINDE_JWT			"kinde_jwt"
#define EM_VERIFIED_ADMIN				"admin"

/* an event's time as the sender wrote it (ISO 8601), or raise */
extern TimestampTz em_parse_event_time(const char *s);

/*
 * Store an event once per (source, dedupe_key): *inserted says whether
 * this call stored it.  verified_by says how the event was verified: one
 * of the EM_VERIFIED_* above, or NULL for an unverified event, which is
 * refused (42501) where only verified events may go.  An event time further ahead
 * than earmark.webhook_tolerance is refused (EM108).  Runs in the caller's
 * SPI connection.
 */
extern void em_inbox_store_verified(text *source, text *dedupe_key,
									text *event_type, Jsonb *payload,
									bool has_occurred_at,
									TimestampTz occurred_at, text *account,
									const char *verified_by,
									int64 *event_id, bool *inserted);

/* hand back (event_id, inserted) as a receive function's row */
extern void em_return_event_id(FunctionCallInfo fcinfo, int64 event_id, bool inserted);

/* the worker's side: claim events that have a handler, apply one */
extern uint64 em_inbox_claim(int max_events, Interval *lease, bool with_handler);
extern const char *em_inbox_apply(int64 event_id, int attempts);

/*
 * inbox.c's own, called by no other file (they could be static there):
 * an unverified store, and marking an event failed.
 */
extern void em_inbox_store(text *source, text *dedupe_key, text *event_type,
						   Jsonb *payload, bool has_occurred_at,
						   TimestampTz occurred_at, text *account,
						   int64 *event_id, bool *inserted);
extern const char *em_inbox_fail(int64 event_id, const char *error);

#endif							/* EARMARK_INBOX_H */
