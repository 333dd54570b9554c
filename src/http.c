/*-------------------------------------------------------------------------
 *
 * http.c
 *	  HTTP requests to the provider with libcurl's multi interface: a batch
 *	  of requests runs with at most "parallel" of them in flight, each
 *	  bounded by its own timeout.  Used for the reporter's meter writes
 *	  (10 at once), the limit reads, the reconciler's read-backs and the
 *	  JSON Web Key Set.  Nothing here retries: a failed request is the
 *	  caller's to mark again, and the next pass is the retry.
 *
 *	  No PostgreSQL error may be raised while libcurl is on the stack (a
 *	  longjmp through it would leak the handles and their sockets), so the
 *	  callbacks use malloc and only flag what went wrong; responses are
 *	  copied into palloc memory once every handle is gone.  Between two
 *	  polls libcurl is off the stack: there the batch checks for a query
 *	  cancel or termination (aborting every transfer first) and calls the
 *	  caller's tick, which the worker uses to keep sweeping on schedule
 *	  while a slow provider answers.  A tick may commit transactions, which
 *	  leaves TopMemoryContext current: the memory context current at the
 *	  call is made current again after each tick, so the answers land where
 *	  the caller expects them (and are freed with it).
 *
 *	  Answers and headers may carry secrets (a token, a bearer header): the
 *	  malloc'd buffers that held them are zeroed before they are freed, and
 *	  a request's auth_header is zeroed and freed when the batch is done.
 *
 *	  Takes no locks and reads no table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "utils/timestamp.h"

#include "http.h"
#include "version.h"

/* one transfer's malloc'd state */
typedef struct Transfer
{
	EmHttpRequest *req;
	CURL	   *curl;
	struct curl_slist *headers;
	char	   *data;
	size_t		len;
	size_t		cap;
	bool		too_large;
	bool		oom;
	TimestampTz retry_at;		/* when the provider takes requests again, 0
								 * when it did not say */
	bool		started;
	bool		done;
	CURLcode	rc;
	char		errbuf[CURL_ERROR_SIZE];
	TimestampTz began;
} Transfer;

static bool curl_ready = false;

/* zero a malloc'd buffer (it may hold a secret) and free it */
static void
free_zeroed(char *p, size_t len)
{
	if (p)
	{
		explicit_bzero(p, len);
		free(p);
	}
}

void
em_forget(char *s, size_t len)
{
	if (s)
	{
		explicit_bzero(s, len);
		pfree(s);
	}
}

static size_t
write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Transfer   *t = (Transfer *) userdata;
	size_t		n = size * nmemb;

	if (t->req->discard_body)
		return n;
	if (n > t->req->max_bytes - t->len)
	{
		t->too_large = true;
		return 0;				/* aborts the transfer */
	}
	if (t->len + n + 1 > t->cap)
	{
		/* not realloc: the old buffer is zeroed before it is freed */
		size_t		cap = Max(t->cap * 2, t->len + n + 1);
		char	   *p = malloc(cap);

		if (p == NULL)
		{
			t->oom = true;
			return 0;
		}
		if (t->len > 0)
			memcpy(p, t->data, t->len);
		free_zeroed(t->data, t->cap);
		t->data = p;
		t->cap = cap;
	}
	memcpy(t->data + t->len, ptr, n);
	t->len += n;
	return n;
}

/*
 * When a RateLimit-Reset or Retry-After value says the provider takes
 * requests again, as a time: seconds from now (counted from this answer,
 * not from when the caller gets to it), a Unix time, or an HTTP date.
 * Returns 0 for a value that is none of these, or a date already past
 * (the caller's fallback then applies); a Unix time already past is now;
 * at most a day from now.
 */
static TimestampTz
reset_time(const char *p)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		unix_now = (int64) time(NULL);
	char	   *end;
	int64		secs;

	secs = strtoi64(p, &end, 10);
	if (end == p)
	{
		/* an HTTP date */
		int64		when = (int64) curl_getdate(p, NULL);

		if (when <= 0 || when < unix_now)
			return 0;
		secs = Min(when, unix_now + 86400);
	}
	else if (secs < 0)
		return 0;
	else if (secs <= 1000000000)
		return now + Min(secs, 86400) * USECS_PER_SEC;
	/* a time (cut to a day ahead first: a huge one would overflow) */
	secs = Min(secs, unix_now + 86400);
	return Max(time_t_to_timestamptz((pg_time_t) secs), now);
}

