#!/usr/bin/env bash
# test/citus/call_shapes.sh: calls of earmark's functions that Citus 13.2
# would crash on (TAP).  On a distributed install Citus delegates an
# earmark call to the account's node; when the statement also has a
# subquery, a VALUES list or a CTE, its planner crashes the backend
# (SIGSEGV) and the postmaster restarts every backend of the coordinator.
# earmark's planner hook (delegation.c) refuses such a statement with
# 0A000 first: the session goes on, the coordinator does not restart, and
# nothing is written.  The bare calls, and shapes Citus does not delegate,
# are unchanged.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55790 bash test/citus/call_shapes.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin
ct_sql 0 -q -c "SELECT earmark_set_limit('acme', 1000)" >/dev/null

# the coordinator's own background processes: new ones after a crash
procs() { ct_val 0 "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type IN ('earmark worker', 'checkpointer', 'walwriter')"; }
before=$(procs)

# shape SQL: the SQLSTATE it ends with (or "ok"), then whether the same
# session could still answer
shape() {
    ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -c "$1" -c "SELECT 'session alive'" 2>&1 |
        sed -n -e 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' -e 's/^server closed.*/crashed/p' -e 's/^session alive$/alive/p' |
        paste -sd' '
}
for q in "SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)" \
         "SELECT earmark_reserve(v.a, 1, 'k1') FROM (VALUES ('acme')) v (a)" \
         "SELECT earmark_budget(s.a) FROM (SELECT 'acme'::text AS a) s" \
         "SELECT r.* FROM earmark_reserve('acme', 10, 'k2') r, (SELECT 1) x" \
         "SELECT r.* FROM earmark_reserve('acme', 10, 'k3') r JOIN (SELECT 1 AS k) x ON true" \
         "WITH c AS (SELECT 'acme'::text AS a) SELECT earmark_budget(c.a) FROM c" \
         "SELECT earmark.sweep_account(v.a, 10) FROM (VALUES ('acme')) v (a)"; do
    is "$(shape "$q")" "0A000 alive" "refused, the session goes on: $q"
done
is "$(shape "DO \$\$ BEGIN PERFORM earmark_reserve(v.a, 1, 'k4') FROM (VALUES ('acme')) v (a); END \$\$")" "0A000 alive" \
   "refused in PL/pgSQL too (PERFORM over a VALUES list)"
is "$(ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -c "BEGIN" -c "SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)" \
        -c "ROLLBACK" -c "SELECT 'after'" 2>&1 | grep -c -e '^after$' -e 'cannot be called over a subquery')" 2 \
   "refused inside a transaction block too"
is "$(procs)" "$before" "the coordinator did not restart"
is "$(ct_val 0 "SELECT count(*) FROM earmark.job WHERE account = 'acme'")" 0 "nothing was written by the refused reserves"

is "$(ct_val 0 "SELECT admitted FROM earmark_reserve('acme', 10, 'k9')")" t "the bare call is delegated and admits"
is "$(ct_val 0 "SELECT (earmark_budget(x)).remaining FROM unnest(ARRAY['acme']) x")" 990 \
   "a call over a set-returning function (which Citus does not delegate) is not refused"
is "$(ct_val 0 "SELECT count(*) FROM (SELECT 1) x, (VALUES (2)) v")" 1 "statements that call no earmark function are not looked at"
done_testing
