#!/usr/bin/env bash
# test/bench/gate.sh: the gate's benchmark, one command, every comparison
# measured side by side in the same run on a private throwaway cluster.
#
#   sudo bash test/bench/gate.sh
#
# Scenarios (pgbench -n -M prepared, BENCH_CLIENTS clients, default 50,
# BENCH_SECONDS each, default 15; one pgbench transaction = one job =
# reserve, charge, settle, each its own transaction, see pgbench/*.sql):
#   earmark, 1 hot account            pgbench/earmark_hot.sql, account hot
#   earmark, 1 hot account, escrow    the same on hot_escrowN, after
#                                     earmark_set_escrow('hot_escrowN', N),
#                                     N = 16 and 64 (BENCH_ESCROW_SLOTS);
#                                     skipped when the function is missing
#   earmark, 10,000 accounts          pgbench/earmark_many.sql
#   reference, 1 hot account          pgbench/ref_hot.sql (reference.sql)
#   reference, 10,000 accounts        pgbench/ref_many.sql
#   floor, 10,000 accounts            pgbench/floor_many.sql (floor.sql):
#                                     three one-row updates a job and no
#                                     gate, a ceiling for any gate
#   design floor, 10,000 accounts     pgbench/floor_design.sql: the writes
#                                     the design asks for (job row, held,
#                                     use, status, ledger row), no check:
#                                     a ceiling for any implementation
#                                     (BENCH_FLOOR=0 leaves both out)
# each once with synchronous_commit on (the default) and once off
# (PGOPTIONS='-c synchronous_commit=off').  Limits are 10^15: finite, never
# reached.  earmark.rate_limit = 0 (the rate limit caps a hot account by
# design), except in "earmark, 1 hot account, rate limit on": the same hot
# account with earmark.rate_limit = 10^8 a minute in pgbench's sessions, a
# rate never reached (BENCH_RATE_SCEN=0 leaves it out).  First the data: 10,002 accounts in
# each system and 50,000 settled jobs of history (an empty job table gives
# sessions sequential-scan plans, see pgbench/bench_lib.sh).  Each run
# starts with 3 s of unmeasured warm-up (BENCH_WARMUP).  After each run the
# books are checked (held = the open holds, used + held <= lim, through
# earmark_budget and ref.budget), the open holds settled, the database
# vacuumed and checkpointed.  Also measured per run: server CPU and WAL
# (bytes, records, full-page images) a job, and what the backends waited
# for (pg_stat_activity sampled every 0.5 s).
#
# Then the sweeper: BENCH_SWEEP_JOBS (100,000) holds with a 1 ms lease on
# 100 accounts, made by earmark_reserve calls in a procedure that commits
# every 1,000; the worker's own sweep is parked (sweep_interval 1h);
# then earmark_sweep(10000) in its own transaction, again and again until
# it returns 0, timed by the wall clock; afterwards held must be 0 on
# every account (earmark_budget, escrow slots included) and no hold may
# be open.  BENCH_SWEEP_USE=N (default 0, holds that used nothing): each
# hold is charged N units right after its reserve (earmark_charge), with a
# 2 s lease instead (a 1 ms one would pass before the charge), and the
# sweep starts once every lease has passed; an expired hold that used
# something is also a ledger entry (its expired job row; a ledger row
# before 0.3.0) and marks its cycle, so this times that path too.  Afterwards every swept hold must have been charged N and
# the 100 accounts' used must add up to BENCH_SWEEP_JOBS x N.
#
# Prints markdown tables: jobs/s per scenario, cost per job, waits, the
# ratios the targets name with pass/MISS marks computed from this run's
# numbers, and the sweeper.
#
# Environment: BENCH_PORT (55458), BENCH_SECONDS (15), BENCH_CLIENTS (50),
# BENCH_ESCROW_SLOTS ("16 64"), BENCH_SWEEP_JOBS (100000), BENCH_SYNC ("on off"),
# BENCH_HISTORY (50000 settled jobs loaded first in each system),
# BENCH_WARMUP (3 s), BENCH_THREADS (pgbench -j, 2),
# BENCH_ROUNDS (1): run every scenario that many times, interleaved, and
# report the median (a busy machine: 3); BENCH_GATE (1): 0 runs no gate
# scenario, only the data load and the sweeper.  About 6-7 minutes with
# the defaults on 2 cores.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${BENCH_PORT:-55458}
SECS=${BENCH_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-50}
SWEEP_JOBS=${BENCH_SWEEP_JOBS:-100000}
SWEEP_USE=${BENCH_SWEEP_USE:-0}
SYNC_MODES=${BENCH_SYNC:-"on off"}
ROUNDS=${BENCH_ROUNDS:-1}
GATE=${BENCH_GATE:-1}

