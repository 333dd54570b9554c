#!/usr/bin/env bash
# test/citus/earmark.sh: earmark distributed with Citus (TAP), the layer
# "citus".  A coordinator and two workers on loopback with
# shared_preload_libraries = 'citus,earmark' (test/citus/cluster.sh), CREATE
# EXTENSION earmark and earmark_distribute() on the coordinator, and every
# call made the way an application makes it: the bare SELECT * FROM
# earmark_x(account, ...) on the coordinator, which Citus runs on the node
# that holds the account.  Accounts are picked on both workers and their
# placement is read from pg_dist_placement.
#
#   1. earmark_distribute(): what it distributes, a second run changes
#      nothing, and it refuses (55000, nothing changed) without Citus, on a
#      worker, on a half-distributed install and without earmark preloaded
#   2. the five-job race in five transactions, for an account on each worker
#   3. the load run (120 jobs of 1,000, 50 at a time, room for 100), on one
#      account and on 20 accounts over both workers
#   4. the gate's contract through the coordinator (idempotent repeats, the
#      0.2.0 forms, a call that is not bare, job ids per node)
#   5. the per-node view (workers' own copies empty), ids unique in the
#      cluster, earmark_check() clean at the end
#   6. kill -9 of a worker under load: every acknowledged call is there
#   7. the background worker on Citus (sweep, reporter, reconcile, inbox);
#      these fail until the coordinator's worker works account by account
#   8. timing: jobs/s and one reserve's latency through the coordinator
#      against a single node (diag lines, never asserted)
#
# They run in the order 1, 4, 2, 3, 6, 7, 8, 5 (the books are checked last),
# each printing its start time.  Section 1 also checks that
# earmark_distribute() refuses while a worker's own copy of a coordinator
# table holds a row a call wrote there; section 5 that a second
# earmark_distribute() moves the workers' id sequences past their ids
# after they were set back (as after a restore).  About 4 to 5 minutes on
# 2 cores.
#
# Needs earmark built and installed in EM_PREFIX (scripts/test.sh does it)
# and /usr/bin/python3 with psycopg2 (the driver, test/citus/driver.py).
# Prints "skipped: Citus is not installed" and passes when citus.so is
# absent.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55740 bash test/citus/earmark.sh
#
# Ports: the Citus nodes CT_PORT .. CT_PORT+2, the single node of the timing
# CT_PORT+3 (CT_SINGLE_PORT).

source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_require_citus
source "$(dirname "${BASH_SOURCE[0]}")/../integration/tap.sh"
set +e
export PGOPTIONS="-c client_min_messages=warning"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DRIVER=$HERE/driver.py
CT_SINGLE_PORT=${CT_SINGLE_PORT:-$((CT_PORT + 3))}
T0=$(date +%s)
WORK=$(mktemp -d /tmp/earmark-citus-layer.XXXXXX)
chmod 755 "$WORK"
BG_PIDS=()

PY=
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import psycopg2' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    echo "Bail out! python3 with psycopg2 (the python3-psycopg2 package) is needed"
    exit 1
fi
if [ ! -f "$("$EM_PGBIN/pg_config" --pkglibdir)/earmark.so" ]; then
    echo "Bail out! earmark is not installed in ${EM_PREFIX:-the system PostgreSQL} (scripts/lib.sh: em_build)"
    exit 1
fi

cleanup() {
    local p
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    em_stop_cluster
    ct_stop
    rm -rf "$WORK"
}

# --- helpers ----------------------------------------------------------------

# ct_try NODE SQL...: "ok", or "SQLSTATE: message" of the first error
ct_try() {
    local n=$1 s out args=()
    shift
    for s in "$@"; do args+=(-c "$s"); done
    if out=$(ct_sql "$n" -A -t -q -v VERBOSITY=verbose "${args[@]}" 2>&1 >/dev/null); then
        echo ok
    else
        echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\): \(.*\)$/\1: \2/p' | head -1
    fi
}

# single-node psql (the cluster of em_start_cluster)
sq() { "$EM_PGBIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h "$EM_SOCK" -p "$EM_PORT" -U postgres -d postgres "$@"; }
sq_try() {
    local out
    if out=$(sq -v VERBOSITY=verbose -c "$1" 2>&1 >/dev/null); then echo ok
    else echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\): \(.*\)$/\1: \2/p' | head -1; fi
}

dsn() { echo "host=$(ct_host "$1") port=$(ct_port "$1") dbname=$CT_DB user=postgres"; }
single_dsn() { echo "host=$EM_SOCK port=$EM_PORT dbname=postgres user=postgres"; }

# kv FILE NAME: a value the driver printed
kv() { sed -n "s/^$2=//p" "$1" | tail -n 1; }

# matches TEXT REGEX: 0 when TEXT matches (for ok)
matches() { [[ $1 =~ $2 ]]; echo $?; }

# wait_lines SECONDS FILE REGEX N: wait until FILE has N lines matching REGEX
wait_lines() {
    local deadline=$(( $(date +%s) + $1 ))
    while [ "$(grep -cE "$3" "$2" 2>/dev/null)" -lt "$4" ]; do
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        sleep 0.2
    done
}

# group_of ACCOUNT: the Citus group (worker) that holds the account's shard
group_of() {
    ct_val 0 "SELECT p.groupid FROM pg_dist_placement p
               WHERE p.shardid = get_shard_id_for_distribution_column('earmark.account', '$1')"
}
# pick NAME GROUP: NAME, or the first of NAME-1, NAME-2, ... held by GROUP
pick() {
    local i c
    for i in '' $(seq 1 60); do
        c=$1${i:+-$i}
        [ "$(group_of "$c")" = "$2" ] && { echo "$c"; return 0; }
    done
    return 1
}

# the earmark rows of Citus's catalogs, to compare before and after a call
# ("none": no row; nothing at all: the query failed)
dist_state() {
    ct_val 0 "SELECT coalesce(string_agg(x, ';' ORDER BY x), 'none') FROM (
                SELECT logicalrelid::text || ':' || partmethod::text || ':' || colocationid AS x
                  FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%'
                UNION ALL
                SELECT objid::regprocedure::text || ':' || coalesce(distribution_argument_index, -1)
                       || ':' || coalesce(colocationid, -1) || ':' || coalesce(force_delegation, false)
                  FROM pg_dist_object WHERE classid = 'pg_proc'::regclass
                   AND objid IN (SELECT objid FROM pg_depend WHERE refobjid =
                                   (SELECT oid FROM pg_extension WHERE extname = 'earmark')
                                 AND classid = 'pg_proc'::regclass)) s"
}