/*
 * RateLimit-Reset (seconds until the limit resets) and Retry-After
 * (seconds, or an HTTP date): when the provider takes requests again.
 */
static size_t
header_cb(char *buffer, size_t size, size_t nitems, void *userdata)
{
	Transfer   *t = (Transfer *) userdata;
	size_t		n = size * nitems;
	const char *names[] = {"ratelimit-reset:", "retry-after:"};
	int			i;

	/* a new status line (after a 1xx answer): its headers start afresh */
	if (n >= 5 && pg_strncasecmp(buffer, "HTTP/", 5) == 0)
		t->retry_at = 0;
	for (i = 0; i < 2; i++)
	{
		size_t		nl = strlen(names[i]);

		if (n > nl && pg_strncasecmp(buffer, names[i], nl) == 0)
		{
			char		val[128];
			size_t		vl = Min(n - nl, sizeof(val) - 1);
			char	   *p = val;
			TimestampTz at;

			memcpy(val, buffer + nl, vl);
			val[vl] = '\0';
			while (*p == ' ' || *p == '\t')
				p++;
			at = reset_time(p);
			t->retry_at = Max(t->retry_at, at);
		}
	}
	return n;
}

/* during transfers: a cancel or shutdown aborts them */
static int
progress_cb(void *userdata, curl_off_t dltotal, curl_off_t dlnow,
			curl_off_t ultotal, curl_off_t ulnow)
{
	return (QueryCancelPending || ProcDiePending || ShutdownRequestPending) ? 1 : 0;
}

static bool
start_transfer(CURLM *multi, Transfer *t, int timeout_ms)
{
	EmHttpRequest *r = t->req;
	int			i;

	t->curl = curl_easy_init();
	if (t->curl == NULL)
		return false;
	t->retry_at = 0;
	t->errbuf[0] = '\0';
	for (i = 0; i < EM_HTTP_MAX_HEADERS && r->headers[i] != NULL; i++)
	{
		struct curl_slist *h = curl_slist_append(t->headers, r->headers[i]);

		if (h == NULL)
			return false;
		t->headers = h;
	}
	if (r->auth_header != NULL)
	{
		struct curl_slist *h = curl_slist_append(t->headers, r->auth_header);

		if (h == NULL)
			return false;
		t->headers = h;
	}
	if (r->body != NULL && r->content_type != NULL)
	{
		char		ct[128];
		struct curl_slist *h;

		snprintf(ct, sizeof(ct), "Content-Type: %s", r->content_type);
		h = curl_slist_append(t->headers, ct);
		if (h == NULL)
			return false;
		t->headers = h;
	}

	curl_easy_setopt(t->curl, CURLOPT_URL, r->url);
	curl_easy_setopt(t->curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(t->curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, (long) timeout_ms);
	curl_easy_setopt(t->curl, CURLOPT_CONNECTTIMEOUT_MS, (long) timeout_ms);
	curl_easy_setopt(t->curl, CURLOPT_USERAGENT, "earmark/" EARMARK_VERSION);
	curl_easy_setopt(t->curl, CURLOPT_ERRORBUFFER, t->errbuf);
	curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, write_cb);
	curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
	curl_easy_setopt(t->curl, CURLOPT_HEADERFUNCTION, header_cb);
	curl_easy_setopt(t->curl, CURLOPT_HEADERDATA, t);
	curl_easy_setopt(t->curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(t->curl, CURLOPT_XFERINFOFUNCTION, progress_cb);
	curl_easy_setopt(t->curl, CURLOPT_XFERINFODATA, t);
	curl_easy_setopt(t->curl, CURLOPT_PRIVATE, t);
	if (t->headers)
		curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, t->headers);
	if (strcmp(r->method, "GET") != 0)
	{
		curl_easy_setopt(t->curl, CURLOPT_CUSTOMREQUEST, r->method);
		curl_easy_setopt(t->curl, CURLOPT_POSTFIELDS, r->body ? r->body : "");
		curl_easy_setopt(t->curl, CURLOPT_POSTFIELDSIZE, (long) (r->body ? strlen(r->body) : 0));
	}
	t->began = GetCurrentTimestamp();
	t->started = true;
	return curl_multi_add_handle(multi, t->curl) == CURLM_OK;
}

