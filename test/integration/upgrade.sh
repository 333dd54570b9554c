#!/usr/bin/env bash
# Upgrades and backups, each in databases of its own (the worker's
# database is not touched):
# - ALTER EXTENSION earmark UPDATE from 0.1.0 (the first release) to the
#   current version with 0.1.0-era data in place: the schema is then exactly
#   a fresh install's (a normalised pg_dump --binary-upgrade --schema-only of both,
#   and the tables pg_dump keeps), every row is still there, and the gate,
#   the sweeper, the usage ledger, the inbox, the reporter and the
#   reconciler work on the old rows with earmark_check() clean.  The
#   inbox's key moves to each event's first receipt (one is written for an
#   event that had none), and a redelivery of an old event is a copy.  The data
#   is written by INSERTs as the superuser: the installed earmark.so is
#   the current version's and expects its tables.
# - pg_dump / pg_restore: the billing state is in the dump (its tables are
#   registered with pg_extension_config_dump) and comes back with CREATE
#   EXTENSION: the same rows and sequence positions, new ids after the old
#   ones, the same earmark_budget numbers, earmark_check() clean.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
OLD=earmark_up_from_010
FRESH=earmark_up_fresh
RESTORED=earmark_up_restored
WORK=$(mktemp -d /tmp/earmark-upgrade.XXXXXX)
chmod 755 "$WORK"

drop_dbs() {
    local db
    for db in "$OLD" "$FRESH" "$RESTORED"; do
        q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    done
}
cleanup() {
    drop_dbs
    rm -rf "$WORK"
}
trap cleanup EXIT
drop_dbs

# colsets DB: "table<TAB>column list" of every table of schema earmark
# (without the columns a later version dropped on purpose: account.rate_tat,
# the rate limit's state, which 0.3.0 keeps in shared memory)
colsets() {
    q -d "$1" -F $'\t' -c "
        SELECT c.relname, string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
         WHERE n.nspname = 'earmark' AND c.relkind = 'r'
           AND (c.relname, a.attname) <> ('account', 'rate_tat')
         GROUP BY c.relname ORDER BY c.relname"
}
# sums DB COLSETS: "table|rows|md5 of the sorted rows" over those columns
sums() {
    local db=$1 sql="" t cols
    while IFS=$'\t' read -r t cols; do
        [ -n "$sql" ] && sql+=" UNION ALL "
        sql+="SELECT '$t', count(*), md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), ''))
                FROM (SELECT $cols FROM earmark.$t) r"
    done <<<"$2"
    q -d "$db" -c "$sql ORDER BY 1"
}
# schema DB: what the extension made, without OIDs, xids, the database name
# and the columns an update dropped (a dropped column keeps its place in the
# table's storage; pg_dump --binary-upgrade shows it)
schema() {
    "$EM_PGBIN/pg_dump" --binary-upgrade --schema-only -d "$1" | sed -E \
        -e '/binary_upgrade_set_next_/d' -e '/^\\(un)?restrict /d' -e '/relfrozenxid/d' \
        -e '/pg\.dropped\./d' -e '/^-- For binary upgrade, recreate dropped column\./d' \
        -e '/^UPDATE pg_catalog\.pg_attribute$/,/attrelid = .*;$/d' \
        -e "/^WHERE oid = '[0-9]+';/d" -e '/^SELECT pg_catalog.setval\(/d' \
        -e "s/(binary_upgrade_create_empty_extension\('earmark', '[^']*', [a-z]+, '[^']*'), '\{[0-9,]*\}'/\1, '{OIDS}'/" \
        -e "s/\\b$1\\b/DBNAME/g" | cat -s
}
# config DB: the tables and sequences pg_dump keeps, with their filters
config() {
    q -d "$1" -c "
        SELECT string_agg(c.rel::regclass::text || coalesce(' ' || nullif(c.cond, ''), ''), ', '
                          ORDER BY c.rel::regclass::text)
          FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS c (rel, cond)
         WHERE e.extname = 'earmark'"
}
# budgets DB: earmark_budget of every account and feature that has a limit
budgets() {
    q -d "$1" -c "
        SELECT string_agg(format('%s/%s: %s', l.account, l.feature, b), '; ' ORDER BY l.account, l.feature)
          FROM earmark.account_limit l, earmark_budget(l.account, l.feature) b"
}
# check DB: earmark_check() in one snapshot ('' when the books are sound)
check() {
    q -d "$1" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
      -c "SELECT string_agg(invariant || ': ' || detail, '; ') FROM earmark_check()" -c "COMMIT"
}

