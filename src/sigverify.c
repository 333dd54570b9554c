/*-------------------------------------------------------------------------
 *
 * sigverify.c
 *	  Webhook signature verification, as pure functions of their input:
 *	  base64, Standard Webhooks (HMAC-SHA256 over "id.timestamp.body"),
 *	  and compact JWS with RS256 for Kinde's webhooks.  intake.c decides
 *	  what to raise; these functions only answer.
 *
 *	  Uses OpenSSL 3's EVP interfaces only (no deprecated RSA or HMAC_CTX
 *	  calls).  OpenSSL objects live outside palloc memory, so no function
 *	  here can raise an error while it holds one: each is freed first, and
 *	  the OpenSSL error queue is cleared so that it never leaks into the
 *	  backend's own TLS connection.
 *
 *	  Reads no table, takes no lock, keeps one cached HMAC implementation
 *	  per backend.  A decoded webhook key is wiped (explicit_bzero) before
 *	  its memory is freed, whether it was decoded whole or refused half way
 *	  (em_wipe_free, em_webhook_key_free); so is a computed MAC.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>				/* openssl/err.h uses INT_MAX */

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>

#include "common/int.h"
#include "datatype/timestamp.h"

#include "sigverify.h"

/* RFC 7518 3.3: RS256 keys are 2048 bits or more; 8192 bounds the work */
#define RSA_MIN_BITS	2048
#define RSA_MAX_BITS	8192

/* Unix epoch to PostgreSQL epoch, in seconds */
#define UNIX_TO_PG_EPOCH_SECS \
	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY)

/* ---------------------------------------------------------------------
 * base64
 * ---------------------------------------------------------------------
 */
static int
b64_value(unsigned char c, bool url)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == (url ? '-' : '+'))
		return 62;
	if (c == (url ? '_' : '/'))
		return 63;
	return -1;
}

/*
 * No whitespace, '=' only as the final padding.  Padding is optional
 * because JWS omits it and some Standard Webhooks secrets are written
 * without it.  Strict (lenient = false) also wants the unused bits of the
 * last character to be zero, so that one byte string has exactly one
 * accepted text: signatures and tokens are decoded so (no malleability).
 * Lenient ignores those bits, as the Standard Webhooks reference libraries
 * do when they decode a secret (Python's base64.b64decode, Node's Buffer).
 *
 * The output may be a secret: a text refused half way is wiped before it
 * is freed.
 */
static unsigned char *
b64_decode(const char *in, size_t len, bool url, bool lenient, size_t *outlen)
{
	size_t		cap;
	size_t		pad = 0;
	size_t		n = 0;
	size_t		i;
	uint32		acc = 0;
	int			bits = 0;
	unsigned char *out;

	while (len > 0 && in[len - 1] == '=' && pad < 2)
	{
		len--;
		pad++;
	}
	if (pad > 0 && (len + pad) % 4 != 0)
		return NULL;
	if (len % 4 == 1)
		return NULL;

	/* exactly the bytes decoded and a NUL, so that a key's free wipes all */
	cap = len / 4 * 3 + (len % 4 == 3 ? 2 : len % 4 == 2 ? 1 : 0) + 1;
	out = palloc(cap);
	for (i = 0; i < len; i++)
	{
		int			v = b64_value((unsigned char) in[i], url);

		if (v < 0)
		{
			em_wipe_free(out, cap);
			explicit_bzero(&acc, sizeof(acc));
			return NULL;
		}
		acc = (acc << 6) | (uint32) v;
		bits += 6;
		if (bits >= 8)
		{
			bits -= 8;
			out[n++] = (unsigned char) ((acc >> bits) & 0xFF);
		}
	}
	if (!lenient && (acc & ((1u << bits) - 1)) != 0)
	{
		em_wipe_free(out, cap);
		explicit_bzero(&acc, sizeof(acc));
		return NULL;
	}
	explicit_bzero(&acc, sizeof(acc));
	out[n] = '\0';
	*outlen = n;
	return out;
}

unsigned char *
em_base64_decode(const char *in, size_t len, bool url, size_t *outlen)
{
	return b64_decode(in, len, url, false, outlen);
}

