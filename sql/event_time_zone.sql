-- An event time without a UTC offset is UTC, whatever the storing
-- session's TimeZone and DateStyle: the order of plan changes must not
-- depend on which connection stored them.  Two deliveries of one provider,
-- its own times 10:00 and 10:30 with no offset, stored by sessions in UTC
-- and in Asia/Tokyo: 10:30 is the newer and is applied.  A time with an
-- offset keeps it; a date in the slash form reads month first under any
-- DateStyle; the session's settings are as they were after each call,
-- also after a time that does not parse.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event, earmark.account_limit, earmark.account,
         earmark.plan_limit RESTART IDENTITY CASCADE;
SELECT earmark_set_plan_limit('pro', 500000);
SELECT earmark_set_plan_limit('free', 1000);
SELECT earmark_set_account('tz', provider_customer => 'cus_tz');

SET TimeZone = 'UTC';
SELECT event_id AS first FROM earmark_inbox_receive('stripe', 'tz-1000', 'customer.plan_changed',
    '{"event_timestamp": "2026-11-02T10:00:00", "data": {"plan": {"key": "free"}}}', NULL, 'tz') \gset
SET TimeZone = 'Asia/Tokyo';
SET DateStyle = 'SQL, DMY';
SELECT event_id AS second FROM earmark_inbox_receive('stripe', 'tz-1030', 'customer.plan_changed',
    '{"event_timestamp": "2026-11-02T10:30:00", "data": {"plan": {"key": "pro"}}}', NULL, 'tz') \gset
SELECT event_id AS third FROM earmark_inbox_receive('stripe', 'tz-offset', 'customer.other',
    '{"event_timestamp": "2026-11-02T10:30:00+09:00"}', NULL, 'tz') \gset
SELECT event_id AS fourth FROM earmark_inbox_receive('stripe', 'tz-slash', 'customer.other',
    '{"event_timestamp": "04/05/2026 10:00:00"}', NULL, 'tz') \gset
-- a time that does not parse: 22008, and the session's settings stay
DO $$
BEGIN
    PERFORM earmark_inbox_receive('stripe', 'tz-bad', 'customer.other',
        '{"event_timestamp": "2026-13-45T10:00:00"}', NULL, 'tz');
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'refused: %', SQLSTATE;
END
$$;
SELECT current_setting('TimeZone') AS tz, current_setting('DateStyle') AS datestyle,
       extract(month FROM '03/04/2026'::date) AS month_read_day_first;
RESET DateStyle;
SET TimeZone = 'UTC';
SELECT dedupe_key, occurred_at FROM earmark.inbox_event WHERE account = 'tz' ORDER BY dedupe_key;

-- the worker applies them in occurred_at order: the 10:30 change last
UPDATE earmark.inbox_event SET status = 'processing' WHERE account = 'tz' AND event_type = 'customer.plan_changed';
SELECT dedupe_key, earmark.apply_plan_change(e) FROM earmark.inbox_event e
 WHERE account = 'tz' AND event_type = 'customer.plan_changed' ORDER BY occurred_at, event_id;
SELECT plan FROM earmark.account WHERE account = 'tz';
RESET TimeZone;
TRUNCATE earmark.plan_limit;