is "$(q -d postgres -c "SHOW earmark.provider")" local "the cluster uses the local provider"
is "$(q -d postgres -c "SELECT default_version || ' ' || (SELECT string_agg(version, ',' ORDER BY version)
                                                            FROM pg_available_extension_versions WHERE name = 'earmark')
                        FROM pg_available_extensions WHERE name = 'earmark'")" \
   "0.3.0 0.1.0,0.2.0,0.3.0" "0.3.0 is the default version; 0.1.0 and 0.2.0 can still be installed"
is "$(q -d postgres -c "SELECT string_agg(source || '->' || target, ',' ORDER BY source, target) FROM pg_extension_update_paths('earmark')
                        WHERE path IS NOT NULL")" "0.1.0->0.2.0,0.1.0->0.3.0,0.2.0->0.3.0" "update paths lead from 0.1.0 and 0.2.0 to 0.3.0"

# --- 0.1.0 with its data -------------------------------------------------------
q -d postgres -c "CREATE DATABASE $OLD" -c "CREATE DATABASE $FRESH" >/dev/null
q -d "$OLD" -c "CREATE EXTENSION earmark VERSION '0.1.0'" >/dev/null
ok $? "CREATE EXTENSION earmark VERSION '0.1.0'"
is "$(q -d "$OLD" -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'")" 0.1.0 "the old database is at 0.1.0"

# What 0.1.0's functions would have left: accounts, limits and plans,
# budgets of the current calendar-month cycle, a closed cycle, and an
# anchored account's closed cycle; jobs settled every way, open and past
# their lease; a ledger row per settled job that used something, a meter
# mark per cycle with a ledger row (0.1.0 never reported); inbox events,
# a copy's receipt, an event without receipts (deleted by hand) and one
# with only a copy's receipt, a secret and a cached key set.
q -d "$OLD" >/dev/null <<'SQL'
CREATE TEMP TABLE cyc AS
SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS cs,
       (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC' AS ce,
       (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month') AT TIME ZONE 'UTC' AS ps;
CREATE FUNCTION pg_temp.bid(a text, f text, s timestamptz) RETURNS bigint LANGUAGE sql AS
    $$ SELECT budget_id FROM earmark.budget WHERE account = a AND feature = f AND cycle_start = s $$;

INSERT INTO earmark.account (account, cycle_anchor, provider_customer, provider_agreement, rate_tat,
                             plan, plan_changed_at, created_at, updated_at) VALUES
    ('acme', NULL, 'cus_acme', 'agr_acme', now(), 'pro', now() - interval '30 days',
     now() - interval '90 days', now() - interval '30 days'),
    ('beta', '2024-01-10 00:00:00+00', 'cus_beta', NULL, NULL, NULL, NULL, now() - interval '900 days', now()),
    ('gamma', NULL, NULL, NULL, NULL, NULL, NULL, now(), now());
INSERT INTO earmark.account_limit (account, feature, lim, source) VALUES
    ('acme', 'default', 10000, 'manual'), ('acme', 'images', NULL, 'manual'), ('beta', 'default', 500, 'manual');
INSERT INTO earmark.plan_limit VALUES ('pro', 'default', 10000), ('team', 'default', 2000);

INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end)
SELECT 'acme', 'default', cs, ce FROM cyc UNION ALL
SELECT 'acme', 'images', cs, ce FROM cyc UNION ALL
SELECT 'acme', 'default', ps, cs FROM cyc UNION ALL
SELECT 'beta', 'default', '2024-03-10 00:00:00+00', '2024-04-10 00:00:00+00';

INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, used, last_step, status,
                         lease, lease_until, created_at, settled_at, charged, released)
SELECT pg_temp.bid('acme', 'default', cs), 'acme', 'default', k, amount, used, step, status,
       lease, now() + until, now() - interval '2 hours', settled, charged, released
  FROM cyc, (VALUES
    ('j-done',    1000, 700, 3,    'completed', interval '5 min',  interval '-1 hour', now() - interval '1 hour', 700, 300),
    ('j-failed',   600, 500, NULL, 'failed',    interval '5 min',  interval '-1 hour', now() - interval '1 hour', 500, 100),
    ('j-cancel',   100,   0, NULL, 'cancelled', interval '5 min',  interval '-1 hour', now() - interval '1 hour', 0,   100),
    ('j-expired',   50,   0, NULL, 'expired',   interval '5 min',  interval '-1 hour', now() - interval '1 hour', 0,    50),
    ('j-open',     300,  50, 1,    'running',   interval '1 hour', interval '1 hour',  NULL::timestamptz, NULL, NULL),
    ('j-stale',    200, 200, 2,    'capped',    interval '1 min',  interval '-10 min', NULL, NULL, NULL)
  ) AS j (k, amount, used, step, status, lease, until, settled, charged, released);
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, used, status,
                         lease, lease_until, created_at, settled_at, charged, released)