void
em_wipe_free(void *p, size_t len)
{
	if (p == NULL)
		return;
	explicit_bzero(p, len);
	pfree(p);
}

/* ---------------------------------------------------------------------
 * Standard Webhooks
 * ---------------------------------------------------------------------
 */

/*
 * The spec's libraries strip "whsec_" when present and decode the rest as
 * standard base64, so a bare base64 secret is accepted too; they ignore
 * the unused bits of the last character, so earmark does (lenient).
 */
unsigned char *
em_webhook_secret_decode(const char *secret, size_t len, size_t *keylen)
{
	unsigned char *key;

	if (len >= 6 && memcmp(secret, "whsec_", 6) == 0)
	{
		secret += 6;
		len -= 6;
	}
	key = b64_decode(secret, len, false, true, keylen);
	if (key != NULL && *keylen == 0)
	{
		pfree(key);
		return NULL;
	}
	return key;
}

/* wipe and free a key em_webhook_secret_decode returned */
void
em_webhook_key_free(unsigned char *key, size_t keylen)
{
	/* the buffer has the terminating NUL after the key */
	em_wipe_free(key, keylen + 1);
}

/* integer seconds since the Unix epoch, digits only */
static bool
parse_unix_seconds(const char *s, size_t len, int64 *result)
{
	int64		v = 0;
	size_t		i;

	/* 12 digits reach the year 33658 and cannot overflow below */
	if (len == 0 || len > 12)
		return false;
	for (i = 0; i < len; i++)
	{
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	*result = v;
	return true;
}

/*
 * The v1 signatures of a webhook-signature header ("v1,<base64> v1,...").
 * Entries of other versions (v1a is asymmetric) are skipped, as the spec
 * asks; a v1 entry that is not base64 of 32 bytes makes the header
 * malformed rather than silently ignored.  Returns the number found, or -1.
 */
static int
parse_v1_signatures(const char *h, size_t len, unsigned char (*sigs)[EM_HMAC_SHA256_LEN],
					int max_sigs)
{
	size_t		pos = 0;
	int			n = 0;

	while (pos < len)
	{
		size_t		end = pos;
		const char *entry = h + pos;
		size_t		elen;

		while (end < len && h[end] != ' ')
			end++;
		elen = end - pos;
		pos = end + 1;
		if (elen == 0)
			continue;			/* several spaces */
		if (elen >= 3 && memcmp(entry, "v1,", 3) == 0)
		{
			size_t		siglen;
			unsigned char *sig = em_base64_decode(entry + 3, elen - 3, false, &siglen);

			if (sig == NULL || siglen != EM_HMAC_SHA256_LEN || n >= max_sigs)
				return -1;
			memcpy(sigs[n++], sig, EM_HMAC_SHA256_LEN);
			pfree(sig);
		}
	}
	return n;
}

static EVP_MAC *hmac_impl = NULL;

/* HMAC-SHA256 over "id.timestamp.body", fed in pieces to avoid a copy */
static void
webhook_hmac(const EmWebhookKey *key, const EmWebhookMessage *msg,
			 unsigned char *out)
{
	EVP_MAC_CTX *ctx = NULL;
	OSSL_PARAM	params[2];
	size_t		outlen = 0;
	bool		ok;

	if (hmac_impl == NULL)
		hmac_impl = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
	if (hmac_impl != NULL)
		ctx = EVP_MAC_CTX_new(hmac_impl);
	params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST,
												 (char *) "SHA256", 0);
	params[1] = OSSL_PARAM_construct_end();
	ok = ctx != NULL &&
		EVP_MAC_init(ctx, key->key, key->len, params) == 1 &&
		EVP_MAC_update(ctx, (const unsigned char *) msg->id, msg->id_len) == 1 &&
		EVP_MAC_update(ctx, (const unsigned char *) ".", 1) == 1 &&
		EVP_MAC_update(ctx, (const unsigned char *) msg->timestamp, msg->timestamp_len) == 1 &&
		EVP_MAC_update(ctx, (const unsigned char *) ".", 1) == 1 &&
		EVP_MAC_update(ctx, (const unsigned char *) msg->body, msg->body_len) == 1 &&
		EVP_MAC_final(ctx, out, &outlen, EM_HMAC_SHA256_LEN) == 1 &&
		outlen == EM_HMAC_SHA256_LEN;
	EVP_MAC_CTX_free(ctx);
	ERR_clear_error();
	if (!ok)
		elog(ERROR, "earmark: could not compute HMAC-SHA256");
}