BENCH_RATE_SCEN=${BENCH_RATE_SCEN:-1}
em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
source "$EM_ROOT/test/bench/pgbench/bench_lib.sh"

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
bench_load

# --- gate scenarios -----------------------------------------------------
declare -A TPS LAT WAITS CPU WAL
SCEN=("${BENCH_SCEN[@]}")
[ "$GATE" = 1 ] || SCEN=()     # BENCH_GATE=0: the sweeper alone

declare -A ALL_TPS
for round in $(seq 1 "$ROUNDS"); do
    for sync in $SYNC_MODES; do
        for s in "${SCEN[@]}"; do
            read -r -a args <<<"${BENCH_ARGS[$s]}"
            PGOPTIONS="-c synchronous_commit=$sync ${BENCH_OPTS[$s]:-}" \
                bench_run "$s-sync-$sync-round$round" "${args[0]}" "$CLIENTS" "$SECS" "${args[@]:1}"
            ALL_TPS[$s,$sync]="${ALL_TPS[$s,$sync]:-} $BENCH_TPS"
            # latency and waits: of the last round
            LAT[$s,$sync]=$BENCH_LAT
            WAITS[$s,$sync]=$BENCH_WAITS
            CPU[$s,$sync]="${CPU[$s,$sync]:-} $BENCH_CPU"
            WAL[$s,$sync]=$BENCH_WAL
        done
    done
done
# jobs/s and CPU of a scenario: the median over the rounds
# shellcheck disable=SC1091
source "$EM_ROOT/test/bench/stats.sh"
for k in "${!ALL_TPS[@]}"; do
    TPS[$k]=$(echo ${ALL_TPS[$k]} | median "%.0f")
    CPU[$k]=$(echo ${CPU[$k]} | median "%.2f")
done

# --- sweeper --------------------------------------------------------------
if [ "$SWEEP_USE" -gt 0 ]; then SWEEP_LEASE='2 seconds'; else SWEEP_LEASE='1 millisecond'; fi
em_log "sweeper: parking the worker's sweep, making $SWEEP_JOBS holds with a $SWEEP_LEASE lease, each charged $SWEEP_USE"
bq "ALTER SYSTEM SET earmark.sweep_interval = '1h'" >/dev/null
bq "SELECT pg_reload_conf()" >/dev/null
sleep 2     # the worker wakes on the reload, sweeps (nothing), then sleeps 1h
bq "SELECT count(earmark_set_limit('s' || i, $BENCH_LIMIT)) FROM generate_series(1, 100) i" >/dev/null
# in transactions of 1,000 reserves (10 per account): many reserves on one
# account in one transaction are slow (each walks the budget row's versions
# that the same transaction made: quadratic)
t0=$(date +%s%N)
em_psql -d "$BENCH_DB" >/dev/null <<SQL
CREATE PROCEDURE pg_temp.make_holds(n int)
LANGUAGE plpgsql AS \$\$
BEGIN
    FOR b IN 0 .. (n - 1) / 1000 LOOP
        IF $SWEEP_USE = 0 THEN
            PERFORM earmark_reserve('s' || (i % 100 + 1), 10, 'sweep-' || i,
                                    lease => interval '$SWEEP_LEASE')
               FROM generate_series(b * 1000 + 1, least(b * 1000 + 1000, n)) i;
        ELSE
            PERFORM c.charged
               FROM generate_series(b * 1000 + 1, least(b * 1000 + 1000, n)) i
              CROSS JOIN LATERAL earmark_reserve('s' || (i % 100 + 1), 10, 'sweep-' || i,
                                                 lease => interval '$SWEEP_LEASE') r
              CROSS JOIN LATERAL earmark_charge('s' || (i % 100 + 1), r.job_id, $SWEEP_USE) c;
        END IF;
        COMMIT;
    END LOOP;
END \$\$;
CALL pg_temp.make_holds($SWEEP_JOBS);
SQL
t1=$(date +%s%N)
made=$(bq "SELECT count(*) FROM earmark.job WHERE idempotency_key LIKE 'sweep-%' AND status IN ('running', 'capped')")
[ "$made" -eq "$SWEEP_JOBS" ] || { em_log "only $made of $SWEEP_JOBS holds admitted"; exit 1; }
MAKE_S=$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.2f", ns / 1e9 }')
# wait until every lease has passed (1 ms, or 2 s after the last charge)
until [ "$(bq "SELECT count(*) FROM earmark.job WHERE idempotency_key LIKE 'sweep-%' AND lease_until >= clock_timestamp()")" = 0 ]; do
    sleep 0.2
