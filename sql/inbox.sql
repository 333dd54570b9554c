-- The webhook inbox: store then answer, one row per (source, dedupe_key),
-- copies counted, SKIP LOCKED claims in event-time order with a lease,
-- complete / ignore / fail with backoff, dead after 6 attempts, replay for
-- the owning account only, and the built-in plan-change handler.
SET client_min_messages = warning;
SET timezone = 'UTC';
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event, earmark.meter_mark, earmark.ledger,
         earmark.job, earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';

-- store: the first delivery inserts, a copy only counts itself
SELECT * FROM earmark_inbox_receive('kinde', 'wh-1', 'customer.payment_succeeded',
    '{"type": "customer.payment_succeeded", "event_timestamp": "2026-10-21T02:29:23.403633+11:00"}');
SELECT * FROM earmark_inbox_receive('kinde', 'wh-1', 'customer.payment_succeeded',
    '{"type": "a copy with another body changes nothing"}');
SELECT * FROM earmark_inbox_receive('kinde', 'wh-1', 'customer.payment_succeeded', '{}');
SELECT event_id, source, dedupe_key, event_type, payload->>'type' AS type, occurred_at, seen_count, status
FROM earmark.inbox_event;
SELECT event_id, inserted FROM earmark.inbox_receipt ORDER BY receipt_id;
-- another source may use the same key
SELECT * FROM earmark_inbox_receive('stripe', 'wh-1', 'invoice.paid', '{}', '2026-10-01 00:00+00');

-- occurred_at is the event's time: the argument, else event_timestamp,
-- else timestamp (nine fractional digits and short offsets are accepted)
SELECT event_id FROM earmark_inbox_receive('kinde', 'wh-2', 'customer.plan_changed',
    '{"timestamp": "2026-10-21T02:29:24.481368869+11:00", "data": {"plan": {"key": "pro"}}}', account => 'acme');
SELECT event_id FROM earmark_inbox_receive('kinde', 'wh-3', 'customer.plan_changed',
    '{"event_timestamp": "2026-10-21T02:26:00+11", "timestamp": "2030-01-01T00:00:00Z", "data": {"plan": {"key": "free"}}}',
    account => 'acme');
SELECT event_id FROM earmark_inbox_receive('kinde', 'wh-4', 'customer.note', '{}', '2026-09-01 00:00+00', 'acme');
SELECT dedupe_key, occurred_at FROM earmark.inbox_event ORDER BY event_id;

-- claims: due events of types without a handler, oldest event time first,
-- each to one consumer only
SELECT event_id, dedupe_key, status, attempts, locked_until > now() AS leased FROM earmark_inbox_claim(2);
SELECT event_id, dedupe_key FROM earmark_inbox_claim(10);
SELECT event_id FROM earmark_inbox_claim(10);     -- nothing left
-- a passed lease makes an event claimable again
SELECT event_id FROM earmark_inbox_receive('kinde', 'wh-5', 'customer.note', '{}', '2026-11-01 00:00+00', 'acme') \gset
SELECT event_id = :event_id AS mine, attempts FROM earmark_inbox_claim(1, '20 milliseconds');
SELECT pg_sleep(0.05);
SELECT event_id = :event_id AS reclaimed, attempts FROM earmark_inbox_claim(1);

-- complete, ignore (with its reason), fail with backoff
SELECT earmark_inbox_complete(4);
SELECT earmark_inbox_ignore(1, 'a duplicate payment notice');
SELECT earmark_inbox_fail(:event_id, 'the handler timed out');
SELECT status, attempts, last_error, next_attempt_at - updated_at AS waits FROM earmark.inbox_event WHERE event_id = :event_id;
SELECT event_id, status, result FROM earmark.inbox_event WHERE event_id IN (1, 4) ORDER BY 1;
SELECT event_id FROM earmark_inbox_claim(10);     -- the failed one is not due yet
-- the waits grow 5 s, 30 s, 2 min, 10 min, 1 h; the 6th failure is final
CREATE FUNCTION fail_again(id bigint) RETURNS text LANGUAGE sql AS $$
    UPDATE earmark.inbox_event SET next_attempt_at = now() WHERE event_id = id;   -- skip the wait
    SELECT earmark_inbox_fail(c.event_id, 'failed again') FROM earmark_inbox_claim(1) c WHERE c.event_id = id;
