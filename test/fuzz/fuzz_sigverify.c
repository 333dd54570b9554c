/*-------------------------------------------------------------------------
 *
 * fuzz_sigverify.c
 *	  libFuzzer target for the parsers and verifiers of src/sigverify.c,
 *	  built outside the server with test/fuzz/pg_shim.c:
 *
 *	  base64      em_base64_decode, standard and base64url
 *	  secret      em_webhook_secret_decode (lenient about the unused bits
 *	              of the last character, as the reference libraries are),
 *	              and that every buffer holding a decoded key, whole or
 *	              half decoded, is wiped before it is freed
 *	  webhook     em_webhook_verify (the webhook-signature header, the
 *	              timestamp and its tolerance, HMAC-SHA256) at any finite
 *	              time, as earmark_webhook_signature_valid(..., at) reaches it
 *	  jwt         em_jwt_split
 *	  rs256       em_rs256_verify with any modulus, exponent, message and
 *	              signature
 *
 *	  Each target also checks the function's answer against a reference
 *	  written here from the spec (RFC 4648 base64, Standard Webhooks,
 *	  RFC 7515 compact JWS, RSASSA-PKCS1-v1_5) with 128-bit arithmetic and
 *	  other OpenSSL calls; a different answer aborts like a crash, with
 *	  both answers printed.
 *
 *	  The target is chosen by the environment variable EM_FUZZ_TARGET (one
 *	  of the names above), so that run.sh fuzzes each for its own time and
 *	  a finding in one does not stop the others.  Unset: the first byte of
 *	  the input chooses.
 *
 *	  What is not here: everything in intake.c (the JSON of JWT headers,
 *	  claims and key sets goes through jsonb_in, the event times through
 *	  timestamptz_in, the key set through SPI): those need a backend and are
 *	  fuzzed through SQL by test/integration/fuzz_sql.sh.
 *
 *-------------------------------------------------------------------------
 */

/* the code under test, with its static helpers */
#include "sigverify.c"

#include <stdio.h>
#include <stdlib.h>

#include <openssl/bn.h>
#include <openssl/evp.h>

#include "pg_shim.h"

/* port.h sends the printf family to libpgport's; the C library's will do here */
#undef fprintf
#undef vsnprintf
#undef snprintf
#undef printf

/* The finite timestamptz range: what earmark_webhook_signature_valid's
 * "at" may be (infinities are refused before em_webhook_verify). */
#define FINITE_MIN	MIN_TIMESTAMP
#define FINITE_END	END_TIMESTAMP	/* exclusive */

typedef enum
{
	T_BASE64,
	T_SECRET,
	T_WEBHOOK,
	T_JWT,
	T_RS256,
	T_COUNT
} Target;

static const char *const target_names[T_COUNT] = {"base64", "secret", "webhook", "jwt", "rs256"};
static int	fixed_target = -1;
static bool verbose = false;	/* EM_FUZZ_VERBOSE: print every answer (to replay an input) */

/* ---------------------------------------------------------------------
 * input reading
 * ---------------------------------------------------------------------
 */
typedef struct Input
{
	const uint8_t *p;
	size_t		n;
} Input;

static uint64_t
take_u(Input *in, int bytes)
{
	uint64_t	v = 0;
	int			i;

	for (i = 0; i < bytes; i++)
	{
		v |= (uint64_t) (in->n > 0 ? in->p[0] : 0) << (8 * i);
		if (in->n > 0)
			in->p++, in->n--;
	}
	return v;
}

/* a text field: the bytes up to the next NUL (SQL text has none) or the end */
static const uint8_t *
take_text(Input *in, size_t *len)
{
	const uint8_t *p = in->p;
	const uint8_t *nul = memchr(p, 0, in->n);
	size_t		l = nul ? (size_t) (nul - p) : in->n;

	in->p += nul ? l + 1 : l;
	in->n -= nul ? l + 1 : l;
	*len = l;
	return p;
}

/* a field: a 2-byte little-endian length, then that many bytes (or what is left) */
static const uint8_t *
take_field(Input *in, size_t *len)
{
	size_t		want = (size_t) take_u(in, 2);
	const uint8_t *p = in->p;

	if (want > in->n)
		want = in->n;
	in->p += want;
	in->n -= want;
	*len = want;
	return p;
}

