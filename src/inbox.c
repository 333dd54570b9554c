/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  The webhook inbox: store then answer, claim with SKIP LOCKED and a
 *	  lease, complete / ignore / fail with backoff, replay, handlers.
 *
 *	  Tables: earmark.inbox_event, earmark.inbox_receipt,
 *	  earmark.inbox_handler.
 *
 *	  Locks: receiving takes the event's key through the first
 *	  delivery's receipt, INSERT ... ON CONFLICT DO NOTHING (a copy waits
 *	  for a concurrent first delivery of the same key, then, in a
 *	  statement of its own, only counts itself under the event's row
 *	  lock; a copy, and the rare round that neither stores nor counts,
 *	  then read the key's receipt by index from C, direct.c, with
 *	  AccessShareLock).  Claims lock due rows FOR UPDATE SKIP LOCKED, so
 *	  two consumers never wait for each other and never get the same event;
 *	  an event whose lease passed on its last attempt is marked dead under
 *	  the same lock, by the claim whose walk meets it.  inbox_event has no
 *	  CHECK constraints: this file is the only writer of status, finished
 *	  and verified_by, and writes only the values docs/inbox.md lists.
 *	  complete, ignore, fail and replay update one event row.  No inbox
 *	  function touches a gate table, so the inbox and the gate cannot
 *	  deadlock with each other; handlers may call the gate, in their own
 *	  transaction.  The built-in plan change (earmark.apply_plan_change,
 *	  in earmark.sql) locks the account's earmark.account_limit rows
 *	  before its earmark.account row, the order of the limit refresh
 *	  (em_refresh_account_limits, limit_cache.c), so the two cannot deadlock.
 *
 *	  The worker applies events that have a handler (em_inbox_apply): it
 *	  claims one event in a short transaction of its own (so that a handler
 *	  that crashes the process still uses up an attempt), then runs the
 *	  handler and the event's mark in a second transaction: both happen or
 *	  neither.  A handler runs as its owner in a security-restricted
 *	  operation whose settings are rolled back when it returns.
 *
 *	  Verified and unverified events: each event records how its source
 *	  was verified (verified_by: a signed intake, or a member of
 *	  earmark_admin who stored it).  An unverified event is refused at
 *	  intake where only verified ones may go (a type whose handler does not
 *	  accept unverified events, a source earmark verifies), and the worker
 *	  never gives one to such a handler.  An event time further ahead than
 *	  earmark.webhook_tolerance is refused at intake (EM108).  An
 *	  application finishes (complete, ignore, fail) only events of types
 *	  without a handler; the worker's events are earmark_admin's.
 *
 *	  earmark_inbox_receive, _claim, _complete, _ignore and _fail have no
 *	  SET search_path clause: each runs its body through em_call_pinned
 *	  (spi.c), which pins the search path for the call.  None of them calls
 *	  a handler: handlers run only in the worker (em_inbox_apply), under
 *	  the worker's own setting.  Code of the user's that their statements
 *	  may run (a trigger put on an earmark table) gets its own SET
 *	  search_path from spi.c's fmgr hook.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/explain.h"
#include "commands/sequence.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgtime.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "cluster.h"
#include "direct.h"
#include "earmark.h"
#include "inbox.h"
#include "settings.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_inbox_receive);
PG_FUNCTION_INFO_V1(earmark_inbox_claim);
PG_FUNCTION_INFO_V1(earmark_inbox_claim_plan);
PG_FUNCTION_INFO_V1(earmark_inbox_complete);
PG_FUNCTION_INFO_V1(earmark_inbox_ignore);
PG_FUNCTION_INFO_V1(earmark_inbox_fail);
PG_FUNCTION_INFO_V1(earmark_inbox_replay);
PG_FUNCTION_INFO_V1(earmark_inbox_set_handler);

/* attempts before an event is dead, and the waits after each failure */
#define INBOX_MAX_ATTEMPTS	6
static const int64 inbox_backoff_s[] = {5, 30, 120, 600, 3600};

/* ---------------------------------------------------------------------
 * Event time
 * ---------------------------------------------------------------------
 */

/*
 * timestamptz_in with the time zone UTC and PostgreSQL's default date
 * order (month, day, year), whatever the session's TimeZone and DateStyle:
 * a time without an offset is the same instant from every connection, so
 * the order of two events does not depend on which one stored them.
 */
static TimestampTz
parse_in_utc(const char *s)
{
	static pg_tz *utc = NULL;
	pg_tz	   *session_tz = session_timezone;
	int			order = DateOrder;
	TimestampTz t = 0;

	if (utc == NULL)
		utc = pg_tzset("UTC");
	if (utc == NULL)
		elog(ERROR, "earmark: the time zone UTC cannot be loaded");
	session_timezone = utc;
	DateOrder = DATEORDER_MDY;
	PG_TRY();
	{
		t = DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in,
													CStringGetDatum(s),
													ObjectIdGetDatum(InvalidOid),
													Int32GetDatum(-1)));
	}
	PG_FINALLY();
	{
		session_timezone = session_tz;
		DateOrder = order;
	}
	PG_END_TRY();
	return t;
}

/*
 * Parse an event's timestamp.  Providers send up to nine fractional
 * digits (2026-10-21T02:29:24.481368869+11:00); timestamptz_in would round
 * them to the microsecond, possibly into the next one.  Truncate to six
 * instead, so that an event time never moves later than the provider
 * said: the plan-change guard compares these times.  Offsets like +11
 * parse as they are; a time without one is UTC (parse_in_utc).
 */
TimestampTz
em_parse_event_time(const char *s)
{
	StringInfoData buf;
	const char *p = s;

	initStringInfo(&buf);
	while (*p)
	{
		appendStringInfoChar(&buf, *p);
		if (*p == '.' && p > s && isdigit((unsigned char) p[-1]))
		{
			int			n = 0;

			p++;
			while (isdigit((unsigned char) *p))
			{
				if (n++ < 6)
					appendStringInfoChar(&buf, *p);
				p++;
			}
			continue;
		}
		p++;
	}
	return parse_in_utc(buf.data);
}

/* a top-level string field of a jsonb object, or NULL */
static char *
jsonb_string_field(Jsonb *jb, const char *key)
{
	JsonbValue *v;

	if (!JB_ROOT_IS_OBJECT(jb))
		return NULL;
	v = getKeyJsonValueFromContainer(&jb->root, key, strlen(key), NULL);
	if (v == NULL || v->type != jbvString)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/* the event's own time: event_timestamp, else timestamp, else occurred_at */
static bool
payload_event_time(Jsonb *payload, TimestampTz *result)
{
	static const char *const keys[] = {"event_timestamp", "timestamp", "occurred_at"};
	int			i;

	for (i = 0; i < (int) lengthof(keys); i++)
	{
		char	   *s = jsonb_string_field(payload, keys[i]);

		if (s != NULL)
		{
			*result = em_parse_event_time(s);
			return true;
		}
	}
	return false;
}

/* ---------------------------------------------------------------------
 * Who calls
 * ---------------------------------------------------------------------
 */

/* the worker's handler runs for this event (em_inbox_apply), or 0 */
static int64 applying_event_id = 0;

/*
 * earmark_inbox_receive, _complete, _ignore and _fail decide with the
 * caller's rights (is it a member of earmark_admin?), which a SECURITY
 * DEFINER function can no longer see: the caller is gone once fmgr has
 * switched to the owner.  So they are SECURITY INVOKER, with the search
 * path pinned in C (em_call_pinned), and switch to the function's owner
 * themselves, as SECURITY DEFINER would have, for their statements.  An
 * error on the way is undone by the (sub)transaction's abort, which
 * restores the user.
 */
typedef struct AsOwner
{
	Oid			caller;
	Oid			save_userid;
	int			save_sec;
} AsOwner;

static void
become_owner(FunctionCallInfo fcinfo, AsOwner *a)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	GetUserIdAndSecContext(&a->save_userid, &a->save_sec);
	a->caller = a->save_userid;
	SetUserIdAndSecContext(owner, a->save_sec | SECURITY_LOCAL_USERID_CHANGE);
}

