#!/usr/bin/env bash
# The worker's claim reads only events of types with a handler: a backlog
# of applications' events (types without a handler) is not walked at each
# of its passes (docs/inbox.md#earmark_inbox_claim).  Before, each pass
# walked inbox_event_due past every waiting application event: with
# 200,000 waiting, a tenth of a CPU core, all the time.  Measured as the index
# tuples the worker's passes read (pg_stat_user_indexes), with 20,000
# application events waiting and nothing else running in the database.
# The worker still takes its own events in event-time order across its
# handled types, an old one received behind the backlog among them, and
# still buries its events whose lease passed on their last attempt.  The
# worker runs without JIT: its claim's plan, estimated above
# jit_above_cost while inbox_handler has never been analyzed, was compiled
# again at every pass.
source "$(dirname "$0")/tap.sh"
P="q -d postgres"
BACKLOG=20000

$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
DROP TABLE IF EXISTS ww_applied;
DROP FUNCTION IF EXISTS ww_note(earmark.inbox_event);
CREATE TABLE ww_applied (n bigserial, event_id bigint, occurred_at timestamptz, jit text);
CREATE FUNCTION ww_note(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ww_applied (event_id, occurred_at, jit)
    VALUES (e.event_id, e.occurred_at, pg_catalog.current_setting('jit'));
    RETURN 'noted';
END $$;
SELECT earmark_inbox_set_handler('ww.a', 'ww_note(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('ww.b', 'ww_note(earmark.inbox_event)');
SQL

# the applications' backlog, as receive stores it (a keyed receipt each)
$P >/dev/null <<SQL
WITH e AS (
    INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, verified_by)
    SELECT 'ww', 'app-' || g, 'ww.app', '{}', '2026-11-01 00:00+00'::timestamptz + g * interval '1 s', 'admin'
      FROM generate_series(1, $BACKLOG) g
    RETURNING event_id, source, dedupe_key)
INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
SELECT event_id, true, source, dedupe_key FROM e;
SQL
$P -c "VACUUM ANALYZE earmark.inbox_event" >/dev/null

# index tuples read so far, each index of inbox_event (the worker's
# statistics reach the view within a second of its passes)
reads() {
    $P -c "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
            WHERE schemaname = 'earmark' AND relname = 'inbox_event' AND indexrelname = '$1'"
}
seq_reads() {
    $P -c "SELECT seq_tup_read FROM pg_stat_user_tables WHERE schemaname = 'earmark' AND relname = 'inbox_event'"
}

# a pass's claim is seen to run: one handled event applied before and after
$P -c "SELECT earmark_inbox_receive('ww', 'first', 'ww.a', '{}')" >/dev/null
is "$(wait_for 30 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'first'" applied)" applied \
   "the worker applies a handled event with $BACKLOG application events waiting"
sleep 1.5
due0=$(reads inbox_event_due)
typed0=$(reads inbox_event_typed_due)
seq0=$(seq_reads)
sleep 3
# (looked up by its id: a look-up by key would read the table)
ID=$($P -c "SELECT event_id FROM earmark_inbox_receive('ww', 'second', 'ww.b', '{}')")
is "$(wait_for 30 "SELECT status FROM earmark.inbox_event WHERE event_id = $ID" applied)" applied \
   "... and another, received after a few seconds of passes"
