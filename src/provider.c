/*-------------------------------------------------------------------------
 *
 * provider.c
 *	  The billing provider: where the meter's totals go and where the
 *	  limits come from.  earmark.provider selects one of
 *	  - local (default): earmark.local_meter stands in for the meter
 *	    (absolute writes, read back); limits are the manual ones.
 *	  - kinde: OAuth2 client credentials (POST /oauth2/token, audience
 *	    <domain>/api, the token kept until 60 s before it expires);
 *	    POST /api/v1/billing/meter_usage with meter_type_code "absolute";
 *	    GET /api/v1/billing/meter_usage to read the current cycle back;
 *	    GET /api/v1/billing/entitlements, paged with starting_after.
 *	  - http: a generic JSON endpoint (docs/providers.md): PUT /meter sets
 *	    an absolute total, GET /meter reads it, GET /limits lists limits;
 *	    a bearer token or an HMAC-SHA256 signature authenticates.
 *
 *	  Secrets (client secret, token, HMAC key) are read from the file that
 *	  earmark.provider_secrets_file names, at each use: never a setting
 *	  (PostgreSQL logs a reloaded setting's value), never shown to any
 *	  role, never put in a log line or an error message here.  Every copy
 *	  this file makes of one (the file's buffer, the token request's form,
 *	  the token answer and its parse, the bearer headers, the cached token)
 *	  is zeroed before it is freed.
 *
 *	  A provider's answer is untrusted text.  It is parsed into a small
 *	  tree by PostgreSQL's JSON parser without raising (parse_answer):
 *	  never by jsonb_in, which raises on valid JSON (a number past
 *	  numeric's range, nesting past the stack depth) and would turn one
 *	  hostile answer into an error of the caller (the worker's send step
 *	  has no transaction to roll back).  Numbers keep their text and are
 *	  read as whole numbers or not at all.  A malformed or hostile answer
 *	  is a failed request, nothing more.
 *
 *	  Takes no locks.  The local provider writes earmark.local_meter in
 *	  the caller's SPI connection; the kinde and http providers need no
 *	  transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include <openssl/hmac.h>
#include <openssl/evp.h>

#include "catalog/pg_type.h"
#include "common/jsonapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/memutils.h"

#include "http.h"
#include "provider.h"
#include "settings.h"
#include "spi.h"

/* a Kinde limit of 2147483647 is how "no maximum" reads */
#define KINDE_NO_MAX		INT64CONST(2147483647)
#define MAX_LIMIT_PAGES		100

const char *
em_provider_name(void)
{
	switch (earmark_provider)
	{
		case EM_PROVIDER_KINDE:
			return "kinde";
		case EM_PROVIDER_HTTP:
			return "http";
		default:
			return "local";
	}
}

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/* the provider's base URL without a trailing slash, or NULL */
static const char *
base_url(void)
{
	const char *u = earmark_provider == EM_PROVIDER_KINDE ? earmark_kinde_domain
		: earmark_provider_url;
	size_t		len;

	if (u == NULL || u[0] == '\0')
		return NULL;
	len = strlen(u);
	while (len > 0 && u[len - 1] == '/')
		len--;
	return pnstrdup(u, len);
}