# node_cpu NODE-DATA-DIRECTORY: CPU ticks a server spent so far on its
# connections: the postmaster, its ended children (connections that
# closed) and its running client backends, not the background processes
# (earmark's worker and Citus's maintenance daemon run on their own
# schedule); a tick is TICK_MS ms
TICK_MS=$((1000 / $(getconf CLK_TCK)))
node_cpu() {
    local pm p t
    pm=$(em_sudo head -1 "$1/postmaster.pid")
    t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat")
    for p in $(ps -o pid=,args= --ppid "$pm" | awk '$2 == "postgres:" && $3 != "earmark" && $3 != "Citus" \
                                                   && $3 != "checkpointer" && $3 != "background" && $3 != "walwriter" \
                                                   && $3 != "autovacuum" && $3 != "logical" { print $1 }'); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

PER_ACCOUNT="earmark.account earmark.account_limit earmark.budget earmark.budget_slot earmark.job
earmark.ledger_entry earmark.usage_shard earmark.meter_mark earmark.meter_send earmark.meter_review
earmark.evidence earmark.local_meter"
REFERENCE="earmark.plan_limit earmark.webhook_secret"
COORD_ONLY="earmark.inbox_event earmark.inbox_receipt earmark.inbox_handler earmark.jwks earmark.reporter_state"
FUNCTIONS="earmark_reserve(text,bigint,text,text,interval) earmark_charge(text,bigint,bigint,bigint)
earmark_heartbeat(text,bigint) earmark_settle(text,bigint,bigint,text) earmark_budget(text,text,timestamptz)
earmark_record_usage(text,bigint,text,text,timestamptz) earmark_set_limit(text,bigint,text)
earmark_set_account(text,timestamptz,text,text) earmark_set_escrow(text,int) earmark.sweep_account(text,int)
earmark.store_limits(text,text[],bigint[])
earmark_reconcile(text,text) earmark_refresh_limits(text)
earmark_record_usage_many(text,bigint[],text[],text[],timestamptz[])
earmark_reserve_many(text,bigint[],text[],text[],interval) earmark_settle_many(text,bigint[],bigint[],text[])
earmark.report_cycle(text,bigint,text,bigint,boolean,integer,text,float8,boolean,boolean,bigint,text,timestamptz,timestamptz)"
# sql_list WORDS [CAST]: 'a', 'b', ... for an IN list
sql_list() { local x out=; for x in $1; do out+="${out:+, }'$x'${2:+::$2}"; done; echo "$out"; }

# --- the clusters -----------------------------------------------------------

CT_PRELOAD='citus,earmark'
ct_start "earmark.database = '$CT_DB'" \
         "earmark.report_interval = '1h'" \
    || { echo "Bail out! the Citus cluster did not start"; exit 1; }
# the single node of section 8 (and of earmark_distribute without Citus)
em_start_cluster "$CT_SINGLE_PORT" "shared_preload_libraries = 'earmark'" \
                 "earmark.database = 'postgres'" "earmark.report_interval = '1h'" >/dev/null 2>&1 \
    || { cleanup; echo "Bail out! the single node did not start"; exit 1; }
trap cleanup EXIT
diag "clusters up after $(( $(date +%s) - T0 )) s"

# === 1. earmark_distribute() =================================================
diag "[$(( $(date +%s) - T0 )) s] 1. earmark_distribute()"

sq -c "CREATE EXTENSION earmark" >/dev/null
got=$(sq_try "SELECT * FROM earmark_distribute()")
is "$got" "55000: earmark_distribute needs Citus" "without Citus (a plain database with earmark only) earmark_distribute refuses: 55000"
is "$(sq -c "SELECT count(*) FROM earmark.account")" 0 "  ... and changes nothing there"

ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark on the coordinator"
is "$(for n in 0 1 2; do ct_val $n "SELECT extversion FROM pg_extension WHERE extname = 'earmark'"; done | sort -u | paste -sd' ')" \
   "0.3.0" "  ... which Citus creates on both workers too (0.3.0 on every node)"

got=$(ct_try 1 "SELECT * FROM earmark_distribute()")
is "$got" "55000: earmark_distribute runs on the Citus coordinator" "on a worker node earmark_distribute refuses: 55000"
is "$(dist_state)" none "  ... and nothing was distributed"

# half-distributed: one table distributed by hand, in a transaction that is
# rolled back (an extension's table cannot be undistributed)
out=$(ct_sql 0 -A -t -q -v ON_ERROR_STOP=0 -v VERBOSITY=verbose 2>&1 <<'SQL'
BEGIN;
SELECT 'by hand:' || create_distributed_table('earmark.account', 'account');
SAVEPOINT s;
SELECT * FROM earmark_distribute();
ROLLBACK TO SAVEPOINT s;
SELECT 'partition:' || string_agg(logicalrelid::text, ',') FROM pg_dist_partition WHERE logicalrelid::text LIKE 'earmark.%';
SELECT 'functions:' || count(*) FROM pg_dist_object WHERE classid = 'pg_proc'::regclass AND objid = 'earmark_reserve(text,bigint,text,text,interval)'::regprocedure;
ROLLBACK;
SQL
)
is "$(echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\): \(.*\)$/\1: \2/p' | head -1)" \
   "55000: earmark is half-distributed: 1 of its 14 tables are distributed" \
   "on a half-distributed install (earmark.account distributed by hand) earmark_distribute refuses: 55000"
is "$(echo "$out" | grep -E '^(partition|functions):' | paste -sd' ')" "partition:earmark.account functions:0" \
   "  ... and changes nothing (only the table distributed by hand is, no function is)"
is "$(dist_state)" none "  ... and after the rollback nothing is distributed"

# a row a call stored in a worker's own copy of a coordinator table (the
# inbox) would never be read: refused
ct_val 1 "INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at)
          VALUES ('billing', 'stored-on-worker', 'test.on_worker', '{}', now())" >/dev/null
got=$(ct_try 0 "SELECT * FROM earmark_distribute()")
ok "$(matches "$got" "^55000: earmark tables on worker nodes hold rows of their own: .*:$(ct_port 1) earmark.inbox_event \\(1 rows\\)$")" \
   "with an event in worker 1's own inbox_event earmark_distribute refuses: ${got:0:120}"
is "$(dist_state)" none "  ... and nothing was distributed"
ct_val 1 "DELETE FROM earmark.inbox_event" >/dev/null

# a node that does not preload earmark has no planner hook to fence the calls
# Citus 13.2 crashes on: refused, naming the coordinator and the worker
for n in 0 2; do ct_val $n "ALTER SYSTEM SET shared_preload_libraries = 'citus'" >/dev/null; done
for n in 0 2; do ct_restart_node $n >/dev/null 2>&1; done
got=$(ct_try 0 "SELECT * FROM earmark_distribute()")
ok "$(matches "$got" "^55000: earmark is not in shared_preload_libraries on every node: the coordinator, [^,]*:$(ct_port 2)$")" \
   "without earmark preloaded on the coordinator and worker 2 earmark_distribute refuses: ${got:0:120}"
is "$(dist_state)" none "  ... and nothing was distributed"
for n in 0 2; do ct_val $n "ALTER SYSTEM RESET shared_preload_libraries" >/dev/null; done
for n in 0 2; do ct_restart_node $n >/dev/null 2>&1; done
# The coordinator's earmark worker, started again, runs a report pass at its
# first round (the next is an hour later): waited for here, before any usage
# is recorded.  A first pass that came late, in the middle of section 4,
# would send a cycle there and again in section 7, which counts one send a
# cycle (as test/citus/cluster.sh's ct_begin waits for it).
ct_wait 60 0 "SELECT last_report_at > pg_postmaster_start_time() FROM earmark.worker_status" t >/dev/null ||
    diag "the coordinator's earmark worker did no report pass within 60 s of its restart"
is "$(for n in 0 1 2; do ct_val $n "SELECT context FROM pg_settings WHERE name = 'earmark.database'"; done | paste -sd' ')" \
   "postmaster postmaster postmaster" "  ... and after a restart with citus,earmark every node preloads it again"

ct_sql 0 -A -t -q -c "SELECT * FROM earmark_distribute()" >"$WORK/distribute.out" 2>"$WORK/distribute.err"
ok $? "earmark_distribute() on the coordinator"
[ -s "$WORK/distribute.err" ] && sed 's/^/#   /' "$WORK/distribute.err"
is "$(cut -d'|' -f2 "$WORK/distribute.out" | sort | uniq -c | awk '{$1=$1; print}' | paste -sd';')" \
   "12 distributed by account;17 distributed by account, delegated;1 emptied on the workers;2 reference table" \
   "  ... reports 12 tables distributed by account, 2 reference tables, 17 functions delegated, the coordinator's tables emptied on the workers"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition p
                 WHERE p.logicalrelid::text IN ($(sql_list "$PER_ACCOUNT")) AND p.partmethod = 'h'
                   AND column_to_column_name(p.logicalrelid, p.partkey) = 'account'
                   AND p.colocationid = (SELECT colocationid FROM pg_dist_partition
                                          WHERE logicalrelid = 'earmark.account'::regclass)")" 12 \
   "pg_dist_partition: the 12 per-account tables hash-distributed by account, colocated with earmark.account"
is "$(ct_val 0 "SELECT string_agg(logicalrelid::text, ',' ORDER BY 1) FROM pg_dist_partition
                 WHERE partmethod = 'n' AND logicalrelid::text LIKE 'earmark.%'")" \
   "earmark.plan_limit,earmark.webhook_secret" "pg_dist_partition: plan_limit and webhook_secret are reference tables"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text IN ($(sql_list "$COORD_ONLY"))")" 0 \
   "the inbox, jwks and reporter_state stay coordinator-local (not in pg_dist_partition)"
is "$(ct_val 0 "SELECT count(*) FROM pg_dist_object o
                 WHERE o.classid = 'pg_proc'::regclass
                   AND o.objid IN ($(sql_list "$FUNCTIONS" regprocedure))
                   AND o.distribution_argument_index = 0 AND o.force_delegation
                   AND o.colocationid = (SELECT colocationid FROM pg_dist_partition
                                          WHERE logicalrelid = 'earmark.account'::regclass)")" 17 \
   "pg_dist_object: the 17 account functions distributed by account, colocated, with force_delegation"
is "$(for n in 0 1 2; do
        ct_val $n "SELECT count(*) FROM pg_class WHERE oid::regclass::text IN ($(sql_list "$PER_ACCOUNT $REFERENCE"))
                    AND pg_relation_size(oid) > 0"; done | paste -sd' ')" "0 0 0" \
   "no node keeps hidden rows in its own copy of a distributed or reference table (pg_relation_size 0)"

before=$(dist_state)
is "$(awk -F';' '{ print NF }' <<<"$before")" 31 "pg_dist_partition and pg_dist_object hold 31 earmark rows (14 tables, 17 functions)"
is "$(ct_val 0 "SELECT count(*) FROM earmark_distribute()")" 0 "a second earmark_distribute() reports nothing to do"
is "$(dist_state)" "$before" "  ... and changes nothing in pg_dist_partition / pg_dist_object"
got=$(ct_try 1 "SELECT * FROM earmark_distribute()")
is "$got" "55000: earmark_distribute runs on the Citus coordinator" "after distribution, on a worker it still refuses: 55000"
is "$(dist_state)" "$before" "  ... and changes nothing"

# the accounts of the tests, on both workers
W1=$(pick acme 1)
W2=$(pick carol 2)
is "$(group_of "$W1")|$(group_of "$W2")" "1|2" "accounts on both workers: $W1 on worker 1, $W2 on worker 2 (pg_dist_placement)"

# === 4. the gate's contract through the coordinator ===========================
diag "[$(( $(date +%s) - T0 )) s] 4. the gate's contract through the coordinator"

ct_sql 0 -q -c "SELECT earmark_set_limit('$W1', 10000)" -c "SELECT earmark_set_limit('$W2', 10000)" >/dev/null
ok $? "earmark_set_limit for $W1 and $W2 (delegated)"
r1=$(ct_val 0 "SELECT job_id || ' ' || admitted || ' ' || remaining FROM earmark_reserve('$W1', 4000, 'g1')")
r2=$(ct_val 0 "SELECT job_id || ' ' || admitted || ' ' || remaining FROM earmark_reserve('$W2', 4000, 'g1')")
J1=${r1%% *}
J2=${r2%% *}
is "${r1#* }|${r2#* }" "true 6000|true 6000" "reserve 4000 of 10000 on each worker's account: admitted, 6000 left"
is "$((J1 >> 48))|$((J2 >> 48))" "1|2" "job ids carry their worker's group in the top 16 bits ($J1, $J2)"
is "$(ct_val 0 "SELECT job_id || ' ' || reason FROM earmark_reserve('$W1', 4000, 'g1')")|$(ct_val 0 "SELECT job_id || ' ' || reason FROM earmark_reserve('$W2', 4000, 'g1')")" \
   "$J1 already admitted|$J2 already admitted" "the same key again: the same job on each account (a key is per account: two jobs)"
is "$(ct_val 0 "SELECT count(*) FROM earmark.job WHERE idempotency_key = 'g1'")" 2 "  ... and one job per account in earmark.job"
is "$(ct_try 0 "SELECT * FROM earmark_reserve('$W1', 5000, 'g1')" | cut -c1-5)" EM001 "the same key with another amount: EM001"
is "$(ct_val 0 "SELECT charged || ' ' || capped || ' ' || room || ' ' || status FROM earmark_charge('$W1', $J1, 1500)")" \
   "1500 false 2500 running" "charge 1500 on the worker-1 job"
is "$(ct_val 0 "SELECT charged || ' ' || capped FROM earmark_charge('$W1', $J1, 500, 1)")|$(ct_val 0 "SELECT charged FROM earmark_charge('$W1', $J1, 500, 1)")" \
   "500 false|0" "a charge with a step, repeated: charged once"
is "$(ct_try 0 "SELECT * FROM earmark_charge('$W2', $J1, 1)" | cut -c1-5)" EM003 "a job charged under another account's name: EM003 (no such job on that account)"
is "$(ct_val 0 "SELECT earmark_heartbeat('$W2', $J2) > now()")" t "heartbeat of the worker-2 job renews its lease"
is "$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$W1', $J1)")" \
   "2000 2000 completed" "settle the worker-1 job at its recorded use: charged 2000, released 2000"
