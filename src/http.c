/*-------------------------------------------------------------------------
 *
 * http.c
 *	  One small HTTP GET with libcurl's easy interface, used to fetch the
 *	  provider's JSON Web Key Set.  It blocks the calling backend for at
 *	  most earmark.http_timeout and never retries: a caller that needs a
 *	  retry is the next request, or the worker's next pass.
 *
 *	  No PostgreSQL error may be raised while libcurl is on the stack (a
 *	  longjmp through it would leak the handle and its socket), so the
 *	  callbacks use malloc and only flag what went wrong; the response is
 *	  copied into palloc memory after the handle is gone.  A query cancel
 *	  or termination aborts the transfer from the progress callback and is
 *	  then serviced by CHECK_FOR_INTERRUPTS.
 *
 *	  Takes no locks and reads no table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include "miscadmin.h"

#include "sigverify.h"

typedef struct Download
{
	char	   *data;			/* malloc'd */
	size_t		len;
	size_t		cap;
	size_t		max;
	bool		too_large;
	bool		interrupted;
} Download;

static bool curl_ready = false;

static size_t
write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	Download   *d = (Download *) userdata;
	size_t		n = size * nmemb;

	if (n > d->max - d->len)
	{
		d->too_large = true;
		return 0;				/* aborts the transfer */
	}
	if (d->len + n + 1 > d->cap)
	{
		size_t		cap = Max(d->cap * 2, d->len + n + 1);
		char	   *p = realloc(d->data, cap);

		if (p == NULL)
			return 0;
		d->data = p;
		d->cap = cap;
	}
	memcpy(d->data + d->len, ptr, n);
	d->len += n;
	return n;
}

/* called about once a second at least, and during transfers */
static int
progress_cb(void *userdata, curl_off_t dltotal, curl_off_t dlnow,
			curl_off_t ultotal, curl_off_t ulnow)
{
	Download   *d = (Download *) userdata;

	if (QueryCancelPending || ProcDiePending)
	{
		d->interrupted = true;
		return 1;
	}
	return 0;
}

/*
 * Only http and https, no redirects (a key set that moved is a
 * configuration change), certificates verified (libcurl's default), and
 * no signals: the backend owns its signal handlers.
 */
bool
em_http_get(const char *url, int timeout_ms, size_t max_bytes,
			EmHttpResponse *resp)
{
	CURL	   *curl;
	CURLcode	rc;
	char		errbuf[CURL_ERROR_SIZE];
	Download	d;
	long		status = 0;

	memset(resp, 0, sizeof(*resp));
	memset(&d, 0, sizeof(d));
	d.max = max_bytes;
	errbuf[0] = '\0';

	if (!curl_ready)
	{
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		{
			resp->error = pstrdup("could not initialize libcurl");
			return false;
		}
		curl_ready = true;
	}
	curl = curl_easy_init();
	if (curl == NULL)
	{
		resp->error = pstrdup("could not create a libcurl handle");
		return false;
	}

	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long) timeout_ms);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long) timeout_ms);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "earmark/0.1");
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_cb);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &d);
	curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, progress_cb);
	curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &d);

	rc = curl_easy_perform(curl);
	if (rc == CURLE_OK)
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(curl);

	/* libcurl is off the stack: errors may be raised again */
	if (d.interrupted)
	{
		free(d.data);
		CHECK_FOR_INTERRUPTS();
		resp->error = pstrdup("the request was interrupted");
		return false;
	}
	if (rc != CURLE_OK)
	{
		free(d.data);
		if (d.too_large)
			resp->error = psprintf("the response is larger than %zu bytes", max_bytes);
		else
			resp->error = pstrdup(errbuf[0] ? errbuf : curl_easy_strerror(rc));
		return false;
	}

	/* no error may be raised before the malloc'd buffer is freed */
	resp->status = status;
	resp->body = palloc_extended(d.len + 1, MCXT_ALLOC_NO_OOM);
	if (resp->body != NULL)
	{
		if (d.len > 0)
			memcpy(resp->body, d.data, d.len);
		resp->body[d.len] = '\0';
		resp->body_len = d.len;
	}
	free(d.data);
	if (resp->body == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	return true;
}
