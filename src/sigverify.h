/*-------------------------------------------------------------------------
 *
 * sigverify.h
 *	  Webhook signature verification (sigverify.c): base64, Standard
 *	  Webhooks signatures, RS256 JWTs, and the sizes a delivery may have.
 *	  Pure functions: they read no table and no setting.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_SIGVERIFY_H
#define EARMARK_SIGVERIFY_H

#include "postgres.h"

#include "utils/jsonb.h"
#include "utils/timestamp.h"

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

#endif							/* EARMARK_SIGVERIFY_H */