done
em_psql -d "$BENCH_DB" -c "VACUUM ANALYZE earmark.job" -c "CHECKPOINT" >/dev/null
em_log "sweeper: earmark_sweep(10000) until 0"
t0=$(date +%s%N)
sweep_out=$(em_psql -d "$BENCH_DB" -At <<'SQL'
CREATE PROCEDURE pg_temp.sweep_all(INOUT calls int DEFAULT 0, INOUT swept bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
    LOOP
        n := earmark_sweep(10000);
        calls := calls + 1;
        swept := swept + n;
        COMMIT;
        EXIT WHEN n = 0;
    END LOOP;
END $$;
CALL pg_temp.sweep_all();
SQL
)
t1=$(date +%s%N)
SWEEP_S=$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.2f", ns / 1e9 }')
SWEPT=${sweep_out#*|}
SWEEP_CALLS=${sweep_out%|*}
open=$(bq "SELECT count(*) FROM earmark.job WHERE status IN ('running', 'capped')")
# held over each account's budget (earmark_budget adds the escrow slots; a
# budget row's own held may differ from 0 under escrow while the sum is 0)
held=$(bq "SELECT count(*) FROM earmark.account a CROSS JOIN LATERAL earmark_budget(a.account) b WHERE b.held <> 0")
# what the swept holds used: each SWEEP_USE, and the accounts' used the sum
charged=$(bq "SELECT count(*) FROM earmark.job WHERE idempotency_key LIKE 'sweep-%' AND status = 'expired' AND charged = $SWEEP_USE")
used=$(bq "SELECT coalesce(sum(b.used), 0) FROM generate_series(1, 100) i CROSS JOIN LATERAL earmark_budget('s' || i) b")
SWEEP_OK=yes
if [ "$SWEPT" != "$SWEEP_JOBS" ] || [ "$open" != 0 ] || [ "$held" != 0 ] \
        || [ "$charged" != "$SWEEP_JOBS" ] || [ "$used" != $((SWEEP_JOBS * SWEEP_USE)) ]; then
    SWEEP_OK=no
    em_log "SWEEP WRONG: swept $SWEPT of $SWEEP_JOBS; $open holds open; $charged expired at $SWEEP_USE; used $used; $held accounts with held <> 0:"
    bq "SELECT a.account, b.held FROM earmark.account a CROSS JOIN LATERAL earmark_budget(a.account) b WHERE b.held <> 0 LIMIT 5" >&2
fi
em_log "budget rows whose own held is not 0 (escrow moves holds between the row and its slots):"
bq "SELECT account, held FROM earmark.budget WHERE held <> 0 LIMIT 5" >&2
bq "ALTER SYSTEM RESET earmark.sweep_interval" >/dev/null
bq "SELECT pg_reload_conf()" >/dev/null
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the table ------------------------------------------------------------
sweeper_table() {
    echo
    echo "| sweeper | result | target |"
    echo "| --- | ---: | --- |"
    echo "| $SWEEP_JOBS holds with a passed lease, on 100 accounts, made by earmark_reserve calls$([ "$SWEEP_USE" -gt 0 ] && echo ", each charged $SWEEP_USE (earmark_charge)"), 1,000 a transaction | ${MAKE_S} s | |"
    echo "| swept by earmark_sweep(10000) x $SWEEP_CALLS calls, a transaction each | **${SWEEP_S} s** ($(bench_mark "$SWEEP_S" "<" 5)) | < 5 s |"
    echo "| afterwards: open holds, accounts with held <> 0 (earmark_budget) | $open, $held (books $([ "$SWEEP_OK" = yes ] && echo right || echo WRONG)) | 0, 0 |"
    [ "$SWEEP_USE" = 0 ] || echo "| afterwards: holds expired at $SWEEP_USE used, the accounts' used | $charged, $used | $SWEEP_JOBS, $((SWEEP_JOBS * SWEEP_USE)) |"
}
read -r -a modes <<<"$SYNC_MODES"
tps() { echo "${TPS[$1,$2]:-n/a}"; }
# table_head FIRST COLUMN ALIGN [LAST]: a markdown table's header, one
# COLUMN per synchronous_commit mode (@ in COLUMN is the mode)
table_head() {
    local hdr="| $1 |" sep="| --- |" sync
    for sync in "${modes[@]}"; do hdr="$hdr ${2//@/$sync} |"; sep="$sep $3 |"; done
    if [ -n "${4:-}" ]; then hdr="$hdr $4 |"; sep="$sep --- |"; fi
    echo "$hdr"; echo "$sep"
}
row_ratio() {   # row_ratio LABEL A B OP TARGET
    local label=$1 a=$2 b=$3 op=$4 target=$5 m r line
    line="| $label |"
    for sync in "${modes[@]}"; do
        if [ -n "${TPS[$a,$sync]:-}" ] && [ -n "${TPS[$b,$sync]:-}" ]; then
            r=$(bench_ratio "${TPS[$a,$sync]}" "${TPS[$b,$sync]}")
            m=$(bench_mark "$r" "$op" "$target")
        else
            r="n/a"; m="skipped"
        fi
        line="$line $r× ($m) |"
    done
    echo "$line $op $target× |"
}

echo
echo "earmark gate benchmark, $STARTED; PostgreSQL $(bq 'SHOW server_version'), $(nproc) CPUs,"
echo "$CLIENTS clients, $SECS s per scenario$([ "$ROUNDS" -gt 1 ] && echo ", median of $ROUNDS interleaved rounds"), pgbench -M prepared; a job = reserve + charge + settle"
echo "(three transactions); limits 10^15, earmark.rate_limit = 0; fsync on; earmark $(git -C "$EM_ROOT" describe --always --dirty 2>/dev/null || echo '(no git)')."
echo "Load average (1, 5, 15 min) before: $LOAD_BEFORE; after: $LOAD_AFTER."
if [ "$GATE" != 1 ]; then
    echo "BENCH_GATE=$GATE: no gate scenario was run, only the data load and the sweeper."
    sweeper_table
    exit 0
fi
[ "$BENCH_ESCROW" = 1 ] || echo "Escrow: earmark_set_escrow(text,int) is missing in this build; its scenarios were skipped."
[ -z "${BENCH_BOOKS_BAD:-}" ] || echo "**Books wrong after: ${BENCH_BOOKS_BAD}** (see the log above)."
echo
table_head scenario "jobs/s, synchronous_commit @" "---:"
for s in "${SCEN[@]}"; do
    line="| ${BENCH_NAME[$s]} |"
    for sync in "${modes[@]}"; do line="$line $(tps "$s" "$sync") (${LAT[$s,$sync]:-n/a} ms) |"; done
    echo "$line"
done
echo
echo "(ms: pgbench's average latency of one job, all three calls.)"
echo
echo "Cost of a job: server CPU (the backends' user + system time, read from the postmaster's"
echo "reaped children, so it includes any autovacuum worker that ended during the run) and WAL"
echo "written, each divided by the jobs pgbench completed:"
echo
table_head scenario "CPU ms / job, sync @ | WAL bytes (records, full pages) / job, sync @" "---: | ---:"
for s in "${SCEN[@]}"; do
    line="| ${BENCH_NAME[$s]} |"
    for sync in "${modes[@]}"; do line="$line ${CPU[$s,$sync]:-n/a} | ${WAL[$s,$sync]:-n/a} |"; done
    echo "$line"
done
echo
echo "What the $CLIENTS backends were doing (pg_stat_activity sampled every 0.5 s; CPU = active"
echo "without a wait event, Client:ClientRead = idle between statements, Lock:* = queued for a"
echo "row lock, IO:WALSync / LWLock:WALWrite = the commit's WAL flush):"
echo
table_head scenario "synchronous_commit @" "---"
for s in "${SCEN[@]}"; do
    line="| ${BENCH_NAME[$s]} |"
    for sync in "${modes[@]}"; do line="$line ${WAITS[$s,$sync]:-n/a} |"; done
    echo "$line"
done
echo
table_head target "synchronous_commit @" "---:" target
row_ratio "hot: earmark / reference, 1 account" em_hot ref_hot ">=" 5
for s in "${SCEN[@]}"; do
    case $s in em_escrow*) row_ratio "hot: earmark escrow ${s#em_escrow} slots / reference, 1 account" "$s" ref_hot ">=" 5 ;; esac
done
row_ratio "hot: earmark 1 account / earmark 10,000 accounts" em_hot em_many ">=" 0.7
for s in "${SCEN[@]}"; do
    case $s in em_escrow*) row_ratio "hot: earmark escrow ${s#em_escrow} slots, 1 account / earmark 10,000 accounts" "$s" em_many ">=" 0.7 ;; esac