static void
end_owner(AsOwner *a)
{
	SetUserIdAndSecContext(a->save_userid, a->save_sec);
}

/* has role the rights of earmark_admin (a superuser has every role's)? */
static bool
is_admin(Oid role)
{
	Oid			admin = get_role_oid("earmark_admin", true);

	return superuser_arg(role) ||
		(OidIsValid(admin) && has_privs_of_role(role, admin));
}

/* ---------------------------------------------------------------------
 * Receive
 * ---------------------------------------------------------------------
 */
/*
 * A first delivery in one statement: its receipt takes the event's key,
 * then the event is stored with the id taken for it ($8, from the event's
 * identity sequence).  ON CONFLICT DO NOTHING: when the key is taken (by a
 * committed delivery, or by one in progress, which the insert waits for)
 * nothing is written; if the delivery it waited for rolled back, this one
 * is stored.  (The key is on the receipt, written once, so that the
 * event's own updates write no entry in a key index: earmark.sql.)  No
 * row back: the key was taken, or a trigger of the user's skipped the
 * event's insert (key_is_ours tells, on that rare path only).  The event
 * takes its id and key from the receipt's row, and the row back is the
 * event's id, source and key, which must be the delivery's (same_text:
 * bytes, as the columns' deterministic collation compares them for
 * equality).  So a trigger on either table that changed the key, or one
 * on the event that changed its id (then the receipt names another id:
 * receipt_names, on that rare path only), which would leave a key that
 * leads to no event, is refused; a trigger on the receipt may move the id
 * the receipt names, and the event follows it.
 */
static EmStatement store_first = {
	"WITH r AS ("
	"  INSERT INTO earmark.inbox_receipt AS r (event_id, inserted, source, dedupe_key) "
	"  VALUES ($8, true, $1, $2) "
	"  ON CONFLICT (source, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING "
	"  RETURNING r.event_id, r.source, r.dedupe_key"
	") "
	"INSERT INTO earmark.inbox_event "
	"    (event_id, source, dedupe_key, event_type, payload, occurred_at, account, verified_by) "
	"  OVERRIDING SYSTEM VALUE "
	"  SELECT r.event_id, coalesce(r.source, ''), coalesce(r.dedupe_key, ''), $3, $4, $5, $6, $7 FROM r "
	"RETURNING event_id, source, dedupe_key",
	8, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, INT8OID}
};

/*
 * The key's receipt, read by index from C (key_is_ours): the event id it
 * names.
 */
static EmDirect receipt_by_key = {
	.table = "inbox_receipt", .nkeys = 2, .keys = {"dedupe_key", "source"},
	.ncols = 1, .cols = {"event_id"}
};

/*
 * The event table, for em_direct_insert_stores (key_is_ours) only: no keys,
 * so no index of the table is needed.
 */
static EmDirect event_table = {.table = "inbox_event"};

/*
 * A copy: one more on the event's seen_count (a HOT update), and a receipt
 * without the key.  A separate statement, so that under READ COMMITTED its
 * snapshot sees the delivery whose key store_first met (under REPEATABLE
 * READ a key committed after the snapshot fails store_first with 40001).
 * The event must still carry the key: an event deleted without its
 * receipts, or one whose id was dealt again after a restart of the
 * identity, is not this key's.  The id back is the event's (a trigger may
 * change the receipt's).
 */
static EmStatement store_copy = {
	"WITH u AS ("
	"  UPDATE earmark.inbox_event e SET seen_count = e.seen_count + 1 "
	"    FROM earmark.inbox_receipt r "
	"   WHERE r.source = $1 AND r.dedupe_key = $2 AND e.event_id = r.event_id "
	"     AND e.source = $1 AND e.dedupe_key = $2 "
	"  RETURNING e.event_id) "
	"INSERT INTO earmark.inbox_receipt (event_id, inserted) SELECT event_id, false FROM u "
	"RETURNING (SELECT u.event_id FROM u)",
	2, {TEXTOID, TEXTOID}
};

/*
 * The key's receipt outlived its event (deleted without its receipts, as
 * docs/inbox.md asks not to): the key is free again, as it was when the
 * event's row held it.  The receipt stays, without the key.
 */
static EmStatement free_stale_key = {
	"UPDATE earmark.inbox_receipt r SET source = NULL, dedupe_key = NULL "
	" WHERE r.source = $1 AND r.dedupe_key = $2 "
	"   AND NOT EXISTS (SELECT 1 FROM earmark.inbox_event e "
	"                    WHERE e.event_id = r.event_id AND e.source = $1 AND e.dedupe_key = $2)",
	2, {TEXTOID, TEXTOID}
};

/* the next event id, from the event's identity sequence */
static int64
next_event_id(void)
{
	Oid			seq = get_relname_relid("inbox_event_event_id_seq",
										get_namespace_oid("earmark", false));

	if (!OidIsValid(seq))
		elog(ERROR, "earmark: sequence earmark.inbox_event_event_id_seq does not exist");
	return nextval_internal(seq, true);
}

static void
report_skipped_insert(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("the event was not stored: a trigger skipped its insert"),
			 errdetail("The receipt this delivery wrote holds the key, and the delivery's statement did not store the event."),
			 errhint("A BEFORE INSERT trigger on earmark.inbox_event or earmark.inbox_receipt must return the row.")));
}

static void
report_changed_insert(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("the event was not stored under its key: a trigger changed its id or its key"),
			 errdetail("The event's id, source or dedupe key differs from what its receipt names, "
					   "so its key would lead to no event."),
			 errhint("A BEFORE INSERT trigger on earmark.inbox_event or earmark.inbox_receipt "
					 "must not change event_id, source or dedupe_key.")));
}

/* whether column col of the result's first row is the text t, byte for byte */
static bool
same_text(int col, Datum t)
{
	bool		isnull;
	Datum		v = em_get(0, col, &isnull);

	return !isnull && em_text_eq(DatumGetTextPP(v), DatumGetTextPP(t));
}

/* the delivery's key (args: store_first's) in receipt_by_key's order */
static void
receipt_key(Datum *args, Datum *keys)
{
	keys[0] = args[1];			/* dedupe_key */
	keys[1] = args[0];			/* source */
}

/* whether the receipt that holds the key names event id */
static bool
receipt_names(Datum *args, int64 id)
{
	Snapshot	snap = em_direct_statement_snapshot(&receipt_by_key.table, 1);
	Datum		keys[2];
	Datum		v[1];
	bool		n[1];
	bool		names;

	receipt_key(args, keys);
	names = em_direct_get(&receipt_by_key, keys, snap, v, n) &&
		!n[0] && DatumGetInt64(v[0]) == id;
	em_direct_release(snap);
	return names;
}

/*
 * After store_first returned no row: whether the key's receipt is the one
 * this round wrote, so that a trigger or a rule of the user's, not an
 * earlier delivery, kept the event from coming back.  Without a rule or a
 * BEFORE INSERT row trigger on either table (em_direct_insert_stores; both
 * are locked by store_first's insert) each receipt the insert writes
 * comes back as an event: no row back means it wrote none, the key being
 * taken before its insert (by an earlier delivery, or by the user's code
 * that ran in the statement and delivered the key itself: a statement
 * trigger, a default; then the event it stored is the one counted), and
 * the receipt is not looked up.  Otherwise: this transaction wrote the
 * receipt's visible version at command id since (the round's start) or
 * later.  Not by the event id it names (a receipt trigger may move it, and
 * an id can be dealt again after a restart of the identity), nor by the
 * receipt's xmin column: a frozen row keeps its raw xmin, which 2^32
 * transactions later is this transaction's id (em_direct_inserted_here).
 */