static void
hexdump(const char *what, const void *p, size_t n)
{
	size_t		i;

	fprintf(stderr, "  %s (%zu bytes): ", what, n);
	for (i = 0; i < n && i < 256; i++)
		fprintf(stderr, "%02x", ((const uint8_t *) p)[i]);
	fprintf(stderr, "%s\n", n > 256 ? "..." : "");
}

#define FINDING(...) do { fprintf(stderr, "FINDING: " __VA_ARGS__); fprintf(stderr, "\n"); } while (0)

/* ---------------------------------------------------------------------
 * reference base64 (RFC 4648, strict, padding optional)
 * ---------------------------------------------------------------------
 */
static int
ref_b64_char(uint8_t c, bool url)
{
	const char *alpha = url ?
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" :
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const char *hit;

	if (c == 0)
		return -1;
	hit = strchr(alpha, c);
	return hit ? (int) (hit - alpha) : -1;
}

/*
 * Decode into out (at least len bytes); false when the text is not the
 * canonical base64 of some bytes: a character outside the alphabet, "="
 * other than one or two at the end that complete a group of four, a
 * length that leaves 6 lone bits, or (unless lenient, as the Standard
 * Webhooks libraries decode secrets) unused bits that are not zero.
 */
static bool
ref_b64_decode(const uint8_t *in, size_t len, bool url, bool lenient,
			   uint8_t *out, size_t *outlen)
{
	size_t		pad = 0;
	size_t		data;
	size_t		i;
	size_t		n = 0;

	while (pad < len && in[len - 1 - pad] == '=')
		pad++;
	if (pad > 2)
		return false;
	data = len - pad;
	if (pad > 0 && len % 4 != 0)
		return false;
	if (data % 4 == 1)
		return false;
	for (i = 0; i < data; i += 4)
	{
		size_t		k = data - i < 4 ? data - i : 4;
		uint32_t	group = 0;
		size_t		j;

		for (j = 0; j < 4; j++)
		{
			int			v = j < k ? ref_b64_char(in[i + j], url) : 0;

			if (v < 0)
				return false;
			group = (group << 6) | (uint32_t) v;
		}
		out[n++] = (uint8_t) (group >> 16);
		if (k >= 3)
			out[n++] = (uint8_t) (group >> 8);
		else if (((group >> 8) & 0xff) && !lenient)
			return false;		/* bits after the last byte */
		if (k == 4)
			out[n++] = (uint8_t) group;
		else if ((group & 0xff) && !lenient)
			return false;
	}
	*outlen = n;
	return true;
}

/* em_base64_decode against the reference; returns the decoded bytes or NULL */
static unsigned char *
checked_b64(const uint8_t *in, size_t len, bool url, size_t *outlen, const char *where)
{
	uint8_t    *ref = malloc(len + 1);
	size_t		reflen = 0;
	bool		ref_ok = ref_b64_decode(in, len, url, false, ref, &reflen);
	size_t		gotlen = 0;
	unsigned char *got = em_base64_decode((const char *) in, len, url, &gotlen);

	if ((got != NULL) != ref_ok ||
		(got != NULL && (gotlen != reflen || memcmp(got, ref, reflen) != 0 || got[gotlen] != '\0')))
	{
		FINDING("em_base64_decode (%s, %s alphabet) %s the text, the reference %s it",
				where, url ? "url" : "standard", got ? "accepts" : "refuses",
				ref_ok ? "accepts" : "refuses");
		hexdump("text", in, len);
		if (got)
			hexdump("em_base64_decode", got, gotlen);
		if (ref_ok)
			hexdump("reference", ref, reflen);
		abort();
	}
	free(ref);
	if (outlen)
		*outlen = gotlen;
	return got;
}

/* ---------------------------------------------------------------------
 * base64, secrets
 * ---------------------------------------------------------------------
 */
static void
fuzz_base64(Input *in)
{
	bool		url = take_u(in, 1) & 1;

	(void) checked_b64(in->p, in->n, url, NULL, "base64 target");
}

