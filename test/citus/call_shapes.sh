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
# each_gives EXPECTED WHAT SQL...: each statement's shape is EXPECTED
each_gives() {
    local want=$1 what=$2 q r
    shift 2
    for q in "$@"; do
        r=$(shape "$q")
        is "$r" "$want" "$what, no crash: $q"
        case $r in *crashed*) recover ;; esac
    done
}
# on_workers SQL WHAT: SQL on each worker leaves its session alive (a worker
# that does not hold the account delegates too)
on_workers() {
    local n r
    for n in 1 2; do
        r=$(ct_sql $n -A -t -q -v ON_ERROR_STOP=0 -c "$1" -c "SELECT 'session alive'" 2>&1 | grep -c '^session alive$')
        is "$r" 1 "$2 on worker $n, no crash"
        ct_ready "$n" 60 2>/dev/null
    done
}
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
# (the earmark worker is started by the launcher after CREATE EXTENSION:
# waited for, or a worker that starts after this list would read as a restart)
ct_worker_pid 0 >/dev/null
before=$(procs)

# --- distributed: statements whose planned form is a bare call --------------
# Reads run on the coordinator and answer.
each_gives "alive" "runs on the coordinator and answers" \
    "SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a)" \
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
    "SELECT cs_set_limit(v.a) FROM (VALUES ('acme')) v (a)"
# Writes that need the account's node refuse there with earmark's 0A000.
each_gives "0A000 alive" "runs on the coordinator, refused there" \
    "SELECT earmark_reserve(v.a, 1, 'k1') FROM (VALUES ('acme')) v (a)" \
    "SELECT r.* FROM earmark_reserve('acme', 10, 'k2') r, (SELECT 1) x" \
    "SELECT r.* FROM earmark_reserve('acme', 10, 'k3') r JOIN (SELECT 1 AS k) x ON true" \
    "SELECT * FROM (SELECT r.* FROM earmark_reserve('acme', 10, 'k5') r, (SELECT 1) x) s" \
    "SELECT earmark.sweep_account(v.a, 10) FROM (VALUES ('acme')) v (a)" \
    "DO \$\$ BEGIN PERFORM earmark_reserve(v.a, 1, 'k4') FROM (VALUES ('acme')) v (a); END \$\$" \
    "SET ROLE cs_app; SELECT r.admitted FROM earmark_reserve('acme', 10, 'k6') r, (SELECT 1) x"
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

# --- review: shapes the filter must also cover ------------------------------
# A CTE that reads a sibling CTE (its reference is one level up from the
# CTE's body); a CTE of an outer level read after another FROM item of a
# subquery; GROUP BY () and grouping sets over a bare call (the planner
# rewrites groupingSets in place, and Citus's deparse of that crashes); a
# FROM function the planner folds to a constant (an RTE_RESULT Citus cannot
# deparse).  Each must run on the coordinator and answer (reads) or refuse
# with 0A000 (writes), never crash it, for any role.
ct_sql 0 -q <<'SQL' >/dev/null
CREATE FUNCTION public.cs_acme() RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN 'acme'; END $$;
SQL
each_gives "alive" "review: runs on the coordinator and answers" \
    "WITH a AS (SELECT 'acme'::text AS x), b AS (SELECT * FROM a) SELECT earmark_budget(b.x) FROM b" \
    "WITH a AS (SELECT 'acme'::text AS x), b AS (SELECT x FROM a) SELECT b.x, r.remaining FROM b, LATERAL earmark_budget(b.x) r" \
    "WITH a AS (SELECT * FROM earmark_budget('acme')), b AS (SELECT * FROM a) SELECT * FROM b" \
    "WITH a AS (SELECT 'acme'::text AS x) SELECT earmark_budget(s.x) FROM (SELECT a.x FROM (VALUES (1)) v, a) s" \
    "SELECT count(*) FROM earmark_budget('acme') GROUP BY ()" \
    "SELECT earmark_budget('acme') GROUP BY GROUPING SETS (())" \
    "SELECT lim, count(*) FROM earmark_budget('acme') GROUP BY ROLLUP (lim)" \
    "SELECT lim, count(*) FROM earmark_budget('acme') GROUP BY CUBE (lim)" \
    "DO \$\$ BEGIN PERFORM count(*) FROM earmark_budget('acme') GROUP BY (); END \$\$" \
    "PREPARE cs_w (text) AS WITH a AS (SELECT \$1 AS x), b AS (SELECT * FROM a) SELECT earmark_budget(b.x) FROM b; EXECUTE cs_w('acme')" \
    "SELECT earmark_budget(x) FROM lower('acme') x" \
    "SELECT earmark_budget(x) FROM cs_acme() x" \
    "SELECT lim FROM earmark_budget('acme') GROUP BY lim HAVING count(*) > 0 AND count(*) < 5" \
    "SET ROLE cs_app; SELECT count(*) FROM earmark_budget('acme') GROUP BY ()" \
    "SET ROLE cs_app; WITH a AS (SELECT 'acme'::text AS x), b AS (SELECT * FROM a) SELECT * FROM b, LATERAL earmark_budget(b.x)"