static bool
key_is_ours(Datum *args, CommandId since)
{
	Snapshot	snap;
	Datum		keys[2];
	bool		ours;

	if (em_direct_insert_stores(&receipt_by_key) &&
		em_direct_insert_stores(&event_table))
		return false;
	snap = em_direct_statement_snapshot(&receipt_by_key.table, 1);
	receipt_key(args, keys);
	ours = em_direct_inserted_here(&receipt_by_key, keys, snap, since);
	em_direct_release(snap);
	return ours;
}

/*
 * Store the delivery (args: store_first's, whose $8 this fills): first, or
 * a copy.  Each round either stores, counts a copy, or frees a key whose
 * event is gone (or finds that a concurrent delivery did); a key that
 * changes hands at every round is a serialization failure the caller
 * retries.
 */
static void
store_delivery(Datum *args, const char *nulls, int64 *event_id, bool *inserted)
{
	int			round;
	int64		id;

	for (round = 0; round < 3; round++)
	{
		CommandId	since;

		/*
		 * Past every command id written at so far, the caller's statement's
		 * own too (a writable WITH of the statement that calls this): SPI
		 * advances the counter before store_first anyway, so this costs
		 * nothing.
		 */
		CommandCounterIncrement();
		since = GetCurrentCommandId(false);
		id = next_event_id();
		args[7] = Int64GetDatum(id);
		em_exec(&store_first, args, nulls, 0);
		if (SPI_processed == 1)
		{
			*event_id = em_get_int64(0, 1, 0);
			if (!same_text(2, args[0]) || !same_text(3, args[1]) ||
				(*event_id != id && !receipt_names(args, *event_id)))
				report_changed_insert();
			*inserted = true;
			return;
		}
		em_exec(&store_copy, args, nulls, 0);
		if (SPI_processed == 1)
		{
			*event_id = em_get_int64(0, 1, 0);
			*inserted = false;
			/* this round's receipt: a trigger stored the event its own way */
			if (key_is_ours(args, since))
				report_skipped_insert();
			return;
		}
		/* this round's receipt, and no event: a trigger skipped its insert */
		if (key_is_ours(args, since))
			report_skipped_insert();
		em_exec(&free_stale_key, args, nulls, 0);
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not store the event: its key changed hands during the delivery"),
			 errdetail("Concurrent deliveries and deletions of events with this key kept taking and freeing it, "
					   "or a trigger on earmark.inbox_event skipped the copy's update, "
					   "or one on earmark.inbox_receipt skipped the receipt's insert."),
			 errhint("Retry the delivery.")));
}

/*
 * Where an unverified event may not go: under a source earmark verifies
 * (kinde, or one with a webhook secret), where it could take the dedupe
 * key of a genuine event to come; or to a type whose handler takes only
 * verified events.
 */
/* the columns of unverified_refused */
enum
{
	UR_VERIFIED_SOURCE = 1, UR_STRICT_HANDLER
};

static EmStatement unverified_refused = {
	"SELECT ($1 = 'kinde' OR EXISTS (SELECT 1 FROM earmark.webhook_secret s WHERE s.source = $1)), "
	"       (SELECT h.handler::oid FROM earmark.inbox_handler h "
	"         WHERE h.event_type = $2 AND NOT h.accepts_unverified)",
	2, {TEXTOID, TEXTOID}
};

static void
check_unverified(text *source, text *event_type)
{
	Datum		args[2];
	bool		isnull;
	Datum		handler;

	args[0] = PointerGetDatum(source);
	args[1] = PointerGetDatum(event_type);
	em_exec(&unverified_refused, args, NULL, 1);
	if (DatumGetBool(em_get(0, UR_VERIFIED_SOURCE, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("source \"%s\" takes only verified events", text_to_cstring(source)),
				 errdetail("Its events come through a signed intake (earmark_inbox_receive_signed, "
						   "earmark_inbox_receive_kinde); an unverified event could take the key of a genuine one."),
				 errhint("Store your own events under a source of your own, or as a member of earmark_admin.")));
	handler = em_get(0, UR_STRICT_HANDLER, &isnull);
	if (!isnull)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("an unverified event of type \"%s\" cannot be stored", text_to_cstring(event_type)),
				 errdetail("Its handler %s takes only verified events: signed "
						   "(earmark_inbox_receive_signed, earmark_inbox_receive_kinde) or stored by a member of earmark_admin.",
						   format_procedure_qualified(DatumGetObjectId(handler))),
				 errhint("Deliver it through a signed intake.")));
}

/*
 * An event time further ahead of the clock than earmark.webhook_tolerance
 * (the clock skew allowed between earmark and a sender) is refused: a
 * handler that orders by event time, like the built-in plan change, would
 * take every later genuine event for an older one.
 */
static void
check_not_future(TimestampTz occurred_at, TimestampTz now)
{
	if (occurred_at > now &&
		occurred_at - now > (int64) earmark_webhook_tolerance_s * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_EVENT_IN_FUTURE),
				 errmsg("event time %s is in the future", timestamptz_to_str(occurred_at)),
				 errdetail("An event time may be at most earmark.webhook_tolerance (%d s) ahead of the server's clock.",
						   earmark_webhook_tolerance_s),
				 errhint("Check the sender's clock, and pass the time the event happened.")));
}

/*
 * Store a delivery: the event once per (source, dedupe_key), a copy only
 * counted, and a receipt for every delivery (store_delivery).  verified_by
 * says how its source was verified (NULL: not at all).  Runs in the
 * caller's SPI connection.
 */