static void
fuzz_secret(Input *in)
{
	const uint8_t *s = in->p;
	size_t		len = in->n;
	size_t		keylen = 0;
	unsigned char *key;
	const uint8_t *b = s;
	size_t		blen = len;
	uint8_t    *ref = malloc(len + 1);
	size_t		reflen = 0;
	bool		ref_ok;

	/* a secret half decoded and then refused must be wiped too */
	shim_expect_wiped(true);
	key = em_webhook_secret_decode((const char *) s, len, &keylen);
	shim_expect_wiped(false);

	if (blen >= 6 && memcmp(b, "whsec_", 6) == 0)
		b += 6, blen -= 6;
	ref_ok = ref_b64_decode(b, blen, false, true, ref, &reflen) && reflen > 0;
	if ((key != NULL) != ref_ok ||
		(key != NULL && (keylen != reflen || memcmp(key, ref, reflen) != 0)))
	{
		FINDING("em_webhook_secret_decode %s the secret, the reference %s it",
				key ? "accepts" : "refuses", ref_ok ? "accepts" : "refuses");
		hexdump("secret", s, len);
		abort();
	}
	free(ref);
	/* and the key is wiped when it is freed */
	shim_expect_wiped(true);
	em_webhook_key_free(key, keylen);
	shim_expect_wiped(false);
}

/* ---------------------------------------------------------------------
 * Standard Webhooks
 * ---------------------------------------------------------------------
 */
static const char *const wh_names[] = {
	"VALID", "MISMATCH", "TOO_OLD", "TOO_NEW", "BAD_TIMESTAMP", "BAD_HEADER"
};

static EmWebhookResult
ref_webhook(const EmWebhookMessage *msg, const EmWebhookKey *keys, int nkeys,
			__int128 now, int tolerance_s)
{
	uint8_t		sigs[1024][32];
	int			nsigs = 0;
	size_t		pos = 0;
	__int128	sent = 0;
	__int128	sent_us;
	__int128	tol = (__int128) tolerance_s * 1000000;
	size_t		i;
	int			k;

	/* the header: space-separated entries, the v1 ones base64 of 32 bytes */
	while (pos <= msg->signature_len)
	{
		size_t		end = pos;

		while (end < msg->signature_len && msg->signature[end] != ' ')
			end++;
		if (end - pos >= 3 && memcmp(msg->signature + pos, "v1,", 3) == 0)
		{
			uint8_t    *buf = malloc(end - pos + 1);
			size_t		blen = 0;
			bool		ok = ref_b64_decode((const uint8_t *) msg->signature + pos + 3,
											end - pos - 3, false, false, buf, &blen);

			if (!ok || blen != 32 || nsigs >= 1024)
			{
				free(buf);
				return EM_WEBHOOK_BAD_HEADER;
			}
			memcpy(sigs[nsigs++], buf, 32);
			free(buf);
		}
		pos = end + 1;
	}
	if (nsigs == 0)
		return EM_WEBHOOK_BAD_HEADER;

	/* the timestamp: 1 to 12 digits */
	if (msg->timestamp_len == 0 || msg->timestamp_len > 12)
		return EM_WEBHOOK_BAD_TIMESTAMP;
	for (i = 0; i < msg->timestamp_len; i++)
	{
		if (msg->timestamp[i] < '0' || msg->timestamp[i] > '9')
			return EM_WEBHOOK_BAD_TIMESTAMP;
		sent = sent * 10 + (msg->timestamp[i] - '0');
	}
	sent_us = (sent - (__int128) 946684800) * 1000000;
	if (now - sent_us > tol)
		return EM_WEBHOOK_TOO_OLD;
	if (sent_us - now > tol)
		return EM_WEBHOOK_TOO_NEW;

	/* HMAC-SHA256 of "id.timestamp.body" with a one-shot OpenSSL call */
	for (k = 0; k < nkeys; k++)
	{
		size_t		mlen = msg->id_len + msg->timestamp_len + msg->body_len + 2;
		uint8_t    *m = malloc(mlen);
		uint8_t		mac[32];
		size_t		maclen = 0;
		int			s;

		memcpy(m, msg->id, msg->id_len);
		m[msg->id_len] = '.';
		memcpy(m + msg->id_len + 1, msg->timestamp, msg->timestamp_len);
		m[msg->id_len + 1 + msg->timestamp_len] = '.';
		memcpy(m + msg->id_len + 2 + msg->timestamp_len, msg->body, msg->body_len);
		if (EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, keys[k].key, keys[k].len,
					  m, mlen, mac, sizeof(mac), &maclen) == NULL || maclen != 32)
			abort();
		free(m);
		for (s = 0; s < nsigs; s++)
			if (memcmp(mac, sigs[s], 32) == 0)
				return EM_WEBHOOK_VALID;
	}
	return EM_WEBHOOK_MISMATCH;
}

