/*-------------------------------------------------------------------------
 *
 * intake.c
 *	  Signed webhook intake: earmark_inbox_receive_signed (Standard
 *	  Webhooks), earmark_inbox_receive_kinde (a JWT signed with RS256),
 *	  their secrets and key set (earmark_inbox_set_secret,
 *	  earmark_inbox_drop_secret, earmark_refresh_jwks, and the worker's
 *	  em_jwks_refresh_if_older) and earmark_webhook_signature_valid.
 *
 *	  A delivery is verified first and stored after (em_inbox_store_verified,
 *	  in inbox.c, which records how: standard_webhooks or kinde_jwt); any
 *	  error stores nothing.  Verification itself is in sigverify.c; this
 *	  file reads the secrets and keys, decides what to raise, and reads the
 *	  event's fields (its type, time and account: the account whose
 *	  provider_customer is data.customer_id, for either intake).  Decoded
 *	  webhook keys and the secret texts they came from are wiped before
 *	  their memory is freed, on errors too.
 *
 *	  Tables: earmark.webhook_secret (read; written by the secret
 *	  functions), earmark.jwks (read; written by a fetch), earmark.account
 *	  (read: the customer's account), and the inbox tables through
 *	  em_inbox_store_verified.
 *
 *	  Locks: row locks only.  A key set fetch upserts the earmark.jwks row
 *	  of its URL, which stays locked until the caller's transaction ends;
 *	  the HTTP request is made before that upsert, so no lock is ever held
 *	  across the network.  A delivery takes the jwks row (when it fetches)
 *	  before em_inbox_store_verified takes the event row, always in that
 *	  order.  Two backends that fetch at once (the worker and
 *	  earmark_refresh_jwks, or deliveries with the cooldown at 0) both
 *	  fetch; the second upsert waits for the first commit and never
 *	  replaces a newer set with an older one.
 *	  A fetch made by a delivery that then fails is rolled back with it, so
 *	  each backend also keeps its last fetched set in memory (see
 *	  local_keys), and the time of the last fetch an unknown kid caused is
 *	  kept in shared memory (em_cooldown_take, cooldown.c: its spinlock, for
 *	  a few instructions), where every backend sees it: the refetch
 *	  cooldown holds across connections.  So does the last fetched set
 *	  (em_cooldown_share, under its LWLock for a copy): a forged token's
 *	  fetch, which takes the cooldown and is rolled back, does not keep
 *	  the other backends from a key the provider rotated in.  Without
 *	  earmark in shared_preload_libraries a delivery never fetches
 *	  (may_refetch).
 *
 *	  earmark_inbox_receive_signed has no SET search_path clause: its body
 *	  runs through em_call_pinned (spi.c), which pins the search path for
 *	  the call; it calls no handler (a trigger of the user's that its
 *	  statements run gets its own SET search_path from spi.c's fmgr hook).
 *	  The Kinde intake, which may fetch the key set, keeps its clause.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "access/detoast.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/base64.h"
#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "cluster.h"
#include "cooldown.h"
#include "earmark.h"
#include "http.h"
#include "inbox.h"
#include "intake.h"
#include "settings.h"
#include "sigverify.h"
#include "spi.h"

PG_FUNCTION_INFO_V1(earmark_inbox_receive_signed);
PG_FUNCTION_INFO_V1(earmark_webhook_signature_valid);
PG_FUNCTION_INFO_V1(earmark_inbox_set_secret);
PG_FUNCTION_INFO_V1(earmark_inbox_drop_secret);
PG_FUNCTION_INFO_V1(earmark_inbox_receive_kinde);
PG_FUNCTION_INFO_V1(earmark_refresh_jwks);

/* a webhook-timestamp longer than this is not a number of seconds */
#define TIMESTAMP_ARG_MAX	64
/* the longest secret argument, in bytes */
#define SECRET_ARG_MAX		1024
/* the largest key set accepted from the provider */
#define JWKS_MAX_BYTES		(1024 * 1024)

#define KINDE_SOURCE		"kinde"

/* Unix epoch to PostgreSQL epoch, in microseconds */
#define UNIX_EPOCH_USECS_OFFSET \
	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * USECS_PER_SEC)

/* ---------------------------------------------------------------------
 * Arguments
 * ---------------------------------------------------------------------
 */

/*
 * A text argument that is not a name: not NULL (22004), not empty
 * (22023), at most max_bytes (22001).  The size is read before the value
 * is detoasted, so an oversized body costs nothing.
 */
static text *
arg_text(FunctionCallInfo fcinfo, int argno, const char *what, size_t max_bytes)
{
	Size		size;

	em_require_schema();
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	size = toast_raw_datum_size(PG_GETARG_DATUM(argno)) - VARHDRSZ;
	if (size == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (size > max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("It has %zu bytes; the most is %zu.",
						   (size_t) size, max_bytes)));
	return PG_GETARG_TEXT_PP(argno);
}

static void raise_malformed(const char *msg, const char *detail) pg_attribute_noreturn();

static void
raise_malformed(const char *msg, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_EARMARK_MALFORMED_WEBHOOK),
			 errmsg("%s", msg),
			 detail ? errdetail("%s", detail) : 0));
}

/* ---------------------------------------------------------------------
 * Parsing untrusted text
 * ---------------------------------------------------------------------
 */
typedef enum ParseKind
{
	PARSE_JSON,					/* text already in the server encoding */
	PARSE_JSON_UTF8,			/* raw bytes that must be UTF-8 (JWT, JWKS) */
	PARSE_TIME					/* an event's ISO 8601 time */
} ParseKind;