SELECT pg_temp.bid('acme', 'images', cs), 'acme', 'images', 'j-img', 100, 40, 'completed',
       interval '5 min', now(), now() - interval '1 hour', now() - interval '30 min', 40, 60 FROM cyc UNION ALL
SELECT pg_temp.bid('acme', 'default', ps), 'acme', 'default', 'j-old', 900, 900, 'completed',
       interval '5 min', ps + interval '2 days', ps + interval '1 day', ps + interval '1 day', 900, 0 FROM cyc UNION ALL
SELECT pg_temp.bid('beta', 'default', '2024-03-10 00:00:00+00'), 'beta', 'default', 'j-beta', 300, 250, 'completed',
       interval '5 min', '2024-03-12', '2024-03-11', '2024-03-11', 250, 50;

-- 0.1.0's settlements: a ledger row when something was charged, the mark
INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)
SELECT budget_id, charged, job_id, settled_at FROM earmark.job WHERE charged > 0 ORDER BY job_id;
INSERT INTO earmark.meter_mark (budget_id, marked_at)
SELECT budget_id, min(recorded_at) FROM earmark.ledger GROUP BY budget_id;
UPDATE earmark.budget b
   SET used = coalesce((SELECT sum(charged) FROM earmark.job j WHERE j.budget_id = b.budget_id AND j.charged IS NOT NULL), 0),
       held = coalesce((SELECT sum(amount) FROM earmark.job j WHERE j.budget_id = b.budget_id
                         AND j.status IN ('running', 'capped')), 0);

INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, account, status,
                                 attempts, seen_count, result, received_at)
VALUES ('kinde', 'evt-1', 'customer.plan_changed', '{"data": {"plan": {"key": "pro"}}}', now() - interval '30 days',
        'acme', 'applied', 1, 2, 'plan set to pro', now() - interval '30 days'),
       ('kinde', 'evt-2', 'customer.plan_changed', '{"data": {"plan": {"key": "team"}}}', now() - interval '1 hour',
        'beta', 'received', 0, 1, NULL, now() - interval '1 hour'),
       ('app', 'inv-0', 'invoice.paid', '{"id": 0}', now() - interval '2 hours',
        'acme', 'received', 0, 1, NULL, now() - interval '2 hours'),
       ('app', 'inv-bare', 'invoice.paid', '{"id": -1}', now() - interval '3 days',
        'acme', 'applied', 1, 1, 'paid', now() - interval '3 days'),
       ('app', 'inv-copied', 'invoice.paid', '{"id": -2}', now() - interval '4 days',
        'acme', 'applied', 1, 2, 'paid', now() - interval '4 days');
INSERT INTO earmark.inbox_receipt (event_id, inserted)
SELECT event_id, true FROM earmark.inbox_event WHERE dedupe_key NOT IN ('inv-bare', 'inv-copied') UNION ALL
SELECT event_id, false FROM earmark.inbox_event WHERE dedupe_key IN ('evt-1', 'inv-copied');
INSERT INTO earmark.webhook_secret (source, secret) VALUES ('kinde', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
INSERT INTO earmark.jwks VALUES ('https://example.kinde.com/.well-known/jwks', '{"keys": []}', now());
SQL
ok $? "0.1.0-era data written"

OLDCOLS=$(colsets "$OLD")
before=$(sums "$OLD" "$OLDCOLS")
is "$(echo "$before" | cut -d'|' -f1,2 | tr '|\n' '= ' | sed 's/ $//')" \
   "account=3 account_limit=3 budget=4 budget_slot=0 inbox_event=5 inbox_handler=1 inbox_receipt=5 job=9 jwks=1 ledger=5 meter_mark=4 plan_limit=2 webhook_secret=1" \
   "the 0.1.0 tables hold the rows written"
MAX_RECEIPT=$(q -d "$OLD" -c "SELECT max(receipt_id) FROM earmark.inbox_receipt")

# --- the update ------------------------------------------------------------------
q -d "$OLD" -c "ALTER EXTENSION earmark UPDATE TO '0.2.0'" -c "ALTER EXTENSION earmark UPDATE TO '0.3.0'" >/dev/null
ok $? "ALTER EXTENSION earmark UPDATE TO '0.2.0', then TO '0.3.0', with data in place"
is "$(q -d "$OLD" -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'")" 0.3.0 "extversion is 0.3.0"