void
em_inbox_store_verified(text *source, text *dedupe_key, text *event_type,
						Jsonb *payload, bool has_occurred_at,
						TimestampTz occurred_at, text *account,
						const char *verified_by, int64 *event_id, bool *inserted)
{
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	TimestampTz now = GetCurrentTimestamp();

	if (!has_occurred_at && !payload_event_time(payload, &occurred_at))
		occurred_at = now;
	if (TIMESTAMP_NOT_FINITE(occurred_at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurred_at must be a finite timestamp")));
	if (verified_by == NULL)
		check_unverified(source, event_type);
	else if (strcmp(verified_by, EM_VERIFIED_STANDARD_WEBHOOKS) != 0 &&
			 strcmp(verified_by, EM_VERIFIED_KINDE_JWT) != 0 &&
			 strcmp(verified_by, EM_VERIFIED_ADMIN) != 0)
		/* the rule a CHECK constraint would keep (docs/inbox.md#the-event-row) */
		elog(ERROR, "earmark: unknown verified_by \"%s\"", verified_by);
	check_not_future(occurred_at, now);

	args[0] = PointerGetDatum(source);
	args[1] = PointerGetDatum(dedupe_key);
	args[2] = PointerGetDatum(event_type);
	args[3] = JsonbPGetDatum(payload);
	args[4] = TimestampTzGetDatum(occurred_at);
	args[5] = PointerGetDatum(account);
	if (account == NULL)
		nulls[5] = 'n';
	args[6] = verified_by ? CStringGetTextDatum(verified_by) : (Datum) 0;
	if (verified_by == NULL)
		nulls[6] = 'n';
	store_delivery(args, nulls, event_id, inserted);
}

/* an unverified store (earmark.h's older entry point) */
void
em_inbox_store(text *source, text *dedupe_key, text *event_type, Jsonb *payload,
			   bool has_occurred_at, TimestampTz occurred_at, text *account,
			   int64 *event_id, bool *inserted)
{
	em_inbox_store_verified(source, dedupe_key, event_type, payload,
							has_occurred_at, occurred_at, account, NULL,
							event_id, inserted);
}

void
em_return_event_id(FunctionCallInfo fcinfo, int64 event_id, bool inserted)
{
	Datum		values[2];
	bool		nulls[2] = {false, false};

	values[0] = Int64GetDatum(event_id);
	values[1] = BoolGetDatum(inserted);
	em_return_row(fcinfo, values, nulls);
}

/*
 * earmark_inbox_receive(source, dedupe_key, event_type, payload,
 * occurred_at, account) RETURNS TABLE (event_id, inserted)
 *
 * Nothing here checks a signature, so the event is verified only when
 * its caller vouches for it: a member of earmark_admin ('admin').  Anyone
 * else's event is unverified, and is refused where only verified events
 * may go (check_unverified).
 */
static Datum receive_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_receive(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, receive_body);
}

static Datum
receive_body(PG_FUNCTION_ARGS)
{
	text	   *source = em_arg_name(fcinfo, 0, "source");
	text	   *dedupe_key = em_arg_name(fcinfo, 1, "dedupe_key");
	text	   *event_type = em_arg_name(fcinfo, 2, "event_type");
	Jsonb	   *payload;
	text	   *account = NULL;
	int64		event_id;
	bool		inserted;
	AsOwner		a;
	em_require_coordinator("earmark_inbox_receive");

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be NULL")));
	payload = PG_GETARG_JSONB_P(3);
	if (!PG_ARGISNULL(5))
		account = em_arg_name(fcinfo, 5, "account");

	become_owner(fcinfo, &a);
	SPI_connect();
	em_inbox_store_verified(source, dedupe_key, event_type, payload,
							!PG_ARGISNULL(4), PG_ARGISNULL(4) ? 0 : PG_GETARG_TIMESTAMPTZ(4),
							account, is_admin(a.caller) ? EM_VERIFIED_ADMIN : NULL,
							&event_id, &inserted);
	SPI_finish();
	end_owner(&a);

	em_return_event_id(fcinfo, event_id, inserted);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * Claim
 * ---------------------------------------------------------------------
 */

/*
 * The claim.  An application's claim (CLAIM_APP) walks the partial index
 * inbox_event_due, whose keys are exactly its ORDER BY and whose predicate
 * (NOT finished) its first condition repeats, and LIMIT stops it after the
 * batch: a claim reads the batch plus the rows it skips (events leased to
 * other consumers, failed ones still waiting, the worker's events), never
 * the whole backlog, and sorts only the rows it returns.  The batch size
 * is a literal, not a parameter: the planner then knows how few rows are
 * wanted, and the plan is made once per backend and batch size (a generic
 * plan, see claim_plan), not at every claim.
 *
 * The worker's claim (CLAIM_WORKER) takes only events of types with a
 * handler, which are few types while the applications' events may be a
 * large backlog: it walks inbox_event_typed_due ((event_type, occurred_at,
 * event_id) of the events not finished) once per handled type, each walk
 * cut after the batch, and keeps the batch's oldest of those.  Walking
 * inbox_event_due instead would pass over every waiting application event
 * at every pass (with 200,000 waiting, a tenth of a CPU core, all the time,
 * test/bench/inbox_worker.sh).
 *
 * The worker's claim may lock up to a batch per handled type and claim only
 * a batch: the others stay locked until its short transaction commits,
 * skipped by the applications' claims meanwhile, which never take them
 * anyway.
 *
 * Each walk also finds the events whose lease passed: one with attempts
 * left is claimed again; one whose lease passed on its last attempt is
 * marked dead here, under the same SKIP LOCKED lock, and left out of what
 * the claim returns (keep_claimed): a claim that buries returns that many
 * fewer, and one that buried its whole batch runs again, so that a claim
 * returns nothing only when nothing is due.  An application's claim buries
 * such events of either side; the worker's, those of handled types.  No
 * index on locked_until or status is needed for it, and so the claim's
 * UPDATE changes no indexed column: a HOT update.
 *
 * $1 lease, $2 now, $3 (an application's claim): false, so that it never
 * takes an event the worker is meant to apply (the worker's claim reads
 * only handled types and does not use $3); $4 the attempts after which an
 * event is dead; ($5, $6) the (occurred_at, event_id) after which the
 * walk starts: the first run starts at the beginning, a run after a batch
 * that was all buried just after that batch (em_inbox_claim).
 */
#define CLAIM_BURIES "e.status = 'processing' AND e.attempts >= $4"
#define CLAIM_DUE \
	"NOT d.finished AND (d.occurred_at, d.event_id) > ($5, $6)" \
	"  AND ((d.status IN ('received', 'failed') AND d.next_attempt_at <= $2" \
	"        AND d.attempts < $4)" \
	"       OR (d.status = 'processing' AND d.locked_until < $2))"
#define CLAIM_SIDE \
	"EXISTS (SELECT 1 FROM earmark.inbox_handler h WHERE h.event_type = d.event_type) = $3"
/* the due events of an application's claim, %d the batch */
#define CLAIM_APP \
	"(SELECT d.event_id FROM earmark.inbox_event d" \
	"  WHERE " CLAIM_DUE \
	"    AND (" CLAIM_SIDE " OR (d.status = 'processing' AND d.attempts >= $4))" \
	"  ORDER BY d.occurred_at, d.event_id" \
	"  LIMIT %d FOR UPDATE SKIP LOCKED)"
/*
 * The due events of the worker's claim, %d the batch (twice).  The type is
 * matched by ">= AND <=", which with the type's (deterministic) collation
 * is "=", so that the plan cannot walk inbox_event_due instead: with "=",
 * the planner takes the type for a constant and the order for (occurred_at,
 * event_id), which inbox_event_due also gives, and its generic estimate of
 * "=" (one in as many event types as the table has) makes a walk of
 * inbox_event_due with a filter look cheap when the backlog has one type.
 * A range on the type keeps it in the order, which only
 * inbox_event_typed_due gives without a sort of every due event.
 */
#define CLAIM_WORKER \
	"(SELECT w.event_id FROM earmark.inbox_handler h" \
	"  CROSS JOIN LATERAL" \
	"   (SELECT d.event_id, d.occurred_at FROM earmark.inbox_event d" \
	"     WHERE d.event_type >= h.event_type AND d.event_type <= h.event_type" \
	"       AND " CLAIM_DUE \
	"     ORDER BY d.event_type, d.occurred_at, d.event_id" \
	"     LIMIT %d FOR UPDATE SKIP LOCKED) AS w" \
	"  ORDER BY w.occurred_at, w.event_id LIMIT %d)"
/* the claim, %s the due events */
#define CLAIM_SQL \
	"WITH c AS (" \
	"  UPDATE earmark.inbox_event AS e" \
	"     SET status = CASE WHEN " CLAIM_BURIES " THEN 'dead' ELSE 'processing' END," \
	"         attempts = CASE WHEN " CLAIM_BURIES " THEN e.attempts ELSE e.attempts + 1 END," \
	"         locked_until = CASE WHEN " CLAIM_BURIES " THEN NULL" \
	"                        ELSE " EM_SQL_PLUS_UTC("$2", "$1") " END," \
	"         last_error = CASE WHEN " CLAIM_BURIES \
	"                      THEN coalesce(e.last_error, 'its lease passed on every attempt')" \
	"                      ELSE e.last_error END," \
	"         finished = (" CLAIM_BURIES ")," \
	"         updated_at = $2" \
	"    FROM %s AS due" \
	"   WHERE e.event_id = due.event_id" \
	"  RETURNING e.*)" \
	"SELECT * FROM c ORDER BY occurred_at, event_id"

static const Oid claim_argtypes[6] = {
	INTERVALOID, TIMESTAMPTZOID, BOOLOID, INT4OID, TIMESTAMPTZOID, INT8OID
};

/* the kept claim plans, [with_handler], and the batch size of each */
static SPIPlanPtr claim_plans[2];
static int	claim_plan_batch[2];

/*
 * The planner settings both claims are planned under, at their first run
 * and whenever an invalidation plans them again (and so their plans, as
 * earmark_inbox_claim_plan shows them): read by index only and join row
 * by row.  The plan is kept for the session, so it must not depend on how
 * big the table looked when it was made:
 * - planned while earmark.inbox_event is empty (a new installation, or
 *   right after TRUNCATE, until autovacuum analyzes it), the estimates are
 *   those of a few pages, where a bitmap read of every due event and a
 *   sort (the application's claim), or the UPDATE's hash join over a
 *   sequential scan of the whole table (the worker's), look cheapest; kept
 *   while the backlog grows, they read all of it at each claim
 *   (sql/inbox_plan_empty.sql);
 * - the worker's walk matches each type by a join clause (">= AND <=" on
 *   inbox_handler's column), whose generic estimate is a fixed sliver of
 *   the due events whatever the statistics: with bitmap scans the planner
 *   reads all of a type's due events and sorts them at every claim (the
 *   worker's drain of a backlog of its own events was quadratic).
 * With these off, the only plan left is the one the claim is written for:
 * the ordered walk of inbox_event_due (inbox_event_typed_due per type)
 * that LIMIT cuts, and the update of each event it locked by its primary
 * key.  (enable_seqscan off alone turns the UPDATE's join into a merge
 * join over a full walk of the primary key: hence the joins too.)
 * They are in force while the claim is planned, not while it runs
 * (run_claim): SQL of the caller's that runs inside the claim, an
 * operator's trigger on inbox_event, is planned under the caller's own
 * settings (with enable_seqscan off, a trigger's update of a table it can
 * only scan was JIT-compiled at each row, and kept so by PL/pgSQL's plan
 * cache for the rest of the session).
 * Returns the GUC nest level to give claim_settings_end.
 */
static int
claim_settings_begin(void)
{
	/*
	 * The two left on are the ones the plan is then made of: a session of
	 * the caller's with either off would leave the planner nothing but
	 * disabled paths (a claim 20 times slower than before these settings,
	 * with a JIT compilation of it at every claim).
	 */
	static const char *const settings[][2] = {
		{"enable_seqscan", "off"}, {"enable_bitmapscan", "off"},
		{"enable_hashjoin", "off"}, {"enable_mergejoin", "off"},
		{"enable_indexscan", "on"}, {"enable_nestloop", "on"}
	};
	int			level = NewGUCNestLevel();
	int			i;

	for (i = 0; i < lengthof(settings); i++)
		(void) set_config_option(settings[i][0], settings[i][1], PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	return level;
}

static void
claim_settings_end(int level)
{
	AtEOXact_GUC(true, level);
}

/*
 * The claim's plan for a batch size, prepared once per backend (again
 * when the batch size changes) and always generic: planning it at every
 * claim cost more than running it.  Generic is safe here because nothing
 * the parameters say changes the best plan; the cached plan is remade
 * when the table's statistics or indexes change.
 */
static SPIPlanPtr
claim_plan(int max_events, bool with_handler)
{
	int			i = with_handler ? 1 : 0;

	if (claim_plans[i] != NULL && claim_plan_batch[i] != max_events)
	{
		SPI_freeplan(claim_plans[i]);
		claim_plans[i] = NULL;
	}
	if (claim_plans[i] == NULL)
	{
		char	   *due = with_handler ?
			psprintf(CLAIM_WORKER, max_events, max_events) :
			psprintf(CLAIM_APP, max_events);
		char	   *sql = psprintf(CLAIM_SQL, due);

		claim_plans[i] = em_prepare_kept(sql, lengthof(claim_argtypes),
										 (Oid *) claim_argtypes,
										 CURSOR_OPT_GENERIC_PLAN);
		claim_plan_batch[i] = max_events;
	}
	return claim_plans[i];
}

/*
 * Drop the events the claim buried (status dead) from SPI_tuptable, in
 * place and in order; returns the number kept, *buried the number dropped.
 */
static uint64
keep_claimed(uint64 *buried)
{
	SPITupleTable *t = SPI_tuptable;
	int			status_col = SPI_fnumber(t->tupdesc, "status");
	uint64		n = SPI_processed;
	uint64		kept = 0;
	uint64		i;

	for (i = 0; i < n; i++)
	{
		bool		isnull;
		char	   *status = TextDatumGetCString(SPI_getbinval(t->vals[i], t->tupdesc,
															  status_col, &isnull));

		if (strcmp(status, "processing") == 0)
			t->vals[kept++] = t->vals[i];
	}
	*buried = n - kept;
	t->numvals = kept;
	SPI_processed = kept;
	return kept;
}

/*
 * Where the claim's walk of inbox_event_due stopped: the key of its last
 * row (the rows come in walk order).  A claim that buried its whole batch
 * runs again from there: inside this transaction the buried events' index
 * entries are still walked, so starting from the beginning again would
 * read every event buried so far at each run (quadratic in a backlog of
 * abandoned events); the rows the walk passed over before it were not
 * claimable and would be passed over again.
 */
static void
walk_ended_at(Datum *occurred_at, Datum *event_id)
{
	SPITupleTable *t = SPI_tuptable;
	HeapTuple	last = t->vals[SPI_processed - 1];
	bool		isnull;

	*occurred_at = SPI_getbinval(last, t->tupdesc,
								 SPI_fnumber(t->tupdesc, "occurred_at"), &isnull);
	*event_id = SPI_getbinval(last, t->tupdesc,
							  SPI_fnumber(t->tupdesc, "event_id"), &isnull);
}

/*
 * Run the claim's plan with args, planned (or found valid) under the
 * claim's settings, which are for its planning only: SQL of the caller's
 * that runs inside the claim (an operator's trigger on inbox_event) is
 * planned, and its plans are kept, under the caller's own settings.  The
 * kept generic plan is made or checked here, which also takes the claim's
 * locks and so reads the invalidations that could make SPI_execute_plan
 * plan it again; SPI_execute_plan then runs that plan.  A session that
 * forces custom plans plans the claim in SPI_execute_plan, at each claim:
 * the settings then stay on for its run.  Returns SPI_execute_plan's code.
 */
static int
run_claim(SPIPlanPtr plan, Datum *args)
{
	bool		custom = plan_cache_mode == PLAN_CACHE_MODE_FORCE_CUSTOM_PLAN;
	CachedPlan *cplan = NULL;
	int			level = claim_settings_begin();
	int			rc;

	if (!custom)
	{
		cplan = SPI_plan_get_cached_plan(plan);
		claim_settings_end(level);
	}
	rc = SPI_execute_plan(plan, args, NULL, false, 0);
	if (custom)
		claim_settings_end(level);
	if (cplan != NULL)
		ReleaseCachedPlan(cplan, CurrentResourceOwner);
	return rc;
}

/* claim into the caller's SPI connection; returns the number claimed */
uint64
em_inbox_claim(int max_events, Interval *lease, bool with_handler)
{
	Datum		args[6];
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext cxt = CurrentMemoryContext;
	uint64		n;
	uint64		buried;
	int			rc;

	args[0] = IntervalPGetDatum(lease);
	args[1] = TimestampTzGetDatum(now);
	args[2] = BoolGetDatum(with_handler);
	args[3] = Int32GetDatum(INBOX_MAX_ATTEMPTS);
	args[4] = TimestampTzGetDatum(DT_NOBEGIN);
	args[5] = Int64GetDatum(0);
	do
	{
		rc = run_claim(claim_plan(max_events, with_handler), args);
		MemoryContextSwitchTo(cxt);
		if (rc < 0)
			elog(ERROR, "earmark: inbox claim failed: %s", SPI_result_code_string(rc));
		if (SPI_processed > 0)
			walk_ended_at(&args[4], &args[5]);
		n = keep_claimed(&buried);
	} while (n == 0 && buried > 0);
	return n;
}

/*
 * earmark_inbox_claim(max_events, lease) RETURNS SETOF earmark.inbox_event
 * Due events of types without a handler, oldest event time first.
 */
static Datum claim_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_claim(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, claim_body);
}

static Datum
claim_body(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_events;
	Interval   *lease;
	TimestampTz now = GetCurrentTimestamp();
	uint64		i;
	uint64		n;
	em_require_schema();
	em_require_coordinator("earmark_inbox_claim");

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_events and lease must not be NULL")));
	max_events = PG_GETARG_INT32(0);
	lease = PG_GETARG_INTERVAL_P(1);
	if (max_events <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_events must be greater than zero")));
	if (em_plus_utc(now, lease) <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be longer than zero")));

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	SPI_connect();
	n = em_inbox_claim(max_events, lease, false);
	for (i = 0; i < n; i++)
		tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
	SPI_finish();
	return (Datum) 0;
}

/*
 * earmark_inbox_claim_plan(max_events, with_handler) RETURNS SETOF text
 * The plan of the claim as it runs (claim_plan's cached generic plan, for
 * this batch size and side), as EXPLAIN (COSTS OFF) prints it: to see
 * that a claim walks inbox_event_due and stops after the batch.
 */
Datum
earmark_inbox_claim_plan(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	CachedPlanSource *source;
	CachedPlan *cplan;
	ExplainState *es;
	ListCell   *lc;
	char	   *line;
	char	   *next;
	int			level;

	em_require_schema();
	em_require_coordinator("earmark_inbox_claim_plan");
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_events and with_handler must not be NULL")));
	if (PG_GETARG_INT32(0) <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_events must be greater than zero")));

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	/* made before SPI_connect: its text must outlive SPI's memory */
	es = NewExplainState();
	es->costs = false;
	SPI_connect();
	level = claim_settings_begin();
	source = linitial(SPI_plan_get_plan_sources(claim_plan(PG_GETARG_INT32(0),
															PG_GETARG_BOOL(1))));
	cplan = GetCachedPlan(source, NULL, CurrentResourceOwner, NULL);
	claim_settings_end(level);
	ExplainBeginOutput(es);
	foreach(lc, cplan->stmt_list)
		ExplainOnePlan(lfirst_node(PlannedStmt, lc), NULL, es, source->query_string,
					   NULL, NULL, NULL, NULL);
	ExplainEndOutput(es);
	ReleaseCachedPlan(cplan, CurrentResourceOwner);
	SPI_finish();

	for (line = es->str->data; *line != '\0'; line = next)
	{
		Datum		value;
		bool		isnull = false;

		next = strchr(line, '\n');
		if (next == NULL)
			next = line + strlen(line);
		else
			*next++ = '\0';
		value = CStringGetTextDatum(line);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &isnull);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * complete, ignore, fail, replay
 * ---------------------------------------------------------------------
 */
/* the columns of lock_event */
enum
{
	LV_STATUS = 1, LV_ATTEMPTS, LV_ACCOUNT
};

static EmStatement lock_event = {
	"SELECT status, attempts, account FROM earmark.inbox_event WHERE event_id = $1 FOR UPDATE",
	1, {INT8OID}
};

static EmStatement finish_event = {
	"UPDATE earmark.inbox_event SET status = $2, result = $3, last_error = coalesce($4, last_error), "
	"  next_attempt_at = coalesce($5, next_attempt_at), locked_until = NULL, updated_at = $6, "
	"  finished = $7 "
	"WHERE event_id = $1",
	7, {INT8OID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, BOOLOID}
};

static EmStatement requeue_event = {
	"UPDATE earmark.inbox_event SET status = 'received', attempts = 0, next_attempt_at = $2, "
	"  locked_until = NULL, result = NULL, updated_at = $2, finished = false WHERE event_id = $1",
	2, {INT8OID, TIMESTAMPTZOID}
};

/*
 * The statuses an event may have, the finished ones last.  inbox_event
 * has no CHECK constraint on status (docs/inbox.md#the-event-row): this
 * file writes it, only with these, and set_event_status refuses others.
 */
static const char *const statuses[] = {
	"received", "processing", "failed", "applied", "ignored", "dead"
};
#define FIRST_FINISHED	3

/* the index of a status in statuses[], or -1 */
static int
status_index(const char *s)
{
	int			i;

	for (i = 0; i < (int) lengthof(statuses); i++)
		if (strcmp(s, statuses[i]) == 0)
			return i;
	return -1;
}

/* lock the event; returns its status (a constant) and attempts */
static const char *
lock_event_row(int64 event_id, int *attempts, char **account)
{
	Datum		arg = Int64GetDatum(event_id);
	bool		isnull;
	char	   *s;
	Datum		acc;
	int			i;

	em_exec(&lock_event, &arg, NULL, 1);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_UNKNOWN_EVENT),
				 errmsg("inbox event " INT64_FORMAT " does not exist", event_id)));
	s = TextDatumGetCString(em_get(0, LV_STATUS, &isnull));
	*attempts = DatumGetInt32(em_get(0, LV_ATTEMPTS, &isnull));
	if (account)
	{
		acc = em_get(0, LV_ACCOUNT, &isnull);
		*account = isnull ? NULL : TextDatumGetCString(acc);
	}
	i = status_index(s);
	if (i < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("inbox event " INT64_FORMAT " has an unknown status \"%s\"", event_id, s),
				 errdetail("earmark writes only received, processing, failed, applied, ignored and dead; "
						   "this one was written to earmark.inbox_event by hand."),
				 errhint("Set status to one of those by hand (and finished to true for applied, ignored or dead).")));
	return statuses[i];
}

static void
wrong_state(int64 event_id, const char *status, const char *action)
{
	ereport(ERROR,
			(errcode(ERRCODE_EARMARK_EVENT_STATE),
			 errmsg("inbox event " INT64_FORMAT " cannot be %s: it is %s",
					event_id, action, status),
			 errhint("Only a claimed event (status processing) is completed or failed; replay an event to run it again.")));
}

/* set an event's outcome; a failure waits retry_after_us from now */
static void
set_event_status(int64 event_id, const char *status, const char *result,
				 const char *error, bool has_next, int64 retry_after_us)
{
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	TimestampTz now = GetCurrentTimestamp();
	int			i = status_index(status);

	if (i < 0)
		elog(ERROR, "earmark: cannot set an inbox event's status to \"%s\"", status);
	args[0] = Int64GetDatum(event_id);
	args[1] = CStringGetTextDatum(status);
	args[2] = result ? CStringGetTextDatum(result) : (Datum) 0;
	nulls[2] = result ? ' ' : 'n';
	args[3] = error ? CStringGetTextDatum(error) : (Datum) 0;
	nulls[3] = error ? ' ' : 'n';
	args[4] = TimestampTzGetDatum(now + retry_after_us);
	nulls[4] = has_next ? ' ' : 'n';
	args[5] = TimestampTzGetDatum(now);
	args[6] = BoolGetDatum(i >= FIRST_FINISHED);
	em_exec(&finish_event, args, nulls, 0);
}

static int64
arg_event_id(FunctionCallInfo fcinfo)
{
	return em_arg_int64(fcinfo, 0, "event_id");
}

static EmStatement event_has_handler = {
	"SELECT EXISTS (SELECT 1 FROM earmark.inbox_event e JOIN earmark.inbox_handler h "
	"USING (event_type) WHERE e.event_id = $1)",
	1, {INT8OID}
};

/*
 * An event whose type has a handler is the worker's: an application (a
 * caller without earmark_admin's rights) finishes only the events its
 * claims can return, so that it cannot complete, ignore or fail a genuine
 * plan change before the worker applies it.  The handler the worker is
 * running may finish its own event.
 */
static void
check_may_finish(int64 event_id, Oid caller, const char *action)
{
	Datum		arg = Int64GetDatum(event_id);
	bool		isnull;

	if (event_id == applying_event_id || is_admin(caller))
		return;
	em_exec(&event_has_handler, &arg, NULL, 1);
	if (DatumGetBool(em_get(0, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("inbox event " INT64_FORMAT " cannot be %s by an application", event_id, action),
				 errdetail("Its type has a handler: the worker applies it, and only a member of earmark_admin may finish it by hand."),
				 errhint("An application finishes the events earmark_inbox_claim returns.")));
}

static char *
arg_text(FunctionCallInfo fcinfo, int argno, const char *what)
{
	em_require_schema();
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/*
 * Complete a claimed event in one statement, the common case: the event
 * is processing and the caller may finish it.  complete_claimed is for
 * an application, which may finish only an event whose type has no
 * handler; complete_claimed_any for a caller that may finish any event
 * (an admin, or the handler of this event), whose plan then has no
 * handler lookup to start and end at every call (it was about 6 % of an
 * admin consumer's completion, docs/inbox.md#benchmark).  No row: the
 * caller learns why from complete_slowly.
 *
 * Both run a generic plan (em_exec_generic), a primary key lookup, made
 * once per session: the plan cache planned the single statement they
 * replace ("$4 OR NOT EXISTS (...)") for its parameters at every call,
 * for good, and the planning was a seventh of a consumer's CPU.
 */
#define COMPLETE_CLAIMED \
	"UPDATE earmark.inbox_event AS e SET status = 'applied', result = $2, locked_until = NULL, updated_at = $3, " \
	"  finished = true " \
	"WHERE e.event_id = $1 AND e.status = 'processing'"

static EmStatement complete_claimed = {
	COMPLETE_CLAIMED
	"  AND NOT EXISTS (SELECT 1 FROM earmark.inbox_handler h WHERE h.event_type = e.event_type)",
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

static EmStatement complete_claimed_any = {
	COMPLETE_CLAIMED,
	3, {INT8OID, TEXTOID, TIMESTAMPTZOID}
};

/*
 * The checks one at a time, with their errors: not the caller's to
 * finish (42501), no such event, not processing.  An event claimed again
 * since complete_claimed or complete_claimed_any looked is completed here.
 */
static void
complete_slowly(int64 event_id, const char *result, Oid caller)
{
	int			attempts;
	const char *status;

	check_may_finish(event_id, caller, "completed");
	status = lock_event_row(event_id, &attempts, NULL);
	if (strcmp(status, "processing") != 0)
		wrong_state(event_id, status, "completed");
	set_event_status(event_id, "applied", result, NULL, false, 0);
}

/* earmark_inbox_complete(event_id, result) RETURNS text: 'applied' */
static Datum complete_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_complete(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, complete_body);
}

static Datum
complete_body(PG_FUNCTION_ARGS)
{
	int64		event_id = arg_event_id(fcinfo);
	char	   *result = arg_text(fcinfo, 1, "result");
	Datum		args[3];
	AsOwner		a;
	bool		may_finish_any;
	em_require_coordinator("earmark_inbox_complete");

	become_owner(fcinfo, &a);
	SPI_connect();
	args[0] = Int64GetDatum(event_id);
	args[1] = CStringGetTextDatum(result);
	args[2] = TimestampTzGetDatum(GetCurrentTimestamp());
	may_finish_any = event_id == applying_event_id || is_admin(a.caller);
	em_exec_generic(may_finish_any ? &complete_claimed_any : &complete_claimed,
					args, NULL, 0);
	if (SPI_processed == 0)
		complete_slowly(event_id, result, a.caller);
	SPI_finish();
	end_owner(&a);
	PG_RETURN_TEXT_P(cstring_to_text("applied"));
}

/*
 * earmark_inbox_ignore(event_id, reason) RETURNS text: 'ignored', with the
 * reason kept in result.  Any event not yet applied may be ignored.
 */
static Datum ignore_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_ignore(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, ignore_body);
}

static Datum
ignore_body(PG_FUNCTION_ARGS)
{
	int64		event_id = arg_event_id(fcinfo);
	char	   *reason = arg_text(fcinfo, 1, "reason");
	int			attempts;
	const char *status;
	AsOwner		a;
	em_require_coordinator("earmark_inbox_ignore");

	if (reason[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reason must not be empty"),
				 errhint("Say why the event changes nothing: it is kept for whoever reads the inbox.")));
	become_owner(fcinfo, &a);
	SPI_connect();
	check_may_finish(event_id, a.caller, "ignored");
	status = lock_event_row(event_id, &attempts, NULL);
	if (strcmp(status, "applied") == 0 || strcmp(status, "ignored") == 0)
		wrong_state(event_id, status, "ignored");
	set_event_status(event_id, "ignored", reason, NULL, false, 0);
	SPI_finish();
	end_owner(&a);
	PG_RETURN_TEXT_P(cstring_to_text("ignored"));
}

/*
 * Mark a claimed event failed: it waits 5 s, 30 s, 2 min, 10 min, 1 h
 * after its 1st to 5th attempt, and is dead after the 6th.  Runs in the
 * caller's SPI connection; returns 'failed' or 'dead'.
 */
const char *
em_inbox_fail(int64 event_id, const char *error)
{
	int			attempts;
	const char *status = lock_event_row(event_id, &attempts, NULL);

	if (strcmp(status, "processing") != 0)
		wrong_state(event_id, status, "failed");
	if (attempts >= INBOX_MAX_ATTEMPTS)
	{
		set_event_status(event_id, "dead", NULL, error, false, 0);
		return "dead";
	}
	set_event_status(event_id, "failed", NULL, error, true,
					 inbox_backoff_s[Max(attempts, 1) - 1] * USECS_PER_SEC);
	return "failed";
}

/* earmark_inbox_fail(event_id, error) RETURNS text: 'failed' or 'dead' */
static Datum fail_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_fail(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, fail_body);
}

static Datum
fail_body(PG_FUNCTION_ARGS)
{
	int64		event_id = arg_event_id(fcinfo);
	char	   *error = arg_text(fcinfo, 1, "error");
	const char *status;
	AsOwner		a;
	em_require_coordinator("earmark_inbox_fail");

	become_owner(fcinfo, &a);
	SPI_connect();
	check_may_finish(event_id, a.caller, "failed");
	status = em_inbox_fail(event_id, error);
	SPI_finish();
	end_owner(&a);
	PG_RETURN_TEXT_P(cstring_to_text(status));
}

/*
 * earmark_inbox_replay(event_id, account) RETURNS text: 'received'.  Puts
 * a stored event back in the queue with fresh attempts, but only for the
 * account it belongs to, so one customer cannot requeue another's events.
 */
Datum
earmark_inbox_replay(PG_FUNCTION_ARGS)
{
	int64		event_id = arg_event_id(fcinfo);
	text	   *account = em_arg_name(fcinfo, 1, "account");
	char	   *owner;
	int			attempts;
	Datum		args[2];
	em_require_coordinator("earmark_inbox_replay");

	SPI_connect();
	(void) lock_event_row(event_id, &attempts, &owner);
	if (owner == NULL || strcmp(owner, text_to_cstring(account)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_NOT_YOUR_EVENT),
				 errmsg("inbox event " INT64_FORMAT " does not belong to account \"%s\"",
						event_id, text_to_cstring(account)),
				 errhint("Replay only the events of the account that asks for it.")));
	args[0] = Int64GetDatum(event_id);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	em_exec(&requeue_event, args, NULL, 0);
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text("received"));
}