static Datum
parse_input(ParseKind kind, const char *s, size_t len)
{
	switch (kind)
	{
		case PARSE_JSON_UTF8:
			/* verifies UTF-8 (and the absence of NUL) as it converts */
			s = pg_any_to_server(s, (int) len, PG_UTF8);
			/* FALLTHROUGH */
		case PARSE_JSON:
			return DirectFunctionCall1(jsonb_in, CStringGetDatum(s));
		case PARSE_TIME:
			return TimestampTzGetDatum(em_parse_event_time(s));
	}
	return (Datum) 0;			/* keep the compiler quiet */
}

/*
 * Run an input function on untrusted text and raise sqlstate (with msg)
 * instead of its own error, so that malformed input has the SQLSTATE an
 * endpoint maps to 400.  PostgreSQL 15's input functions report with
 * ereport, so they run in a subtransaction, as PL/pgSQL's exception
 * blocks do; the subtransaction writes nothing and gets no XID.  Only
 * data errors (class 22) and program limits (class 54: too deep, too
 * large) are translated; a cancel or out of memory passes unchanged.
 */
static Datum
try_parse(ParseKind kind, const char *s, size_t len, int sqlstate,
		  const char *msg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Datum		result = (Datum) 0;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		result = parse_input(kind, s, len);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		int			category;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;

		category = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
		if (category != ERRCODE_DATA_EXCEPTION &&
			category != ERRCODE_PROGRAM_LIMIT_EXCEEDED)
			ReThrowError(edata);
		ereport(ERROR,
				(errcode(sqlstate),
				 errmsg("%s", msg),
				 errdetail("%s", edata->message)));
	}
	PG_END_TRY();
	return result;
}

/* JSON text that must be an object */
static Jsonb *
parse_json_object(ParseKind kind, const char *s, size_t len, int sqlstate,
				  const char *what)
{
	Jsonb	   *jb;

	jb = DatumGetJsonbP(try_parse(kind, s, len, sqlstate,
								  psprintf("%s is not valid JSON", what)));
	if (!JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(sqlstate),
				 errmsg("%s is not a JSON object", what)));
	return jb;
}

/* a member of a JSON object; NULL when absent or JSON null */
static JsonbValue *
json_member(JsonbContainer *obj, const char *key)
{
	JsonbValue *v = getKeyJsonValueFromContainer(obj, key, strlen(key), NULL);

	if (v != NULL && v->type == jbvNull)
		return NULL;
	return v;
}

/*
 * A string member: NULL when absent (or null).  Another type, an empty
 * string or one longer than a name may be is malformed: these become
 * event types, keys and account references.
 */
static char *
json_string(JsonbContainer *obj, const char *key, const char *what)
{
	JsonbValue *v = json_member(obj, key);
	int			chars;

	if (v == NULL)
		return NULL;
	if (v->type != jbvString)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_MALFORMED_WEBHOOK),
				 errmsg("\"%s\" in the %s is not a string", key, what)));
	chars = pg_mbstrlen_with_len(v->val.string.val, v->val.string.len);
	if (chars == 0 || chars > EARMARK_MAX_NAME_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_MALFORMED_WEBHOOK),
				 errmsg("\"%s\" in the %s must have 1 to %d characters",
						key, what, EARMARK_MAX_NAME_LEN)));
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static char *
json_required_string(JsonbContainer *obj, const char *key, const char *what)
{
	char	   *s = json_string(obj, key, what);

	if (s == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_MALFORMED_WEBHOOK),
				 errmsg("the %s has no \"%s\"", what, key)));
	return s;
}

/*
 * The event's own time: event_timestamp (when it happened), else
 * timestamp (when it was sent).  Parsed here, not left to
 * em_inbox_store's fallback, so that a bad one is a 400-class error.
 */
static bool
event_time(JsonbContainer *obj, const char *what, TimestampTz *result)
{
	const char *key = "event_timestamp";
	char	   *s = json_string(obj, key, what);

	if (s == NULL)
	{
		key = "timestamp";
		s = json_string(obj, key, what);
	}
	if (s == NULL)
		return false;

	/* timestamptz_in also takes "now", "epoch" and "infinity" */
	if (!isdigit((unsigned char) s[0]))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_MALFORMED_WEBHOOK),
				 errmsg("\"%s\" in the %s is not an ISO 8601 time", key, what)));
	*result = DatumGetTimestampTz(try_parse(PARSE_TIME, s, strlen(s),
											ERRCODE_EARMARK_MALFORMED_WEBHOOK,
											psprintf("\"%s\" in the %s is not a valid time",
													 key, what)));
	return true;
}

/* ---------------------------------------------------------------------
 * The event's account
 * ---------------------------------------------------------------------
 */
static EmStatement account_of_customer = {
	"SELECT account FROM earmark.account WHERE provider_customer = $1 "
	"ORDER BY account LIMIT 1",
	1, {TEXTOID}
};

/*
 * The earmark account whose provider_customer is data.customer_id (Kinde's
 * claims, and a Standard Webhooks body of the same shape), or NULL.
 */
static text *
customer_account(JsonbContainer *event, const char *what)
{
	JsonbValue *data = json_member(event, "data");
	char	   *customer;
	Datum		arg;
	bool		isnull;

	if (data == NULL || data->type != jbvBinary ||
		!JsonContainerIsObject(data->val.binary.data))
		return NULL;
	customer = json_string(data->val.binary.data, "customer_id", what);
	if (customer == NULL)
		return NULL;
	arg = CStringGetTextDatum(customer);
	em_exec(&account_of_customer, &arg, NULL, 1);
	if (SPI_processed == 0)
		return NULL;
	return DatumGetTextPCopy(em_get(0, 1, &isnull));
}

