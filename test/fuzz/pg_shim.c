/*-------------------------------------------------------------------------
 *
 * pg_shim.c
 *	  What src/sigverify.c needs from the server, outside the server, for
 *	  the libFuzzer target fuzz_sigverify.c: palloc and pfree (one malloc
 *	  each, so that AddressSanitizer guards every buffer on both sides,
 *	  freed together after each input as a memory context reset would) and
 *	  the error reporting behind elog().
 *
 *	  While the harness says secret bytes are about (shim_expect_wiped),
 *	  pfree aborts on a chunk that is not all zeros: a decoded webhook key,
 *	  whole or half decoded, must be wiped before it is freed.
 *
 *	  sigverify.c's only elog is ERROR "could not compute HMAC-SHA256",
 *	  which in the server is an internal error (XX000) that no input should
 *	  cause: here it aborts with the message, so libFuzzer reports it with
 *	  the input.  So does a request above MaxAllocSize, which palloc would
 *	  refuse with an internal error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "utils/memutils.h"

#include "pg_shim.h"

/* port.h sends the printf family to libpgport's; the C library's will do here */
#undef fprintf
#undef vsnprintf
#undef snprintf
#undef printf

/* every live palloc chunk of the current input, and its size */
static void **chunks = NULL;
static size_t *sizes = NULL;
static size_t nchunks = 0;
static size_t maxchunks = 0;

/* while set, pfree checks that the chunk was wiped (see shim_expect_wiped) */
static bool expect_wiped = false;

static void
track(void *p, size_t size)
{
	if (nchunks == maxchunks)
	{
		maxchunks = maxchunks ? maxchunks * 2 : 256;
		chunks = realloc(chunks, maxchunks * sizeof(void *));
		sizes = realloc(sizes, maxchunks * sizeof(size_t));
		if (chunks == NULL || sizes == NULL)
			abort();
	}
	chunks[nchunks] = p;
	sizes[nchunks++] = size;
}

void
shim_expect_wiped(bool on)
{
	expect_wiped = on;
}

/* a chunk freed while secret bytes are about must hold only zeros */
static void
check_wiped(const unsigned char *p, size_t size)
{
	size_t		i;

	if (!expect_wiped)
		return;
	for (i = 0; i < size; i++)
	{
		if (p[i] != 0)
		{
			fprintf(stderr, "pg_shim: pfree of a %zu-byte buffer that still holds secret bytes "
					"(byte %zu is 0x%02x): it must be wiped before it is freed\n", size, i, p[i]);
			abort();
		}
	}
}

void *
palloc(Size size)
{
	void	   *p;

	if (!AllocSizeIsValid(size))
	{
		fprintf(stderr, "pg_shim: palloc(%zu) is above MaxAllocSize: the server raises an internal error\n",
				(size_t) size);
		abort();
	}
	p = malloc(size > 0 ? size : 1);
	if (p == NULL)
		abort();
	track(p, size);
	return p;
}

void *
palloc0(Size size)
{
	void	   *p = palloc(size);

	memset(p, 0, size);
	return p;
}

void
pfree(void *pointer)
{
	size_t		i;

	for (i = nchunks; i > 0; i--)
	{
		if (chunks[i - 1] == pointer)
		{
			check_wiped(pointer, sizes[i - 1]);
			free(pointer);
			nchunks--;
			chunks[i - 1] = chunks[nchunks];
			sizes[i - 1] = sizes[nchunks];
			return;
		}
	}
	fprintf(stderr, "pg_shim: pfree of %p, which palloc did not return (or was freed already)\n", pointer);
	abort();
}

void
shim_reset(void)
{
	while (nchunks > 0)
		free(chunks[--nchunks]);
}

/* ---------------------------------------------------------------------
 * elog / ereport
 * ---------------------------------------------------------------------
 */
static int	cur_elevel;
static char cur_message[1024];

bool
errstart(int elevel, const char *domain)
{
	cur_elevel = elevel;
	cur_message[0] = '\0';
	return true;
}

bool
errstart_cold(int elevel, const char *domain)
{
	return errstart(elevel, domain);
}

int
errmsg_internal(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(cur_message, sizeof(cur_message), fmt, ap);
	va_end(ap);
	return 0;
}

int
errmsg(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(cur_message, sizeof(cur_message), fmt, ap);
	va_end(ap);
	return 0;
}

void
errfinish(const char *filename, int lineno, const char *funcname)
{
	if (cur_elevel >= ERROR)
	{
		fprintf(stderr, "pg_shim: elog(ERROR) at %s:%d in %s: %s\n"
				"pg_shim: in the server this input is an internal error (XX000)\n",
				filename, lineno, funcname ? funcname : "?", cur_message);
		abort();
	}
}