/* ---------------------------------------------------------------------
 * Handlers
 * ---------------------------------------------------------------------
 */
static EmStatement put_handler = {
	"INSERT INTO earmark.inbox_handler (event_type, handler, accepts_unverified) VALUES ($1, $2, $3) "
	"ON CONFLICT (event_type) DO UPDATE SET handler = excluded.handler, "
	"  accepts_unverified = excluded.accepts_unverified",
	3, {TEXTOID, REGPROCEDUREOID, BOOLOID}
};

static EmStatement drop_handler = {
	"DELETE FROM earmark.inbox_handler WHERE event_type = $1",
	1, {TEXTOID}
};

/* raise unless fn can be the handler of an event type, run by its owner */
static void
check_handler(Oid fn, bool accepts_unverified)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	Form_pg_proc proc;
	Oid			earmark_ns = get_namespace_oid("earmark", false);
	Oid			rowtype = get_rel_type_id(get_relname_relid("inbox_event", earmark_ns));

	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function %u does not exist", fn)));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	if (proc->pronargs != 1 || proc->proargtypes.values[0] != rowtype ||
		proc->prorettype != TEXTOID || proc->proretset)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("inbox handler %s must take one earmark.inbox_event and return text",
						format_procedure(fn))));
	if (!superuser_arg(GetOuterUserId()) &&
		!has_privs_of_role(GetOuterUserId(), proc->proowner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must own function %s to make it an inbox handler",
						format_procedure(fn)),
				 errdetail("The worker runs a handler as the role that owns it.")));
	/* an unverified event must never change an account's plan or limits */
	if (accepts_unverified && proc->pronamespace == earmark_ns &&
		strcmp(NameStr(proc->proname), "apply_plan_change") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the built-in plan change cannot accept unverified events"),
				 errdetail("It changes an account's limits: only a signed event, or one a member of earmark_admin stored, may.")));
	ReleaseSysCache(tup);
}