q -d "$FRESH" -c "CREATE EXTENSION earmark" >/dev/null
schema "$OLD" >"$WORK/updated.sql"
schema "$FRESH" >"$WORK/fresh.sql"
diff -u "$WORK/fresh.sql" "$WORK/updated.sql" >"$WORK/schema.diff"
ok $? "the updated schema is exactly a fresh 0.3.0 install's (tables, columns in order, defaults, constraints, indexes, triggers, functions, views, privileges, extension members)"
[ -s "$WORK/schema.diff" ] && sed 's/^/# /' "$WORK/schema.diff" | head -80
n_tables=$(grep -c '^CREATE TABLE earmark\.' "$WORK/fresh.sql")
n_functions=$(grep -c '^CREATE FUNCTION' "$WORK/fresh.sql")
n_views=$(grep -c '^CREATE VIEW' "$WORK/fresh.sql")
ok "$(( n_tables >= 19 && n_functions >= 31 && n_views >= 3 ? 0 : 1 ))" \
   "... compared over $n_tables tables, $n_functions functions and $n_views views"
is "$(config "$OLD")" "$(config "$FRESH")" "the same tables, sequences and filters are registered for pg_dump"

after=$(sums "$OLD" "$OLDCOLS")
is "$(echo "$after" | grep -v '^inbox_receipt|')" "$(echo "$before" | grep -v '^inbox_receipt|')" \
   "every 0.1.0 row is still there, unchanged (row counts and checksums of every table)"
# the receipts: the old ones unchanged in their old columns, and one more,
# for inv-bare, which had none
RCOLS=$(echo "$OLDCOLS" | awk -F'\t' '$1 == "inbox_receipt" { print $2 }')
is "$(q -d "$OLD" -c "SELECT 'inbox_receipt', count(*), md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), ''))
                        FROM (SELECT $RCOLS FROM earmark.inbox_receipt WHERE receipt_id <= $MAX_RECEIPT) r")" \
   "$(echo "$before" | grep '^inbox_receipt|')" "... the old receipts too"
is "$(q -d "$OLD" -c "SELECT count(*) || ' ' || string_agg(e.dedupe_key || ' ' || r.inserted || ' ' || (r.received_at = e.received_at), ',' ORDER BY e.dedupe_key)
                        FROM earmark.inbox_receipt r JOIN earmark.inbox_event e USING (event_id)
                       WHERE r.receipt_id > $MAX_RECEIPT")" \
   "2 inv-bare true true,inv-copied true true" \
   "the update wrote a first receipt, dated at the event's arrival, for the two events that had none (inv-bare: no receipt; inv-copied: a copy's only)"
# the key: on each event's first receipt with inserted, on no other
is "$(q -d "$OLD" -c "
        SELECT string_agg(e.dedupe_key || ':' || (
                   SELECT string_agg(CASE WHEN r.dedupe_key IS NULL THEN 'none'
                                          WHEN (r.source, r.dedupe_key) = (e.source, e.dedupe_key) THEN 'key'
                                          ELSE 'other' END || '/' || r.inserted, ',' ORDER BY r.receipt_id)
                     FROM earmark.inbox_receipt r WHERE r.event_id = e.event_id), ' ' ORDER BY e.dedupe_key)
          FROM earmark.inbox_event e")" \
   "evt-1:key/true,none/false evt-2:key/true inv-0:key/true inv-bare:key/true inv-copied:none/false,key/true" \
   "each event's key is on its first receipt with inserted (written by the update where there was none), a copy's receipt has none"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.inbox_receipt WHERE dedupe_key IS NOT NULL AND source IS NULL
                                 OR source IS NOT NULL AND dedupe_key IS NULL")" 0 "... source and dedupe_key together or neither"
is "$(colsets "$OLD" | grep '^inbox_receipt' | cut -f2)" "receipt_id, event_id, inserted, received_at, source, dedupe_key" \
   "inbox_receipt's columns after the update, in order"
is "$(q -d "$OLD" -c "SELECT relreplident::text || ' ' || (SELECT count(*) FROM pg_index WHERE indrelid = 'earmark.inbox_receipt'::regclass AND indisprimary)
                      FROM pg_class WHERE oid = 'earmark.inbox_receipt'::regclass")" "d 1" \
   "... and its primary key, the replica identity a publication's update or delete of a receipt logs and a subscriber finds the row by"
is "$(q -d "$OLD" -c "SELECT count(*) FROM pg_extension, unnest(extconfig) x WHERE extname = 'earmark' AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x)")" 0 \
   "... and the extension's configuration names no dropped relation"