done
row_ratio "10,000 accounts: earmark / reference" em_many ref_many ">=" 1.5
# issue 13's targets, each with the reference and both floors side by side
# (jobs/s, or WAL bytes a job); "measured" is earmark's number against the
# target's denominator
echo
echo "Issue 13's targets: 1, 10,000 accounts: earmark >= 1.25x the reference's jobs/s, with WAL bytes"
echo "a job <= the reference's; 2, one hot account with the rate limit on (10^8 a minute, never"
echo "reached) and no escrow call >= 0.8x earmark's own 10,000-account jobs/s."
echo
echo "| target | sync | earmark | reference | floor | design floor | measured | target | mark |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
walb() { local w=${WAL[$1,$2]:-}; echo "${w%% *}"; }
for sync in "${modes[@]}"; do
    r=$(bench_ratio "${TPS[em_many,$sync]:-0}" "${TPS[ref_many,$sync]:-0}")
    echo "| 1: jobs/s, 10,000 accounts | $sync | $(tps em_many "$sync") | $(tps ref_many "$sync") | $(tps floor_many "$sync") | $(tps floor_design "$sync") | ${r}× | >= 1.25× | $(bench_mark "$r" ">=" 1.25) |"
    r=$(bench_ratio "$(walb em_many "$sync")" "$(walb ref_many "$sync")")
    # <= 1: the MISS mark of "<" compares with 1.0001
    echo "| 1: WAL bytes / job, 10,000 accounts | $sync | $(walb em_many "$sync") | $(walb ref_many "$sync") | $(walb floor_many "$sync") | $(walb floor_design "$sync") | ${r}× | <= 1× | $(bench_mark "$r" "<" 1.0001) |"
    r=$(bench_ratio "${TPS[em_hot_rate,$sync]:-0}" "${TPS[em_many,$sync]:-0}")
    echo "| 2: jobs/s, 1 hot account, rate limit on, no escrow / earmark 10,000 accounts | $sync | $(tps em_hot_rate "$sync") (10,000: $(tps em_many "$sync")) | $(tps ref_hot "$sync") (hot) | $(tps floor_many "$sync") | $(tps floor_design "$sync") | ${r}× | >= 0.8× | $(bench_mark "$r" ">=" 0.8) |"