/*
 * earmark_inbox_set_handler(event_type, handler, accepts_unverified)
 * RETURNS void.  The handler takes an earmark.inbox_event and returns text
 * (the result kept on the event); NULL removes the handler.  The worker
 * runs it as the role that owns it, so the caller must own it (or be a
 * superuser): registering a handler never lends anybody the worker's
 * rights.  A handler takes only verified events unless registered with
 * accepts_unverified: by default a handler is taken to change billing
 * state.
 */
Datum
earmark_inbox_set_handler(PG_FUNCTION_ARGS)
{
	text	   *event_type = em_arg_name(fcinfo, 0, "event_type");
	Datum		args[3];
	em_require_coordinator("earmark_inbox_set_handler");

	/* a NULL that means nothing is refused, also when a handler is dropped */
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("accepts_unverified must not be NULL")));
	SPI_connect();
	args[0] = PointerGetDatum(event_type);
	if (PG_ARGISNULL(1))
		em_exec(&drop_handler, args, NULL, 0);
	else
	{
		check_handler(PG_GETARG_OID(1), PG_GETARG_BOOL(2));
		args[1] = PG_GETARG_DATUM(1);
		args[2] = PG_GETARG_DATUM(2);
		em_exec(&put_handler, args, NULL, 0);
	}
	SPI_finish();
	PG_RETURN_VOID();
}

