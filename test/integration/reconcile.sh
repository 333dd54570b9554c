#!/usr/bin/env bash
# The reconciler against a real HTTP provider on loopback
# (test/fake_provider.py, Kinde's API), then scheduled with the real pg_cron:
# - the Notch case: the meter 426 behind the ledger (usage after the last
#   report) is under-billed, repaired with an absolute write, confirmed by a
#   read back, the evidence stored, and a second run adds no row;
# - a meter moved without a report is over-billed and repaired (verdict
#   repaired, the drift in its cause; later runs return that row);
# - a provider that cannot be read is "unreadable" and nothing is written;
# - a meter that does not take the repair (a trigger on the local meter
#   keeps it off by one) is that cycle's evidence, not a success, and the
#   run goes on; a repair write that fails is the same: each cycle is its own
#   unit;
# - many accounts are checked in pages;
# - no lock is held during a later cycle's provider call: a rebuilt cycle's
#   budget row is free while another cycle's repair write hangs;
# - pg_cron runs a scheduled reconcile that repairs a drift and leaves
#   evidence.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=postgres
WORK=$(mktemp -d /tmp/earmark-reconcile.XXXXXX)
chmod 755 "$WORK"

cleanup() {
    fake_provider_stop
    q -d postgres -c "ALTER SYSTEM RESET earmark.provider" -c "ALTER SYSTEM RESET earmark.kinde_domain" \
      -c "ALTER SYSTEM RESET earmark.provider_client_id" -c "ALTER SYSTEM RESET earmark.provider_secrets_file" \
      -c "ALTER SYSTEM RESET earmark.report_interval" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    q -d postgres -c "DROP TRIGGER IF EXISTS off_by_one ON earmark.local_meter" \
      -c "DROP FUNCTION IF EXISTS public.off_by_one()" >/dev/null 2>&1
    q -d postgres -c "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = 'earmark-reconcile-test'" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

fake_provider "$WORK" --client-id rec-test --client-secret rec-secret
meter() { state "d['kinde_meters'].get('$1|${2:-default}', -1)"; }   # meter AGREEMENT [FEATURE]
evidence() { q -c "SELECT count(*) FROM earmark.evidence WHERE account = '$1'"; }

printf 'client_secret = rec-secret\n' >"$WORK/secrets"
chown postgres "$WORK/secrets" 2>/dev/null || sudo chown postgres "$WORK/secrets"
chmod 600 "$WORK/secrets" 2>/dev/null || sudo chmod 600 "$WORK/secrets"

q -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
# (the worker must run with them before the first usage is marked: on the
# local provider it would report it to earmark.local_meter)
reload_conf "ALTER SYSTEM SET earmark.provider = 'kinde'" "ALTER SYSTEM SET earmark.kinde_domain = '$BASE'" \
            "ALTER SYSTEM SET earmark.provider_client_id = 'rec-test'" \
            "ALTER SYSTEM SET earmark.provider_secrets_file = '$WORK/secrets'" \
            "ALTER SYSTEM SET earmark.report_interval = '1s'"
# a clean slate for this script's accounts (it may run twice on one cluster)
q -c "CREATE TEMP TABLE gone AS SELECT budget_id FROM earmark.budget WHERE account LIKE 'rec%'" \
  -c "DELETE FROM earmark.ledger_entry WHERE budget_id IN (SELECT budget_id FROM gone)" \
  -c "DELETE FROM earmark.usage_shard WHERE budget_id IN (SELECT budget_id FROM gone)" \
  -c "DELETE FROM earmark.meter_mark WHERE budget_id IN (SELECT budget_id FROM gone)" \
  -c "DELETE FROM earmark.meter_send WHERE budget_id IN (SELECT budget_id FROM gone)" \
  -c "DELETE FROM earmark.evidence WHERE account LIKE 'rec%'" \
  -c "DELETE FROM earmark.local_meter WHERE account LIKE 'rec%'" \
  -c "DELETE FROM earmark.account WHERE account LIKE 'rec%'" \
  -c "UPDATE earmark.reporter_state SET blocked_until = NULL" >/dev/null

# --- the meter 426 behind --------------------------------------------------
q -c "SELECT earmark_set_account('rec_a', NULL, 'cus_ra', 'agr_ra')" -c "SELECT earmark_set_limit('rec_a', NULL)" \
  -c "SELECT earmark_record_usage('rec_a', 8031, 'run-1')" >/dev/null
deadline=$(wait_deadline 60)
until [ "$(meter agr_ra)" = 8031 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
is "$(meter agr_ra)" 8031 "the reporter sent 8,031"
# stop the reporter (waited for until the worker runs with an interval of
# an hour: it reported a moment ago, so its next report is an hour away),
# then 426 more arrive: the meter is behind
wait_for 60 "SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (account, budget_id) WHERE b.account = 'rec_a'" 0 >/dev/null
reload_conf "ALTER SYSTEM SET earmark.report_interval = '1h'"
q -c "SELECT earmark_record_usage('rec_a', 426, 'run-2')" >/dev/null
row=$(q -F ' ' -c "SELECT verdict, ledger_total, last_sent, provider_total, repaired_to, read_back FROM earmark_reconcile('rec_a')")
is "$row" "repaired 8457 8031 8031 8457 8457" "426 behind (under-billed): repaired to 8,457 and read back"
is "$(q -c "SELECT cause FROM earmark.evidence WHERE account = 'rec_a' ORDER BY evidence_id DESC LIMIT 1")" \
   "Under-billed: the meter read 8031, the ledger 8457. The ledger changed after the last report. A late usage or a correction arrived. The repair wrote 8457 and read it back: the meter equals the ledger." \
   "the cause names the drift, the late usage and the proven repair"
is "$(meter agr_ra)" 8457 "the meter holds the ledger total"
is "$(q -c "SELECT origin || ' ' || total || ' ' || ok FROM earmark.send_log WHERE account = 'rec_a' ORDER BY send_id DESC LIMIT 1")" \
   "repair 8457 true" "the repair is in the send log"
is "$(evidence rec_a)" 1 "one evidence row"
q -c "SELECT * FROM earmark_reconcile('rec_a')" >/dev/null
is "$(evidence rec_a)" 1 "a second run on the same numbers adds no row"
is "$(q -c "SELECT last_checked_at > checked_at FROM earmark.evidence WHERE account = 'rec_a'")" t "... it only notes when it was checked"

# --- the meter moved without a report --------------------------------------
control '{"set_meter": {"agreement": "agr_ra", "feature": "default", "value": 9000}}'
row=$(q -F ' ' -c "SELECT verdict, ledger_total, provider_total, read_back FROM earmark_reconcile('rec_a')")
is "$row" "repaired 8457 9000 8457" "a meter moved behind our back (over-billed): repaired"
is "$(q -c "SELECT cause FROM earmark.evidence WHERE account = 'rec_a' ORDER BY evidence_id DESC LIMIT 1")" \
   "Over-billed: the meter read 9000, the ledger 8457. The meter moved without a report. A report was counted twice, or something else wrote to the meter. The repair wrote 8457 and read it back: the meter equals the ledger." \
   "the cause names the unexplained move"
is "$(evidence rec_a)" 2 "a second evidence row"

# --- unreadable --------------------------------------------------------------
control '{"down": true}'
row=$(q -F ' ' -c "SELECT verdict, coalesce(provider_total::text, 'null'), coalesce(repaired_to::text, 'none') FROM earmark_reconcile('rec_a')")
is "$row" "unreadable null none" "a provider that cannot be read: unreadable, nothing written"
q -c "SELECT * FROM earmark_reconcile('rec_a')" >/dev/null
is "$(evidence rec_a)" 3 "an unreadable run is evidence too, once"
control '{"down": false}'

# --- pages: many accounts -----------------------------------------------------
q -c "SELECT earmark_set_account('rec_p' || i, NULL, 'cus_p' || i, 'agr_p' || i), earmark_set_limit('rec_p' || i, NULL), earmark_record_usage('rec_p' || i, i, 'u') FROM generate_series(1, 120) i" >/dev/null
is "$(q -c "SELECT count(*) || ' ' || count(*) FILTER (WHERE verdict = 'repaired' AND read_back = ledger_total AND cause LIKE 'Under-billed: %') FROM earmark_reconcile() WHERE account LIKE 'rec_p%'")" \
   "120 120" "120 never-reported accounts checked over three pages, each repaired and read back"
is "$(q -c "SELECT count(*) FROM earmark_reconcile() WHERE account LIKE 'rec_p%' AND verdict = 'repaired'")" 120 \
   "a second run returns the same evidence: repaired, not a drift"
is "$(q -c "SELECT count(*) FROM earmark.evidence WHERE account LIKE 'rec_p%'")" 120 "... and adds no row"

# --- each cycle is its own unit: a repair that fails undoes nothing else ----
q -c "SELECT earmark_set_account('rec_u', NULL, 'cus_ru', 'agr_ru')" -c "SELECT earmark_set_limit('rec_u', NULL)" \
  -c "SELECT earmark_set_limit('rec_u', NULL, 'images')" \
  -c "SELECT earmark_record_usage('rec_u', 7, 'u1')" -c "SELECT earmark_record_usage('rec_u', 9, 'u2', 'images')" >/dev/null
# the first repair write (the default feature's, the lower budget_id) fails
control '{"fail": {"status": 503, "count": 1, "path": "/api/v1/billing/meter_usage", "method": "POST"}}'
rows=$(q -F ' ' -c "SELECT feature, verdict, coalesce(repaired_to::text, 'none'), coalesce(read_back::text, 'none'), cause LIKE '%The repair failed: %' FROM earmark_reconcile('rec_u') ORDER BY feature")
is "$rows" "default under_billed none none t
images repaired 9 9 f" "a failed repair is the evidence of its cycle; the next cycle is still repaired"
q -c "SELECT feature || ': ' || cause FROM earmark.evidence WHERE account = 'rec_u' ORDER BY evidence_id" | sed 's/^/# /'
is "$(q -c "SELECT string_agg(feature || ' ' || verdict, ', ' ORDER BY feature) FROM earmark.evidence WHERE account = 'rec_u'")" \
   "default under_billed, images repaired" "both cycles' evidence was kept"
is "$(meter agr_ru)/$(meter agr_ru images)" \
   "-1/9" "the provider holds the repaired total, and nothing for the failed one"
row=$(q -F ' ' -c "SELECT verdict, repaired_to, read_back FROM earmark_reconcile('rec_u', 'default')")
is "$row" "repaired 7 7" "once the provider answers, the next run repairs it"

# --- no lock is held during a later cycle's provider call ---------------------
# rec_l's default cycle has counters that differ from the ledger (rebuilt,
# under the budget row's lock); its images cycle needs a repair whose write
# hangs.  While it hangs, the default cycle's budget row is not locked.
q -c "SELECT earmark_set_account('rec_l', NULL, 'cus_rl', 'agr_rl')" -c "SELECT earmark_set_limit('rec_l', NULL)" \
  -c "SELECT earmark_set_limit('rec_l', NULL, 'images')" \
  -c "SELECT earmark_record_usage('rec_l', 5, 'l1')" -c "SELECT earmark_record_usage('rec_l', 3, 'l2', 'images')" >/dev/null
control '{"set_meter": {"agreement": "agr_rl", "feature": "default", "value": 5}}'
bid=$(q -c "SELECT budget_id FROM earmark.budget WHERE account = 'rec_l' AND feature = 'default'")
# (slot_rec: as if an escrow rebalance had read 5 of recorded usage)
q -c "UPDATE earmark.budget SET used = used + 40, slot_rec = 5 WHERE budget_id = $bid" >/dev/null
control '{"hang": {"count": 1, "seconds": 600, "path": "/api/v1/billing/meter_usage", "method": "POST"}}'  # (until released)
PGOPTIONS="$PGOPTIONS -c earmark.http_timeout=60000" q -F ' ' \
    -c "SELECT feature, verdict, counters_rebuilt, coalesce(read_back::text, 'none') FROM earmark_reconcile('rec_l') ORDER BY feature" \
    >"$WORK/rec_l.out" 2>"$WORK/rec_l.err" &
rec_pid=$!
in_flight() { state "len(d['in_flight'])"; }
deadline=$(wait_deadline 60)
until [ "$(in_flight)" = 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
is "$(in_flight)" 1 "the images cycle's repair write is waiting on the provider"
is "$(sqlstate "SELECT 1 FROM earmark.budget WHERE budget_id = $bid FOR UPDATE NOWAIT")" ok \
   "meanwhile the default cycle's budget row is not locked"
control '{"release": true}'
wait "$rec_pid"
is "$(cat "$WORK/rec_l.out")" "default match t none
images repaired f 3" "then the run rebuilt the default cycle's counters and repaired the images cycle"
sed 's/^/# /' "$WORK/rec_l.err"
is "$(q -c "SELECT used FROM earmark_budget('rec_l')")" 5 "the rebuilt counters equal the ledger"
is "$(q -c "SELECT coalesce(slot_rec::text, 'unknown') FROM earmark.budget WHERE budget_id = $bid")" unknown \
   "the rebuild forgets the recorded usage an escrow rebalance read (budget.slot_rec)"

# --- a meter that does not take the repair: the evidence says so -------------
reload_conf "ALTER SYSTEM SET earmark.provider = 'local'"
# (a trigger on the local meter keeps the default feature's total off by one)
q -c "CREATE FUNCTION public.off_by_one() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN IF NEW.feature = 'default' THEN NEW.total := NEW.total - 1; END IF; RETURN NEW; END \$\$" \
  -c "CREATE TRIGGER off_by_one BEFORE INSERT OR UPDATE ON earmark.local_meter FOR EACH ROW EXECUTE FUNCTION public.off_by_one()" \
  -c "SELECT earmark_set_account('rec_b')" -c "SELECT earmark_set_limit('rec_b', NULL)" \
  -c "SELECT earmark_set_limit('rec_b', NULL, 'images')" \
  -c "SELECT earmark_record_usage('rec_b', 10, 'b1')" -c "SELECT earmark_record_usage('rec_b', 4, 'b2', 'images')" >/dev/null
rows=$(q -F ' ' -c "SELECT feature, verdict, repaired_to, read_back, cause LIKE '%The repair did not read back: wrote 10, read back 9.%' FROM earmark_reconcile('rec_b') ORDER BY feature")
is "$rows" "default under_billed 10 9 t
images repaired 4 4 f" "a read back that differs from the repair is its cycle's evidence, and the run goes on"
is "$(q -c "SELECT count(*) FROM earmark.evidence WHERE account = 'rec_b' AND read_back IS DISTINCT FROM repaired_to")" 1 \
   "... the evidence does not claim that repair"
q -c "DROP TRIGGER off_by_one ON earmark.local_meter" -c "DROP FUNCTION public.off_by_one()" >/dev/null
is "$(q -c "SELECT verdict || ' ' || read_back FROM earmark_reconcile('rec_b', 'default')")" "repaired 10" "without the fault the same cycle is repaired"

# --- pg_cron: a scheduled reconcile leaves evidence --------------------------
# (scripts/test.sh preloads pg_cron; without it this step fails)
if q -c "SHOW shared_preload_libraries" | grep -q pg_cron; then
    q -c "CREATE EXTENSION IF NOT EXISTS pg_cron" >/dev/null
    q -c "UPDATE earmark.local_meter SET total = total - 3 WHERE account = 'rec_b' AND feature = 'default'" >/dev/null
    before=$(evidence rec_b)
    q -c "SELECT cron.schedule('earmark-reconcile-test', '* * * * *', \$\$SELECT count(*) FROM earmark_reconcile('rec_b')\$\$)" >/dev/null
    # (pg_cron runs it at the next full minute)
    got=$(wait_for 180 "SELECT count(*) FROM earmark.evidence WHERE account = 'rec_b'" "$((before + 1))")
    is "$got" "$((before + 1))" "pg_cron ran the scheduled reconcile, which stored new evidence"
    is "$(q -c "SELECT verdict || ' ' || read_back FROM earmark.evidence WHERE account = 'rec_b' AND feature = 'default' ORDER BY evidence_id DESC LIMIT 1")" \
       "repaired 10" "... repairing the drift it found"
    got=$(wait_for 60 "SELECT status FROM cron.job_run_details d JOIN cron.job j USING (jobid) WHERE j.jobname = 'earmark-reconcile-test' ORDER BY runid DESC LIMIT 1" succeeded)
    is "$got" succeeded "pg_cron recorded the run as succeeded"
else
    ok 1 "pg_cron is in shared_preload_libraries of the test cluster"  # not ok
fi

done_testing