/*
 * Input: flags (1), now (8), tolerance (4), then id, timestamp, signature
 * header and body, each ended by a NUL (SQL text has none), then the key
 * bytes, cut into 1 to 4 keys.  flags bit 0: "now" is anywhere in the
 * finite timestamptz range (earmark_webhook_signature_valid's "at"); else
 * within 2^31 seconds of 2023-11-14 (a clock).  flags bits 1-2: keys - 1.
 */
static void
fuzz_webhook(Input *in)
{
	uint8_t		flags = (uint8_t) take_u(in, 1);
	uint64_t	rawnow = take_u(in, 8);
	int			tolerance = 1 + (int) (take_u(in, 4) % 86400);	/* the GUC's range */
	int			nkeys = 1 + ((flags >> 1) & 3);
	EmWebhookMessage msg;
	EmWebhookKey keys[4];
	TimestampTz now;
	EmWebhookResult got;
	EmWebhookResult ref;
	size_t		len;
	int			k;

	if (flags & 1)
	{
		uint64_t	range = (uint64_t) FINITE_END - (uint64_t) FINITE_MIN;

		now = (TimestampTz) ((uint64_t) FINITE_MIN + rawnow % range);
	}
	else
		now = ((int64) 1700000000 - (int64) 946684800 + (int64) (int32) rawnow) * USECS_PER_SEC +
			(int64) ((rawnow >> 32) % USECS_PER_SEC);

	msg.id = (const char *) take_text(in, &len);
	msg.id_len = len;
	msg.timestamp = (const char *) take_text(in, &len);
	msg.timestamp_len = len;
	msg.signature = (const char *) take_text(in, &len);
	msg.signature_len = len;
	msg.body = (const char *) take_text(in, &len);
	msg.body_len = len;
	/* what the SQL functions let through (arg_text): none empty, the sizes */
	if (msg.id_len == 0 || msg.timestamp_len == 0 || msg.timestamp_len > 64 ||
		msg.signature_len == 0 || msg.signature_len > EM_SIGNATURE_HEADER_MAX || msg.body_len == 0)
		return;
	for (k = 0; k < nkeys; k++)
	{
		size_t		part = in->n / (size_t) (nkeys - k);

		keys[k].key = in->p;
		keys[k].len = part;
		in->p += part;
		in->n -= part;
		if (keys[k].len == 0)	/* em_webhook_secret_decode never yields an empty key */
		{
			keys[k].key = (const unsigned char *) "k";
			keys[k].len = 1;
		}
	}

	got = em_webhook_verify(&msg, keys, nkeys, now, tolerance);
	ref = ref_webhook(&msg, keys, nkeys, (__int128) now, tolerance);
	if (verbose)
		fprintf(stderr, "webhook: now " INT64_FORMAT ", tolerance %d, %d keys: %s (reference %s)\n",
				now, tolerance, nkeys, wh_names[got], wh_names[ref]);
	if (got != ref)
	{
		FINDING("em_webhook_verify answers %s, the reference %s (now = " INT64_FORMAT
				" us after 2000-01-01, tolerance %d s)", wh_names[got], wh_names[ref], now, tolerance);
		hexdump("webhook-id", msg.id, msg.id_len);
		hexdump("webhook-timestamp", msg.timestamp, msg.timestamp_len);
		hexdump("webhook-signature", msg.signature, msg.signature_len);
		hexdump("body", msg.body, msg.body_len);
		abort();
	}
}