/* ---------------------------------------------------------------------
 * Standard Webhooks
 * ---------------------------------------------------------------------
 */
static EmStatement secrets_of_source = {
	"SELECT secret FROM earmark.webhook_secret WHERE source = $1 "
	"ORDER BY created_at DESC, secret",
	1, {TEXTOID}
};

static EmStatement insert_secret = {
	"INSERT INTO earmark.webhook_secret (source, secret) VALUES ($1, $2) "
	"ON CONFLICT (source, secret) DO NOTHING",
	2, {TEXTOID, TEXTOID}
};

static EmStatement delete_secret = {
	"DELETE FROM earmark.webhook_secret WHERE source = $1 AND secret = $2",
	2, {TEXTOID, TEXTOID}
};

/*
 * The source's keys, newest secret first (in a rotation the new one is
 * the likelier match).  A row that is not a secret (written to the table
 * by hand) can match nothing; it is skipped with a warning that does not
 * show it.
 */
static EmWebhookKey *
load_webhook_keys(text *source, int *nkeys)
{
	Datum		arg = PointerGetDatum(source);
	EmWebhookKey *keys;
	uint64		i;

	em_exec(&secrets_of_source, &arg, NULL, 0);
	keys = palloc(sizeof(EmWebhookKey) * (SPI_processed + 1));
	*nkeys = 0;
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		text	   *secret = DatumGetTextPP(em_get((int) i, 1, &isnull));
		size_t		len;
		unsigned char *key;

		key = em_webhook_secret_decode(VARDATA_ANY(secret),
									   VARSIZE_ANY_EXHDR(secret), &len);
		/* the text is this call's copy (SPI's result): wipe it too */
		explicit_bzero(VARDATA_ANY(secret), VARSIZE_ANY_EXHDR(secret));
		if (key == NULL)
		{
			ereport(WARNING,
					(errmsg("earmark: a webhook secret of source \"%s\" is not base64 and is skipped",
							text_to_cstring(source))));
			continue;
		}
		keys[*nkeys].key = key;
		keys[*nkeys].len = len;
		(*nkeys)++;
	}
	return keys;
}

/* wipe and free the keys of load_webhook_keys */
static void
free_webhook_keys(EmWebhookKey *keys, int nkeys)
{
	int			i;

	for (i = 0; i < nkeys; i++)
		em_webhook_key_free((unsigned char *) keys[i].key, keys[i].len);
	pfree(keys);
}

/*
 * em_webhook_verify, then wipe the keys whatever happens: an error in the
 * HMAC (an internal one) must not leave them in memory either.
 */
static EmWebhookResult
verify_and_wipe(const EmWebhookMessage *msg, EmWebhookKey *keys, int nkeys,
				TimestampTz now)
{
	volatile EmWebhookResult r = EM_WEBHOOK_MISMATCH;

	PG_TRY();
	{
		r = em_webhook_verify(msg, keys, nkeys, now, earmark_webhook_tolerance_s);
	}
	PG_CATCH();
	{
		free_webhook_keys(keys, nkeys);
		PG_RE_THROW();
	}
	PG_END_TRY();
	free_webhook_keys(keys, nkeys);
	return r;
}

/* raise the error of a verification that did not pass (except MISMATCH) */
static void
raise_bad_webhook(EmWebhookResult r)
{
	switch (r)
	{
		case EM_WEBHOOK_VALID:
		case EM_WEBHOOK_MISMATCH:
			break;
		case EM_WEBHOOK_TOO_OLD:
		case EM_WEBHOOK_TOO_NEW:
			ereport(ERROR,
					(errcode(ERRCODE_EARMARK_STALE_TIMESTAMP),
					 errmsg("webhook timestamp is too far in the %s",
							r == EM_WEBHOOK_TOO_OLD ? "past" : "future"),
					 errdetail("It must be within %d seconds of the current time.",
							   earmark_webhook_tolerance_s),
					 errhint("A replayed or delayed delivery is refused; the sender signs each retry anew.")));
			break;
		case EM_WEBHOOK_BAD_TIMESTAMP:
			raise_malformed("webhook-timestamp is not a Unix time in seconds", NULL);
			break;
		case EM_WEBHOOK_BAD_HEADER:
			raise_malformed("webhook-signature has no valid v1 signature",
							"It must hold space-separated \"v1,<base64>\" entries, each the base64 of 32 bytes.");
			break;
	}
}

static void
fill_message(EmWebhookMessage *msg, text *id, text *ts, text *sig, text *body)
{
	msg->id = VARDATA_ANY(id);
	msg->id_len = VARSIZE_ANY_EXHDR(id);
	msg->timestamp = VARDATA_ANY(ts);
	msg->timestamp_len = VARSIZE_ANY_EXHDR(ts);
	msg->signature = VARDATA_ANY(sig);
	msg->signature_len = VARSIZE_ANY_EXHDR(sig);
	msg->body = VARDATA_ANY(body);
	msg->body_len = VARSIZE_ANY_EXHDR(body);
}

/*
 * earmark_inbox_receive_signed(source, webhook_id, webhook_timestamp,
 * webhook_signature, body) RETURNS TABLE (event_id, inserted)
 *
 * The signature is checked before the body is parsed: an unsigned body
 * learns nothing from the parser.
 */
static Datum receive_signed_body(PG_FUNCTION_ARGS);