is "$(colsets "$OLD" | grep -E '^inbox_(event|receipt)')" "$(colsets "$FRESH" | grep -E '^inbox_(event|receipt)')" \
   "... the same as a fresh install's, and inbox_event's too"
is "$(q -d "$OLD" -c "SELECT string_agg(indexname || ': ' || indexdef, '; ' ORDER BY indexname) FROM pg_indexes
                       WHERE schemaname = 'earmark' AND tablename IN ('inbox_event', 'inbox_receipt')")" \
   "$(q -d "$FRESH" -c "SELECT string_agg(indexname || ': ' || indexdef, '; ' ORDER BY indexname) FROM pg_indexes
                       WHERE schemaname = 'earmark' AND tablename IN ('inbox_event', 'inbox_receipt')")" \
   "the inbox's indexes after the update are a fresh install's"
is "$(q -d "$OLD" -c "SELECT indexdef FROM pg_indexes WHERE schemaname = 'earmark' AND indexname = 'inbox_receipt_key'")" \
   "CREATE UNIQUE INDEX inbox_receipt_key ON earmark.inbox_receipt USING btree (dedupe_key, source) WHERE (dedupe_key IS NOT NULL)" \
   "... among them inbox_receipt_key, the key's"
is "$(q -d "$OLD" -c "SELECT count(*) FROM pg_indexes WHERE schemaname = 'earmark' AND tablename = 'inbox_event'
                                                    AND indexdef LIKE '%dedupe_key%'")" 0 \
   "... and no index of inbox_event holds the key any more"
is "$(q -d "$OLD" -c "SELECT count(*) FILTER (WHERE l.account = j.account) || '/' || count(*)
                      FROM earmark.ledger l LEFT JOIN earmark.job j ON j.job_id = l.job_id")" \
   "5/5" "the old ledger rows are job rows that now carry their job's account, as 0.3.0 writes them"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.account WHERE num_nonnulls(limits_fetched_at, limits_wanted_at, limits_tried_at, limits_error) > 0")" \
   0 "the limit cache starts empty"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.reporter_state")" 1 "the reporter's state row exists"
# the one finding right after the update: the 0.1.0 hold whose lease ended
# ten minutes ago and that nothing swept in this database (earmark_check's
# overdue_hold, new in 0.3.0); the sweeper below settles it
STALE=$(q -d "$OLD" -c "SELECT job_id FROM earmark.job WHERE idempotency_key = 'j-stale'")
is "$(q -d "$OLD" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
        -c "SELECT string_agg(invariant || ' ' || account || ' ' || split_part(detail, ',', 1), '; ' ORDER BY invariant)
              FROM earmark_check()" -c "COMMIT")" \
   "overdue_hold acme job $STALE is capped" \
   "earmark_check() right after the update: only the old hold past its lease, not swept yet (overdue_hold)"

# --- the gate on the old rows ----------------------------------------------------------
B1=$(q -d "$OLD" -c "SELECT budget_id FROM earmark.job WHERE idempotency_key = 'j-open'")
is "$(q -d "$OLD" -c "SELECT used || ' ' || held || ' ' || remaining || ' ' || limit_state FROM earmark_budget('acme')")" \
   "1200 500 8300 manual" "earmark_budget reads the old cycle's numbers"
is "$(q -d "$OLD" -c "SELECT admitted || ' ' || remaining FROM earmark_reserve('acme', 1000, 'up-new-1')")" \
   "true 7300" "reserve admits against the old cycle (1200 used, 500 held of 10000)"
is "$(q -d "$OLD" -c "SELECT budget_id FROM earmark.job WHERE idempotency_key = 'up-new-1'")" "$B1" \
   "... into the old budget row"
is "$(q -d "$OLD" -c "SELECT earmark_sweep(1000)")" 1 "the sweeper expires the old hold past its lease"
is "$(q -d "$OLD" -c "SELECT status || ' ' || charged FROM earmark.job WHERE idempotency_key = 'j-stale'")" \
   "expired 200" "... at the use it recorded"
is "$(q -d "$OLD" -c "SELECT admitted || ' ' || reason FROM earmark_reserve('acme', 8000, 'up-too-big')")" \
   "false the job needs 8000 and 7300 is left" "reserve refuses what the old usage leaves no room for"
OPEN=$(q -d "$OLD" -c "SELECT job_id FROM earmark.job WHERE idempotency_key = 'j-open'")
is "$(q -d "$OLD" -c "SELECT charged || ' ' || capped || ' ' || status FROM earmark_charge('acme', $OPEN, 70)")" \
   "70 false running" "an old open job takes a charge"
