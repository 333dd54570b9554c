#!/usr/bin/env bash
# test/citus/worker_isolation.sh: the worker's steps that Citus sends on
# their own run at the node's default_transaction_isolation, not at the
# worker's READ COMMITTED (TAP).  With a worker node's default at
# repeatable read, the worker's store of a limit read through
# earmark.store_limits must refuse there (25000) rather than store from a
# snapshot taken before it waited for the account's refresh lock, and the
# failure must be recorded on the account with its reason; the limits stay
# as they were.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/worker_isolation.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin
ct_fake_provider
limits() {
    ct_val 0 "SELECT string_agg(feature || '=' || lim || ':' || source, ',' ORDER BY feature)
              FROM earmark.account_limit WHERE account = 'acme'"
}
ct_sql 0 -q -c "SELECT earmark_set_account('acme')" -c "SELECT earmark_set_limit('acme', 7, 'm')" >/dev/null
control '{"set_limit": {"account": "acme", "feature": "a", "limit": 10}}'
is "$(ct_val 0 "SELECT * FROM earmark_refresh_limits('acme')") $(limits)" "1 a=10:provider,m=7:manual" \
   "earmark_refresh_limits('acme') reads a = 10"

# the workers' default is repeatable read (the coordinator's stays read committed)
for n in 1 2; do
    ct_sql $n -q -c "ALTER SYSTEM SET default_transaction_isolation = 'repeatable read'" \
                 -c "SELECT pg_reload_conf()" >/dev/null
done
control '{"set_limit": [{"account": "acme", "feature": "a", "limit": 30}, {"account": "acme", "feature": "x", "limit": 5}]}'
ct_val 0 "UPDATE earmark.account SET limits_wanted_at = now(), limits_tried_at = NULL
          WHERE account = 'acme'" >/dev/null
got=$(ct_wait 60 0 "SELECT limits_tried_at IS NOT NULL FROM earmark.account WHERE account = 'acme'" t)
is "$got" t "the worker read acme's limits"
got=$(ct_val 0 "SELECT limits_error FROM earmark.account WHERE account = 'acme'")
ok "$(grep -q 'earmark.store_limits must run in a READ COMMITTED transaction' <<<"$got"; echo $?)" \
   "... its store refused the node's repeatable read, and the failure says why: ${got:0:110}"
is "$(limits)" "a=10:provider,m=7:manual" "... and acme's limits are as they were (nothing stored from a stale snapshot)"

# read committed again: the next read stores
for n in 1 2; do
    ct_sql $n -q -c "ALTER SYSTEM RESET default_transaction_isolation" -c "SELECT pg_reload_conf()" >/dev/null
done
ct_val 0 "UPDATE earmark.account SET limits_wanted_at = now(), limits_tried_at = NULL
          WHERE account = 'acme'" >/dev/null
got=$(ct_wait 60 0 "SELECT coalesce(limits_error, 'none') || ' ' || (SELECT string_agg(feature || '=' || lim, ',' ORDER BY feature)
                    FROM earmark.account_limit WHERE account = 'acme')
                    FROM earmark.account WHERE account = 'acme'" "none a=30,m=7,x=5")
is "$got" "none a=30,m=7,x=5" "with the nodes at read committed again the worker's next read stores a = 30, x = 5"

done_testing