/*
 * The order follows the spec's libraries: the header's form, then the
 * timestamp (it is part of what is signed, so checking it first leaks
 * nothing), then every secret against every v1 signature.  Tolerance is
 * inclusive: exactly tolerance_s away is accepted.
 */
EmWebhookResult
em_webhook_verify(const EmWebhookMessage *msg, const EmWebhookKey *keys,
				  int nkeys, TimestampTz now, int tolerance_s)
{
	int			max_sigs = (int) (msg->signature_len / 4) + 1;
	unsigned char (*sigs)[EM_HMAC_SHA256_LEN];
	unsigned char mac[EM_HMAC_SHA256_LEN];
	int			nsigs;
	int64		sent;
	int64		sent_us;
	int64		tolerance_us = (int64) tolerance_s * USECS_PER_SEC;
	int			k;
	int			s;

	sigs = palloc(sizeof(*sigs) * max_sigs);
	nsigs = parse_v1_signatures(msg->signature, msg->signature_len, sigs, max_sigs);
	if (nsigs <= 0)
		return EM_WEBHOOK_BAD_HEADER;
	if (!parse_unix_seconds(msg->timestamp, msg->timestamp_len, &sent))
		return EM_WEBHOOK_BAD_TIMESTAMP;

	/*
	 * Differences checked for overflow: "now" may be any timestamp (the
	 * "at" argument), and a difference that does not fit is far outside
	 * any tolerance.
	 */
	{
		int64		age;

		sent_us = (sent - UNIX_TO_PG_EPOCH_SECS) * USECS_PER_SEC;
		if (pg_sub_s64_overflow(now, sent_us, &age))
			return now > sent_us ? EM_WEBHOOK_TOO_OLD : EM_WEBHOOK_TOO_NEW;
		if (age > tolerance_us)
			return EM_WEBHOOK_TOO_OLD;
		if (age < -tolerance_us)
			return EM_WEBHOOK_TOO_NEW;
	}

	for (k = 0; k < nkeys; k++)
	{
		webhook_hmac(&keys[k], msg, mac);
		for (s = 0; s < nsigs; s++)
			if (CRYPTO_memcmp(mac, sigs[s], EM_HMAC_SHA256_LEN) == 0)
			{
				explicit_bzero(mac, sizeof(mac));
				return EM_WEBHOOK_VALID;
			}
	}
	explicit_bzero(mac, sizeof(mac));
	return EM_WEBHOOK_MISMATCH;
}

/* ---------------------------------------------------------------------
 * JWT (compact JWS)
 * ---------------------------------------------------------------------
 */

/*
 * The signature part may be empty (an "alg": "none" token) so that the
 * caller can refuse such a token for its algorithm, which is the clearer
 * reason; header and payload may not.
 */
bool
em_jwt_split(const char *token, size_t len, EmJwt *jwt, const char **why)
{
	const char *end = token + len;
	const char *dot1 = memchr(token, '.', len);
	const char *dot2;

	memset(jwt, 0, sizeof(*jwt));
	if (dot1 == NULL ||
		(dot2 = memchr(dot1 + 1, '.', end - (dot1 + 1))) == NULL ||
		memchr(dot2 + 1, '.', end - (dot2 + 1)) != NULL)
	{
		*why = "A compact JWS has three parts separated by dots.";
		return false;
	}
	if (dot1 == token || dot2 == dot1 + 1)
	{
		*why = "The JWS header or payload is empty.";
		return false;
	}
	jwt->header = (char *) em_base64_decode(token, dot1 - token, true,
											&jwt->header_len);
	if (jwt->header == NULL)
	{
		*why = "The JWS header is not base64url.";
		return false;
	}
	jwt->payload = (char *) em_base64_decode(dot1 + 1, dot2 - (dot1 + 1), true,
											 &jwt->payload_len);
	if (jwt->payload == NULL)
	{
		*why = "The JWS payload is not base64url.";
		return false;
	}
	jwt->signature = em_base64_decode(dot2 + 1, end - (dot2 + 1), true,
									  &jwt->signature_len);
	if (jwt->signature == NULL)
	{
		*why = "The JWS signature is not base64url.";
		return false;
	}
	jwt->signing_input = token;
	jwt->signing_input_len = dot2 - token;
	return true;
}

