#!/usr/bin/env bash
# scripts/test.sh: earmark's test layers on a private throwaway cluster.
#
#   sudo ./scripts/test.sh [quick|standard|full]      (or EM_TIER=...)
#
# Installs what is missing (apt), builds and installs earmark, starts a
# PostgreSQL 15 cluster as an unprivileged user with earmark preloaded, and
# runs the layers of the tier:
#
#   quick     pg_regress (sql/) and the isolation specs (test/isolation):
#             what "make installcheck" runs, a minute or two
#   standard  quick, pgTAP (test/pgtap) and the integration scripts
#             worker, meter and fuzz_sql (test/integration)
#   full      (the default; CI runs it) standard with every integration
#             script, earmark distributed on a Citus coordinator and two
#             workers (test/citus/earmark.sh; one "skipped" line when Citus
#             is not installed), the libFuzzer targets (test/fuzz), the same
#             pg_regress, isolation, pgTAP and most integration scripts
#             again with every server process under valgrind memcheck (on
#             two clusters side by side), and pg_regress and the isolation
#             specs at faked dates ("dates")
#
# Ends with a table of the layers (time, passed, failed) and one line
# "N passed, N failed", and a non-zero exit status on any failure.
#
# Counting: one per pg_regress file, one per isolation spec, one per pgTAP
# assertion, one per integration assertion, one per fuzz target, one per
# memcheck check.  A runner that dies counts every test it did not pass as
# failed; an integration script must print its TAP plan ("1..N", N equal to
# the number of "ok" and "not ok" lines) and exit 0, or it counts one more
# failure.
#
# EM_LAYERS picks layers instead of the tier's (regress isolation pgtap
# integration citus fuzz valgrind dates); EM_INTEGRATION picks integration scripts
# by name (e.g. "meter worker"); EM_VALGRIND_SCRIPTS those of the valgrind
# run; EM_VALGRIND=0 skips valgrind; EM_DATES the faked dates of "dates";
# EM_OUT the output directory (every log is kept there).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set +e

TIER=${1:-${EM_TIER:-full}}
case $TIER in
    quick)    TIER_LAYERS="regress isolation" ;;
    standard) TIER_LAYERS="regress isolation pgtap integration"
              EM_INTEGRATION=${EM_INTEGRATION:-worker meter fuzz_sql} ;;
    full)     TIER_LAYERS="regress isolation pgtap integration citus fuzz valgrind dates" ;;
    *)        echo "usage: $0 [quick|standard|full]" >&2; exit 2 ;;
esac
EM_LAYERS=${EM_LAYERS:-$TIER_LAYERS}
layer() { case " $EM_LAYERS " in *" $1 "*) return 0 ;; esac; return 1; }
# the faked dates of the dates layer: a month's last seconds (the run
# crosses into the next month), and the last day of February in a leap year
EM_DATES=${EM_DATES:-2027-01-31 23:59:50|2028-02-29 12:00:00}
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
layer dates && EM_PACKAGES+=(libfaketime)

em_install_packages || exit 1

PASSED=0
FAILED=0
OUT=${EM_OUT:-$(mktemp -d /tmp/earmark-test-out.XXXXXX)}
mkdir -p "$OUT"
em_log "tier $TIER: layers $EM_LAYERS; output in $OUT"
chmod 777 "$OUT"
cd "$EM_ROOT"

# count PASSED FAILED [WHAT [DIFFS]]: add to the totals; a failure is also
# noted with its layer (WHAT: which tests, DIFFS: their regression.diffs)
# for "what failed" at the very end, printed after the server logs' tails
# so that the last lines of a long run's output say which tests failed and
# how, without scrolling back through every layer.
FAIL_NOTES=()
FAIL_DIFFS=()
count() {
    PASSED=$((PASSED + $1))
    FAILED=$((FAILED + $2))
    [ "$2" -gt 0 ] || return 0
    FAIL_NOTES+=("${T_NAME:-?}: ${3:-$2 failed}")
    if [ -n "${4:-}" ] && [ -f "$4" ]; then FAIL_DIFFS+=("$4"); fi
}

