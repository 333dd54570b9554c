#!/usr/bin/env bash
# test/citus/call_shapes.sh: statements that Citus 13.2 would crash the
# coordinator on (TAP).
#
# On a distributed install Citus delegates a call of an earmark function
# to the account's node when, after planning, the statement is the call
# alone.  When planning made it so (a subquery, a view, a CTE, a one-row
# VALUES list or an SQL-language function pulled up or inlined), Citus
# crashes while it deparses it (SIGSEGV) and the postmaster restarts every
# backend of the coordinator.  earmark's planner hook (src/delegation.c)
# gives such a statement an always-true filter, so that Citus does not
# delegate it: it runs on the coordinator, where earmark_budget answers
# and the functions that need the account's node refuse with 0A000.  What
# must hold: no statement crashes the coordinator, for any role; the bare
# calls are still delegated; statements with a table, and a Citus install
# where earmark is not distributed, are left alone.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55790 bash test/citus/call_shapes.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_require_citus
source "$EM_ROOT/test/integration/tap.sh"
set +e
export PGOPTIONS="-c client_min_messages=warning"
CT_PRELOAD='citus,earmark'
ct_start "earmark.database = '$CT_DB'" "earmark.report_interval = '1h'" \
    || { echo "Bail out! the Citus cluster did not start"; exit 1; }

# shape SQL: the SQLSTATE it ends with, "crashed" if the server closed the
# connection, then "alive" if the same session could still answer
shape() {
    ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -v VERBOSITY=verbose -c "$1" -c "SELECT 'session alive'" 2>&1 |
        sed -n -e 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' -e 's/^server closed.*/crashed/p' -e 's/^session alive$/alive/p' |
        paste -sd' '
}
# after a crash, wait for the coordinator to take connections again
recover() { for _ in $(seq 1 60); do ct_val 0 "SELECT 1" >/dev/null 2>&1 && return; sleep 1; done; }
# whether the planned statement carries earmark's filter
fenced() {
    ct_sql 0 -A -t -q -c "EXPLAIN (COSTS OFF) $1" 2>&1 | grep -c 'clock_timestamp() IS NOT NULL'
}

ct_sql 0 -q <<'SQL' >/dev/null
CREATE EXTENSION earmark;
SELECT earmark_set_limit('acme', 1000);
SELECT earmark_set_limit('beta', 500);
CREATE ROLE cs_app LOGIN;
GRANT earmark_user TO cs_app;
CREATE TABLE public.cs_local (a text);
INSERT INTO public.cs_local VALUES ('acme');
GRANT SELECT ON public.cs_local TO cs_app;
CREATE VIEW public.cs_budget AS SELECT * FROM earmark_budget('acme');
CREATE FUNCTION public.cs_set_limit(a text) RETURNS void LANGUAGE sql AS $$ SELECT earmark_set_limit(a, 1000) $$;
CREATE FUNCTION public.cs_remaining(a text) RETURNS bigint LANGUAGE plpgsql AS
    $$ DECLARE r bigint; BEGIN SELECT s.remaining INTO r FROM (SELECT * FROM earmark_budget(a)) s; RETURN r; END $$;
SQL
ok $? "earmark created on a Citus coordinator, not distributed yet"

# --- not distributed: Citus delegates no earmark call, nothing is changed
is "$(fenced "SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)")" 0 \
   "not distributed: no filter on a call over a VALUES list"
run() { ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -v VERBOSITY=terse -c "$1" 2>&1 | paste -sd' '; }
is "$(run "SET ROLE cs_app; SELECT count(*) FROM (VALUES ('acme'), ('beta')) v (a), LATERAL earmark_budget(v.a) b")" 2 \
   "not distributed, earmark_user: a budget per row of a VALUES list"
is "$(run "SET ROLE cs_app; SELECT (earmark_budget(v.a)).remaining FROM (VALUES ('acme')) v (a)")" 1000 \
   "not distributed, earmark_user: a budget over a one-row VALUES list"
is "$(run "SET ROLE cs_app; SELECT r.admitted FROM earmark_reserve('beta', 10, 'u1') r, (SELECT 1) x")" t \
   "not distributed, earmark_user: a reserve joined to a subquery admits"

ct_sql 0 -q -c "SELECT * FROM earmark_distribute()" >/dev/null
ok $? "earmark_distribute() on the coordinator"
# the coordinator's own background processes: new ones after a crash
procs() { ct_val 0 "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type IN ('earmark worker', 'checkpointer', 'walwriter')"; }
before=$(procs)