done
if [ -n "${BENCH_NAME[floor_many]:-}" ]; then
    # the floor (floor.sql) bounds every gate from above: a target ratio
    # the floor does not reach is out of reach for any implementation
    echo
    echo "The ceilings (floor.sql), against the same reference: the floor (three one-row updates a job,"
    echo "no gate) and the design floor (the writes the gate's design asks for, without a check). A ratio"
    echo "below the target means no gate (floor), or no implementation of the design (design floor), can"
    echo "meet it under this load on this machine."
    echo
    table_head ceiling "synchronous_commit @" "---:" target
    ceiling_row() {   # ceiling_row LABEL A B TARGET
        local line="| $1 |" r
        for sync in "${modes[@]}"; do
            r=$(bench_ratio "${TPS[$2,$sync]:-0}" "${TPS[$3,$sync]:-0}")
            if [ "$r" = n/a ]; then line="$line n/a |"
            elif [ "$(bench_mark "$r" ">=" "$4")" = pass ]; then line="$line ${r}× (within reach) |"
            else line="$line ${r}× (out of reach) |"; fi
        done
        echo "$line >= $4× |"
    }
    ceiling_row "floor / reference, 1 hot account" floor_many ref_hot 5
    ceiling_row "floor / reference, 10,000 accounts" floor_many ref_many 1.5
    ceiling_row "design floor / reference, 1 hot account" floor_design ref_hot 5
    ceiling_row "design floor / reference, 10,000 accounts" floor_design ref_many 1.5
    share_row() {     # share_row LABEL A FLOOR: A's share of a floor
        local line="| $1 |"
        for sync in "${modes[@]}"; do line="$line $(bench_ratio "${TPS[$2,$sync]:-0}" "${TPS[$3,$sync]:-0}")× |"; done
        echo "$line |"
    }
    for s in "${SCEN[@]}"; do
        case $s in em_*|ref_*) share_row "${BENCH_NAME[$s]} / design floor" "$s" floor_design ;; esac
    done
fi
sweeper_table