static void
free_transfer(CURLM *multi, Transfer *t)
{
	if (t->curl)
	{
		curl_multi_remove_handle(multi, t->curl);
		curl_easy_cleanup(t->curl);
		t->curl = NULL;
	}
	if (t->headers)
	{
		struct curl_slist *h;

		/* libcurl's copies of the headers: one may be a bearer token */
		for (h = t->headers; h != NULL; h = h->next)
			explicit_bzero(h->data, strlen(h->data));
		curl_slist_free_all(t->headers);
	}
	t->headers = NULL;
}

/* the requests' bearer headers, once nothing will send them again */
static void
forget_auth_headers(EmHttpRequest *reqs, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (reqs[i].auth_header)
			em_forget(reqs[i].auth_header, strlen(reqs[i].auth_header));
		reqs[i].auth_header = NULL;
	}
}

/*
 * The caller's tick, between polls.  It may run transactions of its own
 * (the worker's sweep), whose commit leaves TopMemoryContext current: the
 * caller's context is made current again.  If it raises, the handles are
 * cleaned up before the error goes on.
 */
static void
run_tick(EmHttpTick tick, void *tick_arg, CURLM *multi, Transfer *ts,
		 EmHttpRequest *reqs, int n)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		tick(tick_arg);
		MemoryContextSwitchTo(cxt);
	}
	PG_CATCH();
	{
		int			i;

		for (i = 0; i < n; i++)
		{
			free_transfer(multi, &ts[i]);
			free_zeroed(ts[i].data, ts[i].cap);
			ts[i].data = NULL;
		}
		curl_multi_cleanup(multi);
		free(ts);
		forget_auth_headers(reqs, n);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* a batch in flight: its transfers and how far it has come */
typedef struct Batch
{
	CURLM	   *multi;
	Transfer   *ts;
	int			n;
	int			parallel;		/* at most this many in flight */
	int			timeout_ms;		/* each transfer's */
	int			next;			/* the next transfer to start */
	int			running;		/* in flight */
	int			done;			/* finished, or failed to start */
	bool		saw_429;		/* the provider asked us to wait */
} Batch;

/* clear each request's answer and give it the default size bound */
static void
reset_requests(EmHttpRequest *reqs, int n)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		reqs[i].status = 0;
		reqs[i].body_out = NULL;
		reqs[i].body_len = 0;
		reqs[i].error = NULL;
		reqs[i].retry_at = 0;
		reqs[i].elapsed_ms = 0;
		if (reqs[i].max_bytes == 0)
			reqs[i].max_bytes = 1024 * 1024;
	}
}

/* no request could be made: each gets the error, and no secret is kept */
static void
fail_requests(EmHttpRequest *reqs, int n, const char *error)
{
	int			i;

	for (i = 0; i < n; i++)
		reqs[i].error = pstrdup(error);
	forget_auth_headers(reqs, n);
}

/* start transfers while there is room; after a 429 nothing more is sent */
static void
start_pending(Batch *b)
{
	while (b->next < b->n && b->running < b->parallel && !b->saw_429)
	{
		Transfer   *t = &b->ts[b->next++];

		if (start_transfer(b->multi, t, b->timeout_ms))
			b->running++;
		else
		{
			t->done = true;
			t->rc = CURLE_OUT_OF_MEMORY;
			b->done++;
		}
	}
}

/* let libcurl work, then take in the transfers that have ended */
static void
collect_finished(Batch *b)
{
	CURLMsg    *msg;
	int			left;

	curl_multi_perform(b->multi, &left);
	while ((msg = curl_multi_info_read(b->multi, &left)) != NULL)
	{
		Transfer   *t;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
		t->rc = msg->data.result;
		if (t->rc == CURLE_OK)
			curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->req->status);
		if (t->req->status == 429)
			b->saw_429 = true;
		t->req->elapsed_ms = (double) (GetCurrentTimestamp() - t->began) / 1000.0;
		free_transfer(b->multi, t);
		t->done = true;
		b->running--;
		b->done++;
	}
}

/*
 * Run the batch until every transfer has ended, or a 429 stopped it.
 * Returns false when a cancel or termination is pending: the caller
 * cleans up, then lets it be raised.
 */
