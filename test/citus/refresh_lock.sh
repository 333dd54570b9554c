#!/usr/bin/env bash
# test/citus/refresh_lock.sh: on Citus, the worker's limit read and an
# earmark_refresh_limits call of one account store one after the other
# (TAP), as on one node (meter.sh): both take the account's refresh lock on
# the account's node, the worker through earmark.store_limits, which Citus
# runs there.
#
# The worker's read of acme hangs at the fake provider.  Meanwhile a
# transaction calls earmark_refresh_limits('acme'), which stores a = 20 and
# x = 5, and stays open.  The provider then drops x, and the worker's read
# is answered (a = 30): its store must wait for the refresh lock on acme's
# node (pg_locks there: objsubid 25965), then drop the x the call stored.
# When the worker stored from the coordinator it took the coordinator's
# lock, read acme's stored limits without the uncommitted x, and x stayed.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/refresh_lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin
ct_fake_provider earmark.http_timeout=60s
limits() {
    ct_val 0 "SELECT string_agg(feature || '=' || lim || ':' || source, ',' ORDER BY feature)
              FROM earmark.account_limit WHERE account = 'acme'"
}
# the worker node that holds acme (1 or 2)
port=$(ct_val 0 "SELECT nodeport FROM pg_dist_shard_placement
                 WHERE shardid = get_shard_id_for_distribution_column('earmark.account', 'acme')")
W=$(( port - CT_PORT ))

ct_sql 0 -q -c "SELECT earmark_set_account('acme')" -c "SELECT earmark_set_limit('acme', 7, 'm')" >/dev/null
control '{"set_limit": {"account": "acme", "feature": "a", "limit": 10}}'
is "$(ct_val 0 "SELECT * FROM earmark_refresh_limits('acme')") $(limits)" "1 a=10:provider,m=7:manual" \
   "earmark_refresh_limits('acme') through the coordinator reads a = 10 (acme is on worker $W)"

# the worker's read of acme hangs
control '{"hang": {"count": 1, "seconds": 300, "path": "/generic/limits"}}'
ct_val 0 "UPDATE earmark.account SET limits_wanted_at = now(), limits_tried_at = NULL
          WHERE account = 'acme'" >/dev/null
deadline=$(( $(date +%s) + 60 ))
until [ "$(state "len(d['in_flight'])")" == 1 ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.2; done
got=$(state "len(d['in_flight'])")
is "$got" 1 "the worker's read of acme waits at the provider"

# a transaction stores a = 20 and x = 5 and stays open: it waits on a
# table a third session holds
ct_val 0 "CREATE TABLE rl_gate ()" >/dev/null
PGAPPNAME=rl_gate ct_sql 0 -q -c "BEGIN" -c "LOCK TABLE rl_gate" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
gate=$!
ct_wait 60 0 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rl_gate' AND query = 'SELECT pg_sleep(600)'" 1 >/dev/null
control '{"set_limit": [{"account": "acme", "feature": "a", "limit": 20}, {"account": "acme", "feature": "x", "limit": 5}]}'
PGAPPNAME=rl_first ct_sql 0 -q -c "BEGIN" -c "SELECT * FROM earmark_refresh_limits('acme')" \
    -c "LOCK TABLE rl_gate" -c "COMMIT" >"$WORK/first.out" 2>&1 &
first=$!
got=$(ct_wait 60 0 "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rl_first'
                    AND wait_event_type = 'Lock' AND query = 'LOCK TABLE rl_gate'" 1)
is "$got" 1 "a transaction's earmark_refresh_limits('acme') stored a = 20, x = 5 and stays open"

# the provider drops x; the worker's read is answered and must wait
control '{"set_limit": [{"account": "acme", "feature": "a", "limit": 30}, {"account": "acme", "feature": "x", "remove": true}]}'
control '{"release": true}'
got=$(ct_wait 60 "$W" "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 25965 AND NOT granted" 1)
is "$got" 1 "the worker's store waits for acme's refresh lock on worker $W, the node of acme"

ct_val 0 "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'rl_gate'" >/dev/null
wait "$gate"
wait "$first"
is "$? $(grep -c ERROR "$WORK/first.out")" "0 0" "the transaction commits"
got=$(ct_wait 60 0 "SELECT string_agg(feature || '=' || lim || ':' || source, ',' ORDER BY feature)
                    FROM earmark.account_limit WHERE account = 'acme'" "a=30:provider,m=7:manual")
is "$got" "a=30:provider,m=7:manual" \
   "then the worker's store drops the x the transaction stored: the answer stored last is acme's limits"
is "$(ct_val 0 "SELECT limits_error IS NULL AND limits_wanted_at IS NULL FROM earmark.account WHERE account = 'acme'")" t \
   "... and the read is recorded"
ct_val 0 "DROP TABLE rl_gate" >/dev/null

done_testing
