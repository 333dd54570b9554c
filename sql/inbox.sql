-- The webhook inbox: store then answer, one row per (source, dedupe_key),
-- copies counted, SKIP LOCKED claims in event-time order with a lease,
-- complete / ignore / fail with backoff, dead after 6 attempts, replay for
-- the owning account only, and the built-in plan-change handler.
SET client_min_messages = warning;
SET timezone = 'UTC';
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event, earmark.meter_mark, earmark.ledger_entry,
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

------------------------------------------------------------------------------
-- Who may store what: verified and unverified events
------------------------------------------------------------------------------
-- Every event records how its source was verified: a signed intake
-- (standard_webhooks, kinde_jwt), a caller with earmark_admin's rights
-- (admin), or nobody (NULL).  The superuser here has every role's rights.
SELECT source, dedupe_key, verified_by FROM earmark.inbox_event WHERE dedupe_key IN ('wh-1', 'wh-2') ORDER BY 1, 2;

CREATE ROLE em_inbox_app IN ROLE earmark_user;
SELECT earmark_inbox_set_secret('billing', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SET ROLE em_inbox_app;
-- an application may store its own unverified events, for its own consumers
SELECT inserted FROM earmark_inbox_receive('app', 'note-1', 'customer.note', '{}', '2026-11-02 00:00+00', 'acme');
-- but not an event whose handler changes billing state, nor one under a
-- source that earmark verifies (kinde, or a source with a webhook secret)
\set VERBOSITY sqlstate
SELECT earmark_inbox_receive('app', 'forged-1', 'customer.plan_changed',
    '{"data": {"plan": {"key": "pro"}}}', '2026-11-03 00:00+00', 'acme');
SELECT earmark_inbox_receive('kinde', 'squat-1', 'customer.note', '{}', '2026-11-03 00:00+00', 'acme');
SELECT earmark_inbox_receive('billing', 'squat-2', 'customer.note', '{}', '2026-11-03 00:00+00', 'acme');
\set VERBOSITY default
SELECT earmark_inbox_receive('app', 'forged-1', 'customer.plan_changed',
    '{"data": {"plan": {"key": "pro"}}}', '2026-11-03 00:00+00', 'acme');
SELECT earmark_inbox_receive('kinde', 'squat-1', 'customer.note', '{}', '2026-11-03 00:00+00', 'acme');
RESET ROLE;
SELECT dedupe_key, verified_by, status FROM earmark.inbox_event
 WHERE dedupe_key IN ('note-1', 'forged-1', 'squat-1', 'squat-2') ORDER BY 1;

-- a handler registered as accepting unverified events takes them from
-- the application; the built-in plan change cannot be registered so
CREATE FUNCTION open_handler(e earmark.inbox_event) RETURNS text LANGUAGE sql AS $$ SELECT 'opened ' || e.dedupe_key $$;
SELECT earmark_inbox_set_handler('customer.opened', 'open_handler(earmark.inbox_event)', accepts_unverified => true);
SELECT earmark_inbox_set_handler('customer.audited', 'note_handler(earmark.inbox_event)');
SELECT event_type, handler, accepts_unverified FROM earmark.inbox_handler ORDER BY 1;
SET ROLE em_inbox_app;
SELECT inserted FROM earmark_inbox_receive('app', 'open-1', 'customer.opened', '{}', '2026-11-04 00:00+00', 'acme');
\set VERBOSITY sqlstate
SELECT earmark_inbox_receive('app', 'audit-1', 'customer.audited', '{}', '2026-11-04 00:00+00', 'acme');
\set VERBOSITY default
RESET ROLE;
\set VERBOSITY sqlstate
SELECT earmark_inbox_set_handler('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)', true);
\set VERBOSITY default
SELECT earmark_inbox_set_handler('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)', true);
SELECT earmark_inbox_set_handler('customer.opened', NULL);
SELECT earmark_inbox_set_handler('customer.audited', NULL);

-- the application finishes only the events its claims can return: the
-- worker's events (types with a handler) are not its to complete, ignore
-- or fail, so it cannot silence a genuine plan change either
SELECT event_id AS plan_evt FROM earmark_inbox_receive('kinde', 'wh-7', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2026-11-05 00:00+00', 'acme') \gset
SET ROLE em_inbox_app;
\set VERBOSITY sqlstate
SELECT earmark_inbox_ignore(:plan_evt, 'not today');
SELECT earmark_inbox_complete(:plan_evt);
SELECT earmark_inbox_fail(:plan_evt, 'no');
\set VERBOSITY default
SELECT earmark_inbox_ignore(:plan_evt, 'not today');
SELECT earmark_inbox_complete(event_id, 'noted by the app ' || dedupe_key) FROM earmark_inbox_claim(10);
RESET ROLE;
SELECT dedupe_key, status, result FROM earmark.inbox_event WHERE dedupe_key IN ('wh-7', 'note-1', 'open-1') ORDER BY 1;
-- (an event deleted by hand takes its receipts with it: no foreign key does)
WITH d AS (DELETE FROM earmark.inbox_event WHERE dedupe_key = 'wh-7' RETURNING event_id)
DELETE FROM earmark.inbox_receipt WHERE event_id IN (SELECT event_id FROM d);

-- an unverified plan change that is already stored (the built-in handler
-- was off while the application stored it) changes nothing: the built-in
-- ignores it, and says why
SELECT earmark_inbox_set_handler('customer.plan_changed', NULL);
SET ROLE em_inbox_app;
SELECT event_id AS unverified FROM earmark_inbox_receive('app', 'forged-2', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2026-11-06 00:00+00', 'acme') \gset
RESET ROLE;
SELECT earmark_inbox_set_handler('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)');
UPDATE earmark.inbox_event SET status = 'processing' WHERE event_id = :unverified;
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :unverified;
SELECT status, verified_by, result FROM earmark.inbox_event WHERE event_id = :unverified;
SELECT plan, lim FROM earmark.account JOIN earmark.account_limit USING (account) WHERE account = 'acme';

------------------------------------------------------------------------------
-- Event times from the future
------------------------------------------------------------------------------
-- an event time more than earmark.webhook_tolerance (300 s) ahead of the
-- clock is refused at intake: it would hold the plan-change guard shut
\set VERBOSITY sqlstate
SELECT earmark_inbox_receive('kinde', 'late-1', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2999-01-01 00:00+00', 'acme');
SELECT earmark_inbox_receive('kinde', 'late-2', 'customer.plan_changed',
    '{"event_timestamp": "2999-01-01T00:00:00Z", "data": {"plan": {"key": "free"}}}', NULL, 'acme');
SELECT earmark_inbox_receive('kinde', 'late-3', 'customer.note', '{}', now() + interval '301 seconds', 'acme');
\set VERBOSITY default
SELECT earmark_inbox_receive('kinde', 'late-1', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2999-01-01 00:00+00', 'acme');
-- within the allowance it is taken
SELECT inserted FROM earmark_inbox_receive('kinde', 'skew-1', 'customer.note', '{}', now() + interval '250 seconds', 'acme');
SELECT count(*) AS stored_from_the_future FROM earmark.inbox_event WHERE dedupe_key LIKE 'late-%';

-- a guard an older version let a forged event poison (a plan change dated
-- 2999 already stored) no longer holds back a genuine change
UPDATE earmark.account SET plan = 'forged', plan_changed_at = '2999-01-01 00:00+00' WHERE account = 'acme';
SELECT event_id AS genuine FROM earmark_inbox_receive('kinde', 'wh-8', 'customer.plan_changed',
    '{"data": {"plan": {"key": "free"}}}', '2026-11-07 00:00+00', 'acme') \gset
UPDATE earmark.inbox_event SET status = 'processing' WHERE event_id = :genuine;
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :genuine;
SELECT plan, plan_changed_at, lim FROM earmark.account JOIN earmark.account_limit USING (account) WHERE account = 'acme';
-- and a future-dated event an older version stored is ignored, with why
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, account, status, verified_by)
VALUES ('kinde', 'old-2999', 'customer.plan_changed', '{"data": {"plan": {"key": "pro"}}}', '2999-01-01 00:00+00',
        'acme', 'processing', 'kinde_jwt')
RETURNING event_id AS future \gset
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = :future;
SELECT status, result FROM earmark.inbox_event WHERE event_id = :future;
SELECT plan, plan_changed_at, lim FROM earmark.account JOIN earmark.account_limit USING (account) WHERE account = 'acme';
DROP ROLE em_inbox_app;

------------------------------------------------------------------------------
-- status, verified_by and finished: no CHECK constraint, the C code keeps them
------------------------------------------------------------------------------
-- every event the calls above stored, claimed and finished has a status,
-- a verified_by and a finished that agree with the rules
SELECT count(*) AS events,
       count(*) FILTER (WHERE status NOT IN ('received', 'processing', 'failed', 'applied', 'ignored', 'dead')
                           OR verified_by NOT IN ('standard_webhooks', 'kinde_jwt', 'admin')
                           OR finished <> (status IN ('applied', 'ignored', 'dead'))) AS breaking_a_rule,
       (SELECT count(*) FROM earmark.inbox_receipt r
         WHERE NOT EXISTS (SELECT 1 FROM earmark.inbox_event e WHERE e.event_id = r.event_id)) AS receipts_without_event,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts
  FROM earmark.inbox_event;
-- a status written by hand that earmark does not know: every call that
-- reads it refuses (XX001), and claims pass it over
SELECT event_id AS bogus FROM earmark_inbox_receive('kinde', 'bogus-1', 'customer.note', '{}',
    '2026-01-01 00:00+00', 'acme') \gset
UPDATE earmark.inbox_event SET status = 'procesing' WHERE event_id = :bogus;
SELECT earmark_inbox_complete(:bogus);
\set VERBOSITY sqlstate
SELECT earmark_inbox_fail(:bogus, 'x');
SELECT earmark_inbox_ignore(:bogus, 'x');
SELECT earmark_inbox_replay(:bogus, 'acme');
\set VERBOSITY default
SELECT count(*) AS claimed FROM earmark_inbox_claim(100) WHERE event_id = :bogus;
SELECT status FROM earmark.inbox_event WHERE event_id = :bogus;

------------------------------------------------------------------------------
-- Leases that passed, and what a claim writes
------------------------------------------------------------------------------
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
SELECT earmark_inbox_set_handler('test.worker', 'note_handler(earmark.inbox_event)');
-- leases that passed with attempts left, on the last attempt (an
-- application's event and the worker's), a lease still running, a new event
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, attempts,
                                 locked_until, verified_by)
VALUES ('lease', 'retry', 'test.app', '{}', '2026-10-01 00:01+00', 'processing', 2, now() - interval '1 s', 'admin'),
       ('lease', 'last', 'test.app', '{}', '2026-10-01 00:02+00', 'processing', 6, now() - interval '1 s', 'admin'),
       ('lease', 'worker-last', 'test.worker', '{}', '2026-10-01 00:03+00', 'processing', 6, now() - interval '1 s', 'admin'),
       ('lease', 'worker-retry', 'test.worker', '{}', '2026-10-01 00:04+00', 'processing', 3, now() - interval '1 s', 'admin'),
       ('lease', 'running', 'test.app', '{}', '2026-10-01 00:05+00', 'processing', 1, now() + interval '1 h', 'admin'),
       ('lease', 'new', 'test.app', '{}', '2026-10-01 00:06+00', 'received', 0, NULL, 'admin');
-- the claim takes back the application's passed lease and the new event;
-- the events whose lease passed on their 6th attempt, of either side, are
-- marked dead by the claim that meets them, and not returned
BEGIN;
SELECT pg_stat_get_xact_tuples_updated('earmark.inbox_event'::regclass) AS updated0,
       pg_stat_get_xact_tuples_hot_updated('earmark.inbox_event'::regclass) AS hot0 \gset
SELECT dedupe_key, status, attempts, locked_until > now() AS leased FROM earmark_inbox_claim(10);
-- a claim changes no indexed column: its two claims are HOT updates (no
-- index entry), the two burials are not (they leave the due index)
SELECT pg_stat_get_xact_tuples_updated('earmark.inbox_event'::regclass) - :updated0 AS updated,
       pg_stat_get_xact_tuples_hot_updated('earmark.inbox_event'::regclass) - :hot0 AS hot_updated;
COMMIT;
SELECT dedupe_key, status, attempts, locked_until IS NULL AS unleased, finished, last_error
  FROM earmark.inbox_event ORDER BY occurred_at;
-- buried once: nothing is left for the next claim
SELECT count(*) AS claimed_again FROM earmark_inbox_claim(10);
-- a claim whose whole batch was buried claims again: it returns no events
-- only when none is due (12 events abandoned 6 times before a due one)
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, attempts,
                                 locked_until, verified_by)
SELECT 'lease', 'gone-' || g, 'test.app', '{}', '2026-09-01 00:00+00'::timestamptz + g * interval '1 s',
       'processing', 6, now() - interval '1 s', 'admin'
  FROM generate_series(1, 12) g;
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, verified_by)
VALUES ('lease', 'behind', 'test.app', '{}', '2026-09-02 00:00+00', 'admin');
SELECT dedupe_key, attempts FROM earmark_inbox_claim(10);
SELECT status, count(*) FROM earmark.inbox_event WHERE dedupe_key LIKE 'gone-%' GROUP BY 1;
-- a completion is not a claim: it leaves the due index
SELECT earmark_inbox_complete(event_id) FROM earmark.inbox_event WHERE dedupe_key = 'new';
SELECT dedupe_key, status, finished FROM earmark.inbox_event WHERE dedupe_key = 'new';
SELECT earmark_inbox_set_handler('test.worker', NULL);
SELECT count(*) FILTER (WHERE finished <> (status IN ('applied', 'ignored', 'dead'))) AS finished_wrong
  FROM earmark.inbox_event;