# The table at the end: one row per layer run, its time and counts.
TABLE=()
T_NAME=
T_START=0
T_P=0
T_F=0
t_begin() { T_NAME=$1; T_START=$(date +%s); T_P=$PASSED; T_F=$FAILED; }
t_end() {
    TABLE+=("$(printf '%-34s %7s %7s %7s' "$T_NAME" "$(( $(date +%s) - T_START ))" \
               "$((PASSED - T_P))" "$((FAILED - T_F))")")
}

# count_regress LOG NAME EXPECTED RC: pg_regress and pg_isolation_regress
# print "... ok" per passing test.  Every test that did not print it failed
# (also those a runner that died never reached), and a non-zero exit status
# with every test "ok" still counts one failure.
count_regress() {
    local log=$1 n=$3 rc=$4 p f
    p=$(grep -cE '^(test| ) .* \.\.\. ok|^ok ' "$log" || true)
    f=$((n - p))
    [ "$f" -lt 0 ] && f=0
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    count "$p" "$f" "$(grep -E '\.\.\. (FAILED|failed)' "$log" | awk '{print $2}' | tr '\n' ' ')(exit status $rc)" "${5:-}"
    em_log "$2: $p passed, $f failed (of $n, exit status $rc)"
}

# not_ok TEXT: one failure of the runner's own, printed as a TAP line
not_ok() { echo "not ok - $1"; count 0 1 "$1"; }

# not_ok_lines LOG: the first "not ok" lines of a TAP log, on one line
not_ok_lines() { grep -E '^not ok( |$)' "$1" | head -5 | cut -c1-160 | tr '\n' ';'; }

# count_tap LOG NAME RC: a TAP script's "ok" and "not ok" lines; its plan
# "1..N" must be there once and N must be the number of those lines (a
# script that died, or skipped assertions, did not print it or printed
# another number), and it must have exited 0.  Each of these that does not
# hold counts one failure more (printed as a "not ok" line here).
count_tap() {
    local log=$1 name=$2 rc=$3 p f plans plan extra=0
    p=$(grep -cE '^ok( |$)' "$log")
    f=$(grep -cE '^not ok( |$)' "$log")
    plans=$(grep -cE '^1\.\.[0-9]+$' "$log")
    plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$log" | head -1)
    if [ "$plans" -ne 1 ]; then
        echo "not ok - $name: $plans TAP plans (1..N) printed, not one (it died before its end?)"
        extra=$((extra + 1))
    elif [ "$plan" -ne $((p + f)) ]; then
        echo "not ok - $name: planned $plan assertions, printed $((p + f))"
        extra=$((extra + 1))
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && [ "$extra" -eq 0 ]; then
        echo "not ok - $name: exit status $rc without a failed assertion"
        extra=1
    fi
    count "$p" $((f + extra)) "$(not_ok_lines "$log")"
    em_log "$name: $p passed, $((f + extra)) failed (plan ${plan:-none}, exit status $rc)"
}

start_test_cluster() {
    em_start_cluster "${EM_TEST_PORT:-55432}" \
        "shared_preload_libraries = 'earmark,pg_cron'" \
        "cron.database_name = 'postgres'" \
        "cron.use_background_workers = on" \
        "max_worker_processes = 16" \
        "earmark.database = 'postgres'" \
        "earmark.sweep_interval = '200ms'" \
        "max_prepared_transactions = 10" \
        "log_min_messages = warning" || return 1
    export EM_DATA EM_BASE EM_SOCK EM_PORT EM_ROOT
}

# stop_test_cluster NAME: stop the cluster, keeping its server log as
# $OUT/server-NAME.log (em_stop_cluster removes the cluster's directory)
SERVER_LOGS=()
stop_test_cluster() {
    if [ -n "${EM_BASE:-}" ] && [ -f "$EM_BASE/server.log" ]; then
        cp "$EM_BASE/server.log" "$OUT/server-$1.log" 2>/dev/null && SERVER_LOGS+=("$OUT/server-$1.log")
    fi
    em_stop_cluster
    EM_DATA=
}

