/*-------------------------------------------------------------------------
 *
 * http.h
 *	  HTTP requests with libcurl (http.c): a batch of requests to the
 *	  provider, and the GET that fetches a JSON Web Key Set.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_HTTP_H
#define EARMARK_HTTP_H

#include "postgres.h"

#include "datatype/timestamp.h"

#define EM_HTTP_MAX_HEADERS 4

typedef struct EmHttpRequest
{
	/* in */
	const char *method;			/* GET, POST or PUT */
	const char *url;
	const char *body;			/* NULL: none */
	const char *content_type;	/* of the body */
	const char *headers[EM_HTTP_MAX_HEADERS + 1];	/* "Name: value", NULL-ended */
	char	   *auth_header;	/* "Authorization: ...", palloc'd, or NULL: a
								 * secret, zeroed and freed by em_http_run */
	size_t		max_bytes;		/* 0: 1 MB */
	bool		discard_body;	/* the answer's body is not kept */
	/* out */
	long		status;			/* 0 when no answer arrived */
	char	   *body_out;		/* palloc'd, NUL-terminated */
	size_t		body_len;
	const char *error;			/* transport error, NULL if none */
	TimestampTz retry_at;		/* RateLimit-Reset / Retry-After as a time,
								 * or 0 */
	double		elapsed_ms;
} EmHttpRequest;

/* called between polls of a batch, with libcurl off the stack */
typedef void (*EmHttpTick) (void *arg);

extern void em_http_run(EmHttpRequest *reqs, int n, int parallel, int timeout_ms,
						EmHttpTick tick, void *tick_arg);

/* zero a secret (a token, a key, an answer that carried one) and free it */
extern void em_forget(char *s, size_t len);

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

#endif							/* EARMARK_HTTP_H */