/* ---------------------------------------------------------------------
 * JWT
 * ---------------------------------------------------------------------
 */
static void
fuzz_jwt(Input *in)
{
	const uint8_t *t = in->p;
	size_t		len = in->n;
	EmJwt		jwt;
	const char *why = NULL;
	bool		ok = em_jwt_split((const char *) t, len, &jwt, &why);

	if (verbose)
		fprintf(stderr, "jwt: %s%s%s\n", ok ? "split" : "refused: ", ok ? "" : why, "");
	const uint8_t *d1 = memchr(t, '.', len);
	const uint8_t *d2 = d1 ? memchr(d1 + 1, '.', t + len - (d1 + 1)) : NULL;
	bool		three = d2 != NULL && memchr(d2 + 1, '.', t + len - (d2 + 1)) == NULL;
	bool		ref_ok = three && d1 != t && d2 != d1 + 1;
	uint8_t    *buf = malloc(len + 1);
	size_t		blen;

	if (ref_ok)
	{
		ref_ok = ref_b64_decode(t, d1 - t, true, false, buf, &blen) &&
			(!ok || (blen == jwt.header_len && memcmp(buf, jwt.header, blen) == 0 && jwt.header[blen] == '\0'));
		ref_ok = ref_ok && ref_b64_decode(d1 + 1, d2 - (d1 + 1), true, false, buf, &blen) &&
			(!ok || (blen == jwt.payload_len && memcmp(buf, jwt.payload, blen) == 0 && jwt.payload[blen] == '\0'));
		ref_ok = ref_ok && ref_b64_decode(d2 + 1, t + len - (d2 + 1), true, false, buf, &blen) &&
			(!ok || (blen == jwt.signature_len && memcmp(buf, jwt.signature, blen) == 0));
	}
	free(buf);
	if (ok != ref_ok || (!ok && why == NULL) ||
		(ok && (jwt.signing_input != (const char *) t || jwt.signing_input_len != (size_t) (d2 - t))))
	{
		FINDING("em_jwt_split %s the token (%s), the reference %s it",
				ok ? "accepts" : "refuses", why ? why : "no reason", ref_ok ? "accepts" : "refuses");
		hexdump("token", t, len);
		abort();
	}
}

/* ---------------------------------------------------------------------
 * RS256
 * ---------------------------------------------------------------------
 */
static const char *const rsa_names[] = {"VALID", "MISMATCH", "BAD_KEY"};

/*
 * The answer RFC 8017 8.2.2 gives, with the key rules of em_rs256_verify's
 * comment (2048 to 8192 bits, an odd exponent above 1 of at most 8 bytes).
 * -1: "MISMATCH or BAD_KEY", when OpenSSL may refuse the key itself.
 */