# the worker reports its statistics at most once a second, all it has
# pending at once: wait until its claim of 'second' (at least that event's
# entry of inbox_event_typed_due) has reached the view, and with it every
# pass before
deadline=$(wait_deadline 15)
while [ "$(reads inbox_event_typed_due)" -le "$typed0" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
due1=$(reads inbox_event_due)
typed1=$(reads inbox_event_typed_due)
seq1=$(seq_reads)
diag "index tuples read over about 15 passes (sweep every 200 ms): inbox_event_due $(( due1 - due0 )), inbox_event_typed_due $(( typed1 - typed0 )), inbox_event by sequential scans $(( seq1 - seq0 ))"
ok "$(( due1 - due0 < BACKLOG / 4 ? 0 : 1 ))" \
   "the worker's passes do not walk the applications' backlog ($(( due1 - due0 )) tuples of inbox_event_due read; one walk is $BACKLOG)"
ok "$(( typed1 - typed0 < 1000 && seq1 - seq0 < BACKLOG / 4 ? 0 : 1 ))" \
   "... nor read it another way ($(( typed1 - typed0 )) tuples of inbox_event_typed_due, $(( seq1 - seq0 )) by sequential scans)"
# (review: the counts above are only worth something if the worker's
# passes reach the view at all: its claim of 'second' read at least that
# event's entry of inbox_event_typed_due)
ok "$(( typed1 - typed0 > 0 ? 0 : 1 ))" \
   "... and the worker's reads are counted ($(( typed1 - typed0 )) tuples of inbox_event_typed_due over those passes)"
is "$($P -c "SELECT count(*) FROM earmark.inbox_event WHERE event_type = 'ww.app' AND status = 'received' AND attempts = 0")" \
   "$BACKLOG" "the applications' events are left to them, untouched"

# event time order across the handled types: 40 events, ww.a and ww.b
# alternating in event time, received newest first in one transaction,
# and one ww.b older than the whole backlog
$P >/dev/null <<'SQL'
BEGIN;
SELECT earmark_inbox_receive('ww', 'o-' || g, CASE WHEN g % 2 = 0 THEN 'ww.a' ELSE 'ww.b' END, '{}',
                             '2026-11-05 00:00+00'::timestamptz + g * interval '1 min')
  FROM generate_series(40, 1, -1) g;
SELECT earmark_inbox_receive('ww', 'oldest', 'ww.b', '{}', '2026-10-01 00:00+00');
COMMIT;
SQL
got=$(wait_for 60 "SELECT count(*) FROM earmark.inbox_event WHERE dedupe_key LIKE 'o%' AND status = 'applied'" 41)
is "$got" 41 "the worker applies all 41 events of its two types"
is "$($P -c "SELECT (SELECT array_agg(event_id ORDER BY n) FROM ww_applied WHERE event_id IN (
                         SELECT event_id FROM earmark.inbox_event WHERE dedupe_key LIKE 'o%'))
                  = (SELECT array_agg(event_id ORDER BY occurred_at, event_id) FROM earmark.inbox_event
                      WHERE dedupe_key LIKE 'o%')")" t \
   "... in event time order across both types, the one older than the backlog first"

is "$($P -c "SELECT string_agg(DISTINCT jit, ',') FROM ww_applied")" off \
   "the worker (its handlers' session) runs with jit off, whatever the server's setting"

# a handled event abandoned on its last attempt is buried by the worker's
# claim; an application's is left for an application's claim
$P >/dev/null <<'SQL'
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at,
                                 status, attempts, locked_until, verified_by)
VALUES ('ww', 'gone-a', 'ww.a', '{}', '2026-10-02 00:00+00', 'processing', 6,
        clock_timestamp() - interval '1 hour', 'admin'),
       ('ww', 'gone-app', 'ww.app', '{}', '2026-10-02 00:00+00', 'processing', 6,
        clock_timestamp() - interval '1 hour', 'admin');
SQL
is "$(wait_for 30 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'gone-a'" dead)" dead \
   "the worker buries its own event whose lease passed on the last attempt"
is "$($P -c "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'gone-app'")" processing \
   "... and leaves an application's to the applications' claims"
is "$($P -c "SELECT count(*) FROM earmark_inbox_claim(1, '1 minute')" -c "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'gone-app'")" \
   "$(printf '1\ndead')" "... whose next claim buries it and returns one event of the backlog"

$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type LIKE 'ww.%';
DROP TABLE ww_applied;
DROP FUNCTION ww_note(earmark.inbox_event);
SQL
done_testing
