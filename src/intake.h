/*-------------------------------------------------------------------------
 *
 * intake.h
 *	  Signed webhook intake (intake.c): what the worker calls, the
 *	  refresh of the provider's key set.
 *
 *-------------------------------------------------------------------------
 */
#ifndef EARMARK_INTAKE_H
#define EARMARK_INTAKE_H

#include "postgres.h"

#include "utils/timestamp.h"

/*
 * Fetch the configured JSON Web Key Set and store it in earmark.jwks when
 * it is missing or was fetched before cutoff.  Returns the number of keys
 * fetched, 0 when nothing was due or earmark.kinde_domain is not set.
 * Runs in the caller's SPI connection; raises on failure.
 */
extern int	em_jwks_refresh_if_older(TimestampTz cutoff);

#endif							/* EARMARK_INTAKE_H */
