#!/usr/bin/env bash
# test/citus/review_in_use_router.sh (review of d674143): on Citus, the
# ledger's primary key with the distribution column last, and the account's
# in-use check that d674143 rewrote (account.c account_in_use: the ledger
# probed through the account's budget rows, cycle by cycle).
# test/citus/earmark.sh checks that its ledger probe is one task on the
# account's shard; this checks the whole statement, and the anchor's
# answers where earmark_set_account runs (delegated to the account's node):
# - ledger_pkey on every shard is (budget_id, entry_id, account);
# - the in-use statement is one task (router), and its ledger probe on the
#   shard is by the primary key's budget_id, not a scan of the shard;
# - recorded usage alone (budget row at zero) keeps the anchor (EM002), and
#   two cycles with no ledger row let it move.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55320 bash test/citus/review_in_use_router.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin

is "$(ct_val 0 "SELECT run_command_on_shards('earmark.ledger_entry', \$\$SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = '%s'::regclass AND i.indisprimary\$\$)" \
      | sed 's/.*,"\(.*\)")$/\1/; s/_[0-9]\+ ON / ON /; s/ledger_entry_[0-9]\+ /ledger_entry /' | sort -u)" \
   "CREATE UNIQUE INDEX ledger_pkey ON earmark.ledger_entry USING btree (budget_id, entry_id, account)" \
   "every shard's ledger_pkey is (budget_id, entry_id, account)"

ct_sql 0 -q -c "SELECT earmark_set_limit('used', 1000)" -c "SELECT earmark_record_usage('used', 5, 'one')" \
            -c "SELECT earmark_set_limit('quiet', 1000)" -c "SELECT earmark_set_limit('quiet', 1000, 'images')" >/dev/null
for f in default images; do
    j=$(ct_val 0 "SELECT job_id FROM earmark_reserve('quiet', 10, 'n-$f', feature => '$f')")
    ct_val 0 "SELECT status FROM earmark_settle('quiet', $j, 0, 'cancelled')" >/dev/null
done
is "$(ct_val 0 "SELECT count(*) FROM earmark.budget WHERE account = 'quiet'")|$(ct_val 0 "SELECT count(*) FROM earmark.ledger WHERE account IN ('used', 'quiet')")" \
   "2|1" "used: one recorded usage; quiet: two cycles settled at zero, no ledger row"

in_use() {   # the statement of account.c account_in_use, with the account as a literal
    cat <<SQL
SELECT EXISTS (SELECT 1 FROM earmark.budget b
               LEFT JOIN (SELECT s.budget_id, pg_catalog.sum(s.used) AS used, pg_catalog.sum(s.held) AS held
                            FROM earmark.budget_slot s WHERE s.account = '$1'
                           GROUP BY s.budget_id) s ON s.budget_id = b.budget_id
               WHERE b.account = '$1'
                 AND (b.used + coalesce(s.used, 0) <> 0 OR b.held + coalesce(s.held, 0) <> 0))
    OR EXISTS (SELECT 1 FROM earmark.job j WHERE j.account = '$1' AND j.status IN ('running', 'capped'))
    OR EXISTS (SELECT 1 FROM earmark.budget b WHERE b.account = '$1'
                  AND EXISTS (SELECT 1 FROM earmark.ledger l
                               WHERE l.account = '$1' AND l.budget_id = b.budget_id OFFSET 0))
SQL
}
plan=$(ct_val 0 "EXPLAIN (COSTS OFF) $(in_use quiet)")
is "$(grep -Eo 'Task Count: [0-9]+' <<<"$plan" | paste -sd,)" "Task Count: 1" \
   "the in-use statement is one task on the account's shard"
grep -E 'on ledger_entry_[0-9]+ e' <<<"$plan" | sed 's/^ */# /'
is "$(grep -Ec 'Seq Scan on ledger_entry' <<<"$plan")|$(grep -Ec 'Scan using ledger_pkey_[0-9]+ on ledger_entry_[0-9]+ e' <<<"$plan")" "0|1" \
   "... whose ledger probe on the shard is by ledger_pkey, not a scan"
is "$(ct_val 0 "$(in_use used)")|$(ct_val 0 "$(in_use quiet)")" "t|f" "... and answers: used in use, quiet not"

is "$(ct_val 0 "SELECT earmark_set_account('used', '2026-10-05 00:00:00+00')" 2>&1 | grep -oE 'cannot change: [a-z ]+')" \
   "cannot change: the account has usage or holds" "recorded usage alone keeps used's anchor (EM002)"
is "$(ct_val 0 "SELECT earmark_set_account('quiet', '2026-10-05 00:00:00+00')" 2>&1)" "" \
   "quiet's anchor moves: two cycles, no ledger row"
is "$(ct_val 0 "SELECT cycle_anchor = '2026-10-05 00:00:00+00' FROM earmark.account WHERE account = 'quiet'")" t \
   "... and is set"

# one session, 16 anchor changes of accounts with an empty cycle each: the
# workers' backends run the statement more than five times, past where the
# plan cache weighs a generic plan (Citus plans none of it: custom plans)
for i in $(seq 1 16); do
    j=$(ct_val 0 "SELECT earmark_set_limit('m$i', 100); SELECT job_id FROM earmark_reserve('m$i', 1, 'k')" | tail -1)
    ct_val 0 "SELECT status FROM earmark_settle('m$i', $j, 0, 'cancelled')" >/dev/null
done
out=$(for i in $(seq 1 16); do echo "SELECT earmark_set_account('m$i', '2026-10-05 00:00:00+00');"; done |
      ct_sql 0 -q -A -t 2>&1)
is "$(grep -c ERROR <<<"$out")|$(ct_val 0 "SELECT count(*) FROM earmark.account WHERE account LIKE 'm%' AND cycle_anchor IS NOT NULL")" \
   "0|16" "16 anchor changes in one session: no error, every anchor set"

done_testing
