#!/usr/bin/env bash
# scripts/test.sh: every earmark test layer on a private throwaway cluster.
#
#   sudo ./scripts/test.sh
#
# Installs what is missing (apt), builds and installs earmark, starts a
# PostgreSQL 15 cluster as an unprivileged user with earmark preloaded, and
# runs pg_regress (sql/), the isolation specs (test/isolation), pgTAP
# (test/pgtap) and the integration scripts (test/integration), then the
# libFuzzer targets (test/fuzz, built with AddressSanitizer and
# UndefinedBehaviorSanitizer).  Ends with one line "N passed, N failed" and
# a non-zero exit status on any failure.
#
# Counting: one per pg_regress file, one per isolation spec, one per pgTAP
# assertion, one per integration assertion, one per fuzz target.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set +e

em_install_packages || exit 1

PASSED=0
FAILED=0
OUT=${EM_OUT:-$(mktemp -d /tmp/earmark-test-out.XXXXXX)}
mkdir -p "$OUT"
em_log "test output in $OUT"
chmod 777 "$OUT"
cd "$EM_ROOT"

# EM_LAYERS picks layers for a quicker loop (default: all of them):
#   EM_LAYERS="regress isolation pgtap integration fuzz valgrind"
# EM_INTEGRATION picks integration scripts by name (e.g. "meter worker").
EM_LAYERS=${EM_LAYERS:-regress isolation pgtap integration fuzz valgrind}
layer() { case " $EM_LAYERS " in *" $1 "*) return 0 ;; esac; return 1; }

count() { PASSED=$((PASSED + $1)); FAILED=$((FAILED + $2)); }

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
    count "$p" "$f"
    em_log "$2: $p passed, $f failed (of $n, exit status $rc)"
}

start_test_cluster() {
    em_start_cluster "${EM_TEST_PORT:-55432}" \
        "shared_preload_libraries = 'earmark,pg_cron'" \
        "cron.database_name = 'postgres'" \
        "cron.use_background_workers = on" \
        "max_worker_processes = 16" \
        "earmark.database = 'postgres'" \
        "earmark.sweep_interval = '200ms'" \
        "log_min_messages = warning" || return 1
    export EM_DATA EM_BASE EM_SOCK EM_PORT EM_ROOT
}