/* the body under earmark's own search path (spi.c): no SET clause */
Datum
earmark_inbox_receive_signed(PG_FUNCTION_ARGS)
{
	return em_call_pinned(fcinfo, receive_signed_body);
}

static Datum
receive_signed_body(PG_FUNCTION_ARGS)
{
	text	   *source = em_arg_name(fcinfo, 0, "source");
	text	   *webhook_id = em_arg_name(fcinfo, 1, "webhook_id");
	text	   *ts = arg_text(fcinfo, 2, "webhook_timestamp", TIMESTAMP_ARG_MAX);
	text	   *sig = arg_text(fcinfo, 3, "webhook_signature", EM_SIGNATURE_HEADER_MAX);
	text	   *body = arg_text(fcinfo, 4, "body", EM_WEBHOOK_MAX_BYTES);
	EmWebhookMessage msg;
	EmWebhookKey *keys;
	EmWebhookResult r;
	int			nkeys;
	Jsonb	   *payload;
	char	   *event_type;
	TimestampTz occurred_at = 0;
	bool		has_occurred_at;
	text	   *account;
	int64		event_id;
	bool		inserted;
	em_require_coordinator("earmark_inbox_receive_signed");

	fill_message(&msg, webhook_id, ts, sig, body);

	SPI_connect();
	keys = load_webhook_keys(source, &nkeys);
	if (nkeys == 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_NO_SECRET),
				 errmsg("no webhook secret is configured for source \"%s\"",
						text_to_cstring(source)),
				 errhint("Add one with earmark_inbox_set_secret().")));
	r = verify_and_wipe(&msg, keys, nkeys, GetCurrentTimestamp());
	raise_bad_webhook(r);
	if (r != EM_WEBHOOK_VALID)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_INVALID_SIGNATURE),
				 errmsg("webhook signature does not match"),
				 errdetail("No v1 signature matches a secret of source \"%s\".",
						   text_to_cstring(source))));

	payload = parse_json_object(PARSE_JSON, text_to_cstring(body), msg.body_len,
								ERRCODE_EARMARK_MALFORMED_WEBHOOK, "the webhook body");
	event_type = json_required_string(&payload->root, "type", "webhook body");
	has_occurred_at = event_time(&payload->root, "webhook body", &occurred_at);
	account = customer_account(&payload->root, "webhook body's data");

	em_inbox_store_verified(source, webhook_id, cstring_to_text(event_type), payload,
							has_occurred_at, occurred_at, account,
							EM_VERIFIED_STANDARD_WEBHOOKS, &event_id, &inserted);
	SPI_finish();

	em_return_event_id(fcinfo, event_id, inserted);
	return (Datum) 0;
}

/*
 * earmark_webhook_signature_valid(secret, webhook_id, webhook_timestamp,
 * webhook_signature, body, at) RETURNS boolean
 *
 * The check receive_signed makes, at a given time: false for a signature
 * that does not match or a timestamp outside earmark.webhook_tolerance of
 * "at"; an error for input that is malformed (it is not a "no").  STABLE,
 * not IMMUTABLE, because the tolerance is a setting.
 */
Datum
earmark_webhook_signature_valid(PG_FUNCTION_ARGS)
{
	text	   *secret = arg_text(fcinfo, 0, "secret", SECRET_ARG_MAX);
	text	   *webhook_id = em_arg_name(fcinfo, 1, "webhook_id");
	text	   *ts = arg_text(fcinfo, 2, "webhook_timestamp", TIMESTAMP_ARG_MAX);
	text	   *sig = arg_text(fcinfo, 3, "webhook_signature", EM_SIGNATURE_HEADER_MAX);
	text	   *body = arg_text(fcinfo, 4, "body", EM_WEBHOOK_MAX_BYTES);
	TimestampTz at;
	EmWebhookMessage msg;
	EmWebhookKey key;
	EmWebhookKey *keys;
	EmWebhookResult r;

	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("at must not be NULL")));
	at = PG_GETARG_TIMESTAMPTZ(5);
	if (TIMESTAMP_NOT_FINITE(at))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("at must be a finite timestamp")));

	key.key = em_webhook_secret_decode(VARDATA_ANY(secret),
									   VARSIZE_ANY_EXHDR(secret), &key.len);
	if (key.key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret is not a Standard Webhooks secret"),
				 errdetail("It must be \"whsec_\" followed by base64, or the base64 alone.")));

	fill_message(&msg, webhook_id, ts, sig, body);
	keys = palloc(sizeof(EmWebhookKey));
	keys[0] = key;
	r = verify_and_wipe(&msg, keys, 1, at);
	if (r == EM_WEBHOOK_BAD_TIMESTAMP || r == EM_WEBHOOK_BAD_HEADER)
		raise_bad_webhook(r);
	PG_RETURN_BOOL(r == EM_WEBHOOK_VALID);
}

/*
 * Secrets are stored as "whsec_" + canonical base64, so that the same key
 * written with or without the prefix, or with unused bits set in its last
 * character, is one row, and drop finds it.  The key is wiped and freed
 * here; free the text with wipe_text.
 */
static text *
canonical_secret(unsigned char *key, size_t len)
{
	int			enclen = pg_b64_enc_len((int) len);
	char	   *buf = palloc(6 + enclen + 1);
	text	   *t;
	int			n;

	memcpy(buf, "whsec_", 6);
	n = pg_b64_encode((const char *) key, (int) len, buf + 6, enclen);
	em_webhook_key_free(key, len);
	if (n < 0)
	{
		em_wipe_free(buf, 6 + enclen + 1);
		elog(ERROR, "earmark: could not encode a secret");
	}
	t = cstring_to_text_with_len(buf, 6 + n);
	em_wipe_free(buf, 6 + enclen + 1);
	return t;
}

