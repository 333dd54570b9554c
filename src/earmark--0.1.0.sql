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
    -- the plan as the provider's plan-change events last set it, and the
    -- event time of that change: an older change never overwrites it
    plan                text,
    plan_changed_at     timestamptz,
    -- escrow slots for this account's budgets (NULL: earmark.escrow_slots)
    escrow_slots        int CHECK (escrow_slots BETWEEN 0 AND 256),
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
-- sum of the holds of running jobs.  Updated by every admission and
-- settlement, so it leaves room on its page for HOT updates.
--
-- The hot tables (budget, job, ledger, meter_mark) carry no foreign keys
-- and few CHECK constraints: each costs a trigger query or an expression
-- set-up on every write of the gate's hot path.  The gate's C code keeps
-- these rules, and earmark's tests check them after every scenario.
CREATE TABLE earmark.budget (
    budget_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account     text NOT NULL REFERENCES earmark.account ON DELETE CASCADE,
    feature     text NOT NULL,
    cycle_start timestamptz NOT NULL,
    cycle_end   timestamptz NOT NULL,
    used        bigint NOT NULL DEFAULT 0,
    held        bigint NOT NULL DEFAULT 0,
    -- escrow (docs/design.md, "Escrow for hot accounts"): slots > 0 splits the budget's free room into
    -- that many earmark.budget_slot rows.  used and held above then count
    -- only what passed outside the slots; slot_lim and slot_gen are the
    -- limit and generation of the last rebalance.
    slots       int NOT NULL DEFAULT 0,
    slot_lim    bigint,
    slot_gen    bigint NOT NULL DEFAULT 0,
    UNIQUE (account, feature, cycle_start)
) WITH (fillfactor = 50);

