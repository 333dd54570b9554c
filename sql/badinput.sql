-- Bad input: every argument error has a clear message and its SQLSTATE,
-- and changes nothing.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger, earmark.job, earmark.budget,
         earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('acct', 1000);
SELECT job_id AS j FROM earmark_reserve('acct', 100, 'ok-key') \gset
SELECT earmark_set_limit('unlimited', NULL);
SELECT admitted FROM earmark_reserve('unlimited', 9000000000000000000, 'huge');

-- try(sql): the SQLSTATE and message of the error the statement raises
CREATE FUNCTION try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- what the tables hold, to show that nothing changed
CREATE FUNCTION state() RETURNS text LANGUAGE sql AS $$
SELECT concat_ws(' | ',
    (SELECT count(*) || ' accounts' FROM earmark.account),
    (SELECT count(*) || ' limits ' || coalesce(sum(lim), 0) FROM earmark.account_limit),
    (SELECT count(*) || ' budgets ' || sum(used) || '/' || sum(held) FROM earmark.budget),
    (SELECT count(*) || ' jobs ' || sum(used) || ' ' || string_agg(status, ',') FROM earmark.job),
    (SELECT count(*) || ' ledger' FROM earmark.ledger))
$$;
SELECT state() AS before \gset

SELECT q, try(q) FROM (VALUES
    -- account and key: NULL, empty, too long
    ($$SELECT earmark_reserve(NULL, 1, 'k')$$),
    ($$SELECT earmark_reserve('', 1, 'k')$$),
    ($$SELECT earmark_reserve('acct', 1, NULL)$$),
    ($$SELECT earmark_reserve('acct', 1, '')$$),
    ($$SELECT earmark_reserve('acct', 1, repeat('k', 256))$$),
    ($$SELECT earmark_reserve(repeat('a', 256), 1, 'k')$$),
    ($$SELECT earmark_reserve('acct', 1, 'k', NULL)$$),
    ($$SELECT earmark_reserve('acct', 1, 'k', '')$$),
    -- amounts: NULL, zero, negative, the smallest bigint, holds past bigint
    ($$SELECT earmark_reserve('acct', NULL, 'k')$$),
    ($$SELECT earmark_reserve('acct', 0, 'k')$$),
    ($$SELECT earmark_reserve('acct', -5, 'k')$$),
    ($$SELECT earmark_reserve('acct', -9223372036854775808, 'k')$$),
    ($$SELECT earmark_reserve('unlimited', 9000000000000000000, 'huge-2')$$),
    -- lease: zero and negative
    ($$SELECT earmark_reserve('acct', 1, 'k', lease => '0 seconds')$$),
    ($$SELECT earmark_reserve('acct', 1, 'k', lease => '-1 minute')$$),
    -- charge: unknown job, NULLs, negative tokens
    ($$SELECT earmark_charge(999999, 1)$$),
    ($$SELECT earmark_charge(NULL, 1)$$),
    ($$SELECT earmark_charge(1, NULL)$$),
    ($$SELECT earmark_charge(1, -1)$$),
    -- heartbeat and settle: unknown job, unknown outcome, negative use
    ($$SELECT earmark_heartbeat(999999)$$),
    ($$SELECT earmark_heartbeat(NULL)$$),
    ($$SELECT earmark_settle(999999)$$),
    ($$SELECT earmark_settle(NULL)$$),
    ($$SELECT earmark_settle(1, 10, 'exploded')$$),
    ($$SELECT earmark_settle(1, 10, 'expired')$$),
    ($$SELECT earmark_settle(1, 10, NULL)$$),
    ($$SELECT earmark_settle(1, -10)$$),
    -- limits and accounts
    ($$SELECT earmark_set_limit('acct', -1)$$),
    ($$SELECT earmark_set_limit(NULL, 1)$$),
    ($$SELECT earmark_set_limit('acct', 1, NULL)$$),
    ($$SELECT earmark_set_limit('acct', 1, repeat('f', 300))$$),
    ($$SELECT earmark_set_account(NULL)$$),
    ($$SELECT earmark_set_account('acct', '2026-01-31')$$),
    ($$SELECT earmark_set_account('acct', provider_customer => '')$$),
    ($$SELECT earmark_budget(NULL)$$),
    ($$SELECT earmark_budget('acct', at => 'infinity')$$),
    -- sweep
    ($$SELECT earmark_sweep(0)$$),
    ($$SELECT earmark_sweep(-1)$$),
    ($$SELECT earmark_sweep(NULL)$$)
) AS t(q);

-- the same key with other parameters
SELECT try($$SELECT earmark_reserve('acct', 101, 'ok-key')$$);

SELECT state() = :'before' AS nothing_changed;

-- 255 characters is fine: the limit is inclusive
SELECT admitted FROM earmark_reserve('acct', 1, repeat('k', 255));
SELECT earmark_settle(job_id, 0, 'cancelled') IS NOT NULL AS settled
FROM earmark.job WHERE idempotency_key = repeat('k', 255);
-- multibyte keys count characters, not bytes
SELECT admitted FROM earmark_reserve('acct', 1, repeat('é', 255));
SELECT try($$SELECT earmark_reserve('acct', 1, repeat('é', 256))$$);

-- a NULL limit is not an error: it means unlimited
SELECT try($$SELECT earmark_set_limit('other', NULL)$$);
SELECT count(*) AS jobs FROM earmark.job;