static void
wipe_text(text *t)
{
	em_wipe_free(t, VARSIZE(t));
}

/*
 * earmark_inbox_set_secret(source, secret) RETURNS void
 * Adds a secret; a source may have several while a secret is rotated.
 * The spec asks for 24 to 64 random bytes; fewer than 16 is refused as
 * guessable.
 */
Datum
earmark_inbox_set_secret(PG_FUNCTION_ARGS)
{
	text	   *source = em_arg_name(fcinfo, 0, "source");
	text	   *secret = arg_text(fcinfo, 1, "secret", SECRET_ARG_MAX);
	unsigned char *key;
	size_t		len;
	Datum		args[2];
	text	   *canonical;

	em_require_coordinator("earmark_inbox_set_secret");

	key = em_webhook_secret_decode(VARDATA_ANY(secret),
								   VARSIZE_ANY_EXHDR(secret), &len);
	if (key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret is not a Standard Webhooks secret"),
				 errdetail("It must be \"whsec_\" followed by base64, or the base64 alone.")));
	if (len < EM_SECRET_MIN_BYTES || len > EM_SECRET_MAX_BYTES)
	{
		em_webhook_key_free(key, len);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("secret must decode to %d to %d bytes",
						EM_SECRET_MIN_BYTES, EM_SECRET_MAX_BYTES),
				 errdetail("It decodes to %zu bytes.", len)));
	}

	canonical = canonical_secret(key, len);
	args[0] = PointerGetDatum(source);
	args[1] = PointerGetDatum(canonical);
	SPI_connect();
	em_exec(&insert_secret, args, NULL, 0);
	SPI_finish();
	wipe_text(canonical);
	PG_RETURN_VOID();
}

/*
 * earmark_inbox_drop_secret(source, secret) RETURNS boolean
 * True if the secret was there.  A value that does not decode is looked
 * up as written, so a row put in by hand can be removed too.
 */
Datum
earmark_inbox_drop_secret(PG_FUNCTION_ARGS)
{
	text	   *source = em_arg_name(fcinfo, 0, "source");
	text	   *secret = arg_text(fcinfo, 1, "secret", SECRET_ARG_MAX);
	unsigned char *key;
	size_t		len;
	Datum		args[2];
	bool		dropped;
	text	   *canonical = NULL;

	em_require_coordinator("earmark_inbox_drop_secret");

	key = em_webhook_secret_decode(VARDATA_ANY(secret),
								   VARSIZE_ANY_EXHDR(secret), &len);
	if (key != NULL)
		canonical = canonical_secret(key, len);
	args[0] = PointerGetDatum(source);
	args[1] = PointerGetDatum(canonical ? canonical : secret);
	SPI_connect();
	em_exec(&delete_secret, args, NULL, 0);
	dropped = SPI_processed > 0;
	SPI_finish();
	if (canonical)
		wipe_text(canonical);
	PG_RETURN_BOOL(dropped);
}

/* ---------------------------------------------------------------------
 * The key set (JWKS)
 * ---------------------------------------------------------------------
 */
/* the columns of jwks_of_url */
enum
{
	JU_KEYS = 1, JU_FETCHED_AT
};

static EmStatement jwks_of_url = {
	"SELECT keys, fetched_at FROM earmark.jwks WHERE url = $1",
	1, {TEXTOID}
};

/* an older set never replaces a newer one that another backend stored */
static EmStatement upsert_jwks = {
	"INSERT INTO earmark.jwks AS j (url, keys, fetched_at) VALUES ($1, $2, $3) "
	"ON CONFLICT (url) DO UPDATE SET keys = excluded.keys, fetched_at = excluded.fetched_at "
	"WHERE j.fetched_at < excluded.fetched_at",
	3, {TEXTOID, JSONBOID, TIMESTAMPTZOID}
};

/*
 * The last set this backend fetched, kept in TopMemoryContext.  A fetch
 * stored by a delivery that then fails is rolled back with it; this copy
 * is not, so the next delivery neither fetches again within the cooldown
 * nor refuses a kid that the provider did serve.
 */
static char *local_url = NULL;
static Jsonb *local_keys = NULL;
static TimestampTz local_fetched_at = DT_NOBEGIN;

typedef struct Jwk
{
	char	   *kty;
	char	   *n;
	char	   *e;
	char	   *alg;
	char	   *use;
} Jwk;

/*
 * earmark.kinde_domain + earmark.jwks_path; NULL when the domain is not
 * set, or an error if required.  Both settings are superuser-only: whoever
 * chooses the URL chooses which tokens are genuine.
 */
static char *
jwks_url(bool required)
{
	const char *domain = earmark_kinde_domain ? earmark_kinde_domain : "";
	const char *path = earmark_jwks_path ? earmark_jwks_path : "";
	size_t		dlen = strlen(domain);

	while (dlen > 0 && domain[dlen - 1] == '/')
		dlen--;
	if (dlen == 0)
	{
		if (!required)
			return NULL;
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
				 errmsg("earmark.kinde_domain is not set"),
				 errhint("Set it to the Kinde business domain, e.g. 'https://acme.kinde.com'.")));
	}
	return psprintf("%.*s%s%s", (int) dlen, domain, path[0] == '/' ? "" : "/", path);
}

static void
remember_local(const char *url, Jsonb *keys, TimestampTz at)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

	if (local_url)
		pfree(local_url);
	if (local_keys)
		pfree(local_keys);
	local_url = pstrdup(url);
	local_keys = palloc(VARSIZE(keys));
	memcpy(local_keys, keys, VARSIZE(keys));
	local_fetched_at = at;
	MemoryContextSwitchTo(old);
}

