-- The built-in plan change gives the account the new plan's limits, and
-- removes the limit of a feature that another plan sets: after a
-- downgrade from a plan with an 'api' limit to one without, 'api' is
-- refused (no limit row: fail closed), not admitted at the dearer plan's
-- limit.  A feature no plan sets (a limit set by hand) keeps its limit, a
-- limit the provider gave is not removed, a plan with no limits leaves the
-- account's limits as they were, and an upgrade gives 'api' back.  The
-- guard against older changes holds within any allowance (7).
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event, earmark.meter_mark, earmark.ledger_entry,
         earmark.job, earmark.budget, earmark.account_limit, earmark.account,
         earmark.plan_limit RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;

SELECT earmark_set_plan_limit('pro', 500000);
SELECT earmark_set_plan_limit('pro', 2000, 'api');
SELECT earmark_set_plan_limit('pro', 50, 'export');
SELECT earmark_set_plan_limit('free', 100);
SELECT earmark_set_account('down', provider_customer => 'cus_down');
-- a feature no plan sets, by hand
SELECT earmark_set_limit('down', 7, 'beta');

-- apply(key, plan, seconds ago): one plan change through the handler
CREATE FUNCTION pg_temp.apply(k text, plan text, ago int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
    r text;
BEGIN
    SELECT event_id INTO id FROM earmark_inbox_receive('stripe', k, 'customer.plan_changed',
        jsonb_build_object('data', jsonb_build_object('plan', jsonb_build_object('key', plan))),
        now() - make_interval(secs => ago), 'down');
    UPDATE earmark.inbox_event SET status = 'processing' WHERE event_id = id;
    SELECT earmark.apply_plan_change(e) INTO r FROM earmark.inbox_event e WHERE event_id = id;
    RETURN r;
END
$$;
CREATE FUNCTION pg_temp.limits() RETURNS TABLE (feature text, lim bigint, source text) LANGUAGE sql AS $$
    SELECT l.feature, l.lim, l.source FROM earmark.account_limit l
     WHERE l.account = 'down' ORDER BY l.feature COLLATE "C"
$$;

-- 1. up to pro: its three limits, 'beta' kept
SELECT pg_temp.apply('c1', 'pro', 100);
SELECT * FROM pg_temp.limits();

-- 2. down to free: 'api' and 'export' go (a plan sets them, free does not),
--    'beta' stays (no plan sets it)
SELECT pg_temp.apply('c2', 'free', 90);
SELECT plan FROM earmark.account WHERE account = 'down';
SELECT * FROM pg_temp.limits();
SELECT admitted, reason FROM earmark_reserve('down', 10, 'api-1', feature => 'api');
SELECT admitted FROM earmark_reserve('down', 10, 'default-1');

-- 3. back to pro: 'api' and 'export' again
SELECT pg_temp.apply('c3', 'pro', 80);
SELECT * FROM pg_temp.limits();

-- 4. to a plan with no limits set: the account's limits stay as they were
SELECT pg_temp.apply('c4', 'unpriced', 70);
SELECT plan FROM earmark.account WHERE account = 'down';
SELECT * FROM pg_temp.limits();

-- 5. from pro again, with 'api' given by the provider meanwhile: that row
--    is not removed (the limit refresh owns it); 'export' goes
SELECT pg_temp.apply('c5', 'pro', 60);
UPDATE earmark.account_limit SET source = 'provider' WHERE account = 'down' AND feature = 'api';
SELECT pg_temp.apply('c6', 'free', 50);
SELECT * FROM pg_temp.limits();

-- 6. an older change than the stored one is ignored and changes no limit
SELECT pg_temp.apply('c7', 'pro', 55);
SELECT * FROM pg_temp.limits();

-- 7. the guard holds within any allowance: a change whose sender's clock
--    ran 250 s ahead was taken under earmark.webhook_tolerance = 300; with
--    the allowance lowered since to 10 s, a late delivery of an older
--    change (a minute old) is ignored, not applied over it.  A stored
--    time more than 24 h ahead (the greatest allowance; an older version
--    could store one) guards nothing.
SET earmark.webhook_tolerance = 300;
SELECT pg_temp.apply('g1', 'pro', -250);
SET earmark.webhook_tolerance = 10;
SELECT pg_temp.apply('g2', 'free', 60);
SELECT plan, plan_changed_at > now() AS guard_kept FROM earmark.account WHERE account = 'down';
UPDATE earmark.account SET plan_changed_at = now() + interval '25 hours' WHERE account = 'down';
SELECT pg_temp.apply('g3', 'free', 30);
SELECT plan, plan_changed_at < now() AS guard_replaced FROM earmark.account WHERE account = 'down';
RESET earmark.webhook_tolerance;

-- 8. through a plan with no limits set: pro, then 'unpriced' (keeps pro's
--    limits), then free: pro's 'api' and 'export' go all the same ('api'
--    set by hand first, where case 5 left the provider's)
SELECT earmark_set_limit('down', 2000, 'api');
UPDATE earmark.account_limit SET source = 'manual' WHERE account = 'down' AND feature = 'api';
SELECT pg_temp.apply('v1', 'pro', -240);
SELECT pg_temp.apply('v2', 'unpriced', -245);
SELECT pg_temp.apply('v3', 'free', -248);
SELECT * FROM pg_temp.limits();

-- 9. an event taken under a larger allowance (250 s ahead under 300 s) and
--    applied after it was lowered to 10 s applies (it is not dropped as
--    "in the future"); one more than 24 h ahead is not applied
SET earmark.webhook_tolerance = 300;
SELECT event_id AS ahead FROM earmark_inbox_receive('stripe', 't-ahead', 'customer.plan_changed',
    '{"data": {"plan": {"key": "pro"}}}', now() + interval '250 seconds', 'down') \gset
SET earmark.webhook_tolerance = 10;
UPDATE earmark.inbox_event SET status = 'processing' WHERE event_id = :ahead;
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :ahead;
SELECT plan FROM earmark.account WHERE account = 'down';
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, account, status, verified_by)
VALUES ('stripe', 't-25h', 'customer.plan_changed', '{"data": {"plan": {"key": "free"}}}',
        now() + interval '25 hours', 'down', 'processing', 'admin')
RETURNING event_id AS far \gset
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :far;
SELECT result FROM earmark.inbox_event WHERE event_id = :far;
RESET earmark.webhook_tolerance;

RESET earmark.rate_limit;
TRUNCATE earmark.plan_limit;