static void
append_urlenc(StringInfo buf, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";

	for (; *s; s++)
	{
		unsigned char c = (unsigned char) *s;

		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
			(c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~')
			appendStringInfoChar(buf, c);
		else
		{
			appendStringInfoChar(buf, '%');
			appendStringInfoChar(buf, hex[c >> 4]);
			appendStringInfoChar(buf, hex[c & 15]);
		}
	}
}

/* a cycle start as ISO 8601 in UTC, as the http provider keys cycles */
static char *
iso_utc(TimestampTz t)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
		elog(ERROR, "earmark: timestamp out of range");
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year, tm.tm_mon,
					tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* ---------------------------------------------------------------------
 * Answers
 * ---------------------------------------------------------------------
 */

/* nesting deeper than this is refused (the answers earmark reads nest 3 deep) */
#define ANSWER_MAX_DEPTH	32

typedef enum AnswerType
{
	ANSWER_OBJECT,
	ANSWER_ARRAY,
	ANSWER_STRING,
	ANSWER_NUMBER,
	ANSWER_TRUE,
	ANSWER_FALSE,
	ANSWER_NULL
} AnswerType;

/* one value of an answer; an object's or array's elements are a list */
typedef struct Answer
{
	AnswerType	type;
	char	   *key;			/* as an object's member, else NULL */
	char	   *text;			/* a string's value, a number's text */
	struct Answer *first;		/* elements, in order */
	struct Answer *last;
	struct Answer *next;		/* the next element of the parent */
	struct Answer *parent;
} Answer;

typedef struct AnswerParse
{
	Answer	   *root;
	Answer	   *cur;			/* the open object or array */
	char	   *key;			/* the member whose value comes next */
} AnswerParse;

static Answer *
answer_add(AnswerParse *ps, AnswerType type, char *text)
{
	Answer	   *a = palloc0(sizeof(Answer));

	a->type = type;
	a->text = text;
	a->key = ps->key;
	ps->key = NULL;
	a->parent = ps->cur;
	if (ps->cur == NULL)
		ps->root = a;
	else if (ps->cur->last)
		ps->cur->last->next = a;
	else
		ps->cur->first = a;
	if (ps->cur)
		ps->cur->last = a;
	return a;
}

static void
answer_object_start(void *state)
{
	AnswerParse *ps = (AnswerParse *) state;

	ps->cur = answer_add(ps, ANSWER_OBJECT, NULL);
}

static void
answer_array_start(void *state)
{
	AnswerParse *ps = (AnswerParse *) state;

	ps->cur = answer_add(ps, ANSWER_ARRAY, NULL);
}

static void
answer_end(void *state)
{
	AnswerParse *ps = (AnswerParse *) state;

	ps->cur = ps->cur->parent;
}

static void
answer_field(void *state, char *fname, bool isnull)
{
	((AnswerParse *) state)->key = fname;
}

static void
answer_scalar(void *state, char *token, JsonTokenType tokentype)
{
	AnswerParse *ps = (AnswerParse *) state;
	AnswerType	type;

	switch (tokentype)
	{
		case JSON_TOKEN_STRING:
			type = ANSWER_STRING;
			break;
		case JSON_TOKEN_NUMBER:
			type = ANSWER_NUMBER;
			break;
		case JSON_TOKEN_TRUE:
			type = ANSWER_TRUE;
			break;
		case JSON_TOKEN_FALSE:
			type = ANSWER_FALSE;
			break;
		default:
			type = ANSWER_NULL;
			break;
	}
	(void) answer_add(ps, type, token);
}

/* zero every key and text of an answer that carried a secret */
static void
answer_forget(Answer *a)
{
	for (; a != NULL; a = a->next)
	{
		if (a->key)
			explicit_bzero(a->key, strlen(a->key));
		if (a->text)
			explicit_bzero(a->text, strlen(a->text));
		answer_forget(a->first);
	}
}

/*
 * What the JSON parser would raise on instead of returning an error: it
 * recurses once a level of nesting and checks the stack depth, and in a
 * database that is not UTF-8 it converts a \u escape past ASCII and
 * raises when it cannot.  So: at most ANSWER_MAX_DEPTH levels, and no such
 * escape there.  Brackets inside strings do not count.  For invalid JSON
 * the scan may count wrong, but the parser then stops at the error before
 * it has nested deeper than the scan counted.
 */
static const char *
answer_untame(const char *body, size_t len)
{
	bool		utf8 = GetDatabaseEncoding() == PG_UTF8;
	bool		in_string = false;
	int			depth = 0;
	size_t		i;

	for (i = 0; i < len; i++)
	{
		char		c = body[i];

		if (in_string)
		{
			if (c == '"')
				in_string = false;
			else if (c == '\\' && i + 1 < len)
			{
				if (body[i + 1] == 'u' && !utf8 &&
					(i + 5 >= len || !(body[i + 2] == '0' && body[i + 3] == '0' &&
									   body[i + 4] >= '0' && body[i + 4] <= '7')))
					return "a \\u escape past ASCII in a database that is not UTF-8";
				i++;			/* the escaped character */
			}
		}
		else if (c == '"')
			in_string = true;
		else if (c == '[' || c == '{')
		{
			if (++depth > ANSWER_MAX_DEPTH)
				return psprintf("nested deeper than %d levels", ANSWER_MAX_DEPTH);
		}
		else if (c == ']' || c == '}')
			depth--;
	}
	return NULL;
}

/* a lexer over body whose string buffer never grows (no stale copies) */
static JsonLexContext *
answer_lexer(const char *body, size_t len)
{
	JsonLexContext *lex = makeJsonLexContextCstringLen(unconstify(char *, body), (int) len,
													   GetDatabaseEncoding(), true);

	enlargeStringInfo(lex->strval, (int) len);
	return lex;
}

static void
answer_lexer_forget(JsonLexContext *lex)
{
	explicit_bzero(lex->strval->data, lex->strval->maxlen);
}

/*
 * Parse a provider's answer without raising: its JSON object, or NULL with
 * *why.  Two passes: the first only checks the JSON (its one string buffer
 * is zeroed after), the second, on JSON known to be valid, builds the tree,
 * so that every string the parser copies ends in the tree: a caller whose
 * answer carried a secret zeroes it all with answer_forget once it has
 * what it needs.
 */
static Answer *
parse_answer(const char *body, size_t len, const char **why)
{
	JsonLexContext *lex;
	JsonSemAction sem;
	AnswerParse ps;
	JsonParseErrorType rc;

	*why = NULL;
	if (body == NULL || len == 0)
		*why = "the answer is empty";
	else if (len > INT_MAX ||
			 !pg_verify_mbstr(GetDatabaseEncoding(), body, (int) len, true) ||
			 memchr(body, '\0', len) != NULL)
		*why = "the answer is not text in the database's encoding";
	else
		*why = answer_untame(body, len);
	if (*why)
		return NULL;

	lex = answer_lexer(body, len);
	rc = pg_parse_json(lex, &nullSemAction);
	answer_lexer_forget(lex);
	if (rc != JSON_SUCCESS)
	{
		*why = "the answer is not valid JSON";
		return NULL;
	}

	lex = answer_lexer(body, len);
	memset(&sem, 0, sizeof(sem));
	memset(&ps, 0, sizeof(ps));
	sem.semstate = &ps;
	sem.object_start = answer_object_start;
	sem.object_end = answer_end;
	sem.array_start = answer_array_start;
	sem.array_end = answer_end;
	sem.object_field_start = answer_field;
	sem.scalar = answer_scalar;
	rc = pg_parse_json(lex, &sem);
	answer_lexer_forget(lex);
	if (rc != JSON_SUCCESS || ps.root == NULL)
	{
		/* not expected: the same text parsed a moment ago */
		answer_forget(ps.root);
		*why = "the answer is not valid JSON";
		return NULL;
	}
	if (ps.root->type != ANSWER_OBJECT)
	{
		answer_forget(ps.root);
		*why = "the answer is not a JSON object";
		return NULL;
	}
	return ps.root;
}

/* an object's member; of duplicate keys the last, as jsonb keeps it */
static Answer *
member(Answer *obj, const char *key)
{
	Answer	   *a;
	Answer	   *found = NULL;

	if (obj == NULL || obj->type != ANSWER_OBJECT)
		return NULL;
	for (a = obj->first; a != NULL; a = a->next)
		if (a->key != NULL && strcmp(a->key, key) == 0)
			found = a;
	return found;
}

/*
 * A whole number that fits a bigint, given as a JSON number without a
 * fraction or an exponent, or as a string of decimal digits (either with
 * a leading '-').  Anything else (1.5, 1e3, 1e200000, past bigint, "",
 * true) is not one.
 */
static bool
value_int64(Answer *v, int64 *out)
{
	const char *s;
	const char *p;
	char	   *end;
	long long	n;

	if (v == NULL || (v->type != ANSWER_NUMBER && v->type != ANSWER_STRING))
		return false;
	s = v->text;
	p = s[0] == '-' ? s + 1 : s;
	if (*p == '\0' || strspn(p, "0123456789") != strlen(p))
		return false;
	errno = 0;
	n = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return false;
	*out = (int64) n;
	return true;
}

static char *
value_string(Answer *v)
{
	if (v == NULL || v->type != ANSWER_STRING)
		return NULL;
	return v->text;
}

static char *
status_error(EmHttpRequest *r)
{
	if (r->error)
		return pstrdup(r->error);
	return psprintf("the provider answered HTTP %ld", r->status);
}

/* ---------------------------------------------------------------------
 * Secrets
 * ---------------------------------------------------------------------
 */

/*
 * The value of "name" in the secrets file: "name = value" lines, "#"
 * comments.  NULL when the file or the name is not there; *error when the
 * file cannot be used (its text never goes into the message).
 */
static char *
provider_secret(const char *name, char **error)
{
	const char *path = earmark_provider_secrets_file;
	FILE	   *f;
	struct stat st;
	char		line[1024];
	char		iobuf[BUFSIZ];	/* stdio's buffer: ours, to zero */
	char	   *value = NULL;
	size_t		nlen = strlen(name);

	if (path == NULL || path[0] == '\0')
		return NULL;
	f = AllocateFile(path, "r");
	if (f == NULL)
	{
		*error = psprintf("could not open earmark.provider_secrets_file \"%s\": %m", path);
		return NULL;
	}
	if (fstat(fileno(f), &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0 ||
		st.st_uid != geteuid())
	{
		FreeFile(f);
		*error = psprintf("earmark.provider_secrets_file \"%s\" must belong to the server's user "
						  "and be readable by no one else (chmod 600)", path);
		return NULL;
	}
	setvbuf(f, iobuf, _IOFBF, sizeof(iobuf));
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char	   *p = line;
		char	   *end;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '#' || strncmp(p, name, nlen) != 0)
			continue;
		p += nlen;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p != '=')
			continue;
		p++;
		while (*p == ' ' || *p == '\t')
			p++;
		end = p + strlen(p);
		while (end > p && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (value)
			em_forget(value, strlen(value));
		value = pnstrdup(p, end - p);
	}
	explicit_bzero(line, sizeof(line));
	FreeFile(f);
	explicit_bzero(iobuf, sizeof(iobuf));
	return value && value[0] ? value : NULL;
}