is "$(ct_val 0 "SELECT status FROM earmark_settle('$W1', $J1, 3000)")|$(ct_val 0 "SELECT used || ' ' || held FROM earmark_budget('$W1')")" \
   "completed|2000 0" "settling it again changes nothing (used 2000, held 0)"
is "$(ct_val 0 "SELECT charged || ' ' || released || ' ' || status FROM earmark_settle('$W2', $J2, 1000, 'failed')")" \
   "1000 3000 failed" "settle the worker-2 job as failed at 1000"
is "$(ct_val 0 "SELECT earmark_record_usage('$W1', 700, 'u1')")|$(ct_val 0 "SELECT earmark_record_usage('$W1', 700, 'u1')")" \
   "t|f" "recorded usage of 700, and its repeat (same key) recorded once"
is "$(ct_val 0 "SELECT earmark_record_usage('$W1', -200, 'u1-fix')")" t "a correction of -200"
is "$(ct_val 0 "SELECT lim || ' ' || used || ' ' || held || ' ' || remaining || ' ' || limit_state FROM earmark_budget('$W1')")" \
   "10000 2500 0 7500 manual" "earmark_budget on worker 1's account: limit 10000, used 2500 (2000 + 700 - 200), held 0, 7500 left"
is "$(ct_val 0 "SELECT lim || ' ' || used || ' ' || held || ' ' || remaining FROM earmark_budget('$W2')")" \
   "10000 1000 0 9000" "earmark_budget on worker 2's account: used 1000, 9000 left"