/* GET the key set and keep its "keys" array; raises when it cannot */
static Jsonb *
fetch_jwks(const char *url)
{
	EmHttpResponse resp;
	Jsonb	   *doc;
	JsonbValue *keys;

	if (!em_http_get(url, earmark_http_timeout_ms, JWKS_MAX_BYTES, &resp))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
				 errmsg("could not fetch the JSON Web Key Set from \"%s\"", url),
				 errdetail("%s", resp.error)));
	if (resp.status != 200)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
				 errmsg("could not fetch the JSON Web Key Set from \"%s\"", url),
				 errdetail("The server answered with HTTP status %ld.", resp.status)));

	doc = parse_json_object(PARSE_JSON_UTF8, resp.body, resp.body_len,
							ERRCODE_EARMARK_JWKS_UNAVAILABLE, "the JSON Web Key Set");
	keys = json_member(&doc->root, "keys");
	if (keys == NULL || keys->type != jbvBinary ||
		!JsonContainerIsArray(keys->val.binary.data))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
				 errmsg("the JSON Web Key Set from \"%s\" has no \"keys\" array", url)));
	return JsonbValueToJsonb(keys);
}

static void
store_jwks(const char *url, Jsonb *keys, TimestampTz at)
{
	Datum		args[3];

	args[0] = CStringGetTextDatum(url);
	args[1] = JsonbPGetDatum(keys);
	args[2] = TimestampTzGetDatum(at);
	em_exec(&upsert_jwks, args, NULL, 0);
}

/* the key of a key set's cooldown (cooldown.c) */
static uint64
url_key(const char *url)
{
	return hash_bytes_extended((const unsigned char *) url, (int) strlen(url), 0);
}

/*
 * Fetch, keep the copy (in this backend and for every backend: a store
 * that this transaction rolls back must not hide the set), store; the
 * fetched keys.
 */
static Jsonb *
refetch_jwks(const char *url)
{
	Jsonb	   *keys = fetch_jwks(url);
	TimestampTz now = GetCurrentTimestamp();

	remember_local(url, keys, now);
	em_cooldown_share(url, now, keys, VARSIZE(keys));
	store_jwks(url, keys, now);
	return keys;
}

/*
 * Fetch the configured key set and store it.  Runs in the caller's SPI
 * connection (the worker's pass, or earmark_refresh_jwks).
 */
static int
em_jwks_refresh(void)
{
	char	   *url = jwks_url(false);

	if (url == NULL)
		return 0;
	return (int) JB_ROOT_COUNT(refetch_jwks(url));
}

static EmStatement jwks_fresh = {
	"SELECT 1 FROM earmark.jwks WHERE url = $1 AND fetched_at >= $2",
	2, {TEXTOID, TIMESTAMPTZOID}
};

/*
 * The worker's refresh: fetch the configured key set when it is missing
 * or was fetched before cutoff.  Returns the number of keys fetched, 0
 * when nothing was due (or no provider domain is set).
 */
int
em_jwks_refresh_if_older(TimestampTz cutoff)
{
	char	   *url = jwks_url(false);
	Datum		args[2];

	if (url == NULL)
		return 0;
	args[0] = CStringGetTextDatum(url);
	args[1] = TimestampTzGetDatum(cutoff);
	em_exec(&jwks_fresh, args, NULL, 1);
	if (SPI_processed > 0)
		return 0;
	return (int) JB_ROOT_COUNT(refetch_jwks(url));
}

/* a string member of a key, or NULL (the provider's set is not judged) */
static char *
member_cstring(JsonbContainer *obj, const char *key)
{
	JsonbValue *v = json_member(obj, key);

	if (v == NULL || v->type != jbvString)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/* the key with this kid in a "keys" array */
static bool
jwk_in_set(Jsonb *keys, const char *kid, Jwk *jwk)
{
	JsonbIterator *it = JsonbIteratorInit(&keys->root);
	JsonbIteratorToken tok;
	JsonbValue	v;
	size_t		kidlen = strlen(kid);

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		JsonbContainer *key;
		JsonbValue *k;

		if (tok != WJB_ELEM || v.type != jbvBinary ||
			!JsonContainerIsObject(v.val.binary.data))
			continue;
		key = v.val.binary.data;
		k = json_member(key, "kid");
		if (k == NULL || k->type != jbvString || k->val.string.len != kidlen ||
			memcmp(k->val.string.val, kid, kidlen) != 0)
			continue;
		jwk->kty = member_cstring(key, "kty");
		jwk->n = member_cstring(key, "n");
		jwk->e = member_cstring(key, "e");
		jwk->alg = member_cstring(key, "alg");
		jwk->use = member_cstring(key, "use");
		return true;
	}
	return false;
}

static void raise_unknown_kid(const char *kid, TimestampTz last, const char *why)
			pg_attribute_noreturn();

static void
raise_unknown_kid(const char *kid, TimestampTz last, const char *why)
{
	int64		age = (GetCurrentTimestamp() - last) / USECS_PER_SEC;

	ereport(ERROR,
			(errcode(ERRCODE_EARMARK_UNKNOWN_KEY),
			 errmsg("JWT key id \"%s\" is not in the JSON Web Key Set", kid),
			 why ? errdetail("%s", why) :
			 errdetail("The key set was fetched (or tried) " INT64_FORMAT " seconds ago; an unknown key id makes a fetch at most every %d seconds.",
					   age, earmark_jwks_refetch_cooldown_s)));
}