static void
forget_secret(char *s)
{
	if (s)
		em_forget(s, strlen(s));
}

/* ---------------------------------------------------------------------
 * Authentication
 * ---------------------------------------------------------------------
 */

/*
 * Kinde's access token, kept in this process until 60 s before it expires,
 * and only for the domain and client it was issued to.
 */
static char *kinde_token = NULL;
static char *kinde_token_for = NULL;	/* "domain client_id" */
static TimestampTz kinde_token_until = 0;

static void
forget_kinde_token(void)
{
	if (kinde_token)
	{
		explicit_bzero(kinde_token, strlen(kinde_token));
		pfree(kinde_token);
	}
	if (kinde_token_for)
		pfree(kinde_token_for);
	kinde_token = NULL;
	kinde_token_for = NULL;
	kinde_token_until = 0;
}

/* the longest a token is kept: a day (a longer expires_in is cut to it) */
#define KINDE_TOKEN_MAX_S	86400

/*
 * How long the token may be used, in seconds, from the answer's
 * expires_in: a whole number from 1 up (cut to a day, so that the time
 * computed from it cannot overflow).  Missing, negative, zero, a fraction,
 * an exponent, past bigint, not a number: 0, and the token serves the
 * requests at hand only.
 */
static int64
token_lifetime(Answer *answer)
{
	int64		s;

	if (!value_int64(member(answer, "expires_in"), &s) || s <= 0)
		return 0;
	return Min(s, KINDE_TOKEN_MAX_S);
}