each_gives "0A000 alive" "review: runs on the coordinator, refused there" \
    "WITH a AS (SELECT 'acme'::text AS x), b AS (SELECT * FROM a) SELECT earmark_reserve(b.x, 1, 'rv1') FROM b" \
    "SELECT count(*) FROM earmark_reserve('acme', 1, 'rv2') GROUP BY ()" \
    "SELECT earmark_reserve(x, 1, 'rv3') FROM lower('acme') x" \
    "SET ROLE cs_app; WITH a AS (SELECT 'acme'::text AS x) SELECT r.admitted FROM (SELECT a.x FROM (SELECT 1) z, a) s, LATERAL earmark_reserve(s.x, 1, 'rv4') r"
# a worker that does not hold the account delegates too (Citus's metadata
# is on every node): the same statement must not crash either worker
on_workers "SELECT count(*) FROM earmark_budget('acme') GROUP BY ()" "review: GROUP BY () over a bare call"
# the planner hook's walk of the FROM tree: CTEs nested in CTEs, each read
# twice, must not cost time exponential in the depth (26 levels: about 2^26
# walks of the innermost one, minutes, which would not see a
# cancel); planned at once, well within a statement_timeout of 30 s
nested="SELECT 1 AS x"
for _ in $(seq 1 26); do nested="WITH c AS ($nested) SELECT a.x FROM c a, c b"; done
ct_sql 0 -A -t -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = '30s'" \
    -c "EXPLAIN (COSTS OFF) SELECT * FROM ($nested) s, generate_series(1, 1) g" >/dev/null 2>&1
ok $? "review: 26 levels of nested CTEs, each read twice, planned within the statement_timeout"
# the same with NOT MATERIALIZED CTEs over a volatile function, which the
# planner never inlines: the walk must not enter each reference's body again
# (its time and memory doubled with each level)
nested="SELECT random() AS x"
for _ in $(seq 1 26); do nested="WITH c AS NOT MATERIALIZED ($nested) SELECT a.x FROM c a, c b"; done
ct_sql 0 -A -t -q -v ON_ERROR_STOP=1 -c "SET statement_timeout = '30s'" \
    -c "EXPLAIN (COSTS OFF) SELECT * FROM ($nested) s, generate_series(1, 1) g" >/dev/null 2>&1