/*
 * May this delivery fetch the key set for an unknown kid?  Not when a set
 * this backend can see (stored, or its own copy) is younger than
 * earmark.jwks_refetch_cooldown, nor when any backend fetched within it.
 * The latter lives in shared memory (em_cooldown_take): a delivery that
 * fails rolls back the set it stored, and without the shared record six
 * forged tokens on six connections made six fetches.  Taking the cooldown
 * and deciding to fetch is one step, so of many deliveries at once one
 * fetches.  Without shared memory (earmark not preloaded) no backend can
 * know what another fetched, so a delivery never fetches: the set comes
 * from earmark_refresh_jwks (or the worker, which needs the preload too).
 */
static void
may_refetch(const char *url, const char *kid, TimestampTz last_seen)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		cooldown_us = (int64) earmark_jwks_refetch_cooldown_s * USECS_PER_SEC;
	TimestampTz last;

	if (!TIMESTAMP_IS_NOBEGIN(last_seen) && now - last_seen < cooldown_us)
		raise_unknown_kid(kid, last_seen, NULL);
	switch (em_cooldown_take(url_key(url), now, cooldown_us, &last))
	{
		case EM_COOLDOWN_TAKEN:
			return;
		case EM_COOLDOWN_WAIT:
			raise_unknown_kid(kid, last, NULL);
			break;
		case EM_COOLDOWN_NO_SHMEM:
			ereport(ERROR,
					(errcode(ERRCODE_EARMARK_UNKNOWN_KEY),
					 errmsg("JWT key id \"%s\" is not in the JSON Web Key Set", kid),
					 errdetail("earmark is not in shared_preload_libraries, so a delivery never fetches the key set."),
					 errhint("Preload earmark, or fetch the key set with earmark_refresh_jwks().")));
			break;
	}
}

/*
 * The key for kid from the set another backend fetched last (cooldown.c),
 * when it is newer than *last, the newest set this backend could see:
 * kept here and stored, as this backend's own copy would be.  Else *last
 * becomes that set's time, if it is newer: the cooldown counts from it.
 */
static bool
from_shared_copy(const char *url, const char *kid, Jwk *jwk, TimestampTz *last)
{
	TimestampTz at = 0;
	Jsonb	   *keys = (Jsonb *) em_cooldown_shared(url, *last, &at);

	if (keys == NULL)
		return false;
	if (!jwk_in_set(keys, kid, jwk))
	{
		*last = at;
		return false;
	}
	remember_local(url, keys, at);
	store_jwks(url, keys, at);
	return true;
}

/*
 * The key for kid: from the stored set; else from this backend's own
 * newer copy (stored again, so that it is kept if this delivery commits),
 * or from the newer set another backend fetched;
 * else after one fetch, if may_refetch allows it, so that tokens with
 * made-up kids cannot make every delivery call the provider (jose's
 * cooldownDuration, 30 s, is the model).
 */
static void
find_jwk(const char *url, const char *kid, Jwk *jwk)
{
	Datum		arg = CStringGetTextDatum(url);
	TimestampTz stored_at = DT_NOBEGIN;
	TimestampTz last;

	em_exec(&jwks_of_url, &arg, NULL, 1);
	if (SPI_processed == 1)
	{
		bool		isnull;
		Jsonb	   *keys = DatumGetJsonbP(em_get(0, JU_KEYS, &isnull));

		stored_at = DatumGetTimestampTz(em_get(0, JU_FETCHED_AT, &isnull));
		if (jwk_in_set(keys, kid, jwk))
			return;
	}

	last = stored_at;
	if (local_url != NULL && strcmp(local_url, url) == 0 &&
		local_fetched_at > stored_at)
	{
		if (jwk_in_set(local_keys, kid, jwk))
		{
			store_jwks(url, local_keys, local_fetched_at);
			return;
		}
		last = local_fetched_at;
	}
	if (from_shared_copy(url, kid, jwk, &last))
		return;

	may_refetch(url, kid, last);
	if (!jwk_in_set(refetch_jwks(url), kid, jwk))
		raise_unknown_kid(kid, 0,
						  psprintf("The key set at \"%s\" was fetched again and does not have it.", url));
}

/* ---------------------------------------------------------------------
 * Kinde (JWT, RS256)
 * ---------------------------------------------------------------------
 */
static unsigned char *
jwk_number(const char *b64, const char *name, const char *kid, size_t *len)
{
	unsigned char *v = NULL;

	if (b64 != NULL)
		v = em_base64_decode(b64, strlen(b64), true, len);
	if (v == NULL || *len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
				 errmsg("key \"%s\" of the JSON Web Key Set has no usable \"%s\"", kid, name)));
	return v;
}

/* check the token's signature with the key its header names */
static void
verify_rs256(const EmJwt *jwt, const char *kid, const Jwk *jwk)
{
	unsigned char *n;
	unsigned char *e;
	size_t		n_len;
	size_t		e_len;

	if (jwk->kty == NULL || strcmp(jwk->kty, "RSA") != 0 ||
		(jwk->alg != NULL && strcmp(jwk->alg, "RS256") != 0) ||
		(jwk->use != NULL && strcmp(jwk->use, "sig") != 0))
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_INVALID_SIGNATURE),
				 errmsg("key \"%s\" is not an RS256 signing key", kid)));

	n = jwk_number(jwk->n, "n", kid, &n_len);
	e = jwk_number(jwk->e, "e", kid, &e_len);
	switch (em_rs256_verify(n, n_len, e, e_len, jwt->signing_input,
							jwt->signing_input_len, jwt->signature,
							jwt->signature_len))
	{
		case EM_RSA_VALID:
			return;
		case EM_RSA_MISMATCH:
			ereport(ERROR,
					(errcode(ERRCODE_EARMARK_INVALID_SIGNATURE),
					 errmsg("JWT signature does not match"),
					 errdetail("The token is not signed by key \"%s\".", kid)));
			break;
		case EM_RSA_BAD_KEY:
			ereport(ERROR,
					(errcode(ERRCODE_EARMARK_JWKS_UNAVAILABLE),
					 errmsg("key \"%s\" of the JSON Web Key Set is not a usable RSA key", kid),
					 errdetail("An RS256 key has a modulus of 2048 to 8192 bits and an odd exponent above 1.")));
			break;
	}
}