is "$(ct_val 0 "SELECT admitted || ' ' || reason FROM earmark_reserve('$W1', 9000, 'g2')")" \
   "false the job needs 9000 and 7500 is left" "a reserve past the limit is refused with the numbers"

# the batch forms, through the coordinator, on an account of each worker
for n in 1 2; do
    B=$(pick batch $n)
    ct_sql 0 -q -c "SELECT earmark_set_limit('$B', 10000)" >/dev/null
    got=$(ct_val 0 "SELECT string_agg(admitted::text, ' ' ORDER BY ord)
                      FROM earmark_reserve_many('$B', ARRAY[3000, 4000, 5000], ARRAY['b1', 'b2', 'b3'])")
    is "$got" "true true false" "earmark_reserve_many on worker $n's account $B: 3000 and 4000 admitted, 5000 refused (3000 left)"
    jobs=$(ct_val 0 "SELECT string_agg(job_id::text, ',' ORDER BY job_id) FROM earmark.job WHERE account = '$B'")
    is "$(ct_val 0 "SELECT string_agg(status, ' ' ORDER BY ord) FROM earmark_settle_many('$B', ARRAY[$jobs]::bigint[], ARRAY[1000, 2000])")" \
       "completed completed" "  ... earmark_settle_many settles both"
    is "$(ct_val 0 "SELECT string_agg(recorded::text, ' ' ORDER BY ord)
                      FROM earmark_record_usage_many('$B', ARRAY[5, 5, 7], ARRAY['bu1', 'bu1', 'bu2'])")" \
       "true false true" "  ... earmark_record_usage_many records a key once"
    # the batch's key look-up (a LATERAL probe a distinct key) in one session
    # past the plan cache's five custom plans, with known and repeated keys
    args=()
    for b in 1 2 3 4 5 6 7; do
        args+=(-c "SELECT string_agg(recorded::text, ',' ORDER BY ord) FROM earmark_record_usage_many('$B',
                       ARRAY[5, 7, 1, 1]::bigint[], ARRAY['bu1', 'bu2', 'bm$b', 'bm$b'])")
    done
    is "$(ct_sql 0 -A -t -q "${args[@]}" 2>&1 | paste -sd' ')" \
       "false,false,true,false false,false,true,false false,false,true,false false,false,true,false false,false,true,false false,false,true,false false,false,true,false" \
       "  ... seven batches in one session (custom plans, then generic): known keys are repeats, a new key is recorded once"
    is "$(ct_val 0 "SELECT used || ' ' || held FROM earmark_budget('$B')")" "3019 0" \
       "  ... and the account's budget holds it all: used 3019, held 0"
done
is "$(ct_try 0 "SELECT * FROM earmark_charge($J1, 1)" | cut -c1-5)|$(ct_try 0 "SELECT * FROM earmark_heartbeat($J1)" | cut -c1-5)|$(ct_try 0 "SELECT * FROM earmark_settle($J1)" | cut -c1-5)" \
   "42883|42883|42883" "the 0.2.0 forms of charge, heartbeat and settle fail with 42883"
got=$(ct_try 0 "SELECT count(*) FROM earmark_reserve('$W1', 10, 'not-bare') r WHERE r.admitted")
ok "$(matches "$got" 'ran on a node that does not hold the account')" \
   "a call that is not bare (count(*) ... WHERE r.admitted) is refused: ${got:0:100}"
is "$(ct_val 0 "SELECT count(*) FROM earmark.job WHERE account = '$W1' AND idempotency_key = 'not-bare'")" 0 "  ... and wrote nothing"
got=$(ct_try 0 "SELECT 'x' || (earmark_reserve('$W2', 10, 'in-expression')).admitted")
ok "$(matches "$got" 'ran on a node that does not hold the account')" "a reserve inside an expression is refused too"
got=$(ct_try 0 "DO \$\$ DECLARE a boolean; BEGIN a := (earmark_reserve('$W2', 10, 'in-do')).admitted; END \$\$")
ok "$(matches "$got" 'ran on a node that does not hold the account')" "a reserve assigned in another function (a := (earmark_reserve(...)).admitted in a DO block) is refused too"
is "$(ct_val 0 "SELECT count(*) FROM earmark.job WHERE idempotency_key IN ('in-expression', 'in-do')")" 0 "  ... and wrote nothing"
is "$(ct_try 0 "DO \$\$ BEGIN PERFORM * FROM earmark_reserve('$W2', 10, 'in-do-perform'); END \$\$")|$(ct_val 0 "SELECT job_id >> 48 FROM earmark.job WHERE account = '$W2' AND idempotency_key = 'in-do-perform'")" \
   "ok|2" "PERFORM * FROM earmark_reserve(...) in a DO block is the bare form: Citus runs it on worker 2 (its job id says so)"
j=$(ct_val 0 "SELECT job_id FROM earmark.job WHERE account = '$W2' AND idempotency_key = 'in-do-perform'")
[ -n "$j" ] && ct_val 0 "SELECT status FROM earmark_settle('$W2', $j, 0, 'cancelled')" >/dev/null
# an application transaction with calls for accounts on both workers:
# one commit (two-phase across the workers), or one rollback
ct_sql 0 -q -c "BEGIN" -c "SELECT * FROM earmark_reserve('$W1', 100, 'two-nodes')" \
    -c "SELECT * FROM earmark_reserve('$W2', 100, 'two-nodes')" -c "COMMIT" >/dev/null
ok $? "a transaction with reserves on both workers' accounts commits"
ct_sql 0 -q -c "BEGIN" -c "SELECT * FROM earmark_reserve('$W1', 100, 'rolled-back')" \
    -c "SELECT * FROM earmark_reserve('$W2', 100, 'rolled-back')" -c "ROLLBACK" >/dev/null
is "$(ct_val 0 "SELECT string_agg(idempotency_key || ':' || (job_id >> 48), ' ' ORDER BY idempotency_key, job_id >> 48)
                 FROM earmark.job WHERE idempotency_key IN ('two-nodes', 'rolled-back')")" "two-nodes:1 two-nodes:2" \
   "  ... both holds are there; those of a rolled-back one are not"
for acc in "$W1" "$W2"; do
    j=$(ct_val 0 "SELECT job_id FROM earmark.job WHERE account = '$acc' AND idempotency_key = 'two-nodes'")
    ct_val 0 "SELECT status FROM earmark_settle('$acc', $j, 0, 'cancelled')" >/dev/null
done
got=$(ct_try 0 "SELECT earmark_sweep()")
ok "$(matches "$got" '^0A000: earmark_sweep.*distributed')" "earmark_sweep refuses on a distributed install: ${got:0:70}"

# === 2. the five-job race ======================================================
diag "[$(( $(date +%s) - T0 )) s] 2. the five-job race (five transactions, each holding its reserve ~1 s)"

R1=$(pick race 1)
R2=$(pick race 2)
ct_sql 0 -q -c "SELECT earmark_set_limit('$R1', 100000)" -c "SELECT earmark_set_limit('$R2', 100000)" >/dev/null
# the two races at once, one on each worker
"$PY" "$DRIVER" --dsn "$(dsn 0)" race --account "$R1" --sessions 5 --amount 40000 --hold 1 --key race >"$WORK/race1" 2>&1 &
p1=$!
"$PY" "$DRIVER" --dsn "$(dsn 0)" race --account "$R2" --sessions 5 --amount 40000 --hold 1 --key race >"$WORK/race2" 2>&1 &
p2=$!
wait $p1; wait $p2
for i in 1 2; do
    f=$WORK/race$i
    acc=$([ $i = 1 ] && echo "$R1" || echo "$R2")
    is "$(kv "$f" admitted) $(kv "$f" refused) $(kv "$f" errors)" "2 3 0" \
       "race on worker $i's account $acc: 2 admitted, 3 refused, no error"
    is "$(grep -c '^reason=the job needs 40000 and 20000 is left$' "$f")" 3 "  ... each refusal: the job needs 40000 and 20000 is left"
    is "$(ct_val 0 "SELECT used || ' ' || held FROM earmark_budget('$acc')")" "0 80000" "  ... held 80000, used 0"
    [ "$(kv "$f" admitted)" = 2 ] || sed 's/^/#   /' "$f"
done
# the race's holds are cancelled, so that nothing waits for the sweeper
for acc in "$R1" "$R2"; do
    for j in $(ct_val 0 "SELECT job_id FROM earmark.job WHERE account = '$acc' AND status = 'running'"); do
        ct_val 0 "SELECT status FROM earmark_settle('$acc', $j, 0, 'cancelled')" >/dev/null
    done
done
is "$(ct_val 0 "SELECT held FROM earmark_budget('$R1')")|$(ct_val 0 "SELECT held FROM earmark_budget('$R2')")" "0|0" \
   "the race's holds cancelled: nothing held"

# === 3. the load run ===========================================================
diag "[$(( $(date +%s) - T0 )) s] 3. the load run (120 jobs of 1000, 50 at a time, limit 100000)"

L1=$(pick load 1)
ct_val 0 "SELECT earmark_set_limit('$L1', 100000)" >/dev/null
"$PY" "$DRIVER" --dsn "$(dsn 0)" load --accounts "$L1" --jobs 120 --amount 1000 --concurrency 50 --key load >"$WORK/load1" 2>&1
is "$(kv "$WORK/load1" admitted) $(kv "$WORK/load1" refused) $(kv "$WORK/load1" errors)" "100 20 0" \
   "one account ($L1): 100 admitted, 20 refused, no error"
[ "$(kv "$WORK/load1" errors)" = 0 ] || sed 's/^/#   /' "$WORK/load1"
is "$(ct_val 0 "SELECT used || ' ' || held || ' ' || remaining FROM earmark_budget('$L1')")" "100000 0 0" \
   "  ... used 100000, held 0 (earmark_budget)"
is "$(ct_val 0 "SELECT count(*) || ' ' || sum(charged) FROM earmark.job WHERE account = '$L1' AND status = 'completed'")|$(ct_val 0 "SELECT sum(units) FROM earmark.ledger WHERE account = '$L1'")" \
   "100 100000|100000" "  ... 100 jobs completed at 1000, the ledger adds up to 100000"
# review wal13: the ledger is a view over earmark.ledger_entry and the
# settled jobs; a read of one account's ledger (reconcile's cycle total,
# the account's in-use check) must stay a single-shard (router) query
L1B=$(ct_val 0 "SELECT budget_id FROM earmark.budget WHERE account = '$L1' ORDER BY budget_id LIMIT 1")
tasks() { ct_val 0 "EXPLAIN (COSTS OFF) $1" | grep -Eo 'Task Count: [0-9]+' | paste -sd,; }
is "$(tasks "SELECT coalesce(sum(units), 0) FROM earmark.ledger WHERE account = '$L1' AND budget_id = $L1B")" \
   "Task Count: 1" "  ... a cycle's ledger total (the view) is one task on the account's shard"
is "$(tasks "SELECT EXISTS (SELECT 1 FROM earmark.budget b WHERE b.account = '$L1'
                 AND EXISTS (SELECT 1 FROM earmark.ledger l WHERE l.account = '$L1' AND l.budget_id = b.budget_id OFFSET 0))")" \
   "Task Count: 1" "  ... the in-use check's ledger probe, cycle by cycle (the view), is one task on the account's shard"

ACCS=$(for i in $(seq -w 1 20); do echo "many$i"; done | paste -sd,)
ct_sql 0 -q -c "$(for a in ${ACCS//,/ }; do echo "SELECT earmark_set_limit('$a', 100000);"; done)" >/dev/null
spread=$(ct_val 0 "SELECT string_agg(n::text, ' ' ORDER BY g) FROM (
                     SELECT p.groupid AS g, count(*) AS n FROM unnest(string_to_array('$ACCS', ',')) a
                       JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('earmark.account', a)
                      GROUP BY 1) s")
ok "$(matches "$spread" '^[1-9][0-9]* [1-9][0-9]*$')" "20 accounts spread over both workers (on worker 1 / worker 2: $spread)"
c0=$(( $(node_cpu "$(ct_dir 0)/data") + $(node_cpu "$(ct_dir 1)/data") + $(node_cpu "$(ct_dir 2)/data") ))
"$PY" "$DRIVER" --dsn "$(dsn 0)" load --accounts "$ACCS" --jobs 120 --amount 1000 --concurrency 50 --key load >"$WORK/load20" 2>&1
CPU_LOAD20=$(( $(node_cpu "$(ct_dir 0)/data") + $(node_cpu "$(ct_dir 1)/data") + $(node_cpu "$(ct_dir 2)/data") - c0 ))
is "$(kv "$WORK/load20" admitted) $(kv "$WORK/load20" refused) $(kv "$WORK/load20" errors)" "2000 400 0" \
   "20 accounts, 2400 jobs: 2000 admitted, 400 refused, no error"
is "$(kv "$WORK/load20" per_account)" "100/20/0:20" "  ... every account: 100 admitted, 20 refused"
[ "$(kv "$WORK/load20" errors)" = 0 ] || sed 's/^/#   /' "$WORK/load20"
is "$(ct_val 0 "SELECT count(*) FROM earmark.budget WHERE account = ANY (string_to_array('$ACCS', ','))
                 AND used = 100000 AND held = 0")" 20 "  ... every account used 100000, holds 0"

# === 6. kill -9 of a worker under load ========================================
diag "[$(( $(date +%s) - T0 )) s] 6. kill -9 of worker 1 during reserves and settles on its accounts"

K=$(for i in 1 2 3 4; do pick "crash$i" 1; done | paste -sd,)
ct_sql 0 -q -c "$(for a in ${K//,/ }; do echo "SELECT earmark_set_limit('$a', 1000000000);"; done)" >/dev/null
: >"$WORK/crash.log"
"$PY" "$DRIVER" --dsn "$(dsn 0)" crash --accounts "$K" --concurrency 4 --key crash \
    --stop-file "$WORK/crash.stop" --log "$WORK/crash.log" >"$WORK/crash.out" 2>&1 &
CRASH_PID=$!
BG_PIDS+=("$CRASH_PID")
wait_lines 90 "$WORK/crash.log" '^S ' 30
ok $? "the load runs: 30 jobs reserved, charged and settled before the kill"
ct_kill_node 1
n_e=$(grep -c '^E ' "$WORK/crash.log")
wait_lines 60 "$WORK/crash.log" '^E ' $((n_e + 4))
ok $? "with worker 1 killed (kill -9) the calls fail"
# one worker down stops only its own accounts: a job on worker 2's account
# runs from start to end meanwhile
jb=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$W2', 100, 'w1-down')" 2>&1)
ok "$(matches "$jb" '^[0-9]+$')" "with worker 1 down, a reserve on worker 2's account $W2 works"
is "$(ct_val 0 "SELECT charged FROM earmark_charge('$W2', ${jb:-0}, 40)" 2>&1)" 40 "  ... a charge works"
is "$(ct_val 0 "SELECT earmark_heartbeat('$W2', ${jb:-0}) > now()" 2>&1)" t "  ... a heartbeat works"
got=$(ct_val 0 "SELECT charged || ' ' || status FROM earmark_settle('$W2', ${jb:-0})" 2>&1)
is "${got:0:100}" "40 completed" "  ... a settlement works (it must not need worker 1)"
got=$(ct_val 0 "SELECT earmark_record_usage('$W2', 5, 'w1-down')" 2>&1)
is "${got:0:100}" t "  ... recorded usage works (it must not need worker 1)"
je=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$W2', 100, 'w1-down-expired')" 2>&1)
ct_val 0 "UPDATE earmark.job SET lease_until = '$(ct_val 0 "SELECT clock_timestamp() - interval '1 ms'")'
           WHERE account = '$W2' AND job_id = ${je:-0}" >/dev/null 2>&1
got=$(ct_try 0 "SELECT earmark.sweep_account('$W2', 10)")
is "${got:0:100}|$(ct_val 0 "SELECT status FROM earmark.job WHERE account = '$W2' AND job_id = ${je:-0}")" "ok|expired" \
   "  ... earmark.sweep_account sweeps its expired hold (it must not need worker 1)"
ct_start_node 1
ok $? "worker 1 started again (crash recovery)"
n_s=$(grep -c '^S ' "$WORK/crash.log")
wait_lines 90 "$WORK/crash.log" '^S ' $((n_s + 30))
ok $? "the load goes on: 30 more jobs settled after the restart"
touch "$WORK/crash.stop"
wait "$CRASH_PID"
# what the checks above left open on worker 2's account is settled now
for j in ${jb:-} ${je:-}; do
    [[ $j =~ ^[0-9]+$ ]] && ct_val 0 "SELECT status FROM earmark_settle('$W2', $j, 0, 'cancelled')" >/dev/null 2>&1
done
diag "  acknowledged: $(grep -c '^R ' "$WORK/crash.log") reserves, $(grep -c '^S ' "$WORK/crash.log") settlements; $(grep -c '^E ' "$WORK/crash.log") failed calls"
ct_val 0 "SELECT account, job_id, status, amount, used, coalesce(charged, -1) FROM earmark.job
           WHERE account = ANY (string_to_array('$K', ','))" | tr '|' ' ' >"$WORK/crash.jobs"
ct_val 0 "SELECT account, job_id, units FROM earmark.ledger
           WHERE account = ANY (string_to_array('$K', ',')) AND job_id IS NOT NULL" | tr '|' ' ' >"$WORK/crash.ledger"
missing_r=$(awk 'FNR == NR { j[$1 " " $2] = $4 " " $5; next }
                 $1 == "R" && j[$2 " " $3] != "100 60" { n++ } END { print n + 0 }' "$WORK/crash.jobs" "$WORK/crash.log")
is "$missing_r" 0 "every reserve (with its charge) whose COMMIT returned is there, amount 100, used 60"
missing_s=$(awk 'FILENAME ~ /jobs$/ { j[$1 " " $2] = $3 " " $6; next }
                 FILENAME ~ /ledger$/ { l[$1 " " $2] = $3; next }
                 $1 == "S" && (j[$2 " " $3] != "completed " $4 || l[$2 " " $3] != $4) { n++ } END { print n + 0 }' \
                 "$WORK/crash.jobs" "$WORK/crash.ledger" "$WORK/crash.log")
is "$missing_s" 0 "every settlement that returned is there: completed, charged as returned, its ledger row"
books=$(for a in ${K//,/ }; do
    b=$(ct_val 0 "SELECT held || ' ' || used FROM earmark_budget('$a')")
    x=$(ct_val 0 "SELECT coalesce(sum(amount) FILTER (WHERE status IN ('running', 'capped')), 0) || ' '
                         || coalesce(sum(charged) FILTER (WHERE status NOT IN ('running', 'capped')), 0)
                    FROM earmark.job WHERE account = '$a'")
    l=$(ct_val 0 "SELECT coalesce(sum(units), 0) FROM earmark.ledger WHERE account = '$a'")
    if [ -n "$b" ] && [ "$b" = "$x" ] && [ "${b#* }" = "$l" ]; then echo t
    else echo "$a: budget held, used $b; jobs open, settled $x; ledger $l"; fi
done | sort -u | paste -sd' ')
is "$books" "t" "the books add up on each account: held = the open holds, used = the settled jobs = the ledger"
is "$(ct_sql 0 -A -t -q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT 'n=' || count(*) FROM earmark_check()" -c "COMMIT" | sed -n 's/^n=//p')" 0 \
   "earmark_check() is clean after the crash"

# === 7. the background worker on Citus =========================================
diag "[$(( $(date +%s) - T0 )) s] 7. the background worker on Citus (the coordinator's worker, account by account)"

for acc in "$W1" "$W2"; do
    g=$(group_of "$acc")
    j=$(ct_val 0 "SELECT job_id FROM earmark_reserve('$acc', 5000, 'to-expire')")
    ct_val 0 "SELECT charged FROM earmark_charge('$acc', $j, 1234)" >/dev/null
    # the lease ends now: a time written by the superuser (Citus takes no
    # volatile function in an UPDATE of a distributed table)
    ct_val 0 "UPDATE earmark.job SET lease_until = '$(ct_val 0 "SELECT clock_timestamp() - interval '1 ms'")'
               WHERE account = '$acc' AND job_id = $j" >/dev/null
    got=$(ct_wait 20 0 "SELECT status || ' ' || charged || ' ' || released FROM earmark.job WHERE account = '$acc' AND job_id = $j" \
          "expired 1234 3766")
    is "$got" "expired 1234 3766" "worker: an expired lease on worker $g's account $acc is swept at its recorded use"
    # (not swept: settled here, so that earmark_check at the end looks at the rest)
    ct_val 0 "SELECT status FROM earmark_settle('$acc', $j)" >/dev/null
done

# the reporter, with the local provider: every cycle's total once
for n in 0 1 2; do
    ct_sql $n -q -c "ALTER SYSTEM SET earmark.report_interval = '1s'" -c "SELECT pg_reload_conf()" >/dev/null
done
unsent="SELECT count(*) FROM (SELECT account, budget_id, sum(units) AS t FROM earmark.ledger GROUP BY 1, 2) l
          JOIN earmark.budget b USING (account, budget_id)
          LEFT JOIN earmark.local_meter m ON m.account = b.account AND m.feature = b.feature AND m.cycle_start = b.cycle_start
         WHERE m.total IS DISTINCT FROM l.t"
got=$(ct_wait 30 0 "$unsent" 0)
is "$got" 0 "reporter: every cycle's ledger total reaches the local meter (earmark.local_meter)"
# two more passes of the coordinator's reporter, then count the sends
# (a reporter that sent nothing in 30 s gets 3 s for each pass)
pw=15
[ "$got" = 0 ] || pw=3
p0=$(ct_val 0 "SELECT coalesce(last_pass_at, '-infinity') FROM earmark.reporter_state")
ct_wait $pw 0 "SELECT last_pass_at > '$p0'::timestamptz FROM earmark.reporter_state" t >/dev/null
p0=$(ct_val 0 "SELECT coalesce(last_pass_at, '-infinity') FROM earmark.reporter_state")
ct_wait $pw 0 "SELECT last_pass_at > '$p0'::timestamptz FROM earmark.reporter_state" t >/dev/null
ok $? "reporter: the coordinator's reporter passes (earmark.reporter_state.last_pass_at advances)"
is "$(ct_val 0 "SELECT count(*) || ' ' || count(*) FILTER (WHERE n = 1 AND w = 1)
                 FROM (SELECT b.account, b.budget_id,
                              count(s.send_id) AS n, max(m.writes) AS w
                         FROM earmark.budget b
                         JOIN earmark.meter_send s ON s.account = b.account AND s.budget_id = b.budget_id AND s.ok
                         JOIN earmark.local_meter m ON m.account = b.account AND m.feature = b.feature AND m.cycle_start = b.cycle_start
                        GROUP BY 1, 2) x")" \
   "$(ct_val 0 "SELECT count(*) || ' ' || count(*) FROM (SELECT DISTINCT account, budget_id FROM earmark.ledger) l")" \
   "reporter: each cycle's total sent exactly once (one meter_send row, one local_meter write)"
got=$(ct_sql 0 -A -t -q -c "SELECT verdict FROM earmark_reconcile('$W1')" 2>&1 | sort -u | paste -sd,)
is "$got" "match" "reconcile: earmark_reconcile('$W1') called on its own returns match"
got=$(ct_sql 0 -A -t -q -c "BEGIN" -c "SELECT verdict FROM earmark_reconcile('$W2')" -c "COMMIT" 2>&1 | grep -vE '^(BEGIN|COMMIT)$' | sort -u | paste -sd,)
is "$got" "match" "reconcile: earmark_reconcile('$W2') inside a transaction block returns match"
got=$(ct_try 0 "SELECT earmark_report()")
ok "$(matches "$got" '^0A000: earmark_report')" "reporter: earmark_report refuses on a distributed install, as earmark_sweep does: ${got:0:90}"

# the inbox: a plan change stored by an admin (verified_by admin) on the
# coordinator is applied once, by the coordinator's worker
ct_sql 0 -q -c "SELECT earmark_set_plan_limit('pro', 50000)" -c "SELECT earmark_set_account('$W2')" >/dev/null
ev=$(ct_val 0 "SELECT event_id FROM earmark_inbox_receive('billing', 'plan-1', 'customer.plan_changed',
                '{\"data\": {\"plan\": {\"key\": \"pro\"}}}', now() - interval '1 minute', '$W2')")
got=$(ct_wait 20 0 "SELECT status || ' ' || attempts || ' ' || result || ' ' || verified_by FROM earmark.inbox_event WHERE event_id = $ev" \
      "applied 1 plan set to pro admin")
is "$got" "applied 1 plan set to pro admin" "inbox: a plan change an admin stored is applied by the worker, on the first attempt"
is "$(ct_val 0 "SELECT plan FROM earmark.account WHERE account = '$W2'")|$(ct_val 0 "SELECT lim FROM earmark_budget('$W2')")" \
   "pro|50000" "inbox: the account (on worker 2) is on plan pro, with its limit 50000"
got=$(ct_try 1 "SELECT * FROM earmark_inbox_receive('billing', 'plan-on-worker', 'customer.plan_changed',
                '{\"data\": {\"plan\": {\"key\": \"pro\"}}}', now(), '$W2')")
ok "$(matches "$got" '^[0-9A-Z]{5}: ')" "inbox: earmark_inbox_receive on a worker refuses (the inbox is on the coordinator): ${got:-it stored the event}"
is "$(ct_val 1 "SELECT count(*) FROM ONLY earmark.inbox_event")" 0 "inbox: no event in worker 1's own inbox_event"
got=$(ct_try 2 "SELECT earmark_set_plan_limit('pro', 1)")
is "$got" "0A000: earmark_set_plan_limit runs on the Citus coordinator" "plans: earmark_set_plan_limit on a worker refuses: 0A000"
is "$(ct_val 0 "SELECT lim FROM earmark.plan_limit WHERE plan = 'pro'")" 50000 "  ... and the plan keeps its limit"
# (what a worker stored is removed, so that section 5 looks at the rest)
ct_val 1 "DELETE FROM ONLY earmark.inbox_event" >/dev/null

# === 8. timing ===================================================================
diag "[$(( $(date +%s) - T0 )) s] 8. timing (the figures compare; on this machine they do not measure capacity)"

LC=$(pick latc 1)
LW=$(pick latw 1)
LJ=$(pick latj 1)
ct_sql 0 -q -c "SELECT earmark_set_limit('$LC', NULL)" -c "SELECT earmark_set_limit('$LW', NULL)" \
    -c "SELECT earmark_set_limit('$LJ', NULL)" >/dev/null
sq -c "SELECT earmark_set_limit('one', 100000)" -c "SELECT earmark_set_limit('lats', NULL)" \
   -c "SELECT earmark_set_limit('latj', NULL)" \
   -c "$(for a in ${ACCS//,/ }; do echo "SELECT earmark_set_limit('$a', 100000);"; done)" >/dev/null
"$PY" "$DRIVER" --dsn "$(single_dsn)" load --accounts one --jobs 120 --amount 1000 --concurrency 50 --key load >"$WORK/s_load1" 2>&1
c0=$(node_cpu "$EM_DATA")
"$PY" "$DRIVER" --dsn "$(single_dsn)" load --accounts "$ACCS" --jobs 120 --amount 1000 --concurrency 50 --key load >"$WORK/s_load20" 2>&1
CPU_S_LOAD20=$(( $(node_cpu "$EM_DATA") - c0 ))
is "$(kv "$WORK/s_load1" admitted) $(kv "$WORK/s_load1" refused)|$(kv "$WORK/s_load20" admitted) $(kv "$WORK/s_load20" refused)" \
   "100 20|2000 400" "the same load runs on a single node: the same outcome"

# one reserve at a time, through the coordinator, on the worker that holds
# the account, and on the single node; with each server's CPU time
# (each server's CPU while idle, per second, is taken off: the background
# workers' passes reach every node)
declare -A IDLE
idle_rates() {
    local d t0 b=() i=0
    t0=$(date +%s%N)
    for d in "$@"; do b+=("$(node_cpu "$d")"); done
    sleep 3
    for d in "$@"; do
        IDLE[$d]=$(awk -v t=$(( $(node_cpu "$d") - ${b[$i]} )) -v ns=$(( $(date +%s%N) - t0 )) 'BEGIN { print t / (ns / 1e9) }')
        i=$((i + 1))
    done
}
latency() {  # latency NAME WHAT DSN ACCOUNT DATADIRS...
    local name=$1 what=$2 dsn=$3 acc=$4 d before=() after=() i=0 cpu= t0 ns
    shift 4
    t0=$(date +%s%N)
    for d in "$@"; do before+=("$(node_cpu "$d")"); done
    "$PY" "$DRIVER" --dsn "$dsn" latency --what "$what" --account "$acc" --calls 100 --key lat >"$WORK/lat_$name" 2>&1
    for d in "$@"; do after+=("$(node_cpu "$d")"); done
    ns=$(( $(date +%s%N) - t0 ))
    for d in "$@"; do
        cpu+="${cpu:+ + }$(awk -v k=$TICK_MS -v t=$(( ${after[$i]} - ${before[$i]} )) -v idle="${IDLE[$d]:-0}" -v ns=$ns \
                           'BEGIN { x = (t - idle * ns / 1e9) * k / 110; printf "%.1f", x < 0 ? 0 : x }')"
        i=$((i + 1))
    done
    echo "$(kv "$WORK/lat_$name" median_ms)|$(kv "$WORK/lat_$name" p90_ms)|$cpu"
}
idle_rates "$(ct_dir 0)/data" "$(ct_dir 1)/data" "$(ct_dir 2)/data" "$EM_DATA"
lat_c=$(latency coord reserve "$(dsn 0)" "$LC" "$(ct_dir 0)/data" "$(ct_dir 1)/data" "$(ct_dir 2)/data")
lat_w=$(latency worker reserve "$(dsn 1)" "$LW" "$(ct_dir 1)/data" "$(ct_dir 0)/data" "$(ct_dir 2)/data")
lat_s=$(latency single reserve "$(single_dsn)" lats "$EM_DATA")
job_c=$(latency jcoord job "$(dsn 0)" "$LJ" "$(ct_dir 0)/data" "$(ct_dir 1)/data" "$(ct_dir 2)/data")
job_s=$(latency jsingle job "$(single_dsn)" latj "$EM_DATA")
n=0
for x in "$lat_c" "$lat_w" "$lat_s" "$job_c" "$job_s"; do
    [[ $x =~ ^[0-9.]+\|[0-9.]+\|[0-9.\ +]+$ ]] && n=$((n + 1))
done
is "$n" 5 "the timing runs reported their figures"
diag "| run | single node | Citus, through the coordinator |"
diag "| --- | --- | --- |"
diag "| load: 120 jobs, 1 account, 50 at a time | $(kv "$WORK/s_load1" jobs_per_s) jobs/s | $(kv "$WORK/load1" jobs_per_s) jobs/s |"
diag "| load: 2400 jobs, 20 accounts, 50 at a time | $(kv "$WORK/s_load20" jobs_per_s) jobs/s | $(kv "$WORK/load20" jobs_per_s) jobs/s |"
diag "| load, 20 accounts: server CPU per job (reserve, charge, settle) | $(awk -v k=$TICK_MS -v t=$CPU_S_LOAD20 'BEGIN { printf "%.1f", t * k / 2400 }') ms | $(awk -v k=$TICK_MS -v t=$CPU_LOAD20 'BEGIN { printf "%.1f", t * k / 2400 }') ms (all three nodes) |"
diag "| one reserve, median / p90 | $(cut -d'|' -f1 <<<"$lat_s") / $(cut -d'|' -f2 <<<"$lat_s") ms | $(cut -d'|' -f1 <<<"$lat_c") / $(cut -d'|' -f2 <<<"$lat_c") ms (connected to worker 1: $(cut -d'|' -f1 <<<"$lat_w") / $(cut -d'|' -f2 <<<"$lat_w") ms) |"
diag "| one job (reserve, charge, settle) on one connection, median / p90 | $(cut -d'|' -f1 <<<"$job_s") / $(cut -d'|' -f2 <<<"$job_s") ms | $(cut -d'|' -f1 <<<"$job_c") / $(cut -d'|' -f2 <<<"$job_c") ms |"
diag "| server CPU per job on one connection | $(cut -d'|' -f3 <<<"$job_s") ms | coordinator + worker 1 + worker 2: $(cut -d'|' -f3 <<<"$job_c") ms |"
diag "| server CPU per reserve | $(cut -d'|' -f3 <<<"$lat_s") ms | coordinator + worker 1 + worker 2: $(cut -d'|' -f3 <<<"$lat_c") ms (connected to worker 1: worker 1 + coordinator + worker 2: $(cut -d'|' -f3 <<<"$lat_w") ms) |"

# === 5. the per-node view, ids, earmark_check ====================================
diag "[$(( $(date +%s) - T0 )) s] 5. the per-node view, ids, and the books at the end"

for n in 1 2; do
    is "$(ct_val $n "SELECT coalesce(string_agg(c.oid::regclass::text, ','), 'none') FROM pg_class c
                      WHERE c.oid::regclass::text IN ($(sql_list "$PER_ACCOUNT $REFERENCE")) AND pg_relation_size(c.oid) > 0")" \
       none "worker $n: its own copies of the distributed and reference tables hold no rows (pg_relation_size 0)"
    is "$(for t in earmark.inbox_event earmark.inbox_receipt earmark.jwks; do ct_val $n "SELECT count(*) FROM ONLY $t"; done | paste -sd' ')" \
       "0 0 0" "worker $n: its own inbox_event, inbox_receipt, jwks are empty"
    is "$(for t in earmark.reporter_state earmark.inbox_handler; do ct_val $n "SELECT count(*) FROM ONLY $t"; done | paste -sd' ')" \
       "0 0" "worker $n: the install's seed rows of reporter_state and inbox_handler are cleared there (coordinator-only tables)"
done
is "$(ct_val 0 "SELECT count(*) - count(DISTINCT job_id) FROM earmark.job")|$(ct_val 0 "SELECT count(*) - count(DISTINCT entry_id) FROM earmark.ledger_entry")|$(ct_val 0 "SELECT count(*) - count(DISTINCT budget_id) FROM earmark.budget")" \
   "0|0|0" "job, ledger entry and budget ids are unique in the whole cluster"
is "$(ct_val 0 "WITH j AS MATERIALIZED (SELECT account, job_id >> 48 AS g FROM earmark.job)
                SELECT count(*) FILTER (WHERE j.g <> p.groupid) || ' of ' || count(*)
                  FROM j JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('earmark.account', j.account)")" \
   "0 of $(ct_val 0 "SELECT count(*) FROM earmark.job")" "every job id carries the group of the worker that holds its account"
# after a restore the workers' id sequences start again at 1 (set back
# here): a second earmark_distribute() moves each past its group's ids
for n in 1 2; do
    ct_val $n "SELECT setval('earmark.job_id_seq', 1, false), setval('earmark.budget_id_seq', 1, false),
                      setval('earmark.entry_id_seq', 1, false)" >/dev/null
done
ct_sql 0 -A -t -q -c "SELECT * FROM earmark_distribute()" >"$WORK/redistribute.out" 2>&1
is "$(grep -E ":($(ct_port 1)|$(ct_port 2))\|3 id sequences moved past its ids$" "$WORK/redistribute.out" | wc -l)" 2 \
   "with the workers' id sequences set back, earmark_distribute() moves three on each worker"
[ "$(grep -c 'moved past' "$WORK/redistribute.out")" = 2 ] || sed 's/^/#   /' "$WORK/redistribute.out"
r=$(ct_val 0 "SELECT job_id || ' ' || admitted FROM earmark_reserve('$W1', 1, 'after-restore')" 2>&1)
ok "$(matches "$r" '^[0-9]+ true$')" "  ... and a reserve on worker 1's account gets a new job id: ${r:0:100}"
[[ $r =~ ^[0-9]+ ]] && ct_val 0 "SELECT status FROM earmark_settle('$W1', ${r%% *}, 0, 'cancelled')" >/dev/null
is "$(ct_val 0 "SELECT count(*) FROM earmark_distribute()")" 0 "  ... and a third run has nothing to do"

chk=$(ct_sql 0 -A -t -q -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT invariant || ' ' || coalesce(account, '') || ' ' || detail FROM earmark_check()" -c "COMMIT" 2>&1 | grep -vE '^(BEGIN|COMMIT)$')
is "$chk" "" "earmark_check() on the coordinator is clean at the end"
[ -n "$chk" ] && echo "$chk" | head -20 | sed 's/^/#   /'

diag "the layer ran $(( $(date +%s) - T0 )) s"
done_testing