# run_regress NAME OUTDIR [ENV...]: pg_regress over sql/ against the cluster
run_regress() {
    local name=$1 dir=$2 tests rc diffs=$2/regress/regression.diffs
    shift 2
    tests=$(cd sql && ls *.sql 2>/dev/null | sed 's/\.sql$//' | sort)
    [ -n "$tests" ] || return 0
    em_log "$name: $(echo $tests | wc -w) files"
    env "$@" "$PGXS_DIR/test/regress/pg_regress" --inputdir=. --outputdir="$dir/regress" \
        --bindir="$EM_PGBIN" --load-extension=earmark --dbname=earmark_regress \
        $tests >"$dir/regress.log" 2>&1
    rc=$?
    cat "$dir/regress.log"
    [ -f "$diffs" ] && head -200 "$diffs"
    count_regress "$dir/regress.log" "$name" "$(echo $tests | wc -w)" "$rc" "$diffs"
}

# run_isolation NAME OUTDIR: the isolation specs against the cluster
run_isolation() {
    local name=$1 dir=$2 tests rc diffs=$2/isolation/regression.diffs
    tests=$(cd test/isolation/specs 2>/dev/null && ls *.spec 2>/dev/null | sed 's/\.spec$//' | sort)
    [ -n "$tests" ] || return 0
    em_log "$name: $(echo $tests | wc -w) specs"
    "$PGXS_DIR/test/isolation/pg_isolation_regress" --inputdir=test/isolation \
        --outputdir="$dir/isolation" --bindir="$EM_PGBIN" --load-extension=earmark \
        --dbname=earmark_isolation $tests >"$dir/isolation.log" 2>&1
    rc=$?
    cat "$dir/isolation.log"
    [ -f "$diffs" ] && head -200 "$diffs"
    count_regress "$dir/isolation.log" "$name" "$(echo $tests | wc -w)" "$rc" "$diffs"
}