static bool
run_batch(Batch *b, EmHttpTick tick, void *tick_arg, EmHttpRequest *reqs)
{
	while (b->done < b->n)
	{
		start_pending(b);
		collect_finished(b);
		if (b->done >= b->n || (b->saw_429 && b->running == 0))
			break;

		if (QueryCancelPending || ProcDiePending || ShutdownRequestPending)
			return false;
		/* a transfer just ended and another may start: no waiting */
		if (b->next < b->n && b->running < b->parallel && !b->saw_429)
			continue;
		curl_multi_poll(b->multi, NULL, 0, 100, NULL);

		/* libcurl is off the stack here */
		if (tick)
			run_tick(tick, tick_arg, b->multi, b->ts, reqs, b->n);
	}
	return true;
}

/*
 * Copy one transfer's answer (or what went wrong) out of malloc'd memory
 * into its request, and free the transfer.  Errors may be raised after.
 */
static void
take_answer(CURLM *multi, Transfer *t, bool saw_429)
{
	EmHttpRequest *r = t->req;

	free_transfer(multi, t);
	r->retry_at = t->retry_at;
	if (!t->started && saw_429)
		r->error = "not sent: the provider answered 429 to an earlier request";
	else if (!t->done)
		r->error = "the request was interrupted";
	else if (t->rc != CURLE_OK)
	{
		r->status = 0;
		if (t->too_large)
			r->error = psprintf("the response is larger than %zu bytes", r->max_bytes);
		else if (t->oom)
			r->error = "out of memory for the response";
		else
			r->error = pstrdup(t->errbuf[0] ? t->errbuf : curl_easy_strerror(t->rc));
	}
	else
	{
		r->body_out = palloc_extended(t->len + 1, MCXT_ALLOC_NO_OOM);
		if (r->body_out != NULL)
		{
			if (t->len > 0)
				memcpy(r->body_out, t->data, t->len);
			r->body_out[t->len] = '\0';
			r->body_len = t->len;
		}
		else
			r->error = "out of memory for the response";
	}
	free_zeroed(t->data, t->cap);
	t->data = NULL;
}

/*
 * Run n requests, at most parallel at once, each within timeout_ms.  Fills
 * each request's status, body, error, retry_at and elapsed_ms.  Never
 * raises for a failed request; raises only for a cancel or termination
 * (after cleaning up) or when tick raises.
 */
void
em_http_run(EmHttpRequest *reqs, int n, int parallel, int timeout_ms,
			EmHttpTick tick, void *tick_arg)
{
	Batch		b = {0};
	bool		interrupted;
	int			i;

	reset_requests(reqs, n);
	if (n == 0)
		return;

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		{
			fail_requests(reqs, n, "could not initialize libcurl");
			return;
		}
		curl_ready = true;
	}

	/* plain malloc: nothing below may raise until it is freed */
	b.ts = calloc(n, sizeof(Transfer));
	b.multi = b.ts ? curl_multi_init() : NULL;
	if (b.multi == NULL)
	{
		free(b.ts);
		fail_requests(reqs, n, "could not create libcurl handles");
		return;
	}
	for (i = 0; i < n; i++)
		b.ts[i].req = &reqs[i];
	b.n = n;
	b.parallel = Max(parallel, 1);
	b.timeout_ms = timeout_ms;

	interrupted = !run_batch(&b, tick, tick_arg, reqs);

	for (i = 0; i < n; i++)
		take_answer(b.multi, &b.ts[i], b.saw_429);
	curl_multi_cleanup(b.multi);
	free(b.ts);
	forget_auth_headers(reqs, n);

	if (interrupted)
		CHECK_FOR_INTERRUPTS();
}

/*
 * One GET (the key set).  Returns false, with error set, when no complete
 * response arrived.
 */
bool
em_http_get(const char *url, int timeout_ms, size_t max_bytes,
			EmHttpResponse *resp)
{
	EmHttpRequest req;

	memset(&req, 0, sizeof(req));
	memset(resp, 0, sizeof(*resp));
	req.method = "GET";
	req.url = url;
	req.max_bytes = max_bytes;
	em_http_run(&req, 1, 1, timeout_ms, NULL, NULL);
	if (req.error)
	{
		resp->error = pstrdup(req.error);
		return false;
	}
	resp->status = req.status;
	resp->body = req.body_out;
	resp->body_len = req.body_len;
	return true;
}