static int
ref_rs256(const uint8_t *n, size_t n_len, const uint8_t *e, size_t e_len,
		  const uint8_t *msg, size_t msg_len, const uint8_t *sig, size_t sig_len)
{
	static const uint8_t prefix[] = {
		0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01,
		0x05, 0x00, 0x04, 0x20
	};
	BIGNUM	   *bn_n;
	BIGNUM	   *bn_e;
	BIGNUM	   *bn_s;
	BIGNUM	   *bn_m;
	BN_CTX	   *ctx;
	size_t		k;
	uint8_t    *em;
	uint8_t    *want;
	int			bits;
	int			result;

	while (n_len > 0 && *n == 0)
		n++, n_len--;
	while (e_len > 0 && *e == 0)
		e++, e_len--;
	if (n_len == 0 || n_len > 1024 || e_len == 0 || e_len > 8 || (e[e_len - 1] & 1) == 0 ||
		(e_len == 1 && e[0] == 1))
		return EM_RSA_BAD_KEY;
	bn_n = BN_bin2bn(n, (int) n_len, NULL);
	bits = BN_num_bits(bn_n);
	k = (size_t) BN_num_bytes(bn_n);
	if (bits < 2048 || bits > 8192)
	{
		BN_free(bn_n);
		return EM_RSA_BAD_KEY;
	}
	if (sig_len != k)
	{
		BN_free(bn_n);
		return EM_RSA_MISMATCH;
	}
	bn_e = BN_bin2bn(e, (int) e_len, NULL);
	bn_s = BN_bin2bn(sig, (int) sig_len, NULL);
	bn_m = BN_new();
	ctx = BN_CTX_new();
	em = calloc(1, k);
	want = calloc(1, k);
	result = EM_RSA_MISMATCH;
	if (BN_cmp(bn_s, bn_n) < 0 && BN_mod_exp(bn_m, bn_s, bn_e, bn_n, ctx) == 1 &&
		BN_bn2binpad(bn_m, em, (int) k) == (int) k)
	{
		want[0] = 0x00;
		want[1] = 0x01;
		memset(want + 2, 0xff, k - 3 - sizeof(prefix) - 32);
		want[k - 1 - sizeof(prefix) - 32] = 0x00;
		memcpy(want + k - sizeof(prefix) - 32, prefix, sizeof(prefix));
		EVP_Digest(msg, msg_len, want + k - 32, NULL, EVP_sha256(), NULL);
		if (memcmp(em, want, k) == 0)
			result = EM_RSA_VALID;
	}
	/* an even modulus: OpenSSL's Montgomery code cannot use it at all */
	if (result != EM_RSA_VALID && !BN_is_odd(bn_n))
		result = -1;
	free(em);
	free(want);
	BN_CTX_free(ctx);
	BN_free(bn_m);
	BN_free(bn_s);
	BN_free(bn_e);
	BN_free(bn_n);
	return result;
}

/* Input: fields n, e, msg, sig (big-endian numbers, as a JWK's n and e decode) */
static void
fuzz_rs256(Input *in)
{
	size_t		n_len,
				e_len,
				msg_len,
				sig_len;
	const uint8_t *n = take_field(in, &n_len);
	const uint8_t *e = take_field(in, &e_len);
	const uint8_t *msg = take_field(in, &msg_len);
	const uint8_t *sig = take_field(in, &sig_len);
	EmRsaResult got = em_rs256_verify(n, n_len, e, e_len, (const char *) msg, msg_len, sig, sig_len);
	int			ref = ref_rs256(n, n_len, e, e_len, msg, msg_len, sig, sig_len);

	if (verbose)
		fprintf(stderr, "rs256: n %zu bytes, e %zu, msg %zu, sig %zu: %s (reference %s)\n",
				n_len, e_len, msg_len, sig_len, rsa_names[got], ref < 0 ? "either" : rsa_names[ref]);

	if (ref == -1 ? got == EM_RSA_VALID : (int) got != ref)
	{
		FINDING("em_rs256_verify answers %s, the reference %s", rsa_names[got],
				ref < 0 ? "MISMATCH or BAD_KEY" : rsa_names[ref]);
		hexdump("n", n, n_len);
		hexdump("e", e, e_len);
		hexdump("msg", msg, msg_len);
		hexdump("sig", sig, sig_len);
		abort();
	}
}

/* ---------------------------------------------------------------------
 * libFuzzer
 * ---------------------------------------------------------------------
 */
int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *t = getenv("EM_FUZZ_TARGET");
	int			i;

	verbose = getenv("EM_FUZZ_VERBOSE") != NULL;
	if (t != NULL && *t != '\0')
	{
		for (i = 0; i < T_COUNT; i++)
			if (strcmp(t, target_names[i]) == 0)
				fixed_target = i;
		if (fixed_target < 0)
		{
			fprintf(stderr, "EM_FUZZ_TARGET must be one of base64, secret, webhook, jwt, rs256\n");
			exit(2);
		}
	}
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Input		in = {data, size};
	int			target = fixed_target >= 0 ? fixed_target : (int) (take_u(&in, 1) % T_COUNT);

	switch (target)
	{
		case T_BASE64:
			fuzz_base64(&in);
			break;
		case T_SECRET:
			fuzz_secret(&in);
			break;
		case T_WEBHOOK:
			fuzz_webhook(&in);
			break;
		case T_JWT:
			fuzz_jwt(&in);
			break;
		case T_RS256:
			fuzz_rs256(&in);
			break;
	}
	shim_reset();
	return 0;
}