# run_layers NAME: every layer against the running cluster
run_layers() {
    local OUT=$OUT/$1 t rc p f
    mkdir -p "$OUT"
    chmod 777 "$OUT"
    # --- pg_regress ----------------------------------------------------------
    regress_tests=$(cd sql && ls *.sql 2>/dev/null | sed 's/\.sql$//' | sort)
    if [ -n "$regress_tests" ] && layer regress; then
        em_log "pg_regress: $(echo $regress_tests | wc -w) files"
        "$PGXS_DIR/test/regress/pg_regress" --inputdir=. --outputdir="$OUT/regress" \
            --bindir="$EM_PGBIN" --load-extension=earmark --dbname=earmark_regress \
            $regress_tests >"$OUT/regress.log" 2>&1
        rc=$?
        cat "$OUT/regress.log"
        [ -f "$OUT/regress/regression.diffs" ] && head -200 "$OUT/regress/regression.diffs"
        count_regress "$OUT/regress.log" pg_regress "$(echo $regress_tests | wc -w)" "$rc"
    fi

    # --- isolation -----------------------------------------------------------
    iso_tests=$(cd test/isolation/specs 2>/dev/null && ls *.spec 2>/dev/null | sed 's/\.spec$//' | sort)
    if [ -n "$iso_tests" ] && layer isolation; then
        em_log "isolation: $(echo $iso_tests | wc -w) specs"
        "$PGXS_DIR/test/isolation/pg_isolation_regress" --inputdir=test/isolation \
            --outputdir="$OUT/isolation" --bindir="$EM_PGBIN" --load-extension=earmark \
            --dbname=earmark_isolation $iso_tests >"$OUT/isolation.log" 2>&1
        rc=$?
        cat "$OUT/isolation.log"
        [ -f "$OUT/isolation/regression.diffs" ] && head -200 "$OUT/isolation/regression.diffs"
        count_regress "$OUT/isolation.log" isolation "$(echo $iso_tests | wc -w)" "$rc"
    fi

    # --- pgTAP ---------------------------------------------------------------
    if ls test/pgtap/*.sql >/dev/null 2>&1 && layer pgtap; then
        em_log "pgTAP"
        em_psql -d postgres -c "DROP DATABASE IF EXISTS earmark_tap" -c "CREATE DATABASE earmark_tap"
        em_psql -d earmark_tap -c "CREATE EXTENSION pgtap" -c "CREATE EXTENSION earmark"
        pg_prove --verbose -d earmark_tap test/pgtap/*.sql >"$OUT/pgtap.log" 2>&1
        grep -vE '^ok ' "$OUT/pgtap.log"
        p=$(grep -cE '^ok ' "$OUT/pgtap.log")
        f=$(grep -cE '^not ok ' "$OUT/pgtap.log")
        # a file that dies before its plan is done counts as one failure
        if ! grep -q '^Result: PASS' "$OUT/pgtap.log" && [ "$f" -eq 0 ]; then f=1; fi
        count "$p" "$f"
        em_log "pgTAP: $p passed, $f failed"
    fi

    # --- integration ---------------------------------------------------------
    if ls test/integration/*.sh >/dev/null 2>&1 && layer integration; then
        for t in test/integration/*.sh; do
            [ "$(basename "$t")" = tap.sh ] && continue
            if [ -n "${EM_INTEGRATION:-}" ]; then
                case " $EM_INTEGRATION " in *" $(basename "$t" .sh) "*) ;; *) continue ;; esac
            fi
            em_log "integration: $t"
            timeout 900 bash "$t" >"$OUT/int.log" 2>&1
            rc=$?
            cat "$OUT/int.log"
            p=$(grep -cE '^ok ' "$OUT/int.log")
            f=$(grep -cE '^not ok ' "$OUT/int.log")
            # a script that dies without reporting a failure still fails once
            if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
            count "$p" "$f"
        done
    fi
}

# --- the layers ------------------------------------------------------------
em_build || exit 1
PGXS_DIR=$(dirname "$("$EM_PGBIN/pg_config" --pgxs)")/..
start_test_cluster || exit 1
run_layers plain

# --- libFuzzer over the C parsers and verifiers (no server needed) ----------
if layer fuzz; then
em_log "libFuzzer: test/fuzz/run.sh"
timeout 600 bash test/fuzz/run.sh >"$OUT/fuzz.log" 2>&1 ||
    grep -q '^not ok ' "$OUT/fuzz.log" || echo 'not ok - test/fuzz/run.sh died' >>"$OUT/fuzz.log"
cat "$OUT/fuzz.log"
count "$(grep -cE '^ok ' "$OUT/fuzz.log")" "$(grep -cE '^not ok ' "$OUT/fuzz.log")"
fi

# --- valgrind: pg_regress, the isolation specs, pgTAP and the integration ---
# scripts (EM_VALGRIND_SCRIPTS) again, with every server process under
# memcheck: backends, the earmark worker, pg_cron.  Their results are not
# counted (valgrind's slowdown passes the short leases and time windows some
# tests rely on); what counts is that no memcheck error is earmark's
# (test/valgrind/check.py: its stack reaches earmark's code before
# PostgreSQL's).  Errors of PostgreSQL itself (without suppressions, e.g.
# uninitialised padding written to WAL) are not ours to judge.  The load
# scripts run smaller under memcheck (5,000 bad calls instead of 100,000; 10
# escrow clients); crash.sh (about 14 minutes under memcheck, its restarts
# keep the wrapper) and lab.sh (4 minutes, the gate's paths again) are left
# to EM_VALGRIND_SCRIPTS.
VG_SCRIPTS=${EM_VALGRIND_SCRIPTS:-meter reconcile inbox_worker jwt worker upgrade fuzz_sql escrow_stress engine_room}
if [ "${EM_VALGRIND:-1}" = 1 ] && layer valgrind; then
    em_log "valgrind: pg_regress, the isolation specs, pgTAP and integration ($VG_SCRIPTS) under memcheck"
    VG=$OUT/valgrind
    mkdir -p "$VG"
    chmod 777 "$VG"
    printf '#!/bin/sh\nexec valgrind --quiet --num-callers=40 --log-file=%s/vg.%%p.log %s/postgres "$@"\n' \
        "$VG" "$EM_PGBIN" >"$VG/postgres"
    chmod 755 "$VG/postgres"
    em_stop_cluster
    if EM_PG_WRAPPER=$VG/postgres start_test_cluster; then
        "$PGXS_DIR/test/regress/pg_regress" --inputdir=. --outputdir="$VG/regress" \
            --bindir="$EM_PGBIN" --load-extension=earmark --dbname=earmark_regress \
            $(cd sql && ls *.sql | sed 's/\.sql$//' | sort) >"$VG/regress.log" 2>&1
        "$PGXS_DIR/test/isolation/pg_isolation_regress" --inputdir=test/isolation \
            --outputdir="$VG/isolation" --bindir="$EM_PGBIN" --load-extension=earmark \
            --dbname=earmark_isolation $(cd test/isolation/specs && ls *.spec | sed 's/\.spec$//' | sort) \
            >"$VG/isolation.log" 2>&1
        em_psql -d postgres -c "CREATE DATABASE earmark_tap"
        em_psql -d earmark_tap -c "CREATE EXTENSION pgtap" -c "CREATE EXTENSION earmark"
        pg_prove -d earmark_tap test/pgtap/*.sql >"$VG/pgtap.log" 2>&1
        for t in $VG_SCRIPTS; do
            em_log "valgrind: integration $t"
            EM_PG_WRAPPER=$VG/postgres EM_FUZZ_CALLS=5000 ESCROW_STRESS_CLIENTS=10 ESCROW_STRESS_SECONDS=20 \
                ESCROW_STRESS_PAIR_CLIENTS=5 ESCROW_STRESS_PAIR_SECONDS=5 \
                timeout 900 bash "test/integration/$t.sh" >"$VG/int-$t.log" 2>&1
            echo "integration $t ... $(grep -cE '^ok ' "$VG/int-$t.log") ok, $(grep -cE '^not ok ' "$VG/int-$t.log") not ok" >>"$VG/int.log"
        done
        em_stop_cluster
        grep -hE '\.\.\. (ok|FAILED)' "$VG/regress.log" "$VG/isolation.log" | sed 's/^/# valgrind run: /'
        sed 's/^/# valgrind run: pgTAP: /' <(tail -1 "$VG/pgtap.log")
        sed 's/^/# valgrind run: /' "$VG/int.log"
        logs=$(ls "$VG"/vg.*.log 2>/dev/null | wc -l)
        if [ "$logs" -gt 100 ]; then echo "ok - valgrind: $logs processes ran under memcheck"; count 1 0
        else echo "not ok - valgrind: only $logs processes ran under memcheck"; count 0 1; fi
        if python3 test/valgrind/check.py "$VG"/vg.*.log >"$VG/ours.txt"; then
            echo "ok - valgrind: no memcheck error in earmark's code"; count 1 0
        else
            echo "not ok - valgrind: memcheck errors in earmark's code"; count 0 1
            head -120 "$VG/ours.txt"
        fi
    else
        echo "not ok - valgrind: the server did not start under memcheck"; count 0 1
        tail -20 "$EM_BASE/server.log"
    fi
fi

if [ "$FAILED" -ne 0 ]; then
    em_log "server log tail:"
    tail -50 "$EM_BASE/server.log" >&2
fi
echo
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
