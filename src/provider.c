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
 *	  role, never put in a log line or an error message here.  A provider's answer is untrusted text: it is parsed
 *	  without raising (a malformed answer is a failed request).
 *
 *	  Takes no locks.  The local provider writes earmark.local_meter in
 *	  the caller's SPI connection.
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
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "earmark.h"
#include "provider.h"
#include "sigverify.h"

int			earmark_provider = EM_PROVIDER_LOCAL;
char	   *earmark_provider_url = NULL;
char	   *earmark_provider_client_id = NULL;
char	   *earmark_provider_secrets_file = NULL;
int			earmark_report_interval_s = 60;
int			earmark_report_batch = 100;
int			earmark_report_parallel = 10;
int			earmark_limit_fresh_s = 60;
int			earmark_limit_stale_s = 600;

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

/*
 * Parse a provider's answer: a JSON object, or NULL when it is not one.
 * Checked with the non-raising parser first, so that jsonb_in (which
 * raises) only ever sees valid JSON.
 */
static Jsonb *
parse_answer(const char *body, size_t len)
{
	JsonLexContext *lex;

	if (body == NULL || len == 0 || len > INT_MAX)
		return NULL;
	if (!pg_verify_mbstr(GetDatabaseEncoding(), body, (int) len, true) ||
		memchr(body, '\0', len) != NULL)
		return NULL;
	lex = makeJsonLexContextCstringLen(unconstify(char *, body), (int) len,
									   GetDatabaseEncoding(), true);
	if (pg_parse_json(lex, &nullSemAction) != JSON_SUCCESS)
		return NULL;
	{
		Jsonb	   *jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(body)));

		return JB_ROOT_IS_OBJECT(jb) ? jb : NULL;
	}
}

static JsonbValue *
member(JsonbContainer *obj, const char *key)
{
	return getKeyJsonValueFromContainer(obj, key, strlen(key), NULL);
}

/* a whole number given as a JSON number or a decimal string */
static bool
value_int64(JsonbValue *v, int64 *out)
{
	char	   *s;
	char	   *end;

	if (v == NULL)
		return false;
	if (v->type == jbvNumeric)
		s = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(v->val.numeric)));
	else if (v->type == jbvString)
		s = pnstrdup(v->val.string.val, v->val.string.len);
	else
		return false;
	errno = 0;
	*out = strtoll(s, &end, 10);
	return errno == 0 && end != s && *end == '\0';
}

static char *
value_string(JsonbValue *v)
{
	if (v == NULL || v->type != jbvString)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
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
			pfree(value);
		value = pnstrdup(p, end - p);
	}
	explicit_bzero(line, sizeof(line));
	FreeFile(f);
	return value && value[0] ? value : NULL;
}

static void
forget_secret(char *s)
{
	if (s)
	{
		explicit_bzero(s, strlen(s));
		pfree(s);
	}
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

static const char *
get_kinde_token(const char *base, char **error)
{
	EmHttpRequest req;
	StringInfoData form;
	Jsonb	   *jb;
	int64		expires_in = 0;
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
		*error = pstrdup("the kinde provider needs earmark.provider_client_id and a client_secret in earmark.provider_secrets_file");
		return NULL;
	}
	initStringInfo(&form);
	appendStringInfoString(&form, "grant_type=client_credentials&client_id=");
	append_urlenc(&form, earmark_provider_client_id);
	appendStringInfoString(&form, "&client_secret=");
	append_urlenc(&form, secret);
	forget_secret(secret);
	appendStringInfoString(&form, "&audience=");
	append_urlenc(&form, psprintf("%s/api", base));

	memset(&req, 0, sizeof(req));
	req.method = "POST";
	req.url = psprintf("%s/oauth2/token", base);
	req.body = form.data;
	req.content_type = "application/x-www-form-urlencoded";
	req.headers[0] = "Accept: application/json";
	em_http_run(&req, 1, 1, earmark_http_timeout_ms, NULL, NULL);

	/* the form holds the secret: gone before anything can be reported */
	explicit_bzero(form.data, form.len);
	pfree(form.data);

	if (req.error || req.status != 200)
	{
		*error = psprintf("token request failed: %s", status_error(&req));
		return NULL;
	}
	jb = parse_answer(req.body_out, req.body_len);
	tok = jb ? value_string(member(&jb->root, "access_token")) : NULL;
	if (tok == NULL || tok[0] == '\0')
	{
		*error = pstrdup("the token endpoint's answer has no access_token");
		return NULL;
	}
	if (!value_int64(member(&jb->root, "expires_in"), &expires_in))
		expires_in = 0;
	kinde_token = MemoryContextStrdup(TopMemoryContext, tok);
	kinde_token_for = MemoryContextStrdup(TopMemoryContext, issued_for);
	/* kept until 60 s before it expires, as the provider's clock counts */
	kinde_token_until = GetCurrentTimestamp() +
		Max(expires_in - 60, 0) * USECS_PER_SEC;
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
		return false;
	req->headers[h++] = "Accept: application/json";
	if (token)
		req->headers[h++] = psprintf("Authorization: Bearer %s", token);
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
static EmStatement local_write = {
	"INSERT INTO earmark.local_meter AS m (account, feature, cycle_start, total) "
	"VALUES ($1, $2, $3, $4) ON CONFLICT (account, feature, cycle_start) "
	"DO UPDATE SET total = excluded.total, writes = m.writes + 1, updated_at = pg_catalog.now()",
	4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, INT8OID}
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
provider_connect(const char **base, const char **token, char **error)
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
		*token = get_kinde_token(*base, error);
	return *error == NULL;
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
		req->headers[1] = psprintf("Authorization: Bearer %s", token);
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
	if (earmark_provider == EM_PROVIDER_HTTP && !http_auth(req, &op->error))
		return false;
	return true;
}

