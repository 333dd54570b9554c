-- Bad input: every argument error has a clear message and its SQLSTATE,
-- and changes nothing.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

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

-- what every table of schema earmark holds (the md5 of its rows in order),
-- to show that nothing changed
CREATE FUNCTION state() RETURNS TABLE (rel text, n bigint, md5 text) LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
              WHERE s.nspname = 'earmark' AND c.relkind IN ('r', 'p') ORDER BY c.relname LOOP
        rel := t.relname;
        EXECUTE format('SELECT count(*), md5(coalesce(string_agg(x::text, E''\n'' ORDER BY x::text), '''')) FROM earmark.%I x',
                       t.relname) INTO n, md5;
        RETURN NEXT;
    END LOOP;
END
$$;
CREATE TABLE before AS SELECT * FROM state();

-- the bad calls, one per row
CREATE TABLE bad_call (n int PRIMARY KEY, q text NOT NULL, result text);
INSERT INTO bad_call (q, n) SELECT * FROM unnest(ARRAY[
    -- account and key: NULL, empty, too long
    $$SELECT earmark_reserve(NULL, 1, 'k')$$,
    $$SELECT earmark_reserve('', 1, 'k')$$,
    $$SELECT earmark_reserve('acct', 1, NULL)$$,
    $$SELECT earmark_reserve('acct', 1, '')$$,
    $$SELECT earmark_reserve('acct', 1, repeat('k', 256))$$,
    $$SELECT earmark_reserve(repeat('a', 256), 1, 'k')$$,
    $$SELECT earmark_reserve('acct', 1, 'k', NULL)$$,
    $$SELECT earmark_reserve('acct', 1, 'k', '')$$,
    -- amounts: NULL, zero, negative, the smallest bigint, holds past bigint
    $$SELECT earmark_reserve('acct', NULL, 'k')$$,
    $$SELECT earmark_reserve('acct', 0, 'k')$$,
    $$SELECT earmark_reserve('acct', -5, 'k')$$,
    $$SELECT earmark_reserve('acct', -9223372036854775808, 'k')$$,
    $$SELECT earmark_reserve('unlimited', 9000000000000000000, 'huge-2')$$,
    -- lease: zero and negative
    $$SELECT earmark_reserve('acct', 1, 'k', lease => '0 seconds')$$,
    $$SELECT earmark_reserve('acct', 1, 'k', lease => '-1 minute')$$,
    -- charge: unknown job, a job of another account, NULLs, negative tokens
    $$SELECT earmark_charge('acct', 999999, 1)$$,
    $$SELECT earmark_charge('unlimited', 1, 1)$$,
    $$SELECT earmark_charge(NULL, 1, 1)$$,
    $$SELECT earmark_charge('acct', NULL, 1)$$,
    $$SELECT earmark_charge('acct', 1, NULL)$$,
    $$SELECT earmark_charge('acct', 1, -1)$$,
    -- heartbeat and settle: unknown job, a job of another account, unknown
    -- outcome, negative use
    $$SELECT earmark_heartbeat('acct', 999999)$$,
    $$SELECT earmark_heartbeat('unlimited', 1)$$,
    $$SELECT earmark_heartbeat(NULL, 1)$$,
    $$SELECT earmark_heartbeat('acct', NULL)$$,
    $$SELECT earmark_settle('acct', 999999)$$,
    $$SELECT earmark_settle('unlimited', 1)$$,
    $$SELECT earmark_settle(NULL, 1)$$,
    $$SELECT earmark_settle('acct', NULL)$$,
    $$SELECT earmark_settle('acct', 1, 10, 'exploded')$$,
    $$SELECT earmark_settle('acct', 1, 10, 'expired')$$,
    $$SELECT earmark_settle('acct', 1, 10, NULL)$$,
    $$SELECT earmark_settle('acct', 1, -10)$$,
    -- the 0.2.0 forms (no account) fail and say to pass the account
    $$SELECT earmark_charge(1, 1)$$,
    $$SELECT earmark_heartbeat(1)$$,
    $$SELECT earmark_settle(1, 10)$$,
    -- limits and accounts
    $$SELECT earmark_set_limit('acct', -1)$$,
    $$SELECT earmark_set_limit(NULL, 1)$$,
    $$SELECT earmark_set_limit('acct', 1, NULL)$$,
    $$SELECT earmark_set_limit('acct', 1, repeat('f', 300))$$,
    $$SELECT earmark_set_account(NULL)$$,
    $$SELECT earmark_set_account('acct', '2026-01-31')$$,
    $$SELECT earmark_set_account('acct', provider_customer => '')$$,
    $$SELECT earmark_budget(NULL)$$,
    $$SELECT earmark_budget('acct', at => 'infinity')$$,
    -- sweep
    $$SELECT earmark_sweep(0)$$,
    $$SELECT earmark_sweep(-1)$$,
    $$SELECT earmark_sweep(NULL)$$,
    -- the same key with other parameters
    $$SELECT earmark_reserve('acct', 101, 'ok-key')$$,
    -- earmark.store_limits, the worker's store of a limit read on a
    -- distributed install: NULLs, arrays that do not pair, features and
    -- limits a provider's answer may not have, an unknown account
    $$SELECT earmark.store_limits(NULL, '{a}', '{1}')$$,
    $$SELECT earmark.store_limits('', '{a}', '{1}')$$,
    $$SELECT earmark.store_limits('acct', NULL, '{1}')$$,
    $$SELECT earmark.store_limits('acct', '{a}', NULL)$$,
    $$SELECT earmark.store_limits('acct', '{a,b}', '{1}')$$,
    $$SELECT earmark.store_limits('acct', '{{a},{b}}', '{{1},{2}}')$$,
    $$SELECT earmark.store_limits('acct', ARRAY[NULL]::text[], '{1}')$$,
    $$SELECT earmark.store_limits('acct', '{""}', '{1}')$$,
    $$SELECT earmark.store_limits('acct', ARRAY[repeat('f', 256)], '{1}')$$,
    $$SELECT earmark.store_limits('acct', '{a}', '{-1}')$$,
    $$SELECT earmark.store_limits('nobody', '{a}', '{1}')$$
]) WITH ORDINALITY AS t(q, n);
-- each call in a statement of its own, so in a transaction of its own: a
-- call that wrongly succeeds commits what it did, for the check below to
-- see (try() only rolls back a call that raised)
SELECT format('UPDATE bad_call SET result = try(q) WHERE n = %s', n) FROM bad_call ORDER BY n \gexec
SELECT q, result FROM bad_call ORDER BY n;

-- nothing changed: no table of schema earmark differs (none listed)
SELECT rel, b.n AS rows_before, a.n AS rows_after
FROM before b FULL JOIN state() a USING (rel)
WHERE b.md5 IS DISTINCT FROM a.md5 ORDER BY rel;
SELECT count(*) >= 10 AS tables_compared FROM before;

-- 255 characters is fine: the limit is inclusive
SELECT admitted FROM earmark_reserve('acct', 1, repeat('k', 255));
SELECT earmark_settle('acct', job_id, 0, 'cancelled') IS NOT NULL AS settled
FROM earmark.job WHERE account = 'acct' AND idempotency_key = repeat('k', 255);
-- multibyte keys count characters, not bytes
SELECT admitted FROM earmark_reserve('acct', 1, repeat('é', 255));
SELECT try($$SELECT earmark_reserve('acct', 1, repeat('é', 256))$$);

-- a NULL limit is not an error: it means unlimited
SELECT try($$SELECT earmark_set_limit('other', NULL)$$);
SELECT count(*) AS jobs FROM earmark.job;

-- earmark.report_cycle, the worker's step 3 on a distributed install:
-- feature may be NULL only together with cycle_account (the cycle of a
-- deleted account); for a live cycle a NULL feature is refused (22004),
-- and its meter mark stays for the next pass
SELECT earmark_set_limit('rc', 1000);
SELECT job_id AS rc_job FROM earmark_reserve('rc', 10, 'rc-1') \gset
SELECT charged FROM earmark_settle('rc', :rc_job, 5);
SELECT budget_id AS rc_budget FROM earmark.budget WHERE account = 'rc' \gset
SELECT count(*) AS marks_before FROM earmark.meter_mark WHERE account = 'rc';
-- a closed cycle the provider refused (listed for review under its feature)
SELECT try(format($$SELECT earmark.report_cycle('rc', %s, 'rc', 5, false, 10, 'why', 1000, true, false, 10, NULL, now(), now())$$, :rc_budget));
-- a sent one (logged under its feature)
SELECT try(format($$SELECT earmark.report_cycle('rc', %s, 'rc', 5, true, 200, NULL, 1.0, false, false, 5, NULL, now(), now())$$, :rc_budget));
SELECT count(*) AS reviews FROM earmark.meter_review WHERE account = 'rc';
SELECT count(*) AS marks_after FROM earmark.meter_mark WHERE account = 'rc';

-- earmark.store_limits stores what it is given as a provider read does: the
-- provider limits replace the old ones (a NULL is unlimited), a limit set
-- by hand stays, and the read is recorded
SELECT earmark_set_limit('sl', 7, 'm');
SELECT earmark.store_limits('sl', '{b,a,u}', ARRAY[2, 1, NULL]::bigint[]) AS stored;
SELECT feature, lim, source FROM earmark.account_limit WHERE account = 'sl' ORDER BY feature;
SELECT earmark.store_limits('sl', '{a}', '{3}') AS stored;
SELECT feature, lim, source FROM earmark.account_limit WHERE account = 'sl' ORDER BY feature;
SELECT limits_fetched_at IS NOT NULL AS read, limits_error FROM earmark.account WHERE account = 'sl';

-- the worker's limit store on a distributed install reads the stored
-- limits after the refresh lock's wait: under a transaction snapshot (a
-- Citus node whose default_transaction_isolation is repeatable read) it
-- refuses
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT try($$SELECT earmark.store_limits('sl', '{a}', '{4}')$$);
COMMIT;
SELECT feature, lim, source FROM earmark.account_limit WHERE account = 'sl' ORDER BY feature;