# run_pgtap NAME OUTDIR: every pgTAP file in a database of its own
run_pgtap() {
    local name=$1 dir=$2 rc p f
    ls test/pgtap/*.sql >/dev/null 2>&1 || return 0
    em_log "$name"
    em_psql -d postgres -c "DROP DATABASE IF EXISTS earmark_tap" -c "CREATE DATABASE earmark_tap"
    em_psql -d earmark_tap -c "CREATE EXTENSION pgtap" -c "CREATE EXTENSION earmark"
    pg_prove --verbose -d earmark_tap test/pgtap/*.sql >"$dir/pgtap.log" 2>&1
    rc=$?
    grep -vE '^ok ' "$dir/pgtap.log"
    p=$(grep -cE '^ok ' "$dir/pgtap.log")
    f=$(grep -cE '^not ok ' "$dir/pgtap.log")
    # a file that dies before its plan is done (pg_prove checks the plans)
    # counts as one failure
    if { ! grep -q '^Result: PASS' "$dir/pgtap.log" || [ "$rc" -ne 0 ]; } && [ "$f" -eq 0 ]; then f=1; fi
    count "$p" "$f" "$(not_ok_lines "$dir/pgtap.log")(exit status $rc)"
    em_log "$name: $p passed, $f failed (exit status $rc)"
}

# run_integration NAME OUTDIR SCRIPTS [ENV...]: each script's output in
# OUTDIR/int-SCRIPT.log, counted with its plan
run_integration() {
    local name=$1 dir=$2 scripts=$3 t rc
    shift 3
    for t in $scripts; do
        if [ ! -f "test/integration/$t.sh" ]; then
            not_ok "$name: test/integration/$t.sh does not exist"
            continue
        fi
        em_log "$name: $t"
        env "$@" timeout 1800 bash "test/integration/$t.sh" >"$dir/int-$t.log" 2>&1
        rc=$?
        cat "$dir/int-$t.log"
        count_tap "$dir/int-$t.log" "$name $t" "$rc"
    done
}

integration_scripts() {
    local t names=""
    for t in test/integration/*.sh; do
        t=$(basename "$t" .sh)
        [ "$t" = tap ] && continue
        names="$names $t"
    done
    echo ${EM_INTEGRATION:-$names}
}

# --- build, and the layers on a plain cluster ---------------------------------
t_begin "build and start"
em_build || exit 1
PGXS_DIR=$(dirname "$("$EM_PGBIN/pg_config" --pgxs)")/..
if layer regress || layer isolation || layer pgtap || layer integration; then
    start_test_cluster || exit 1
fi
t_end
PLAIN=$OUT/plain
mkdir -p "$PLAIN"
chmod 777 "$PLAIN"
if layer regress; then t_begin "pg_regress"; run_regress pg_regress "$PLAIN"; t_end; fi
if layer isolation; then t_begin "isolation"; run_isolation isolation "$PLAIN"; t_end; fi
if layer pgtap; then t_begin "pgTAP"; run_pgtap pgTAP "$PLAIN"; t_end; fi
if layer integration; then
    for s in $(integration_scripts); do
        t_begin "integration $s"
        run_integration integration "$PLAIN" "$s"
        t_end
    done
fi
stop_test_cluster plain

# --- citus: a coordinator and two workers of their own (test/citus) ---------
# Runs when Citus is installed (.ci/run builds it first); otherwise the
# script prints one "skipped: Citus is not installed" line, and nothing is
# counted.
if layer citus; then
    t_begin "citus"
    # earmark.sh, escrow_settle.sh (a settle of escrow slot jobs,
    # whose locks are SQL on Citus), mark_shard_move.sh (an account's
    # shards moved while its cycle is marked), mark_one.sh (a failed
    # pass leaves a cycle one mark), review_batch_repeat.sh (a usage
    # batch's repeats and errors in array order) and review_key_order.sh
    # (the key's index led by the key, distributed and moved) and
    # call_shapes.sh (statements Citus would crash the coordinator on),
    # refresh_lock.sh (the worker's limit read and earmark_refresh_limits
    # store one after the other), worker_isolation.sh (a worker node's
    # repeatable read default refused), store_limits_fallback.sh (a
    # failed store recorded all the same) and report_isolation.sh (a node
    # at repeatable read holds up no other node's report) and
    # distribute_pass.sh (earmark_distribute and a held pass of the
    # coordinator's worker wait for each other, never deadlock), with
    # review_distribute_callers.sh (lock_timeout, a second call, refused
    # at REPEATABLE READ), review_distribute_worker_node.sh (a worker
    # node's worker idles, before the distribution too),
    # review_worker_added_late.sh (a worker that started before
    # citus_add_node idles after it) and
    # review_distribute_report_straddle.sh (a distribution between a
    # report's claim and its finish) and review_distribute_worker_path.sh
    # (what it sends to the workers runs no operator a role planted in
    # public there) and review_in_use_router.sh (the ledger's key with the
    # account last, and the in-use check before an anchor change, one
    # task), each on a cluster of its own
    for ct in earmark escrow_settle mark_shard_move mark_one review_batch_repeat review_key_order call_shapes refresh_lock worker_isolation store_limits_fallback report_isolation distribute_pass review_distribute_callers review_distribute_worker_node review_worker_added_late review_distribute_report_straddle review_distribute_worker_path review_in_use_router; do
        em_log "citus: test/citus/$ct.sh"
        CT_PORT=${EM_CITUS_PORT:-$(( ${EM_TEST_PORT:-55432} + 300 ))} timeout 1800 \
            bash test/citus/$ct.sh >"$OUT/citus-$ct.log" 2>&1
        rc=$?
        cat "$OUT/citus-$ct.log"
        if [ "$rc" -eq 0 ] && grep -qx 'skipped: Citus is not installed' "$OUT/citus-$ct.log"; then
            em_log "citus: skipped (Citus is not installed; README says how to get it)"
            break
        fi
        count_tap "$OUT/citus-$ct.log" "citus test/citus/$ct.sh" "$rc"
    done
    t_end
fi

# --- libFuzzer over the C parsers and verifiers (no server needed) ------------
if layer fuzz; then
    t_begin "libFuzzer"
    em_log "libFuzzer: test/fuzz/run.sh"
    timeout 600 bash test/fuzz/run.sh >"$OUT/fuzz.log" 2>&1
    rc=$?
    cat "$OUT/fuzz.log"
    count_tap "$OUT/fuzz.log" "libFuzzer test/fuzz/run.sh" "$rc"
    t_end
fi

# --- dates: pg_regress and the isolation specs at faked dates -----------------
# The server runs under libfaketime (LD_PRELOAD through a wrapper that
# pg_ctl starts instead of postgres), its clock starting at each date of
# EM_DATES and running on from there; the clients keep the real one.
if layer dates; then
    IFS='|' read -r -a DATES <<<"$EM_DATES"
    for d in "${DATES[@]}"; do
        t_begin "dates: $d"
        tag=$(echo "$d" | tr -c '0-9\n' '-')
        DT=$OUT/dates-$tag
        mkdir -p "$DT"
        chmod 777 "$DT"
        if [ ! -r "$FAKETIME_LIB" ]; then
            not_ok "dates $d: $FAKETIME_LIB is missing (Debian: libfaketime)"; t_end; continue
        fi
        printf '#!/bin/sh\nLD_PRELOAD=%s FAKETIME="@%s" FAKETIME_DONT_RESET=1 FAKETIME_DONT_FAKE_MONOTONIC=1 exec %s/postgres "$@"\n' \
            "$FAKETIME_LIB" "$d" "$EM_PGBIN" >"$DT/postgres"
        chmod 755 "$DT/postgres"
        if EM_PG_WRAPPER=$DT/postgres start_test_cluster; then
            now=$(em_psql -At -d postgres -c "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')")
            em_log "dates: the server's clock reads $now (UTC)"
            case $now in
                "${d:0:13}"*) ;;
                *) not_ok "dates $d: the server's clock reads $now, not the faked date" ;;
            esac
            run_regress "pg_regress at $d" "$DT"
            run_isolation "isolation at $d" "$DT"
            [ "${EM_DATES_PGTAP:-0}" = 1 ] && run_pgtap "pgTAP at $d" "$DT"
            stop_test_cluster "dates-$tag"
        else
            not_ok "dates $d: the server did not start under libfaketime"
            stop_test_cluster "dates-$tag"
        fi
        t_end
    done
fi

# --- valgrind: pg_regress, the isolation specs, pgTAP and the integration -----
# scripts (EM_VALGRIND_SCRIPTS) again, with every server process under
# memcheck: backends, the earmark worker, pg_cron.  Their results count like
# the plain run's (the tests wait for states, not for time, so valgrind's
# slowdown of about 30 times changes no answer), and so does that no
# memcheck error is earmark's (test/valgrind/check.py: its stack reaches
# earmark's code before PostgreSQL's).  Errors of PostgreSQL itself
# (without suppressions, e.g. uninitialised padding written to WAL) are not
# ours to judge.  The load scripts run smaller under memcheck (5,000 bad
# calls instead of 100,000).  The scripts that only run the gate's and the
# ledger's SQL paths again, which pg_regress, the isolation specs and pgTAP
# already take under memcheck, are left to EM_VALGRIND_SCRIPTS, so that the
# full suite stays well under CI's 90 minutes: crash.sh (about 14 minutes
# under memcheck; its restarts keep the wrapper), upgrade.sh (about 14),
# escrow_stress.sh (about 15; 10 clients, a limit of 2,000 and leases of
# 60 s when it runs), lab.sh and hunt.sh.
VG_SCRIPTS=${EM_VALGRIND_SCRIPTS:-meter reconcile inbox_worker jwt worker fuzz_sql engine_room}

# The layer runs as two streams side by side, each on a cluster of its own
# under memcheck: "sql" (pg_regress, the isolation specs) and "int" (pgTAP,
# the integration scripts): 21 minutes side by side on 2 cores, where one
# after the other took 38 (2026-12-05; pgTAP, about 50 s, went to "int"
# after, which had ended 140 s before "sql").  Each stream is a subshell: it counts from zero,
# writes its output to $OUT/valgrind-TAG.log and its counts, table rows
# and failure notes to $OUT/valgrind-TAG/state.sh, which the runner adds to
# its own once both have ended.  The clusters' sockets are in directories of
# their own, and their ports differ by 20, past the ports that integration
# scripts derive from theirs (PGPORT + 1 to + 11).  What a run before left
# in $OUT (its counts, its memcheck logs) is removed first: a stream that
# dies before writing its counts must not pass with the old ones.  An
# interrupt of the runner ends both streams, whose clusters stop on exit.

# vg_stream TAG PORT PARTS...: one stream; a part is regress, isolation,
# pgtap or int:SCRIPT
vg_stream() {
    local tag=$1 port=$2 vg=$OUT/valgrind-$1 part s
    shift 2
    PASSED=0 FAILED=0 TABLE=() FAIL_NOTES=() FAIL_DIFFS=() SERVER_LOGS=()
    mkdir -p "$vg"
    chmod 777 "$vg"
    # --leak-check=no: a backend's exit would otherwise scan its memory,
    # shared buffers included, for a leak summary that --quiet does not
    # print (0.2 to 0.5 s a connection here; PostgreSQL frees by memory
    # context, not by pointer, so its leak reports say nothing anyway)
    printf '#!/bin/sh\nexec valgrind --quiet --leak-check=no --num-callers=40 --log-file=%s/vg.%%p.log %s/postgres "$@"\n' \
        "$vg" "$EM_PGBIN" >"$vg/postgres"
    chmod 755 "$vg/postgres"
    t_begin "valgrind: start ($tag)"
    if EM_TEST_PORT=$port EM_PG_WRAPPER=$vg/postgres start_test_cluster; then
        t_end
        for part in "$@"; do
            case $part in
                regress) t_begin "valgrind: pg_regress"; run_regress "valgrind pg_regress" "$vg" ;;
                isolation) t_begin "valgrind: isolation"; run_isolation "valgrind isolation" "$vg" ;;
                pgtap) t_begin "valgrind: pgTAP"; run_pgtap "valgrind pgTAP" "$vg" ;;
                int:*)
                    s=${part#int:}
                    t_begin "valgrind: integration $s"
                    run_integration "valgrind integration" "$vg" "$s" \
                        EM_PG_WRAPPER="$vg/postgres" EM_FUZZ_CALLS=5000 ESCROW_STRESS_CLIENTS=10 \
                        ESCROW_STRESS_SECONDS=20 ESCROW_STRESS_LIMIT=2000 ESCROW_STRESS_LEASE=60 \
                        ESCROW_STRESS_PAIR_CLIENTS=5 ESCROW_STRESS_PAIR_SECONDS=5 ;;
            esac
            t_end
        done
    else
        not_ok "valgrind $tag: the server did not start under memcheck"
        t_end
    fi
    stop_test_cluster "valgrind-$tag"
    declare -p PASSED FAILED TABLE FAIL_NOTES FAIL_DIFFS SERVER_LOGS >"$vg/state.sh"
}

# vg_merge TAG: print a stream's output and add its state to the runner's
vg_merge() {
    local log=$OUT/valgrind-$1.log state=$OUT/valgrind-$1/state.sh
    cat "$log"
    if [ ! -f "$state" ]; then
        not_ok "valgrind $1: the stream ended without its counts (see $log)"
        return
    fi
    local PASSED0=$PASSED FAILED0=$FAILED TABLE0=("${TABLE[@]}") NOTES0=("${FAIL_NOTES[@]}") \
        DIFFS0=("${FAIL_DIFFS[@]}") LOGS0=("${SERVER_LOGS[@]}")
    # declare -p wrote "declare"; inside this function that would make
    # locals, so the state is read as globals
    source <(sed 's/^declare /declare -g /' "$state")
    PASSED=$((PASSED0 + PASSED))
    FAILED=$((FAILED0 + FAILED))
    TABLE=("${TABLE0[@]}" "${TABLE[@]}")
    FAIL_NOTES=("${NOTES0[@]}" "${FAIL_NOTES[@]}")
    FAIL_DIFFS=("${DIFFS0[@]}" "${FAIL_DIFFS[@]}")
    SERVER_LOGS=("${LOGS0[@]}" "${SERVER_LOGS[@]}")
}

if [ "${EM_VALGRIND:-1}" = 1 ] && layer valgrind; then
    em_log "valgrind: pg_regress and the isolation specs on one cluster, pgTAP and integration ($VG_SCRIPTS) on another, side by side under memcheck; output at the end"
    VG_PORT=${EM_TEST_PORT:-55432}
    VG_START=$(date +%s)
    rm -rf "$OUT"/valgrind-sql "$OUT"/valgrind-int "$OUT"/valgrind-sql.log "$OUT"/valgrind-int.log
    vg_stream sql "$VG_PORT" regress isolation >"$OUT/valgrind-sql.log" 2>&1 &
    VG_SQL=$!
    vg_stream int $((VG_PORT + 20)) pgtap $(printf 'int:%s ' $VG_SCRIPTS) >"$OUT/valgrind-int.log" 2>&1 &
    VG_INT=$!
    trap 'kill "$VG_SQL" "$VG_INT" 2>/dev/null; wait; exit 130' INT TERM
    wait "$VG_SQL" "$VG_INT"
    trap - INT TERM
    TABLE+=("$(printf '%-34s %7s %7s %7s' "valgrind: both streams, wall time" "$(( $(date +%s) - VG_START ))" "" "")")
    vg_merge sql
    vg_merge int
    t_begin "valgrind: memcheck"
    logs=$(ls "$OUT"/valgrind-*/vg.*.log 2>/dev/null | wc -l)
    if [ "$logs" -gt 100 ]; then echo "ok - valgrind: $logs processes ran under memcheck"; count 1 0
    else not_ok "valgrind: only $logs processes ran under memcheck"; fi
    # the checker itself, on two logs of memcheck's format: an error whose
    # stack is in earmark's code first (a sample), and two PostgreSQL
    # errors from a run, with earmark's worker further down the stack
    if ! python3 test/valgrind/check.py test/valgrind/samples/ours.log >/dev/null &&
        python3 test/valgrind/check.py test/valgrind/samples/theirs.log >/dev/null; then
        echo "ok - valgrind: check.py finds the sample error in earmark's code and passes PostgreSQL's"; count 1 0
    else
        not_ok "valgrind: check.py misjudges test/valgrind/samples (ours.log must fail, theirs.log pass)"
    fi
    if python3 test/valgrind/check.py "$OUT"/valgrind-*/vg.*.log >"$OUT/valgrind-ours.txt"; then
        echo "ok - valgrind: no memcheck error in earmark's code"; count 1 0
    else
        not_ok "valgrind: memcheck errors in earmark's code"
        head -120 "$OUT/valgrind-ours.txt"
    fi
    t_end
fi

if [ "$FAILED" -ne 0 ]; then
    for l in "${SERVER_LOGS[@]}"; do
        em_log "server log tail ($l):"
        tail -50 "$l" >&2
    done
    echo
    echo "what failed:"
    for n in "${FAIL_NOTES[@]}"; do echo "  $n"; done
    for d in "${FAIL_DIFFS[@]}"; do
        echo "--- the first lines of $d:"
        head -60 "$d"
    done
fi
echo
printf '%-34s %7s %7s %7s\n' "layer" "seconds" "passed" "failed"
for row in "${TABLE[@]}"; do echo "$row"; done
echo "(output and logs in $OUT)"
echo
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