/* ---------------------------------------------------------------------
 * The worker's part: apply one event with its handler
 * ---------------------------------------------------------------------
 */
/* the columns of event_for_handler */
enum
{
	EH_ROW = 1, EH_HANDLER, EH_STATUS, EH_ATTEMPTS, EH_MAY_RUN
};

static EmStatement event_for_handler = {
	"SELECT e, h.handler, e.status, e.attempts, "
	"       e.verified_by IS NOT NULL OR h.accepts_unverified "
	"FROM earmark.inbox_event e "
	"JOIN earmark.inbox_handler h USING (event_type) "
	"WHERE e.event_id = $1 FOR UPDATE OF e",
	1, {INT8OID}
};

static EmStatement event_status = {
	"SELECT status FROM earmark.inbox_event WHERE event_id = $1",
	1, {INT8OID}
};

static Oid
handler_owner(Oid fn)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("inbox handler function %u no longer exists", fn)));
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	return owner;
}

/*
 * An unverified event whose handler takes only verified events ends
 * ignored, with why, and its handler never runs.
 */
static const char *
refuse_unverified(int64 event_id, Oid handler)
{
	char	   *why = psprintf("not applied: the event is unverified, and its handler %s takes only verified events",
							   format_procedure_qualified(handler));

	ereport(LOG,
			(errmsg("earmark: inbox event " INT64_FORMAT " %s", event_id, why)));
	set_event_status(event_id, "ignored", why, NULL, false, 0);
	return "ignored";
}