/* ---------------------------------------------------------------------
 * RS256
 * ---------------------------------------------------------------------
 */

/* the public key (n, e), or NULL if OpenSSL does not take it */
static EVP_PKEY *
rsa_public_key(BIGNUM *bn_n, BIGNUM *bn_e)
{
	OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
	OSSL_PARAM *params = NULL;
	EVP_PKEY_CTX *pctx = NULL;
	EVP_PKEY   *pkey = NULL;

	if (bld != NULL &&
		OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n) == 1 &&
		OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e) == 1)
		params = OSSL_PARAM_BLD_to_param(bld);
	if (params != NULL)
		pctx = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL);
	if (pctx != NULL &&
		(EVP_PKEY_fromdata_init(pctx) != 1 ||
		 EVP_PKEY_fromdata(pctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1))
	{
		EVP_PKEY_free(pkey);
		pkey = NULL;
	}
	EVP_PKEY_CTX_free(pctx);
	OSSL_PARAM_free(params);
	OSSL_PARAM_BLD_free(bld);
	return pkey;
}

/*
 * The key is checked before OpenSSL sees it: RFC 7518's minimum size, an
 * upper bound so that a hostile key set cannot make verification slow,
 * and an odd exponent above 1.  A signature of the wrong length cannot
 * match, and is not passed on.
 */
EmRsaResult
em_rs256_verify(const unsigned char *n, size_t n_len,
				const unsigned char *e, size_t e_len,
				const char *msg, size_t msg_len,
				const unsigned char *sig, size_t sig_len)
{
	BIGNUM	   *bn_n = NULL;
	BIGNUM	   *bn_e = NULL;
	EVP_PKEY   *pkey = NULL;
	EVP_MD_CTX *md = NULL;
	EmRsaResult result = EM_RSA_BAD_KEY;
	int			bits;

	while (n_len > 0 && *n == 0)
		n++, n_len--;
	while (e_len > 0 && *e == 0)
		e++, e_len--;
	if (n_len == 0 || n_len > RSA_MAX_BITS / 8 || e_len == 0 || e_len > 8 ||
		(e[e_len - 1] & 1) == 0 || (e_len == 1 && e[0] == 1))
		return EM_RSA_BAD_KEY;

	bn_n = BN_bin2bn(n, (int) n_len, NULL);
	bn_e = BN_bin2bn(e, (int) e_len, NULL);
	if (bn_n == NULL || bn_e == NULL)
		goto done;
	bits = BN_num_bits(bn_n);
	if (bits < RSA_MIN_BITS || bits > RSA_MAX_BITS)
		goto done;
	if (sig_len != (size_t) BN_num_bytes(bn_n))
	{
		result = EM_RSA_MISMATCH;
		goto done;
	}
	pkey = rsa_public_key(bn_n, bn_e);
	if (pkey == NULL)
		goto done;
	md = EVP_MD_CTX_new();
	if (md == NULL ||
		EVP_DigestVerifyInit_ex(md, NULL, "SHA256", NULL, NULL, pkey, NULL) != 1)
		goto done;
	/* 0 is a mismatch; a negative answer is a signature it cannot parse */
	result = EVP_DigestVerify(md, sig, sig_len, (const unsigned char *) msg,
							  msg_len) == 1 ? EM_RSA_VALID : EM_RSA_MISMATCH;

done:
	EVP_MD_CTX_free(md);
	EVP_PKEY_free(pkey);
	BN_free(bn_n);
	BN_free(bn_e);
	ERR_clear_error();
	return result;
}