-- An escrow slot: part of a hot budget's room that admissions take without
-- locking the budget row.  room + held + used is the slot's allocation; an
-- admission moves room to held, a settlement held to used and back to
-- room, so only a rebalance (under the budget row's lock) changes it.  A
-- slot whose gen is not the budget's slot_gen admits nothing.
CREATE TABLE earmark.budget_slot (
    budget_id   bigint NOT NULL,
    slot        int NOT NULL,
    gen         bigint NOT NULL DEFAULT 0,
    room        bigint NOT NULL DEFAULT 0,
    held        bigint NOT NULL DEFAULT 0,
    used        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (budget_id, slot)
) WITH (fillfactor = 50);

-- Slots go with their budget rows.  (No foreign key: see escrow.c.)
CREATE FUNCTION earmark.truncate_slots() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM earmark.budget_slot;
    RETURN NULL;
END
$$;
CREATE TRIGGER budget_truncate_slots AFTER TRUNCATE ON earmark.budget
    FOR EACH STATEMENT EXECUTE FUNCTION earmark.truncate_slots();
REVOKE ALL ON FUNCTION earmark.truncate_slots() FROM PUBLIC;

-- A job is a hold taken by earmark_reserve.  status is 'running' or
-- 'capped' while the hold is open, then one of 'completed', 'failed',
-- 'cancelled', 'expired'.
CREATE TABLE earmark.job (
    job_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id       bigint NOT NULL,
    account         text NOT NULL,
    feature         text NOT NULL,
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL,                    -- > 0
    used            bigint NOT NULL DEFAULT 0,          -- 0 .. amount, what charges recorded
    last_step       bigint,
    status          text NOT NULL DEFAULT 'running',
    slot            int,                                -- the escrow slot that holds it, if any
    lease           interval NOT NULL,
    lease_until     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    settled_at      timestamptz,
    charged         bigint,
    released        bigint,
    UNIQUE (account, idempotency_key)
) WITH (fillfactor = 70);

-- The sweeper and reserve's reclaim look for open holds.  lease_until is
-- deliberately not indexed: every charge renews it, and an unindexed
-- column keeps that update HOT.
CREATE INDEX job_open ON earmark.job (budget_id)
    WHERE status IN ('running', 'capped');

-- The usage ledger: append-only, the record of what was used.  A settled
-- job writes one row keyed by its job_id; usage that did not pass a hold
-- is keyed by the caller's idempotency key.
CREATE TABLE earmark.ledger (
    entry_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id       bigint NOT NULL,
    units           bigint NOT NULL,
    job_id          bigint UNIQUE,                      -- a settled job's row, or
    entry_key       text,                               -- the caller's key
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX ledger_budget ON earmark.ledger (budget_id);

-- Cycles whose ledger changed since the meter was last told.  A mark is
-- written once; more usage while it is marked writes nothing more.
CREATE TABLE earmark.meter_mark (
    budget_id   bigint PRIMARY KEY,
    marked_at   timestamptz NOT NULL DEFAULT pg_catalog.now()
);

------------------------------------------------------------------------------
-- Webhook inbox
------------------------------------------------------------------------------

-- One row per event, keyed by (source, dedupe_key): a copy of a delivery
-- adds one to seen_count and nothing else.  occurred_at is the event's own
-- time, not the arrival.  status: received -> processing -> applied |
-- ignored | failed (waits next_attempt_at) -> dead after 6 attempts.
CREATE TABLE earmark.inbox_event (
    event_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          text NOT NULL,
    dedupe_key      text NOT NULL,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    occurred_at     timestamptz NOT NULL,
    account         text,
    status          text NOT NULL DEFAULT 'received'
                    CHECK (status IN ('received', 'processing', 'applied', 'ignored', 'failed', 'dead')),
    attempts        int NOT NULL DEFAULT 0,
    seen_count      int NOT NULL DEFAULT 1,
    next_attempt_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    locked_until    timestamptz,
    result          text,
    last_error      text,
    received_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    UNIQUE (source, dedupe_key)
);
-- claims read due events in (occurred_at, event_id) order
CREATE INDEX inbox_event_due ON earmark.inbox_event (occurred_at, event_id)
    WHERE status IN ('received', 'failed', 'processing');
CREATE INDEX inbox_event_account ON earmark.inbox_event (account);
-- claims look for leases that passed
CREATE INDEX inbox_event_leased ON earmark.inbox_event (locked_until)
    WHERE status = 'processing';

-- Every delivery, copies included.
CREATE TABLE earmark.inbox_receipt (
    receipt_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    bigint NOT NULL REFERENCES earmark.inbox_event ON DELETE CASCADE,
    inserted    boolean NOT NULL,
    received_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE INDEX inbox_receipt_event ON earmark.inbox_receipt (event_id);

-- Event types the worker applies, and the function that applies them:
-- handler(earmark.inbox_event) RETURNS text.
CREATE TABLE earmark.inbox_handler (
    event_type  text PRIMARY KEY,
    handler     regprocedure NOT NULL
);

-- Standard Webhooks secrets ("whsec_..."), per source; several rows for a
-- rotation.  Readable by superusers only.
CREATE TABLE earmark.webhook_secret (
    source      text NOT NULL,
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (source, secret)
);

-- The provider's JSON Web Key Set, as last fetched.
CREATE TABLE earmark.jwks (
    url         text PRIMARY KEY,
    keys        jsonb NOT NULL,
    fetched_at  timestamptz NOT NULL
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
LANGUAGE C CALLED ON NULL INPUT STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_reserve(account text, amount bigint, idempotency_key text,
                                feature text DEFAULT 'default', lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, admitted boolean, remaining bigint, reason text)
AS 'MODULE_PATHNAME', 'earmark_reserve'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_charge(job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_charge'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_heartbeat(job_id bigint)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'earmark_heartbeat'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_settle(job_id bigint, used bigint DEFAULT NULL, outcome text DEFAULT 'completed')
RETURNS TABLE (charged bigint, released bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_settle'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_set_escrow(account text, slots int)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_escrow'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_sweep(max_jobs int DEFAULT 1000)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_sweep'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- Inbox

CREATE FUNCTION earmark_inbox_receive(source text, dedupe_key text, event_type text, payload jsonb,
                                      occurred_at timestamptz DEFAULT NULL, account text DEFAULT NULL)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_claim(max_events int DEFAULT 25, lease interval DEFAULT '30 seconds')
RETURNS SETOF earmark.inbox_event
AS 'MODULE_PATHNAME', 'earmark_inbox_claim'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 25
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_complete(event_id bigint, result text DEFAULT 'applied')
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_complete'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_ignore(event_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_ignore'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_fail(event_id bigint, error text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_fail'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_replay(event_id bigint, account text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_replay'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_set_handler(event_type text, handler regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_inbox_set_handler'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- The local provider's plans: the limits an account gets when a plan-change
-- event moves it to that plan.
CREATE TABLE earmark.plan_limit (
    plan        text NOT NULL,
    feature     text NOT NULL DEFAULT 'default',
    lim         bigint CHECK (lim >= 0),
    PRIMARY KEY (plan, feature)
);
REVOKE ALL ON earmark.plan_limit FROM PUBLIC;

CREATE FUNCTION earmark_set_plan_limit(plan text, lim bigint, feature text DEFAULT 'default')
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO earmark.plan_limit AS p (plan, feature, lim) VALUES ($1, $3, $2)
    ON CONFLICT (plan, feature) DO UPDATE SET lim = excluded.lim
$$;

-- The built-in handler of the provider's plan change
-- (customer.plan_changed): it records the plan only when the event is newer
-- than the stored change (a tie is ignored), and gives the account the
-- plan's limits, so that the next admission uses the new plan.
CREATE FUNCTION earmark.apply_plan_change(e earmark.inbox_event)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_plan text := e.payload #>> '{data,plan,key}';
    n int;
BEGIN
    IF e.account IS NULL OR NOT EXISTS (SELECT 1 FROM earmark.account a WHERE a.account = e.account) THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'the event names no known account');
        RETURN 'ignored';
    END IF;
    IF new_plan IS NULL THEN
        RAISE EXCEPTION 'plan change event % has no data.plan.key', e.event_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE earmark.account
       SET plan = new_plan, plan_changed_at = e.occurred_at, updated_at = now()
     WHERE account = e.account
       AND (plan_changed_at IS NULL OR plan_changed_at < e.occurred_at);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'a newer plan change is already stored');
        RETURN 'ignored';
    END IF;
    INSERT INTO earmark.account_limit AS l (account, feature, lim, source, updated_at)
    SELECT e.account, p.feature, p.lim, 'manual', now()
      FROM earmark.plan_limit p WHERE p.plan = new_plan
    ON CONFLICT (account, feature) DO UPDATE SET lim = excluded.lim, updated_at = excluded.updated_at;
    RETURN 'plan set to ' || new_plan;
END
$$;
REVOKE ALL ON FUNCTION earmark.apply_plan_change(earmark.inbox_event) FROM PUBLIC;
INSERT INTO earmark.inbox_handler VALUES ('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)');

REVOKE ALL ON FUNCTION
    earmark_inbox_receive(text, text, text, jsonb, timestamptz, text),
    earmark_inbox_claim(int, interval),
    earmark_inbox_complete(bigint, text),
    earmark_inbox_ignore(bigint, text),
    earmark_inbox_fail(bigint, text),
    earmark_inbox_replay(bigint, text),
    earmark_inbox_set_handler(text, regprocedure),
    earmark_set_plan_limit(text, bigint, text)
FROM PUBLIC;
-- intake and the application's own consumers run as earmark_user; replay
-- and handlers are the admin's
GRANT EXECUTE ON FUNCTION
    earmark_inbox_receive(text, text, text, jsonb, timestamptz, text),
    earmark_inbox_claim(int, interval),
    earmark_inbox_complete(bigint, text),
    earmark_inbox_ignore(bigint, text),
    earmark_inbox_fail(bigint, text)
TO earmark_user;
GRANT EXECUTE ON FUNCTION
    earmark_inbox_replay(bigint, text),
    earmark_inbox_set_handler(text, regprocedure),
    earmark_set_plan_limit(text, bigint, text)
TO earmark_admin;

REVOKE ALL ON FUNCTION
    earmark_set_limit(text, bigint, text),
    earmark_set_account(text, timestamptz, text, text),
    earmark_budget(text, text, timestamptz),
    earmark_reserve(text, bigint, text, text, interval),
    earmark_charge(bigint, bigint, bigint),
    earmark_heartbeat(bigint),
    earmark_settle(bigint, bigint, text),
    earmark_set_escrow(text, int),
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
    earmark_set_escrow(text, int),
    earmark_sweep(int)
TO earmark_admin;
------------------------------------------------------------------------------
-- Signed webhook intake (src/intake.c)
------------------------------------------------------------------------------

CREATE FUNCTION earmark_inbox_receive_signed(source text, webhook_id text, webhook_timestamp text,
                                             webhook_signature text, body text)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive_signed'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_webhook_signature_valid(secret text, webhook_id text, webhook_timestamp text,
                                                webhook_signature text, body text,
                                                at timestamptz DEFAULT pg_catalog.now())
RETURNS boolean
AS 'MODULE_PATHNAME', 'earmark_webhook_signature_valid'
LANGUAGE C CALLED ON NULL INPUT STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_set_secret(source text, secret text)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_inbox_set_secret'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_drop_secret(source text, secret text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'earmark_inbox_drop_secret'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_receive_kinde(webhook_id text, token text)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive_kinde'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_refresh_jwks()
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_refresh_jwks'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION
    earmark_inbox_receive_signed(text, text, text, text, text),
    earmark_webhook_signature_valid(text, text, text, text, text, timestamptz),
    earmark_inbox_set_secret(text, text),
    earmark_inbox_drop_secret(text, text),
    earmark_inbox_receive_kinde(text, text),
    earmark_refresh_jwks()
FROM PUBLIC;

-- earmark_user receives and verifies; earmark_admin manages the secrets
-- and may refresh the key set by hand.
GRANT EXECUTE ON FUNCTION
    earmark_inbox_receive_signed(text, text, text, text, text),
    earmark_webhook_signature_valid(text, text, text, text, text, timestamptz),
    earmark_inbox_receive_kinde(text, text)
TO earmark_user;

GRANT EXECUTE ON FUNCTION
    earmark_inbox_set_secret(text, text),
    earmark_inbox_drop_secret(text, text),
    earmark_refresh_jwks()
TO earmark_admin;

DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('earmark_admin', 'earmark_user', 'MEMBER') THEN
        GRANT earmark_user TO earmark_admin;
    END IF;
END
$$;