void
em_meter_write(EmMeterOp *ops, int n, EmHttpTick tick, void *tick_arg)
{
	EmHttpRequest *reqs;
	int		   *which;
	int			m = 0;
	int			i;
	const char *base;
	const char *token = NULL;
	char	   *error = NULL;

	for (i = 0; i < n; i++)
	{
		ops[i].ok = false;
		ops[i].http_status = 0;
		ops[i].retry_after = -1;
		ops[i].elapsed_ms = 0;
		ops[i].error = NULL;
	}
	if (earmark_provider == EM_PROVIDER_LOCAL)
	{
		for (i = 0; i < n; i++)
		{
			Datum		args[4];

			local_args(&ops[i], args);
			em_exec(&local_write, args, NULL, 0);
			ops[i].ok = true;
		}
		return;
	}

	if (!provider_connect(&base, &token, &error))
	{
		for (i = 0; i < n; i++)
			ops[i].error = error;
		return;
	}

	reqs = palloc0(sizeof(EmHttpRequest) * n);
	which = palloc(sizeof(int) * n);
	for (i = 0; i < n; i++)
		if (build_write(&ops[i], base, token, &reqs[m]))
			which[m++] = i;
	em_http_run(reqs, m, earmark_report_parallel, earmark_http_timeout_ms, tick, tick_arg);
	for (i = 0; i < m; i++)
	{
		EmMeterOp  *op = &ops[which[i]];
		EmHttpRequest *r = &reqs[i];

		op->http_status = r->status;
		op->retry_after = r->retry_after;
		op->elapsed_ms = r->elapsed_ms;
		op->ok = r->error == NULL && r->status >= 200 && r->status < 300;
		if (!op->ok)
			op->error = status_error(r);
		if (r->status == 401 && earmark_provider == EM_PROVIDER_KINDE)
			forget_kinde_token();
	}
}