/* a token goes into a header: printable ASCII only, no spaces */
static bool
token_is_sane(const char *tok)
{
	const char *p;

	if (tok == NULL || tok[0] == '\0' || strlen(tok) > 16384)
		return false;
	for (p = tok; *p; p++)
		if (*p <= ' ' || *p > '~')
			return false;
	return true;
}

/* the token request's form; it holds the client secret */
static StringInfoData
token_form(const char *base, const char *secret)
{
	StringInfoData form;
	const char *client = earmark_provider_client_id;

	initStringInfo(&form);
	/* room for the whole form at once: no regrowth leaves a copy behind */
	enlargeStringInfo(&form, (int) (3 * (strlen(client) + strlen(secret) + strlen(base)) + 128));
	appendStringInfoString(&form, "grant_type=client_credentials&client_id=");
	append_urlenc(&form, client);
	appendStringInfoString(&form, "&client_secret=");
	append_urlenc(&form, secret);
	appendStringInfoString(&form, "&audience=");
	append_urlenc(&form, psprintf("%s/api", base));
	return form;
}

static const char *
get_kinde_token(const char *base, EmHttpTick tick, void *tick_arg, char **error)
{
	EmHttpRequest req;
	StringInfoData form;
	Answer	   *answer;
	const char *why;
	char	   *tok;
	char	   *secret;

	char	   *issued_for = psprintf("%s %s", base,
									  earmark_provider_client_id ? earmark_provider_client_id : "");

	if (kinde_token && GetCurrentTimestamp() < kinde_token_until &&
		strcmp(kinde_token_for, issued_for) == 0)
		return kinde_token;
	forget_kinde_token();
	secret = provider_secret("client_secret", error);
	if (*error)
		return NULL;
	if (!earmark_provider_client_id || !earmark_provider_client_id[0] || secret == NULL)
	{
		forget_secret(secret);
		*error = pstrdup("the kinde provider needs earmark.provider_client_id and a client_secret in earmark.provider_secrets_file");
		return NULL;
	}
	form = token_form(base, secret);
	forget_secret(secret);

	memset(&req, 0, sizeof(req));
	req.method = "POST";
	req.url = psprintf("%s/oauth2/token", base);
	req.body = form.data;
	req.content_type = "application/x-www-form-urlencoded";
	req.headers[0] = "Accept: application/json";
	em_http_run(&req, 1, 1, earmark_http_timeout_ms, tick, tick_arg);

	/* the form holds the secret: gone before anything can be reported */
	em_forget(form.data, form.maxlen);

	if (req.error || req.status != 200)
	{
		*error = psprintf("token request failed: %s", status_error(&req));
		em_forget(req.body_out, req.body_len);
		return NULL;
	}
	answer = parse_answer(req.body_out, req.body_len, &why);
	em_forget(req.body_out, req.body_len);
	if (answer == NULL)
	{
		*error = psprintf("the token endpoint's answer cannot be read: %s", why);
		return NULL;
	}
	tok = value_string(member(answer, "access_token"));
	if (!token_is_sane(tok))
	{
		answer_forget(answer);
		*error = pstrdup("the token endpoint's answer has no usable access_token");
		return NULL;
	}
	kinde_token = MemoryContextStrdup(TopMemoryContext, tok);
	kinde_token_for = MemoryContextStrdup(TopMemoryContext, issued_for);
	/* kept until 60 s before it expires, as the provider's clock counts */
	kinde_token_until = GetCurrentTimestamp() +
		Max(token_lifetime(answer) - 60, 0) * USECS_PER_SEC;
	answer_forget(answer);
	return kinde_token;
}

