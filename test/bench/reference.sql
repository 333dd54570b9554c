-- test/bench/reference.sql: the gate's rules written plainly in PL/pgSQL,
-- the reference the benchmarks compare earmark with.
--
-- This is the code a careful developer would write without earmark: one
-- budget row per account, locked FOR UPDATE to check and hold in one
-- transaction; a job row per hold, idempotent on (account, key); charge
-- capped by the hold and renewing the lease; settle charging what was used
-- and releasing the rest, once.  It keeps invariants 1-4 of docs/design.md for
-- its own tables (used + held <= lim, held = the open holds, settled once,
-- one hold per key).
--
-- What it does not do, and earmark does: billing cycles (one budget row
-- per account for ever), a usage ledger and meter mark per settlement,
-- reclaiming expired holds before a refusal, the rate limit, escrow, error
-- messages with the numbers.  So earmark does more work per job than this.
--
-- Everything is in schema ref:
--   ref.reserve(account, amount, key)  -> job id, NULL when refused
--   ref.charge(job, tokens)            -> units charged (0 when not running)
--   ref.settle(job, used)              -> units charged
--   ref.set_limit(account, lim)        -> creates or changes the budget row

SET client_min_messages = warning;
DROP SCHEMA IF EXISTS ref CASCADE;
RESET client_min_messages;
CREATE SCHEMA ref;

CREATE TABLE ref.budget (
    account text PRIMARY KEY,
    lim     bigint,                         -- NULL: unlimited
    used    bigint NOT NULL DEFAULT 0,
    held    bigint NOT NULL DEFAULT 0
);

CREATE TABLE ref.job (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account     text NOT NULL REFERENCES ref.budget,
    key         text NOT NULL,
    amount      bigint NOT NULL CHECK (amount > 0),
    used        bigint NOT NULL DEFAULT 0,
    status      text NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'settled', 'expired')),
    lease_until timestamptz NOT NULL,
    UNIQUE (account, key)
);

CREATE FUNCTION ref.set_limit(p_account text, p_lim bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO ref.budget (account, lim) VALUES (p_account, p_lim)
    ON CONFLICT (account) DO UPDATE SET lim = excluded.lim
$$;

-- Check and hold in one transaction, under the budget row's lock.  The key
-- is looked up after the lock: a concurrent reserve with the same key holds
-- the same lock, so it has committed (and its job is visible to this
-- statement's snapshot) or not started.
CREATE FUNCTION ref.reserve(p_account text, p_amount bigint, p_key text,
                            p_lease interval DEFAULT interval '2 minutes')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    b       ref.budget;
    j_id    bigint;
    j_amount bigint;
BEGIN
    IF p_amount IS NULL OR p_amount <= 0 THEN
        RAISE EXCEPTION 'amount must be greater than zero';
    END IF;

    SELECT * INTO b FROM ref.budget WHERE account = p_account FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;                        -- no limit known: refuse
    END IF;

    SELECT id, amount INTO j_id, j_amount
      FROM ref.job WHERE account = p_account AND key = p_key;
    IF FOUND THEN
        IF j_amount <> p_amount THEN
            RAISE EXCEPTION 'idempotency key % was used for a different amount', p_key;
        END IF;
        RETURN j_id;                        -- the same job, nothing new held
    END IF;

    IF b.lim IS NOT NULL AND p_amount > b.lim - b.used - b.held THEN
        RETURN NULL;                        -- refused
    END IF;

    INSERT INTO ref.job (account, key, amount, lease_until)
    VALUES (p_account, p_key, p_amount, clock_timestamp() + p_lease)
    RETURNING id INTO j_id;

    UPDATE ref.budget SET held = held + p_amount WHERE account = p_account;
    RETURN j_id;
END
$$;

-- Charge a step against the hold: never more than what is left of it; a
-- charge renews the lease.
CREATE FUNCTION ref.charge(p_job bigint, p_tokens bigint,
                           p_lease interval DEFAULT interval '2 minutes')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    j       ref.job;
    charged bigint;
BEGIN
    SELECT * INTO j FROM ref.job WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', p_job;
    END IF;
    IF j.status <> 'running' OR j.lease_until < clock_timestamp() THEN
        RETURN 0;
    END IF;

    charged := least(p_tokens, j.amount - j.used);
    UPDATE ref.job
       SET used = used + charged, lease_until = clock_timestamp() + p_lease
     WHERE id = p_job;
    RETURN charged;
END
$$;

-- Settle once: charge what was used (at most the hold), release the rest.
-- After the lease has passed the job ends expired at the use it recorded.
CREATE FUNCTION ref.settle(p_job bigint, p_used bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    j       ref.job;
    charged bigint;
    st      text := 'settled';
BEGIN
    SELECT * INTO j FROM ref.job WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', p_job;
    END IF;
    IF j.status <> 'running' THEN
        RETURN 0;                           -- settled already
    END IF;

    IF j.lease_until < clock_timestamp() THEN
        st := 'expired';
        charged := j.used;
    ELSE
        charged := least(coalesce(p_used, j.used), j.amount);
    END IF;

    UPDATE ref.budget
       SET held = held - j.amount, used = used + charged
     WHERE account = j.account;
    UPDATE ref.job SET status = st, used = charged WHERE id = p_job;
    RETURN charged;
END
$$;
