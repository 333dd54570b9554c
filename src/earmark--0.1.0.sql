/* earmark install script, version 0.1.0
 *
 * Tables live in schema "earmark" and are written only through the API
 * functions, which are SECURITY DEFINER with a pinned search_path.  Callers
 * get EXECUTE through the role earmark_user; nothing here is granted to
 * PUBLIC.
 */

\echo Use "CREATE EXTENSION earmark" to load this file. \quit

CREATE SCHEMA earmark;
REVOKE ALL ON SCHEMA earmark FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'earmark_user') THEN
        CREATE ROLE earmark_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'earmark_admin') THEN
        CREATE ROLE earmark_admin NOLOGIN;
    END IF;
END
$$;

-- One row per customer account: its billing cycle anchor and provider ids.
CREATE TABLE earmark.account (
    account             text PRIMARY KEY,
    cycle_anchor        timestamptz,
    provider_customer   text,
    provider_agreement  text,
    -- GCRA state of the admission rate limit (theoretical arrival time):
    -- one small value per account, never a count of job rows
    rate_tat            timestamptz,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT account_name_ok CHECK (account <> '' AND pg_catalog.length(account) <= 255)
);

-- The limit the gate enforces for an account and feature.  No row means the
-- limit is unknown and the gate refuses ("limit unknown"); a row with a NULL
-- lim means unlimited.
CREATE TABLE earmark.account_limit (
    account     text NOT NULL REFERENCES earmark.account ON DELETE CASCADE,
    feature     text NOT NULL,
    lim         bigint CHECK (lim >= 0),
    source      text NOT NULL DEFAULT 'manual' CHECK (source IN ('manual', 'provider')),
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (account, feature)
);

-- One row per account, feature and billing cycle: the serial point of the
-- gate.  used is final usage (the sum of the cycle's ledger rows), held the
-- sum of the holds of running jobs.
CREATE TABLE earmark.budget (
    budget_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account     text NOT NULL REFERENCES earmark.account ON DELETE CASCADE,
    feature     text NOT NULL,
    cycle_start timestamptz NOT NULL,
    cycle_end   timestamptz NOT NULL,
    used        bigint NOT NULL DEFAULT 0,
    held        bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    UNIQUE (account, feature, cycle_start)
);

-- A job is a hold taken by earmark_reserve.  status is 'running' or
-- 'capped' while the hold is open, then one of 'completed', 'failed',
-- 'cancelled', 'expired'.
CREATE TABLE earmark.job (
    job_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id       bigint NOT NULL REFERENCES earmark.budget,
    account         text NOT NULL,
    feature         text NOT NULL,
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    used            bigint NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= amount),
    last_step       bigint,
    status          text NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'capped', 'completed', 'failed', 'cancelled', 'expired')),
    lease           interval NOT NULL,
    lease_until     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    settled_at      timestamptz,
    charged         bigint,
    released        bigint,
    UNIQUE (account, idempotency_key)
);

-- The sweeper and reserve's reclaim look for open holds by lease end.
CREATE INDEX job_open_lease ON earmark.job (budget_id, lease_until)
    WHERE status IN ('running', 'capped');
CREATE INDEX job_open_by_lease ON earmark.job (lease_until)
    WHERE status IN ('running', 'capped');

-- The usage ledger: append-only, the record of what was used.  A settled
-- job writes one row keyed by its job_id; usage that did not pass a hold
-- is keyed by the caller's idempotency key.
CREATE TABLE earmark.ledger (
    entry_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id       bigint NOT NULL REFERENCES earmark.budget,
    units           bigint NOT NULL,
    job_id          bigint UNIQUE REFERENCES earmark.job,
    entry_key       text,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CHECK ((job_id IS NULL) <> (entry_key IS NULL))
);
CREATE INDEX ledger_budget ON earmark.ledger (budget_id);

-- Cycles whose ledger changed since the meter was last told.  A mark is
-- written once; more usage while it is marked writes nothing more.
CREATE TABLE earmark.meter_mark (
    budget_id   bigint PRIMARY KEY REFERENCES earmark.budget,
    marked_at   timestamptz NOT NULL DEFAULT pg_catalog.now()
);

REVOKE ALL ON ALL TABLES IN SCHEMA earmark FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA earmark FROM PUBLIC;

------------------------------------------------------------------------------
-- API
------------------------------------------------------------------------------

CREATE FUNCTION earmark_set_limit(account text, lim bigint, feature text DEFAULT 'default')
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_limit'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_set_account(account text,
                                    cycle_anchor timestamptz DEFAULT NULL,
                                    provider_customer text DEFAULT NULL,
                                    provider_agreement text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_account'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_budget(account text, feature text DEFAULT 'default', at timestamptz DEFAULT NULL)
RETURNS TABLE (cycle_start timestamptz, cycle_end timestamptz, lim bigint,
               used bigint, held bigint, remaining bigint, limit_state text)
AS 'MODULE_PATHNAME', 'earmark_budget'
LANGUAGE C CALLED ON NULL INPUT STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_reserve(account text, amount bigint, idempotency_key text,
                                feature text DEFAULT 'default', lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, admitted boolean, remaining bigint, reason text)
AS 'MODULE_PATHNAME', 'earmark_reserve'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_charge(job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_charge'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_heartbeat(job_id bigint)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'earmark_heartbeat'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_settle(job_id bigint, used bigint DEFAULT NULL, outcome text DEFAULT 'completed')
RETURNS TABLE (charged bigint, released bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_settle'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_sweep(max_jobs int DEFAULT 1000)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_sweep'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION
    earmark_set_limit(text, bigint, text),
    earmark_set_account(text, timestamptz, text, text),
    earmark_budget(text, text, timestamptz),
    earmark_reserve(text, bigint, text, text, interval),
    earmark_charge(bigint, bigint, bigint),
    earmark_heartbeat(bigint),
    earmark_settle(bigint, bigint, text),
    earmark_sweep(int)
FROM PUBLIC;

-- earmark_user runs the gate; earmark_admin also sets limits, accounts
-- and may sweep by hand.
GRANT EXECUTE ON FUNCTION
    earmark_budget(text, text, timestamptz),
    earmark_reserve(text, bigint, text, text, interval),
    earmark_charge(bigint, bigint, bigint),
    earmark_heartbeat(bigint),
    earmark_settle(bigint, bigint, text)
TO earmark_user;

GRANT EXECUTE ON FUNCTION
    earmark_set_limit(text, bigint, text),
    earmark_set_account(text, timestamptz, text, text),
    earmark_sweep(int)
TO earmark_admin;
DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('earmark_admin', 'earmark_user', 'MEMBER') THEN
        GRANT earmark_user TO earmark_admin;
    END IF;
END
$$;