/* the path and query of a URL, as the server sees it */
static const char *
url_path(const char *url)
{
	const char *p = strstr(url, "://");

	p = p ? strchr(p + 3, '/') : NULL;
	return p ? p : "/";
}

/*
 * The http provider's headers: a bearer token, and/or an HMAC-SHA256
 * signature over "timestamp.METHOD.path?query.body".
 */
static bool
http_auth(EmHttpRequest *req, char **error)
{
	int			h = 0;
	char	   *token = provider_secret("token", error);
	char	   *key = *error ? NULL : provider_secret("hmac_secret", error);

	if (*error)
	{
		forget_secret(token);
		return false;
	}
	req->headers[h++] = "Accept: application/json";
	if (token)
		req->auth_header = psprintf("Authorization: Bearer %s", token);
	if (key)
	{
		long		ts = (long) time(NULL);
		char	   *msg = psprintf("%ld.%s.%s.%s", ts, req->method, url_path(req->url),
								   req->body ? req->body : "");
		unsigned char mac[EVP_MAX_MD_SIZE];
		unsigned int maclen = 0;
		char		hex[2 * EVP_MAX_MD_SIZE + 1];
		unsigned int i;

		if (HMAC(EVP_sha256(), key, (int) strlen(key),
				 (unsigned char *) msg, strlen(msg), mac, &maclen) == NULL)
			elog(ERROR, "earmark: HMAC-SHA256 failed");
		for (i = 0; i < maclen; i++)
			snprintf(hex + 2 * i, 3, "%02x", mac[i]);
		req->headers[h++] = psprintf("X-Earmark-Timestamp: %ld", ts);
		req->headers[h++] = psprintf("X-Earmark-Signature: v1=%s", hex);
	}
	req->headers[h] = NULL;
	forget_secret(token);
	forget_secret(key);
	return true;
}

/* ---------------------------------------------------------------------
 * The local provider
 * ---------------------------------------------------------------------
 */
/*
 * The write's time is a parameter (the transaction's start, as now()):
 * Citus takes no STABLE function in ON CONFLICT ... DO UPDATE SET.
 */
static EmStatement local_write = {
	"INSERT INTO earmark.local_meter AS m (account, feature, cycle_start, total, updated_at) "
	"VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account, feature, cycle_start) "
	"DO UPDATE SET total = excluded.total, writes = m.writes + 1, updated_at = excluded.updated_at",
	5, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID}
};

static EmStatement local_read = {
	"SELECT total FROM earmark.local_meter "
	"WHERE account = $1 AND feature = $2 AND cycle_start = $3",
	3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static void
local_args(EmMeterOp *op, Datum *args)
{
	args[0] = CStringGetTextDatum(op->account);
	args[1] = CStringGetTextDatum(op->feature);
	args[2] = TimestampTzGetDatum(op->cycle_start);
	args[3] = Int64GetDatum(op->total);
}

/* ---------------------------------------------------------------------
 * Meter writes and reads
 * ---------------------------------------------------------------------
 */

/*
 * The provider's base URL and, for kinde, an access token; false with
 * *error when either cannot be had (then no request is made).
 */
static bool
provider_connect(const char **base, const char **token, EmHttpTick tick,
				 void *tick_arg, char **error)
{
	*token = NULL;
	*base = base_url();
	if (*base == NULL)
	{
		*error = psprintf("%s is not set", earmark_provider == EM_PROVIDER_KINDE ?
						  "earmark.kinde_domain" : "earmark.provider_url");
		return false;
	}
	if (earmark_provider == EM_PROVIDER_KINDE)
		*token = get_kinde_token(*base, tick, tick_arg, error);
	return *error == NULL;
}

/* every op's answer cleared, so that a path that returns early leaves none */
static void
clear_ops(EmMeterOp *ops, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		ops[i].ok = false;
		ops[i].read_total = 0;
		ops[i].http_status = 0;
		ops[i].retry_at = 0;
		ops[i].elapsed_ms = 0;
		ops[i].error = NULL;
	}
}