/* the header: alg must be RS256 and kid names the key */
static char *
check_jwt_header(const EmJwt *jwt)
{
	Jsonb	   *header;
	char	   *alg;

	header = parse_json_object(PARSE_JSON_UTF8, jwt->header, jwt->header_len,
							   ERRCODE_EARMARK_MALFORMED_WEBHOOK, "the JWT header");
	alg = json_required_string(&header->root, "alg", "JWT header");
	if (strcmp(alg, "RS256") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_INVALID_SIGNATURE),
				 errmsg("JWT algorithm \"%s\" is not accepted", alg),
				 errdetail("Kinde signs webhooks with RS256; nothing else is taken.")));
	/* RFC 7515 4.1.11: an extension we do not understand must fail */
	if (json_member(&header->root, "crit") != NULL)
		raise_malformed("the JWT header has \"crit\" extensions, which are not supported", NULL);
	return json_required_string(&header->root, "kid", "JWT header");
}

/* an "exp" that has passed refuses the token (RFC 7519 4.1.4: no leeway) */
static void
check_expiry(JsonbContainer *claims)
{
	JsonbValue *exp = json_member(claims, "exp");
	TimestampTz now = GetCurrentTimestamp();
	Numeric		now_n;

	if (exp == NULL)
		return;
	if (exp->type != jbvNumeric)
		raise_malformed("\"exp\" in the JWT payload is not a number", NULL);
	now_n = int64_div_fast_to_numeric(now + UNIX_EPOCH_USECS_OFFSET, 6);
	if (DatumGetInt32(DirectFunctionCall2(numeric_cmp, NumericGetDatum(now_n),
										  NumericGetDatum(exp->val.numeric))) >= 0)
		ereport(ERROR,
				(errcode(ERRCODE_EARMARK_TOKEN_EXPIRED),
				 errmsg("JWT has expired"),
				 errdetail("Its \"exp\" is %s.",
						   DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(exp->val.numeric))))));
}

/*
 * earmark_inbox_receive_kinde(webhook_id, token) RETURNS TABLE (event_id,
 * inserted)
 *
 * The dedupe key is the signed event_id when there is one: the
 * webhook-id header is not covered by the signature.
 */
Datum
earmark_inbox_receive_kinde(PG_FUNCTION_ARGS)
{
	text	   *webhook_id = em_arg_name(fcinfo, 0, "webhook_id");
	text	   *token = arg_text(fcinfo, 1, "token", EM_WEBHOOK_MAX_BYTES);
	char	   *url;
	char	   *kid;
	const char *why = NULL;
	EmJwt		jwt;
	Jwk			jwk;
	Jsonb	   *claims;
	char	   *event_type;
	char	   *event_id_claim;
	TimestampTz occurred_at = 0;
	bool		has_occurred_at;
	text	   *account;
	int64		event_id;
	bool		inserted;
	em_require_coordinator("earmark_inbox_receive_kinde");

	if (!em_jwt_split(VARDATA_ANY(token), VARSIZE_ANY_EXHDR(token), &jwt, &why))
		raise_malformed("the Kinde webhook token is not a JWT", why);
	kid = check_jwt_header(&jwt);
	url = jwks_url(true);

	SPI_connect();
	find_jwk(url, kid, &jwk);
	verify_rs256(&jwt, kid, &jwk);

	claims = parse_json_object(PARSE_JSON_UTF8, jwt.payload, jwt.payload_len,
							   ERRCODE_EARMARK_MALFORMED_WEBHOOK, "the JWT payload");
	check_expiry(&claims->root);
	event_type = json_required_string(&claims->root, "type", "JWT payload");
	event_id_claim = json_string(&claims->root, "event_id", "JWT payload");
	has_occurred_at = event_time(&claims->root, "JWT payload", &occurred_at);
	account = customer_account(&claims->root, "JWT payload's data");

	em_inbox_store_verified(cstring_to_text(KINDE_SOURCE),
							event_id_claim ? cstring_to_text(event_id_claim) : webhook_id,
							cstring_to_text(event_type), claims,
							has_occurred_at, occurred_at, account,
							EM_VERIFIED_KINDE_JWT, &event_id, &inserted);
	SPI_finish();

	em_return_event_id(fcinfo, event_id, inserted);
	return (Datum) 0;
}

/*
 * earmark_refresh_jwks() RETURNS int
 * Fetch the key set now; the number of keys it has.
 */
Datum
earmark_refresh_jwks(PG_FUNCTION_ARGS)
{
	int			n;
	em_require_schema();
	em_require_coordinator("earmark_refresh_jwks");

	(void) jwks_url(true);		/* a clear error when it is not configured */
	SPI_connect();
	n = em_jwks_refresh();
	SPI_finish();
	PG_RETURN_INT32(n);
}