is "$(q -d "$OLD" -c "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('acme', $OPEN)")" \
   "120 180 completed" "... and settles at its recorded use (50 before the update, 70 after)"
is "$(q -d "$OLD" -c "SELECT earmark_record_usage('acme', 30, 'rec-1')")" t "record_usage writes a keyed row"
is "$(q -d "$OLD" -c "SELECT earmark_record_usage('acme', 30, 'rec-1')")" f "... once per key"
is "$(q -d "$OLD" -c "SELECT account || ' ' || units FROM earmark.ledger WHERE entry_key = 'rec-1'")" \
   "acme 30" "... with its account"
is "$(q -d "$OLD" -c "SELECT used || ' ' || held || ' ' || remaining FROM earmark_budget('acme')")" \
   "1550 1000 7450" "earmark_budget: old and new usage together (1200 + 200 expired + 120 settled + 30 recorded)"
# 0.3.0 writes no ledger row for a settled job: the job row is the entry
# (the view earmark.ledger); the jobs 0.1.0 settled count through their
# rows, once each
is "$(q -d "$OLD" -c "SELECT string_agg(j.idempotency_key || ' ' || l.units || ' ' || (l.entry_id IS NULL), ', ' ORDER BY j.idempotency_key)
                      FROM earmark.ledger l JOIN earmark.job j USING (account, job_id)
                     WHERE j.idempotency_key IN ('j-open', 'j-stale', 'j-done')")" \
   "j-done 700 false, j-open 120 true, j-stale 200 true" \
   "the ledger: an old job's row (j-done), and the settlement and the expiry after the update as their job rows"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.ledger_entry WHERE job_id IS NOT NULL")" 5 \
   "... which wrote no row of earmark.ledger_entry (the 5 of 0.1.0 are all there is)"
is "$(q -d "$OLD" -c "SELECT count(*) FROM (SELECT job_id FROM earmark.ledger WHERE job_id IS NOT NULL
                                            GROUP BY account, job_id HAVING count(*) > 1) d")" 0 \
   "no job counts twice in the ledger"
is "$(q -d "$OLD" -c "SELECT coalesce(string_agg(invariant || ' ' || detail, '; '), 'none') FROM earmark_check()
                      WHERE invariant IN ('used_mismatch', 'settled_twice', 'open_job_settled', 'key_twice')")" \
   none "earmark_check(): the counters match the ledger, old rows and new job entries together"