/* the local provider's write: the total set in earmark.local_meter */
static void
local_write_one(EmMeterOp *op)
{
	Datum		args[5];

	local_args(op, args);
	args[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	em_exec(&local_write, args, NULL, 0);
	op->ok = true;
}

/* fill req for op; false (with op->error) when it cannot be sent */
static bool
build_write(EmMeterOp *op, const char *base, const char *token, EmHttpRequest *req)
{
	StringInfoData body;

	memset(req, 0, sizeof(*req));
	initStringInfo(&body);
	if (earmark_provider == EM_PROVIDER_KINDE)
	{
		if (op->agreement == NULL)
		{
			op->error = psprintf("account \"%s\" has no provider_agreement", op->account);
			return false;
		}
		appendStringInfoString(&body, "{\"customer_agreement_id\":");
		escape_json(&body, op->agreement);
		appendStringInfoString(&body, ",\"billing_feature_code\":");
		escape_json(&body, op->feature);
		appendStringInfo(&body, ",\"meter_value\":\"" INT64_FORMAT "\",\"meter_type_code\":\"absolute\"}",
						 op->total);
		req->method = "POST";
		req->url = psprintf("%s/api/v1/billing/meter_usage", base);
		req->headers[0] = "Accept: application/json";
		req->auth_header = psprintf("Authorization: Bearer %s", token);
	}
	else
	{
		appendStringInfoString(&body, "{\"account\":");
		escape_json(&body, op->account);
		appendStringInfoString(&body, ",\"customer\":");
		if (op->customer)
			escape_json(&body, op->customer);
		else
			appendStringInfoString(&body, "null");
		appendStringInfoString(&body, ",\"agreement\":");
		if (op->agreement)
			escape_json(&body, op->agreement);
		else
			appendStringInfoString(&body, "null");
		appendStringInfoString(&body, ",\"feature\":");
		escape_json(&body, op->feature);
		appendStringInfo(&body, ",\"cycle_start\":\"%s\",\"total\":" INT64_FORMAT "}",
						 iso_utc(op->cycle_start), op->total);
		req->method = "PUT";
		req->url = psprintf("%s/meter", base);
	}
	req->body = body.data;
	req->content_type = "application/json";
	/* success is the status: the body is not read, so not kept either */
	req->discard_body = true;
	if (earmark_provider == EM_PROVIDER_HTTP && !http_auth(req, &op->error))
		return false;
	return true;
}

/* a meter write's answer: success is the status */
static void
take_write(EmMeterOp *op, EmHttpRequest *r)
{
	op->http_status = r->status;
	op->retry_at = r->retry_at;
	op->elapsed_ms = r->elapsed_ms;
	op->ok = r->error == NULL && r->status >= 200 && r->status < 300;
	if (!op->ok)
		op->error = status_error(r);
	if (r->status == 401 && earmark_provider == EM_PROVIDER_KINDE)
		forget_kinde_token();
}

/* what a write and a read each do with one op: locally, or over HTTP */
typedef struct MeterCall
{
	void		(*local) (EmMeterOp *op);
	bool		(*build) (EmMeterOp *op, const char *base, const char *token,
						  EmHttpRequest *req);
	void		(*take) (EmMeterOp *op, EmHttpRequest *r);
} MeterCall;

/*
 * ops through the local provider, or as HTTP requests sent
 * earmark_report_parallel at a time.  An op whose request cannot be made
 * keeps the error its build gave; when provider_connect cannot make the
 * requests (no address, or no token to be had), every op carries its error.
 * Each request's own failure is the op's answer (take).
 */
static void
meter_run(const MeterCall *call, EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg)
{
	EmHttpRequest *reqs;
	int		   *which;
	int			m = 0;
	int			i;
	const char *base;
	const char *token = NULL;
	char	   *error = NULL;

	clear_ops(ops, n);
	if (earmark_provider == EM_PROVIDER_LOCAL)
	{
		for (i = 0; i < n; i++)
			call->local(&ops[i]);
		return;
	}

	if (!provider_connect(&base, &token, tick, tick_arg, &error))
	{
		for (i = 0; i < n; i++)
			ops[i].error = error;
		return;
	}

	reqs = palloc0(sizeof(EmHttpRequest) * n);
	which = palloc(sizeof(int) * n);
	for (i = 0; i < n; i++)
	{
		if (call->build(&ops[i], base, token, &reqs[m]))
			which[m++] = i;
		else if (reqs[m].auth_header)
			em_forget(reqs[m].auth_header, strlen(reqs[m].auth_header));
	}
	em_http_run(reqs, m, earmark_report_parallel, earmark_http_timeout_ms, tick, tick_arg);
	for (i = 0; i < m; i++)
		call->take(&ops[which[i]], &reqs[i]);
}

static const MeterCall meter_write_call = {local_write_one, build_write, take_write};

void
em_meter_write(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg)
{
	meter_run(&meter_write_call, ops, n, tick, tick_arg);
}

/*
 * The local provider's read is planned again at the next read after this
 * (em_exec_lookup): the reconciler's own repairs fill earmark.local_meter.
 */
void
em_meter_read_replan(void)
{
	em_forget_plan(&local_read);
}

/* the local provider's read: a cycle never written reads as zero */
static void
local_read_one(EmMeterOp *op)
{
	Datum		args[4];

	local_args(op, args);
	em_exec_lookup(&local_read, args, NULL, 1);
	op->read_total = SPI_processed == 1 ? em_get_int64(0, 1, 0) : 0;
	op->ok = true;
}

/* a meter read's request; false (op->error set) when it cannot be made */
static bool
build_read(EmMeterOp *op, const char *base, const char *token, EmHttpRequest *req)
{
	StringInfoData url;

	memset(req, 0, sizeof(*req));
	initStringInfo(&url);
	req->method = "GET";
	if (earmark_provider == EM_PROVIDER_KINDE)
	{
		/* Kinde reads the current cycle only: a closed one is unreadable */
		if (op->closed)
		{
			op->error = pstrdup("the provider reads back only the current cycle");
			return false;
		}
		if (op->agreement == NULL)
		{
			op->error = psprintf("account \"%s\" has no provider_agreement", op->account);
			return false;
		}
		appendStringInfo(&url, "%s/api/v1/billing/meter_usage?customer_agreement_id=", base);
		append_urlenc(&url, op->agreement);
		appendStringInfoString(&url, "&billing_feature_code=");
		append_urlenc(&url, op->feature);
		req->url = url.data;
		req->headers[0] = "Accept: application/json";
		req->auth_header = psprintf("Authorization: Bearer %s", token);
		return true;
	}
	appendStringInfo(&url, "%s/meter?account=", base);
	append_urlenc(&url, op->account);
	appendStringInfoString(&url, "&feature=");
	append_urlenc(&url, op->feature);
	appendStringInfoString(&url, "&cycle_start=");
	append_urlenc(&url, iso_utc(op->cycle_start));
	req->url = url.data;
	return http_auth(req, &op->error);
}

/* a meter read's answer: the provider's total, never a guess */
static void
take_read(EmMeterOp *op, EmHttpRequest *r)
{
	Answer	   *answer;
	const char *why;

	op->http_status = r->status;
	if (r->error || r->status != 200)
	{
		op->error = status_error(r);
		if (r->status == 401 && earmark_provider == EM_PROVIDER_KINDE)
			forget_kinde_token();
		return;
	}
	answer = parse_answer(r->body_out, r->body_len, &why);
	if (answer == NULL)
	{
		op->error = psprintf("the provider's answer cannot be read: %s", why);
		return;
	}
	if (!value_int64(member(answer,
							earmark_provider == EM_PROVIDER_KINDE ? "meter_value" : "total"),
					 &op->read_total))
	{
		/* an answer without a total is unreadable */
		op->error = pstrdup("the provider's answer carries no total");
		return;
	}
	op->ok = true;
}

static const MeterCall meter_read_call = {local_read_one, build_read, take_read};

void
em_meter_read(EmMeterOp *ops, int n)
{
	meter_run(&meter_read_call, ops, n, NULL, NULL);
}

/* ---------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------
 */
static EmLimit *
new_limit(const char *feature, bool unlimited, int64 lim)
{
	EmLimit    *l = palloc(sizeof(EmLimit));

	l->feature = pstrdup(feature);
	l->unlimited = unlimited;
	l->lim = lim;
	return l;
}

/* a failed request: whether the provider itself is down or busy */
static bool
provider_failed(EmHttpRequest *r)
{
	return r->error != NULL || r->status == 0 || r->status == 429 || r->status >= 500;
}

/* one limit of a page; false with *error when it is not usable */
static bool
read_limit(Answer *e, bool kinde, List **limits, char **last_id, char **error)
{
	char	   *feature;
	Answer	   *max;
	int64		lim = 0;
	bool		unlimited;

	if (e->type != ANSWER_OBJECT)
	{
		*error = pstrdup("a limit in the provider's answer is not an object");
		return false;
	}
	feature = value_string(member(e, kinde ? "feature_code" : "feature"));
	if (feature == NULL || feature[0] == '\0' || pg_mbstrlen(feature) > EARMARK_MAX_NAME_LEN)
	{
		*error = pstrdup("a limit in the provider's answer has no usable feature");
		return false;
	}
	if (kinde)
	{
		char	   *id = value_string(member(e, "id"));

		if (id)
			*last_id = id;
	}
	max = member(e, kinde ? "entitlement_limit_max" : "limit");
	unlimited = max == NULL || max->type == ANSWER_NULL;
	if (!unlimited)
	{
		if (!value_int64(max, &lim) || lim < 0)
		{
			*error = psprintf("the limit of feature \"%s\" is not a whole number >= 0", feature);
			return false;
		}
		if (kinde && lim == KINDE_NO_MAX)
			unlimited = true;
	}
	*limits = lappend(*limits, new_limit(feature, unlimited, lim));
	return true;
}

/* one page of limits; false with *error (and *unreachable) on failure */
static bool
limits_page(const char *url, const char *token, EmHttpTick tick, void *tick_arg,
			List **limits, char **last_id, bool *has_more, char **error,
			bool *unreachable)
{
	EmHttpRequest req;
	Answer	   *answer;
	Answer	   *arr;
	Answer	   *e;
	const char *why;
	bool		kinde = earmark_provider == EM_PROVIDER_KINDE;

	memset(&req, 0, sizeof(req));
	req.method = "GET";
	req.url = url;
	if (kinde)
	{
		req.headers[0] = "Accept: application/json";
		req.auth_header = psprintf("Authorization: Bearer %s", token);
	}
	else if (!http_auth(&req, error))
		return false;
	em_http_run(&req, 1, 1, earmark_http_timeout_ms, tick, tick_arg);
	if (req.error || req.status != 200)
	{
		if (req.status == 401 && kinde)
			forget_kinde_token();
		*unreachable = provider_failed(&req);
		*error = status_error(&req);
		return false;
	}
	answer = parse_answer(req.body_out, req.body_len, &why);
	if (answer == NULL)
	{
		*error = psprintf("the provider's answer cannot be read: %s", why);
		return false;
	}
	arr = member(answer, kinde ? "entitlements" : "limits");
	if (arr == NULL || arr->type != ANSWER_ARRAY)
	{
		*error = pstrdup("the provider's answer has no list of limits");
		return false;
	}
	*has_more = false;
	if (kinde)
	{
		Answer	   *more = member(answer, "has_more");

		*has_more = more != NULL && more->type == ANSWER_TRUE;
	}
	for (e = arr->first; e != NULL; e = e->next)
		if (!read_limit(e, kinde, limits, last_id, error))
			return false;
	return true;
}

/* a page's URL */
static char *
limits_url(const char *base, const char *account, const char *customer,
		   const char *last_id)
{
	StringInfoData url;

	initStringInfo(&url);
	if (earmark_provider == EM_PROVIDER_KINDE)
	{
		appendStringInfo(&url, "%s/api/v1/billing/entitlements?customer_id=", base);
		append_urlenc(&url, customer);
		if (last_id)
		{
			appendStringInfoString(&url, "&starting_after=");
			append_urlenc(&url, last_id);
		}
	}
	else
	{
		appendStringInfo(&url, "%s/limits?account=", base);
		append_urlenc(&url, account);
		if (customer)
		{
			appendStringInfoString(&url, "&customer=");
			append_urlenc(&url, customer);
		}
	}
	return url.data;
}

/* the limits of one page, and its error, into the caller's context */
static List *
keep_page(List *limits, List *page, char **error, char *page_error)
{
	ListCell   *lc;

	if (page_error)
		*error = pstrdup(page_error);
	foreach(lc, page)
	{
		EmLimit    *l = (EmLimit *) lfirst(lc);

		limits = lappend(limits, new_limit(l->feature, l->unlimited, l->lim));
	}
	return limits;
}

List *
em_provider_limits(const char *account, const char *customer,
				   EmHttpTick tick, void *tick_arg, char **error, bool *unreachable)
{
	const char *base;
	const char *token;
	List	   *limits = NIL;
	char	   *last_id = NULL;
	bool		has_more = true;
	bool		down = false;
	int			page;
	MemoryContext outer = CurrentMemoryContext;
	MemoryContext page_cxt;

	*error = NULL;
	if (unreachable)
		*unreachable = false;
	if (earmark_provider == EM_PROVIDER_LOCAL)
	{
		*error = pstrdup("the local provider has no limits to read: set them with earmark_set_limit");
		return NIL;
	}
	if (earmark_provider == EM_PROVIDER_KINDE && customer == NULL)
	{
		*error = psprintf("account \"%s\" has no provider_customer", account);
		return NIL;
	}
	if (!provider_connect(&base, &token, tick, tick_arg, error))
	{
		if (unreachable)
			*unreachable = true;
		return NIL;
	}

	/* a page's request, answer and parse live only as long as the page */
	page_cxt = AllocSetContextCreate(outer, "earmark limits page", ALLOCSET_DEFAULT_SIZES);
	for (page = 0; has_more && *error == NULL; page++)
	{
		List	   *page_limits = NIL;
		char	   *page_last = NULL;
		char	   *page_error = NULL;
		bool		more = false;

		if (page >= MAX_LIMIT_PAGES)
		{
			*error = psprintf("the provider kept paging after %d pages", MAX_LIMIT_PAGES);
			break;
		}
		MemoryContextSwitchTo(page_cxt);
		if (limits_page(limits_url(base, account, customer, last_id), token, tick, tick_arg,
						&page_limits, &page_last, &more, &page_error, &down) &&
			more && page_last == NULL)
			page_error = "the provider said it has more limits but gave no id to start after";
		MemoryContextSwitchTo(outer);
		limits = keep_page(limits, page_limits, error, page_error);
		if (page_last)
			last_id = pstrdup(page_last);
		has_more = more;
		MemoryContextReset(page_cxt);
	}
	MemoryContextDelete(page_cxt);
	if (unreachable)
		*unreachable = down;
	return *error ? NIL : limits;
}