# --- distributed: statements whose planned form is a bare call --------------
# Reads run on the coordinator and answer.
for q in "SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)" \
         "SELECT earmark_budget(s.a) FROM (SELECT 'acme'::text AS a) s" \
         "WITH c AS (SELECT 'acme'::text AS a) SELECT earmark_budget(c.a) FROM c" \
         "SELECT * FROM (SELECT * FROM earmark_budget('acme')) s" \
         "SELECT b.* FROM (SELECT 'acme'::text) v (a), LATERAL (SELECT * FROM earmark_budget(v.a)) b" \
         "SELECT * FROM earmark_budget('acme') b WHERE 'x' IN (SELECT 'x')" \
         "SELECT * FROM cs_budget" \
         "SELECT cs_remaining('acme')" \
         "PREPARE cs_p (text) AS SELECT * FROM (SELECT * FROM earmark_budget(\$1)) s; EXECUTE cs_p('acme'); EXECUTE cs_p('acme'); EXECUTE cs_p('acme'); EXECUTE cs_p('acme'); EXECUTE cs_p('acme'); EXECUTE cs_p('acme')" \
         "DO \$\$ DECLARE t timestamptz; BEGIN SELECT cycle_start INTO t FROM (SELECT * FROM earmark_budget('acme')) s; END \$\$" \
         "BEGIN; DECLARE cs_c CURSOR FOR SELECT * FROM cs_budget; FETCH cs_c; COMMIT" \
         "EXPLAIN SELECT * FROM cs_budget" \
         "CREATE TEMP TABLE cs_t AS SELECT * FROM cs_budget" \
         "COPY (SELECT * FROM cs_budget) TO STDOUT" \
         "SET ROLE cs_app; CREATE TEMP VIEW cs_v AS SELECT * FROM earmark_budget('acme'); SELECT * FROM cs_v" \
         "SET ROLE cs_app; CREATE FUNCTION pg_temp.cs_b(a text) RETURNS TABLE (lim bigint, remaining bigint) LANGUAGE sql STABLE AS \$\$ SELECT lim, remaining FROM earmark_budget(a) \$\$; SELECT * FROM pg_temp.cs_b('acme')" \
         "SET ROLE cs_app; SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)" \
         "SELECT cs_set_limit(v.a) FROM (VALUES ('acme')) v (a)"; do
    r=$(shape "$q")
    is "$r" "alive" "runs on the coordinator and answers, no crash: $q"
    case $r in *crashed*) recover ;; esac
done
# Writes that need the account's node refuse there with earmark's 0A000.
for q in "SELECT earmark_reserve(v.a, 1, 'k1') FROM (VALUES ('acme')) v (a)" \
         "SELECT r.* FROM earmark_reserve('acme', 10, 'k2') r, (SELECT 1) x" \
         "SELECT r.* FROM earmark_reserve('acme', 10, 'k3') r JOIN (SELECT 1 AS k) x ON true" \
         "SELECT * FROM (SELECT r.* FROM earmark_reserve('acme', 10, 'k5') r, (SELECT 1) x) s" \
         "SELECT earmark.sweep_account(v.a, 10) FROM (VALUES ('acme')) v (a)" \
         "DO \$\$ BEGIN PERFORM earmark_reserve(v.a, 1, 'k4') FROM (VALUES ('acme')) v (a); END \$\$" \
         "SET ROLE cs_app; SELECT r.admitted FROM earmark_reserve('acme', 10, 'k6') r, (SELECT 1) x"; do
    r=$(shape "$q")
    is "$r" "0A000 alive" "runs on the coordinator, refused there, no crash: $q"
    case $r in *crashed*) recover ;; esac
done
is "$(ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -c "BEGIN" -c "SELECT earmark_reserve(v.a, 1, 'k7') FROM (VALUES ('acme')) v (a)" \
        -c "ROLLBACK" -c "SELECT 'after'" 2>&1 | grep -c -e '^after$' -e 'ERROR:  .*node that does not hold')" 2 \
   "in a transaction block too: refused on the coordinator, and the session goes on"
is "$(procs)" "$before" "the coordinator did not restart"
is "$(ct_val 0 "SELECT count(*) FROM earmark.job WHERE account = 'acme'")" 0 "nothing was written by the refused reserves"
is "$(ct_val 0 "SELECT lim FROM earmark_budget('acme')")" 1000 "the refused limit left acme's limit as it was"

# --- distributed: what is left alone ----------------------------------------
is "$(ct_val 0 "SELECT admitted FROM earmark_reserve('acme', 10, 'k9')")" t "the bare call is delegated and admits"
is "$(ct_val 0 "SELECT r.admitted FROM earmark_reserve('acme', 10, 'k10') r")" t "... with an alias and a column list too"
is "$(ct_val 0 "SELECT cs_set_limit('acme')")" "" "a scalar SQL wrapper called bare (inlined to a bare call) is delegated"
is "$(fenced "SELECT * FROM earmark_budget('acme')")" 0 "no filter on a bare call"
is "$(fenced "SELECT earmark_budget(a) FROM cs_local")" 0 "no filter on a statement with a table"
is "$(fenced "SELECT * FROM (SELECT 1) x, (VALUES (2)) v")" 0 "no filter on a statement that calls no added function"
is "$(fenced "SELECT * FROM (SELECT * FROM earmark_budget('acme')) s")" 1 "the filter on a bare call in a subquery"
is "$(ct_val 0 "SELECT count(*) FROM (VALUES ('acme'), ('acme')) v (a), LATERAL earmark_budget(v.a) b" 2>&1)" 2 \
   "a budget per row of a VALUES list of two rows"
is "$(ct_val 0 "SELECT count(*) FROM earmark_budget('acme') b, (VALUES (1)) v (x) WHERE b.remaining > v.x" 2>&1)" 1 \
   "a budget joined to a VALUES list with a WHERE"
is "$(ct_val 0 "SELECT count(*) FROM earmark_check() c, (VALUES ('acme')) v (a) WHERE c.account = v.a" 2>&1)" 0 \
   "earmark_check (not distributed) over a VALUES list"
is "$(ct_val 0 "SELECT (earmark_budget(x)).remaining FROM unnest(ARRAY['acme']) x")" 980 \
   "a budget over a set-returning function"
is "$(ct_val 0 "SELECT count(*) FROM (SELECT 1) x, (VALUES (2)) v")" 1 "a statement that calls no added function"
is "$(procs)" "$before" "the coordinator did not restart"
done_testing