# the inbox: an application claims and completes its old event; the
# built-in handler (the worker's, in the worker's database) applies an old
# plan change
E0=$(q -d "$OLD" -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'inv-0'")
E2=$(q -d "$OLD" -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'evt-2'")
is "$(q -d "$OLD" -c "SELECT string_agg(event_id || ' ' || attempts, ',') FROM earmark_inbox_claim(10)")" "$E0 1" \
   "an application claims the old received event"
is "$(q -d "$OLD" -c "SELECT earmark_inbox_complete($E0, 'paid')")" applied "... and completes it"
# redeliveries of the old events are copies: their keys came through the
# update, on the first receipt or, where there was none, on a new one
E1=$(q -d "$OLD" -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'evt-1'")
EB=$(q -d "$OLD" -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'inv-bare'")
EC=$(q -d "$OLD" -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'inv-copied'")
is "$(q -d "$OLD" -c "SELECT event_id || ' ' || inserted FROM earmark_inbox_receive('kinde', 'evt-1', 'customer.plan_changed', '{}')")" \
   "$E1 false" "a redelivery of an event stored before the update is a copy of it (inserted false)"
is "$(q -d "$OLD" -c "SELECT seen_count || ' ' || status || ' ' || (SELECT count(*) FROM earmark.inbox_receipt r WHERE r.event_id = e.event_id)
                      FROM earmark.inbox_event e WHERE event_id = $E1")" \
   "3 applied 3" "... its seen_count one up (2 to 3), a third receipt, nothing else changed"
is "$(q -d "$OLD" -c "SELECT string_agg(event_id || ' ' || inserted, ',') FROM (
                        SELECT * FROM earmark_inbox_receive('app', 'inv-bare', 'invoice.paid', '{}', NULL, 'acme') UNION ALL
                        SELECT * FROM earmark_inbox_receive('app', 'inv-copied', 'invoice.paid', '{}', NULL, 'acme')) c")" \
   "$EB false,$EC false" "the events that had no first receipt before the update kept their keys: their redeliveries are copies"
is "$(q -d "$OLD" -c "SELECT string_agg(dedupe_key || ' ' || seen_count, ',' ORDER BY dedupe_key) FROM earmark.inbox_event
                       WHERE dedupe_key IN ('inv-bare', 'inv-copied')")" \
   "inv-bare 2,inv-copied 3" "... each seen once more"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.inbox_event")" 5 "... and no event was added"
is "$(q -d "$OLD" -c "SELECT coalesce(verified_by, 'unverified') FROM earmark.inbox_event WHERE event_id = $E2")" \
   unverified "an event stored before 0.3.0 is unverified (0.2.0 did not record how it came)"
is "$(q -d "$OLD" -c "UPDATE earmark.inbox_event SET verified_by = 'admin' WHERE event_id = $E2" \
                 -c "SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE event_id = $E2")" \
   "plan set to team" "the built-in handler applies an old plan change a superuser vouched for"
is "$(q -d "$OLD" -c "SELECT a.plan || ' ' || l.lim FROM earmark.account a
                      JOIN earmark.account_limit l ON l.account = a.account AND l.feature = 'default'
                      WHERE a.account = 'beta'")" "team 2000" "... and beta has the team plan's limit"

# the reporter: 0.1.0's marks are sent (open cycles) or listed (closed ones)
is "$(q -d "$OLD" -c "SELECT earmark_report()")" 2 "the first report sends the two open marked cycles"
is "$(q -d "$OLD" -c "SELECT string_agg(feature || '=' || total, ' ' ORDER BY feature) FROM earmark.local_meter WHERE account = 'acme'")" \
   "default=1550 images=40" "... their absolute totals"
is "$(q -d "$OLD" -c "SELECT string_agg(account || ':' || ledger_total, ' ' ORDER BY account) FROM earmark.review_list")" \
   "acme:900 beta:250" "the closed cycles 0.1.0 marked wait on the review list"
is "$(q -d "$OLD" -c "SELECT count(*) FROM earmark.meter_mark")" 0 "no mark is left"
is "$(q -d "$OLD" -c "SELECT verdict || ' ' || ledger_total || ' ' || provider_total FROM earmark_reconcile('acme', 'default') WHERE budget_id = $B1")" \
   "match 1550 1550" "reconcile on the updated data: match"
is "$(check "$OLD")" "" "earmark_check() is clean after the gate, sweeper, ledger, reporter and reconciler ran"

# --- pg_dump and pg_restore ------------------------------------------------------
# more 0.2.0 state: an escrow budget with slots, a handler of the
# application's own (dumped) beside the built-in one (not dumped), an
# event it received
q -d "$OLD" >/dev/null <<'SQL'
SELECT earmark_set_limit('hot', 1000);
SELECT earmark_set_escrow('hot', 4);
SELECT r.admitted FROM generate_series(1, 3) i, earmark_reserve('hot', 100, 'h' || i) r;
SELECT status FROM earmark_settle('hot', (SELECT job_id FROM earmark.job WHERE account = 'hot' AND idempotency_key = 'h1'), 60);
SELECT earmark_set_plan_limit('enterprise', NULL);
CREATE FUNCTION public.upgrade_test_handler(e earmark.inbox_event) RETURNS text LANGUAGE sql AS $$ SELECT 'noted' $$;
SELECT earmark_inbox_set_handler('invoice.paid', 'public.upgrade_test_handler(earmark.inbox_event)');
SELECT * FROM earmark_inbox_receive('app', 'inv-1', 'invoice.paid', '{"id": 1}', NULL, 'acme');
SELECT earmark_record_usage('hot', 5, 'rec-hot');
SQL
ok $? "0.2.0 state added: escrow slots, a plan, a handler, an event, keyed usage"
is "$(q -d "$OLD" -c "SELECT count(*) > 0 FROM earmark.budget_slot")" t "... the escrow budget has slot rows"

NEWCOLS=$(colsets "$OLD")
src_sums=$(sums "$OLD" "$NEWCOLS")
src_seqs=$(q -d "$OLD" -c "SELECT string_agg(sequencename || '=' || coalesce(last_value::text, '-'), ' ' ORDER BY sequencename)
                          FROM pg_sequences WHERE schemaname = 'earmark'")
src_budgets=$(budgets "$OLD")
src_handlers=$(q -d "$OLD" -c "SELECT string_agg(event_type || '=' || handler::text, ' ' ORDER BY event_type) FROM earmark.inbox_handler")
src_max_job=$(q -d "$OLD" -c "SELECT max(job_id) FROM earmark.job")
src_job=$(q -d "$OLD" -c "SELECT job_id FROM earmark.job WHERE idempotency_key = 'up-new-1'")

"$EM_PGBIN/pg_dump" -Fc -d "$OLD" -f "$WORK/earmark.dump" 2>"$WORK/dump.err"
ok $? "pg_dump -Fc of the database with data"
[ -s "$WORK/dump.err" ] && sed 's/^/# /' "$WORK/dump.err"
"$EM_PGBIN/pg_restore" -l "$WORK/earmark.dump" >"$WORK/toc"
is "$(grep -c 'TABLE DATA earmark ' "$WORK/toc")" 17 "the dump holds the rows of the 17 tables registered for it"
is "$(grep -c 'SEQUENCE SET earmark ' "$WORK/toc")" 7 "... and the positions of their 7 identity sequences"

q -d postgres -c "CREATE DATABASE $RESTORED" >/dev/null
"$EM_PGBIN/pg_restore" --exit-on-error -d "$RESTORED" "$WORK/earmark.dump" 2>"$WORK/restore.err"
ok $? "pg_restore into a new database: CREATE EXTENSION runs, then the rows load, without an error"
[ -s "$WORK/restore.err" ] && sed 's/^/# /' "$WORK/restore.err" | head -20
is "$(q -d "$RESTORED" -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'")" 0.3.0 "the restored extension is 0.3.0"

dst_sums=$(sums "$RESTORED" "$NEWCOLS")
is "$(echo "$dst_sums" | grep -v '^jwks|\|^reporter_state|')" "$(echo "$src_sums" | grep -v '^jwks|\|^reporter_state|')" \
   "every kept table has the same rows after the restore (row counts and checksums)"
is "$(echo "$dst_sums" | grep '^reporter_state|' | cut -d'|' -f2) $(echo "$dst_sums" | grep '^jwks|' | cut -d'|' -f2)" \
   "1 0" "the reporter's state is the install's one row; the key set cache starts empty"
is "$(q -d "$RESTORED" -c "SELECT string_agg(event_type || '=' || handler::text, ' ' ORDER BY event_type) FROM earmark.inbox_handler")" \
   "$src_handlers" "the built-in handler once, the application's handler restored"
is "$(q -d "$RESTORED" -c "SELECT string_agg(sequencename || '=' || coalesce(last_value::text, '-'), ' ' ORDER BY sequencename)
                           FROM pg_sequences WHERE schemaname = 'earmark'")" \
   "$src_seqs" "the identity sequences are where they were"
is "$(budgets "$RESTORED")" "$src_budgets" "earmark_budget gives the same numbers for every account and feature"
is "$(check "$RESTORED")" "" "earmark_check() is clean after the restore"

got=$(q -d "$RESTORED" -c "SELECT admitted || ' ' || (job_id > $src_max_job) FROM earmark_reserve('acme', 10, 'after-restore')" 2>&1)
is "$got" "true true" "a new reserve gets a fresh job id (no duplicate key)"
is "$(q -d "$RESTORED" -c "SELECT job_id FROM earmark_reserve('acme', 1000, 'up-new-1')")" "$src_job" \
   "a repeated key finds its restored job"
is "$(q -d "$RESTORED" -c "SELECT earmark_record_usage('acme', 1, 'after-restore')")" t "keyed usage writes a new ledger row"
is "$(q -d "$RESTORED" -c "SELECT earmark_record_usage('acme', 30, 'rec-1')")" f "... and a restored key is still known"
is "$(q -d "$RESTORED" -c "SELECT inserted FROM earmark_inbox_receive('app', 'inv-2', 'invoice.paid', '{}', NULL, 'acme')")" \
   t "the inbox takes a new event (new event and receipt ids)"
is "$(q -d "$RESTORED" -c "SELECT event_id || ' ' || inserted FROM earmark_inbox_receive('kinde', 'evt-1', 'customer.plan_changed', '{}')")" \
   "$E1 false" "... and a redelivery of a restored event is a copy of it (its key's receipt was restored)"
q -d "$RESTORED" -c "SELECT earmark_settle('acme', job_id, 5) FROM earmark.job WHERE account = 'acme' AND idempotency_key = 'after-restore'" >/dev/null
is "$(q -d "$RESTORED" -c "SELECT earmark_report()")" 2 "the reporter sends the cycles marked before the dump (hot) and after it (acme)"
is "$(q -d "$RESTORED" -c "SELECT string_agg(account || '=' || total, ' ' ORDER BY account) FROM earmark.local_meter WHERE feature = 'default' AND cycle_start >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'")" \
   "acme=1556 hot=65" "... their totals: the restored ledger and the new rows"
is "$(check "$RESTORED")" "" "earmark_check() is clean after new work on the restored data"

done_testing
