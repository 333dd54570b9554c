/*-------------------------------------------------------------------------
 *
 * sigverify.h
 *	  Webhook signature verification (sigverify.c), the HTTP GET that
 *	  fetches a JSON Web Key Set (http.c), and the SQLSTATEs the signed
 *	  intake raises (intake.c).
 *
 *	  Every verification error has its own SQLSTATE so that an HTTP
 *	  endpoint in front of earmark can answer with the right status; the
 *	  status each one maps to is noted beside it.  Nothing is stored when
 *	  any of them is raised.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_SIGVERIFY_H
#define EARMARK_SIGVERIFY_H

#include "postgres.h"

#include "utils/jsonb.h"
#include "utils/timestamp.h"

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

/* the largest body or token accepted, in bytes */
#define EM_WEBHOOK_MAX_BYTES		(1024 * 1024)
/* the largest webhook-signature header accepted, in bytes */
#define EM_SIGNATURE_HEADER_MAX		4096
/* HMAC-SHA256 output */
#define EM_HMAC_SHA256_LEN			32

/* ---------------------------------------------------------------------
 * base64 (sigverify.c)
 * ---------------------------------------------------------------------
 */

/*
 * Decode standard (url = false) or base64url (url = true) text, padded or
 * not.  Returns a palloc'd buffer (NUL-terminated, for convenience) or
 * NULL if the text is not canonical base64 of that alphabet (the unused
 * bits of the last character must be zero: signatures are strict).
 */
extern unsigned char *em_base64_decode(const char *in, size_t len, bool url,
									   size_t *outlen);

/* explicit_bzero the len bytes at p, then pfree it (NULL: nothing) */
extern void em_wipe_free(void *p, size_t len);

/* ---------------------------------------------------------------------
 * Standard Webhooks (sigverify.c)
 * ---------------------------------------------------------------------
 */

/* the shortest and longest decoded secret earmark_inbox_set_secret takes */
#define EM_SECRET_MIN_BYTES		16
#define EM_SECRET_MAX_BYTES		128

/*
 * A secret: "whsec_" + base64, or the base64 alone, decoded as leniently
 * as the reference libraries do (the unused bits of the last character are
 * ignored).  Returns the key (palloc'd) or NULL if it is not base64 or
 * decodes to nothing.  Free it with em_webhook_key_free, which wipes it.
 */
extern unsigned char *em_webhook_secret_decode(const char *secret, size_t len,
											   size_t *keylen);
extern void em_webhook_key_free(unsigned char *key, size_t keylen);

typedef struct EmWebhookMessage
{
	const char *id;
	size_t		id_len;
	const char *timestamp;
	size_t		timestamp_len;
	const char *signature;		/* the webhook-signature header */
	size_t		signature_len;
	const char *body;
	size_t		body_len;
} EmWebhookMessage;

typedef struct EmWebhookKey
{
	const unsigned char *key;
	size_t		len;
} EmWebhookKey;

typedef enum EmWebhookResult
{
	EM_WEBHOOK_VALID,
	EM_WEBHOOK_MISMATCH,		/* well formed, but no signature matches */
	EM_WEBHOOK_TOO_OLD,
	EM_WEBHOOK_TOO_NEW,
	EM_WEBHOOK_BAD_TIMESTAMP,	/* not integer seconds */
	EM_WEBHOOK_BAD_HEADER		/* no v1 signature, or one that is not base64
								 * of 32 bytes */
} EmWebhookResult;

extern EmWebhookResult em_webhook_verify(const EmWebhookMessage *msg,
										 const EmWebhookKey *keys, int nkeys,
										 TimestampTz now, int tolerance_s);

/* ---------------------------------------------------------------------
 * JWT, RS256 (sigverify.c)
 * ---------------------------------------------------------------------
 */

/* a compact JWS split and decoded; header and payload are NUL-terminated */
typedef struct EmJwt
{
	const char *signing_input;	/* "header.payload" as sent */
	size_t		signing_input_len;
	char	   *header;
	size_t		header_len;
	char	   *payload;
	size_t		payload_len;
	unsigned char *signature;
	size_t		signature_len;
} EmJwt;

/* false, with a reason, if the token is not three base64url parts */
extern bool em_jwt_split(const char *token, size_t len, EmJwt *jwt,
						 const char **why);

typedef enum EmRsaResult
{
	EM_RSA_VALID,
	EM_RSA_MISMATCH,
	EM_RSA_BAD_KEY				/* the modulus or exponent is not usable */
} EmRsaResult;

/* RSASSA-PKCS1-v1_5 with SHA-256 under the public key (n, e), big-endian */
extern EmRsaResult em_rs256_verify(const unsigned char *n, size_t n_len,
								   const unsigned char *e, size_t e_len,
								   const char *msg, size_t msg_len,
								   const unsigned char *sig, size_t sig_len);

/* ---------------------------------------------------------------------
 * HTTP (http.c)
 * ---------------------------------------------------------------------
 */

typedef struct EmHttpResponse
{
	long		status;			/* HTTP status, 0 if none was received */
	char	   *body;			/* palloc'd, NUL-terminated */
	size_t		body_len;
	char	   *error;			/* transport error, NULL if none */
} EmHttpResponse;

/*
 * GET url, at most max_bytes of body, within timeout_ms.  Returns false
 * (and sets error) when no complete response arrived.
 */
extern bool em_http_get(const char *url, int timeout_ms, size_t max_bytes,
						EmHttpResponse *resp);

/* ---------------------------------------------------------------------
 * Shared cooldowns (earmark.c's shared memory)
 * ---------------------------------------------------------------------
 */

typedef enum EmCooldownResult
{
	EM_COOLDOWN_TAKEN,			/* not taken within the cooldown: now it is */
	EM_COOLDOWN_WAIT,			/* taken less than the cooldown ago */
	EM_COOLDOWN_NO_SHMEM		/* earmark is not in shared_preload_libraries */
} EmCooldownResult;

extern EmCooldownResult em_cooldown_take(uint64 key, TimestampTz now,
										 int64 cooldown_us, TimestampTz *last);

/* ---------------------------------------------------------------------
 * Storing a verified event (inbox.c)
 * ---------------------------------------------------------------------
 */

/* earmark.inbox_event.verified_by: how the event's source was verified */
#define EM_VERIFIED_STANDARD_WEBHOOKS	"standard_webhooks"
#define EM_VERIFIED_KINDE_JWT			"kinde_jwt"
#define EM_VERIFIED_ADMIN				"admin"

/*
 * em_inbox_store (earmark.h) with how the event was verified: one of the
 * EM_VERIFIED_* above, or NULL for an unverified event, which is refused
 * (42501) where only verified events may go.  An event time further ahead
 * than earmark.webhook_tolerance is refused (EM108).  Runs in the caller's
 * SPI connection.
 */
extern void em_inbox_store_verified(text *source, text *dedupe_key,
									text *event_type, Jsonb *payload,
									bool has_occurred_at,
									TimestampTz occurred_at, text *account,
									const char *verified_by,
									int64 *event_id, bool *inserted);

/* ---------------------------------------------------------------------
 * Key set (intake.c)
 * ---------------------------------------------------------------------
 */

/*
 * Fetch the configured JWKS and store it in earmark.jwks; returns the
 * number of keys, or 0 without fetching when earmark.kinde_domain is not
 * set.  Runs in the caller's SPI connection; raises on failure.
 */
extern int	em_jwks_refresh(void);

#endif							/* EARMARK_SIGVERIFY_H */
