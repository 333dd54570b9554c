#!/usr/bin/env bash
# review_anchor_orphan_upgrade: the rows of an account deleted under 0.2.0
# (DELETE FROM earmark.account: its budget rows cascade, its ledger and job
# rows stay), through ALTER EXTENSION UPDATE to 0.3.0: its keyed usage row
# (0.2.0 wrote its account) and its settled job's row (the update takes the
# account from the job) stay, in no cycle, as docs/operations.md says; a
# row whose account cannot be told (neither its budget row nor its job is
# left) is dropped.  The account made again under the same name may set
# its cycle anchor (docs/api.md, earmark_set_account: "no ledger entry in
# one of its cycles"); an account with usage in its cycle may not (EM002).
source "$(dirname "$0")/tap.sh"
DB=review_anchor_orphan_upgrade
P="q -d $DB"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$P -c "CREATE EXTENSION earmark VERSION '0.2.0'" >/dev/null
ok $? "CREATE EXTENSION earmark VERSION '0.2.0'"

# 0.2.0's rows, written as 0.2.0's functions would have (the library is
# 0.3.0's): an account with a cycle, a keyed usage row and a settled job
# with its ledger row; then the account deleted
$P >/dev/null <<'SQL'
INSERT INTO earmark.account (account) VALUES ('gone'), ('kept');
INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, used)
SELECT a, 'default', date_trunc('month', now()), date_trunc('month', now()) + interval '1 month', 7
  FROM unnest(ARRAY['gone', 'kept']) a;
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, used, status,
                         lease, lease_until, settled_at, charged, released)
SELECT budget_id, account, 'default', 'j-1', 10, 7, 'completed', '5 min', now(), now(), 7, 3
  FROM earmark.budget;
INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)
SELECT budget_id, charged, job_id, settled_at FROM earmark.job;
INSERT INTO earmark.ledger (budget_id, units, entry_key, occurred_at, account)
SELECT budget_id, 5, 'u-1', now(), account FROM earmark.budget;
-- and a job row of gone's whose job is gone too (no account to tell)
INSERT INTO earmark.ledger (budget_id, units, job_id, occurred_at)
SELECT budget_id, 2, 999999, now() FROM earmark.budget WHERE account = 'gone';
DELETE FROM earmark.account WHERE account = 'gone';
SQL
ok $? "0.2.0 rows written; account gone deleted (its budget row cascades)"
is "$($P -c "SELECT count(*) FROM earmark.ledger l WHERE NOT EXISTS (SELECT 1 FROM earmark.budget b WHERE b.budget_id = l.budget_id)")" 3 \
   "... its three ledger rows stay, with no budget row"

$P -c "ALTER EXTENSION earmark UPDATE TO '0.3.0'" >/dev/null
ok $? "ALTER EXTENSION earmark UPDATE TO '0.3.0'"
is "$($P -c "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger WHERE account = 'gone'")" "2 12" \
   "gone's keyed row and its settled job's row stay (5 + 7 units); the row with no account to tell is dropped"
is "$($P -c "SELECT count(*) FROM earmark.ledger_entry WHERE account IS NULL OR job_id = 999999")" 0 \
   "... no row without an account"

$P -c "SELECT earmark_set_limit('gone', 1000)" >/dev/null
got=$($P -c "SELECT earmark_set_account('gone', '2026-10-05 00:00:00+00')" 2>&1 >/dev/null | grep -oE 'cannot change: [a-z ]+')
is "$got" "" "gone made again: the rows its deleted self left are in none of its cycles, and its anchor may move"
is "$($P -c "SELECT earmark_set_account('kept', '2026-10-05 00:00:00+00')" 2>&1 >/dev/null | grep -oE 'cannot change: [a-z ]+')" \
   "cannot change: the account has usage or holds" "kept, with usage in its cycle: its anchor stays (EM002)"

q -d postgres -c "DROP DATABASE $DB WITH (FORCE)" >/dev/null
done_testing