void
em_meter_read(EmMeterOp *ops, int n)
{
	EmHttpRequest *reqs;
	int		   *which;
	int			m = 0;
	int			i;
	const char *base;
	const char *token = NULL;
	char	   *error = NULL;

	for (i = 0; i < n; i++)
	{
		ops[i].ok = false;
		ops[i].read_total = 0;
		ops[i].http_status = 0;
		ops[i].error = NULL;
	}
	if (earmark_provider == EM_PROVIDER_LOCAL)
	{
		for (i = 0; i < n; i++)
		{
			Datum		args[4];

			local_args(&ops[i], args);
			em_exec(&local_read, args, NULL, 1);
			/* a cycle never written reads as zero */
			ops[i].read_total = SPI_processed == 1 ? em_get_int64(0, 1, 0) : 0;
			ops[i].ok = true;
		}
		return;
	}

	if (!provider_connect(&base, &token, &error))
	{
		for (i = 0; i < n; i++)
			ops[i].error = error;
		return;
	}

	reqs = palloc0(sizeof(EmHttpRequest) * n);
	which = palloc(sizeof(int) * n);
	for (i = 0; i < n; i++)
	{
		EmMeterOp  *op = &ops[i];
		EmHttpRequest *req = &reqs[m];
		StringInfoData url;

		initStringInfo(&url);
		req->method = "GET";
		if (earmark_provider == EM_PROVIDER_KINDE)
		{
			/* Kinde reads the current cycle only: a closed one is unreadable */
			if (op->closed)
			{
				op->error = pstrdup("the provider reads back only the current cycle");
				continue;
			}
			if (op->agreement == NULL)
			{
				op->error = psprintf("account \"%s\" has no provider_agreement", op->account);
				continue;
			}
			appendStringInfo(&url, "%s/api/v1/billing/meter_usage?customer_agreement_id=", base);
			append_urlenc(&url, op->agreement);
			appendStringInfoString(&url, "&billing_feature_code=");
			append_urlenc(&url, op->feature);
			req->url = url.data;
			req->headers[0] = "Accept: application/json";
			req->headers[1] = psprintf("Authorization: Bearer %s", token);
		}
		else
		{
			appendStringInfo(&url, "%s/meter?account=", base);
			append_urlenc(&url, op->account);
			appendStringInfoString(&url, "&feature=");
			append_urlenc(&url, op->feature);
			appendStringInfoString(&url, "&cycle_start=");
			append_urlenc(&url, iso_utc(op->cycle_start));
			req->url = url.data;
			if (!http_auth(req, &op->error))
				continue;
		}
		which[m++] = i;
	}
	em_http_run(reqs, m, earmark_report_parallel, earmark_http_timeout_ms, NULL, NULL);
	for (i = 0; i < m; i++)
	{
		EmMeterOp  *op = &ops[which[i]];
		EmHttpRequest *r = &reqs[i];
		Jsonb	   *jb;

		op->http_status = r->status;
		if (r->error || r->status != 200)
		{
			op->error = status_error(r);
			if (r->status == 401 && earmark_provider == EM_PROVIDER_KINDE)
				forget_kinde_token();
			continue;
		}
		jb = parse_answer(r->body_out, r->body_len);
		if (jb == NULL ||
			!value_int64(member(&jb->root,
								earmark_provider == EM_PROVIDER_KINDE ? "meter_value" : "total"),
						 &op->read_total))
		{
			/* never a guess: an answer without a total is unreadable */
			op->error = pstrdup("the provider's answer carries no total");
			continue;
		}
		op->ok = true;
	}
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

/* one page of limits; false with *error on failure */
static bool
limits_page(const char *url, const char *token, List **limits, char **last_id,
			bool *has_more, char **error)
{
	EmHttpRequest req;
	Jsonb	   *jb;
	JsonbValue *arr;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	bool		kinde = earmark_provider == EM_PROVIDER_KINDE;

	memset(&req, 0, sizeof(req));
	req.method = "GET";
	req.url = url;
	if (kinde)
	{
		req.headers[0] = "Accept: application/json";
		req.headers[1] = psprintf("Authorization: Bearer %s", token);
	}
	else if (!http_auth(&req, error))
		return false;
	em_http_run(&req, 1, 1, earmark_http_timeout_ms, NULL, NULL);
	if (req.error || req.status != 200)
	{
		if (req.status == 401 && kinde)
			forget_kinde_token();
		*error = status_error(&req);
		return false;
	}
	jb = parse_answer(req.body_out, req.body_len);
	arr = jb ? member(&jb->root, kinde ? "entitlements" : "limits") : NULL;
	if (arr == NULL || arr->type != jbvBinary || !JsonContainerIsArray(arr->val.binary.data))
	{
		*error = pstrdup("the provider's answer has no list of limits");
		return false;
	}
	*has_more = false;
	if (kinde)
	{
		JsonbValue *more = member(&jb->root, "has_more");

		*has_more = more && more->type == jbvBool && more->val.boolean;
	}

	it = JsonbIteratorInit(arr->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		JsonbContainer *e;
		char	   *feature;
		JsonbValue *max;
		int64		lim = 0;
		bool		unlimited;

		if (tok != WJB_ELEM)
			continue;
		if (v.type != jbvBinary || !JsonContainerIsObject(v.val.binary.data))
		{
			*error = pstrdup("a limit in the provider's answer is not an object");
			return false;
		}
		e = v.val.binary.data;
		feature = value_string(member(e, kinde ? "feature_code" : "feature"));
		if (feature == NULL || feature[0] == '\0' || strlen(feature) > EARMARK_MAX_NAME_LEN)
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
		unlimited = max == NULL || max->type == jbvNull;
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
	}
	return true;
}

List *
em_provider_limits(const char *account, const char *customer, char **error)
{
	const char *base;
	const char *token;
	List	   *limits = NIL;
	char	   *last_id = NULL;
	bool		has_more = true;
	int			page;

	*error = NULL;
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
	if (!provider_connect(&base, &token, error))
		return NIL;

	for (page = 0; has_more; page++)
	{
		StringInfoData url;

		if (page >= MAX_LIMIT_PAGES)
		{
			*error = psprintf("the provider kept paging after %d pages", MAX_LIMIT_PAGES);
			return NIL;
		}
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
		{
			char	   *before = last_id;

			if (!limits_page(url.data, token, &limits, &last_id, &has_more, error))
				return NIL;
			if (has_more && last_id == before)
			{
				*error = pstrdup("the provider said it has more limits but gave no id to start after");
				return NIL;
			}
		}
	}
	return limits;
}