/*
 * Run the handler as its owner, the way PostgreSQL runs an index function
 * or a trigger of another role: a security-restricted operation (no
 * temporary tables, no SET ROLE, no cursors WITH HOLD, ...) inside a GUC
 * nest level that is rolled back when it returns, so that nothing it
 * sets, even with SET SESSION or set_config(..., false), outlives its
 * event.  The caller runs it in a subtransaction, whose abort restores
 * the user and the settings if it raises.  Returns its result, copied
 * into cxt, or NULL.
 */
static char *
run_handler(Oid handler, Oid owner, Datum row, MemoryContext cxt)
{
	Oid			save_userid;
	int			save_sec;
	int			guc_level;
	Datum		d;
	char	   *result = NULL;
	LOCAL_FCINFO(hfcinfo, 1);
	FmgrInfo	flinfo;

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	guc_level = NewGUCNestLevel();

	/*
	 * The worker pins its own search_path; a handler gets the ordinary one,
	 * as if its owner had called it, unless it pins its own with SET (which
	 * fmgr applies).
	 */
	(void) set_config_option("search_path", "\"$user\", public",
							 PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	fmgr_info(handler, &flinfo);
	InitFunctionCallInfoData(*hfcinfo, &flinfo, 1, InvalidOid, NULL, NULL);
	hfcinfo->args[0].value = row;
	hfcinfo->args[0].isnull = false;
	d = FunctionCallInvoke(hfcinfo);
	if (!hfcinfo->isnull)
		result = MemoryContextStrdup(cxt, TextDatumGetCString(d));

	AtEOXact_GUC(false, guc_level);
	SetUserIdAndSecContext(save_userid, save_sec);
	return result;
}

/*
 * Apply a claimed event in the current transaction (the caller commits):
 * run its handler (run_handler) in a subtransaction; on success mark it
 * applied with the handler's result (unless the handler ignored it
 * itself), on error roll the handler back and mark the event failed.  An
 * unverified event is not given to a handler that takes only verified
 * ones.  "attempts" is the attempt number the claim gave it: if the event
 * moved on since (its lease passed and someone else claimed it), leave it.
 * Returns the event's new status, or NULL when it was not ours.
 */
const char *
em_inbox_apply(int64 event_id, int attempts)
{
	Datum		arg = Int64GetDatum(event_id);
	bool		isnull;
	Datum		row;
	Oid			handler;
	Oid			owner;
	Oid			save_userid;
	int			save_sec;
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	const char *volatile status = NULL;
	char	   *volatile result = NULL;
	char	   *volatile error = NULL;
	char	   *st;

	em_exec(&event_for_handler, &arg, NULL, 1);
	if (SPI_processed == 0)
		return NULL;
	st = TextDatumGetCString(em_get(0, EH_STATUS, &isnull));
	if (strcmp(st, "processing") != 0 ||
		DatumGetInt32(em_get(0, EH_ATTEMPTS, &isnull)) != attempts)
		return NULL;
	handler = DatumGetObjectId(em_get(0, EH_HANDLER, &isnull));
	if (!DatumGetBool(em_get(0, EH_MAY_RUN, &isnull)))
		return refuse_unverified(event_id, handler);
	row = SPI_datumTransfer(em_get(0, EH_ROW, &isnull), false, -1);
	owner = handler_owner(handler);

	GetUserIdAndSecContext(&save_userid, &save_sec);
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	applying_event_id = event_id;
	PG_TRY();
	{
		result = run_handler(handler, owner, row, oldcxt);
		applying_event_id = 0;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		applying_event_id = 0;
		SetUserIdAndSecContext(save_userid, save_sec);
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		error = edata->message ? pstrdup(edata->message) : pstrdup("handler failed");
		FreeErrorData(edata);
	}
	PG_END_TRY();

	/*
	 * SPI's connection survives the subtransaction; the handler may have
	 * used SPI itself, which pushed and popped its own.
	 */
	if (error != NULL)
	{
		ereport(LOG,
				(errmsg("earmark: inbox handler failed for event " INT64_FORMAT ": %s",
						event_id, error)));
		return em_inbox_fail(event_id, error);
	}

	em_exec(&event_status, &arg, NULL, 1);
	st = TextDatumGetCString(em_get(0, 1, &isnull));
	if (strcmp(st, "processing") == 0)
	{
		set_event_status(event_id, "applied", result ? result : "applied", NULL, false, 0);
		status = "applied";
	}
	else
		status = strcmp(st, "ignored") == 0 ? "ignored" : "applied";
	return status;
}
