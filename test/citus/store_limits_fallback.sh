#!/usr/bin/env bash
# test/citus/store_limits_fallback.sh: when the worker's store of a limit
# read through earmark.store_limits fails, the failure is still recorded
# on the account (TAP), so that the account waits its retry time and the
# provider is not asked again at every wake-up.
#
# earmark.store_limits is made a function Citus does not delegate (as on
# an install whose earmark_distribute ran before the function existed, or
# before it was listed): every call of it from the coordinator then fails
# with 0A000.  The failure must be recorded all the same (limits_tried_at,
# limits_error), as it was when the worker recorded it from the coordinator.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55930 bash test/citus/store_limits_fallback.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin
ct_fake_provider earmark.sweep_interval=500ms
reads() { state "len([r for r in d['requests'] if r['path'] == '/generic/limits'])"; }

ct_sql 0 -q -c "SELECT earmark_set_account('acme')" >/dev/null
control '{"set_limit": {"account": "acme", "feature": "a", "limit": 10}}'

# the coordinator no longer delegates earmark.store_limits
ct_val 0 "UPDATE pg_dist_object SET distribution_argument_index = NULL, colocationid = NULL, force_delegation = NULL
          WHERE objid = 'earmark.store_limits(text, text[], bigint[])'::regprocedure" >/dev/null
got=$(ct_sql 0 -A -t -q -v VERBOSITY=verbose -c "SELECT earmark.store_limits('acme', '{a}', '{1}')" 2>&1)
ok "$(grep -q '^ERROR:  0A000' <<<"$got"; echo $?)" \
   "a bare earmark.store_limits now runs on the coordinator and refuses (0A000)"

before=$(reads)
ct_val 0 "UPDATE earmark.account SET limits_wanted_at = now(), limits_tried_at = NULL WHERE account = 'acme'" >/dev/null
got=$(ct_wait 30 0 "SELECT limits_tried_at IS NOT NULL FROM earmark.account WHERE account = 'acme'" t)
is "$got" t "the worker's failed store is recorded: limits_tried_at is set"
got=$(ct_val 0 "SELECT limits_error FROM earmark.account WHERE account = 'acme'")
ok "$(grep -q 'could not be stored' <<<"$got"; echo $?)" "... with the store's error in limits_error: ${got:0:100}"
sleep 5
n=$(( $(reads) - before ))
ok "$([ "$n" -le 2 ] && echo 0 || echo 1)" \
   "... and the account waits its retry time: the provider was asked $n times in about 5 s (at most 2)"

done_testing
