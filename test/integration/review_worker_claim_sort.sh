#!/usr/bin/env bash
# review (0ae1827): the worker's claim walks inbox_event_typed_due per
# handled type, the type matched by ">= AND <=" against inbox_handler's
# column (a join clause).  Its generic estimate is a fixed sliver of the
# due events (the default range selectivity), so with or without
# statistics the planner takes "Bitmap Heap Scan + Sort" for each type's
# walk: every pass reads and sorts ALL due events of each handled type to
# claim a batch of 10, and draining a backlog of B handled events costs
# O(B^2 / 10) (20,000 waiting: 42 ms a pass instead of 0.6 ms).
#  1. the plan (earmark_inbox_claim_plan(10, true)) over a handled backlog,
#     analyzed and never analyzed, has no sort below the LockRows;
#  2. what the worker reads to drain 5,000 handled events (index tuples of
#     inbox_event_typed_due per applied event) stays about constant.
source "$(dirname "$0")/tap.sh"
DB=review_worker_claim_sort
P="q -d $DB"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$P -c "CREATE EXTENSION earmark" >/dev/null

load() {   # load N: N events, half finished, a third of the type with a handler
    $P >/dev/null <<SQL
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, finished, verified_by)
SELECT 'rw', 'k' || g, (ARRAY['invoice.paid', 'customer.plan_changed', 'user.created'])[g % 3 + 1], '{}',
       '2026-10-01 00:00+00'::timestamptz + g * interval '1 s',
       CASE WHEN g % 2 = 0 THEN 'received' ELSE 'applied' END, g % 2 = 1, 'admin'
  FROM generate_series(1, $1) g;
SQL
}
walk() {   # the lines of the worker's plan under its per-type LockRows
    $P -c "SELECT * FROM earmark_inbox_claim_plan(10, true)" | sed -n '/LockRows/,/Index Scan using inbox_event_pkey/p'
}

load 60000
$P -c "ANALYZE earmark.inbox_event" >/dev/null
w=$(walk)
diag "$w"
ok "$(grep -qE 'Sort|Bitmap Heap Scan' <<<"$w"; echo $(( $? == 0 )))" \
   "analyzed, 10,000 handled events due: each type's walk is an ordered index walk cut by LIMIT (no Sort, no Bitmap)"

# never analyzed (a new database, as after a restore or pg_upgrade)
q -d postgres -c "DROP DATABASE $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$P -c "CREATE EXTENSION earmark" >/dev/null
load 60000
w=$(walk)
ok "$(grep -qE 'Sort|Bitmap Heap Scan' <<<"$w"; echo $(( $? == 0 )))" \
   "never analyzed: the same"
q -d postgres -c "DROP DATABASE $DB WITH (FORCE)" >/dev/null

# the worker (database postgres) draining 5,000 due events of a handled
# type (next to 5,000 of two application types and 15,000 finished), with
# statistics (ANALYZE invalidates its plan: the next pass plans anew)
DB=postgres
P="q -d postgres"
N=5000
$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
$P >/dev/null <<SQL
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
DROP FUNCTION IF EXISTS rw_note(earmark.inbox_event);
CREATE FUNCTION rw_note(e earmark.inbox_event) RETURNS text LANGUAGE sql AS \$\$ SELECT 'noted' \$\$;
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, finished, verified_by)
SELECT 'rw', 'k' || g, (ARRAY['rw.app1', 'rw.h', 'rw.app2'])[g % 3 + 1], '{}',
       '2026-10-01 00:00+00'::timestamptz + g * interval '1 s',
       CASE WHEN g % 2 = 0 THEN 'received' ELSE 'applied' END, g % 2 = 1, 'admin'
  FROM generate_series(1, $N * 6) g;
ANALYZE earmark.inbox_event;
SQL
sleep 1.5
r0=$($P -c "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = 'earmark.inbox_event_typed_due'::regclass")
$P -c "SELECT earmark_inbox_set_handler('rw.h', 'rw_note(earmark.inbox_event)')" >/dev/null
is "$(wait_for 180 "SELECT count(*) FROM earmark.inbox_event WHERE event_type = 'rw.h' AND status = 'applied'" $(( N * 2 )))" $(( N * 2 )) \
   "the worker applies the $N handled events (next to $N applied before)"
sleep 1.5
r1=$($P -c "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = 'earmark.inbox_event_typed_due'::regclass")
diag "index tuples of inbox_event_typed_due read to drain $N: $(( r1 - r0 ))"
ok "$(( r1 - r0 > 0 && r1 - r0 < N * 5 ? 0 : 1 ))" \
   "draining $N handled events reads a few index tuples per event, not the backlog at each pass ($(( r1 - r0 )) read)"

$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type = 'rw.h';
DROP FUNCTION rw_note(earmark.inbox_event);
SQL
done_testing