$$;
CREATE FUNCTION wait_of(id bigint) RETURNS text LANGUAGE sql AS $$
    SELECT status || ' after attempt ' || attempts || coalesce(', waits ' || (next_attempt_at - updated_at), '')
    FROM earmark.inbox_event WHERE event_id = id;
$$;
SELECT fail_again(:event_id), wait_of(:event_id);
SELECT fail_again(:event_id), wait_of(:event_id);
SELECT fail_again(:event_id), wait_of(:event_id);
SELECT fail_again(:event_id);
SELECT fail_again(:event_id);                     -- dead: not claimed any more
SELECT status, attempts, last_error FROM earmark.inbox_event WHERE event_id = :event_id;
UPDATE earmark.inbox_event SET next_attempt_at = now() - interval '1 day' WHERE event_id = :event_id;
SELECT count(*) AS dead_claimed FROM earmark_inbox_claim(10);    -- a dead event stays dead

-- replay: only for the account the event belongs to
\set VERBOSITY sqlstate
SELECT earmark_inbox_replay(:event_id, 'someone-else');
SELECT earmark_inbox_replay(1, 'acme');           -- an event with no account
\set VERBOSITY default
SELECT earmark_inbox_replay(:event_id, 'someone-else');
SELECT earmark_inbox_replay(:event_id, 'acme');
SELECT status, attempts, last_error FROM earmark.inbox_event WHERE event_id = :event_id;
SELECT event_id = :event_id AS replayed_and_claimed FROM earmark_inbox_claim(10);
SELECT earmark_inbox_complete(:event_id, 'handled after replay');

-- wrong states and unknown events
\set VERBOSITY sqlstate
SELECT earmark_inbox_complete(4);                 -- already applied
SELECT earmark_inbox_fail(4, 'x');
SELECT earmark_inbox_ignore(4, 'x');
SELECT earmark_inbox_complete(999);
SELECT earmark_inbox_ignore(2, '');
SELECT earmark_inbox_receive(NULL, 'k', 't', '{}');
SELECT earmark_inbox_receive('s', '', 't', '{}');
SELECT earmark_inbox_receive('s', repeat('k', 256), 't', '{}');
SELECT earmark_inbox_receive('s', 'k', 't', NULL);
SELECT earmark_inbox_receive('s', 'k', 't', '{"timestamp": "not a time"}');
SELECT earmark_inbox_claim(0);
SELECT earmark_inbox_claim(1, '0 seconds');
\set VERBOSITY default
SELECT count(*) AS events, sum(seen_count) AS deliveries FROM earmark.inbox_event;

-- handlers: one earmark.inbox_event in, text out
CREATE FUNCTION note_handler(e earmark.inbox_event) RETURNS text LANGUAGE sql AS $$ SELECT 'noted ' || e.dedupe_key $$;
CREATE FUNCTION bad_handler(e earmark.inbox_event, x int) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
SELECT earmark_inbox_set_handler('customer.note', 'note_handler(earmark.inbox_event)');
SELECT event_type, handler FROM earmark.inbox_handler ORDER BY 1;
SELECT earmark_inbox_set_handler('customer.note', 'bad_handler(earmark.inbox_event, int)');
SELECT earmark_inbox_set_handler('customer.note', NULL);
SELECT event_type FROM earmark.inbox_handler ORDER BY 1;

-- the built-in plan change: applies only when newer than the stored change
SELECT earmark_set_plan_limit('pro', 500000);
SELECT earmark_set_plan_limit('free', 1000);
SELECT earmark_set_limit('acme', 1000);
UPDATE earmark.inbox_event SET status = 'processing' WHERE dedupe_key IN ('wh-2', 'wh-3');
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE dedupe_key = 'wh-2';
SELECT plan, plan_changed_at FROM earmark.account WHERE account = 'acme';
SELECT lim FROM earmark_budget('acme');
-- the older change (a cancellation that arrived late) is ignored, with why
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE dedupe_key = 'wh-3';
SELECT dedupe_key, status, result FROM earmark.inbox_event WHERE dedupe_key = 'wh-3';
SELECT plan, lim FROM earmark.account JOIN earmark.account_limit USING (account) WHERE account = 'acme';
-- a tie is ignored too
SELECT event_id AS tie FROM earmark_inbox_receive('kinde', 'wh-6', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2026-10-20 15:29:24.481368+00', 'acme') \gset
UPDATE earmark.inbox_event SET status = 'processing' WHERE event_id = :tie;
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :tie;
SELECT plan FROM earmark.account WHERE account = 'acme';