ok $? "review 28c: 26 levels of NOT MATERIALIZED CTEs over random(), each read twice, planned within the statement_timeout"
# statements over Citus tables are left alone, also in a set operation
ct_sql 0 -q <<'SQL' >/dev/null
CREATE TABLE public.cs_dist (a text, n int);
SELECT create_distributed_table('cs_dist', 'a');
INSERT INTO cs_dist SELECT 'k' || g, g FROM generate_series(1, 20) g;
CREATE TABLE public.cs_ref (a text);
SELECT create_reference_table('cs_ref');
INSERT INTO cs_ref VALUES ('acme'), ('beta');
CREATE FUNCTION public.cs_plus(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN $1 + 1; END $$;
SQL
is "$(fenced "SELECT sum(cs_plus(s.n)) FROM (SELECT a, n FROM cs_dist UNION ALL SELECT a, n FROM cs_dist) s")" 0 \
   "review: no filter on a statement over a distributed table in a UNION ALL subquery"
is "$(fenced "SELECT s.a, b.remaining FROM (SELECT a FROM cs_ref UNION SELECT a FROM cs_ref) s, LATERAL earmark_budget(s.a) b")" 0 \
   "review: no filter on a statement over a reference table in a UNION subquery"
# --- review 28c ---------------------------------------------------------------
# A NULL account: Citus 13.2 hashes the NULL distribution argument of a
# delegated call (FindShardInterval on a NULL Datum) and the node crashes.
# A bare call with a NULL account, written, defaulted (earmark_reconcile()
# is "every account"), folded, a bound parameter or a PL/pgSQL variable;
# and a FROM function that is strict, not immutable and returns no set
# folds to NULL given a NULL argument (the planner turns the FROM item into
# an RTE_RESULT): Citus then either writes out an RTE_RESULT (XX000) or,
# when the account came from that item, hashes a NULL and crashes.  Each
# must run where it was sent and answer or refuse, never crash, any role.
ct_sql 0 -q <<'SQL' >/dev/null
CREATE FUNCTION public.cs_strict(t text) RETURNS text LANGUAGE plpgsql STRICT AS $$ BEGIN RETURN t; END $$;
SQL
shape_ok() { case $1 in *crashed*|*XX000*) echo "$1";; *alive) echo ok;; *) echo "$1";; esac; }
for q in \
    "SELECT * FROM earmark_budget(NULL)" \
    "SELECT earmark_budget(NULL::text)" \
    "SELECT * FROM earmark_budget(nullif('a', 'a'))" \
    "SELECT * FROM earmark_reserve(NULL, 1, 'n1')" \
    "SELECT earmark_set_limit(NULL, 5)" \
    "SELECT count(*) FROM earmark_reconcile()" \
    "PREPARE cs_n (text) AS SELECT * FROM earmark_budget(\$1); EXECUTE cs_n(NULL)" \
    "DO \$\$ DECLARE a text; BEGIN PERFORM * FROM earmark_budget(a); END \$\$" \
    "SET ROLE cs_app; SELECT * FROM earmark_budget(NULL)" \
    "DO \$\$ DECLARE v boolean; BEGIN v := earmark_record_usage(NULL, 1, 'n4'); END \$\$" \
    "SELECT earmark_budget(x) FROM to_char(NULL::timestamptz, 'YYYY') x" \
    "SELECT earmark_budget(x) FROM ROWS FROM (to_char(NULL::timestamptz, 'YYYY')) x" \
    "SELECT earmark_budget('acme') FROM to_char(NULL::timestamptz, 'YYYY') x" \
    "SELECT earmark_budget('acme') FROM pg_sleep(NULL) x" \
    "SELECT earmark_budget('acme') FROM cs_strict(NULL) x" \
    "SELECT earmark_budget(coalesce(x, 'acme')) FROM to_char(CASE WHEN false THEN now() END, 'YYYY') x" \
    "SELECT earmark_reserve('acme', 1, 'n2') FROM to_char(NULL::timestamptz, 'YYYY') x" \
    "SET ROLE cs_app; SELECT earmark_reserve('acme', 1, 'n3') FROM cs_strict(NULL) x" \
    "SET ROLE cs_app; SELECT earmark_budget(x) FROM cs_strict(NULL) x"; do
    r=$(shape "$q")
    is "$(shape_ok "$r")" ok "review 28c: no crash, no XX000 (got: $r): $q"
    case $r in *crashed*) recover ;; esac
done
on_workers "SELECT * FROM earmark_budget(NULL)" "review 28c: a NULL account"
# --- review 28d ---------------------------------------------------------------
# The NULL-account test folds the bare call once more before the planner
# does: only an earmark call may be looked at.  An immutable function in
# the call's arguments is then evaluated twice (a WARNING it raises shows
# twice, a slow one costs twice), and a call of a function that is not
# earmark's got the filter, whose gating Result a PL/pgSQL simple
# expression does not expect (exec_save_simple_expr asserts it has none):
# so a bare call with a NULL account gets no filter, its account is made
# volatile instead.
ct_sql 0 -q <<'SQL' >/dev/null
CREATE FUNCTION public.cs_imm_warn(t text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RAISE WARNING 'cs_imm_warn evaluated'; RETURN t; END $$;
CREATE FUNCTION public.cs_plain(t text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN t; END $$;
SQL
is "$(ct_sql 0 -A -t -q -c "SELECT cs_plain(cs_imm_warn('x'))" 2>&1 | grep -c 'cs_imm_warn evaluated')" 1 \
   "review 28d: an immutable argument of a bare call that is not earmark's is evaluated once"
is "$(ct_sql 0 -A -t -q -c "SELECT * FROM earmark_budget(cs_imm_warn('acme'))" 2>&1 | grep -c 'cs_imm_warn evaluated')" 1 \
   "review 28d: an immutable argument of a bare earmark call is evaluated once"
is "$(fenced "SELECT cs_plain(NULL)")" 0 "review 28d: no filter on a bare call with a NULL first argument of a function that is not earmark's"
is "$(fenced "SELECT * FROM earmark_budget(NULL)")" 0 "review 28d: no filter on a bare earmark call with a NULL account (its plan may be a PL/pgSQL simple expression's) ..."
is "$(ct_sql 0 -A -t -q -c "EXPLAIN (VERBOSE, COSTS OFF) SELECT * FROM earmark_budget(NULL)" 2>&1 | grep -c 'earmark_budget(CASE WHEN (clock_timestamp() IS NOT NULL) THEN NULL::text ELSE NULL::text END')" 1 \
   "... but its account made volatile, with the same value"
is "$(procs)" "$before" "the coordinator did not restart"
done_testing
