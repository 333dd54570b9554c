#!/usr/bin/env bash
# test/bench/inbox.sh: throughput of the webhook inbox, side by side with a
# plain SKIP LOCKED queue written the usual way (pgmq's send / read /
# delete), in the same run, on a private throwaway cluster; the targets of
# docs/benchmarks.md (the webhook inbox) with pass/MISS marks, and the claim's plan.
#
#   sudo bash test/bench/inbox.sh
#
# With pgbench (-M prepared, one transaction per call, default durability:
# fsync and synchronous_commit on), for each number of clients C (1 and 8):
#   1. receive: with 20,000 events waiting in each queue, C producers
#      store RECEIVE events between them, one delivery per transaction,
#      each with a unique dedupe key (client_id + a random 63-bit number);
#   2. claim + complete, for each backlog B (20,000 and 200,000 events
#      waiting): C consumers loop "claim 10, complete each" in one
#      transaction for CLAIMED events in all (a fifth of B: 4,000 of
#      20,000, 40,000 of 200,000, so that a measurement with 200,000
#      waiting lasts a few seconds, not a tenth of one, and the machine's
#      passing moments weigh less):
#        earmark: SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(10)
#        plain:   SELECT plain_delete(msg_id) FROM plain_read(30, 10)
#      Before each run of pgbench the queue is topped up to exactly B
#      events waiting (one INSERT ... SELECT, the same rows receive
#      stores), then VACUUM ANALYZE and CHECKPOINT, untimed, the same for
#      both queues.  A measurement is CLAIM_RUNS such runs, their events
#      over their time (by default as many as handle 20,000 events: 5
#      with 20,000 waiting, 1 with 200,000): with 8 clients one run of
#      4,000 events lasts about a fifth of a second, and single runs
#      of the same build ranged over 140 to 290 ms.
# Every measurement runs ROUNDS times, the two queues interleaved (plain
# first in odd rounds, earmark first in even ones), so that the machine's
# slow moments fall on both; the tables show the median of the rounds.
# Each phase is timed by the wall clock around pgbench (connections
# included); the rate counts the events actually handled.
#
# Printed (markdown): the targets (target, measured, pass/MISS), events/s
# of both queues and the ratio earmark / plain, and the plan of one claim
# (EXPLAIN ANALYZE, BUFFERS, through auto_explain) at each backlog, next to
# the plain queue's read.  Nothing is hard-coded: every number is measured.
#
# Settings (environment): EM_BENCH_BACKLOGS (default "20000 200000"),
# EM_BENCH_CLIENTS (default "1 8"), EM_BENCH_ROUNDS (default 3),
# EM_BENCH_RECEIVE (events per receive measurement, default 3000),
# EM_BENCH_CLAIMED (events per claim + complete run, default a fifth of
# the backlog), EM_BENCH_CLAIM_RUNS (runs per claim + complete
# measurement, default 20,000 events' worth), EM_BENCH_PORT (default 55456).  About three to four minutes with the
# defaults on a busy 2-core machine.
#
# The queues differ in what they keep: earmark stores each event once per
# (source, dedupe_key) with a receipt per delivery (the first one carries
# the key; the fill writes it too), and keeps the event
# (status applied) with its attempts and result; the plain queue inserts
# every delivery (no dedupe) and deletes a message once it is handled.
# The SQL files are in test/bench/inbox/.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

BACKLOGS=${EM_BENCH_BACKLOGS:-"20000 200000"}
CLIENTS=${EM_BENCH_CLIENTS:-"1 8"}
ROUNDS=${EM_BENCH_ROUNDS:-3}
RECEIVE=${EM_BENCH_RECEIVE:-3000}
CLAIMED=${EM_BENCH_CLAIMED:-}
CLAIM_RUNS=${EM_BENCH_CLAIM_RUNS:-}
PORT=${EM_BENCH_PORT:-55456}
RECEIVE_BACKLOG=20000
TARGET=0.80
DB=earmark_bench
BENCH_DIR=$EM_ROOT/test/bench/inbox

em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
BENCH_TMP=$(mktemp -d /tmp/earmark-bench.XXXXXX)
trap 'rm -rf "$BENCH_TMP"; em_stop_cluster' EXIT

em_psql -d postgres -c "CREATE DATABASE $DB"
em_psql -d "$DB" -c "CREATE EXTENSION earmark" -f "$BENCH_DIR/plain_queue.sql"

q() { em_psql -d "$DB" -At -c "$1"; }
now_ns() { date +%s%N; }
rate() { awk -v n="$1" -v ns="$2" 'BEGIN { printf "%.0f", n / (ns / 1e9) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# shellcheck disable=SC1091
source "$EM_ROOT/test/bench/stats.sh"
mark() { awk -v m="$1" -v t="$2" 'BEGIN { print (m + 0 >= t + 0) ? "pass" : "**MISS**" }'; }

waiting() {
    case $1 in
        earmark) q "SELECT count(*) FROM earmark.inbox_event WHERE status = 'received'" ;;
        plain)   q "SELECT count(*) FROM plain_q" ;;
    esac
}

# top_up SYS B: add events until B wait, the rows receive would store
# (fill keys are unique across top-ups: they go on from the last one)
FILLED=0
top_up() {
    local need=$(( $2 - $(waiting "$1") ))
    [ "$need" -gt 0 ] || return 0
    em_psql -d "$DB" -v first=$(( FILLED + 1 )) -v last=$(( FILLED + need )) -f "$BENCH_DIR/fill_$1.sql"
    FILLED=$(( FILLED + need ))
}

reset_queues() {
    em_psql -d "$DB" \
        -c "TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE" \
        -c "TRUNCATE plain_q RESTART IDENTITY"
}

settle() { em_psql -d "$DB" -c "VACUUM ANALYZE earmark.inbox_event" -c "VACUUM ANALYZE earmark.inbox_receipt" \
               -c "VACUUM ANALYZE plain_q" -c "CHECKPOINT"; }

pgbench_run() {   # pgbench_run LABEL SCRIPT CLIENTS TRANSACTIONS_PER_CLIENT
    if ! "$EM_PGBIN/pgbench" -n -M prepared -c "$3" -j "$3" -t "$4" \
            -f "$BENCH_DIR/$2" "$DB" >"$BENCH_TMP/$1.log" 2>&1; then
        cat "$BENCH_TMP/$1.log" >&2
        em_log "pgbench failed: $1"
        exit 1
    fi
}

order() { if [ $(( $1 % 2 )) -eq 1 ]; then echo "plain earmark"; else echo "earmark plain"; fi; }

# the plan of one claim (and one plain read) as it runs, rolled back
explain_claim() {   # explain_claim B
    {
        echo "LOAD 'auto_explain';"
        echo "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
        echo "SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off;"
        echo "SET auto_explain.log_level = notice; SET client_min_messages = notice;"
        echo "BEGIN; SELECT count(*) FROM earmark_inbox_claim(10); ROLLBACK;"
        echo "BEGIN; SELECT count(*) FROM plain_read(30, 10); ROLLBACK;"
    } | em_psql -d "$DB" -At >/dev/null 2>"$BENCH_TMP/explain-$1.txt"
}
# a statement's plan out of auto_explain's notices (its query text left out)
plan_of() {   # plan_of FILE QUERY_TEXT_START
    awk -v q="$2" '/^NOTICE/ { keep = 0 } index($0, "Query Text: " q) == 1 { keep = 2; next }
                   keep == 2 && /^[A-Z]/ { keep = 1 } keep == 1' "$1"
}
claim_plan() { plan_of "$BENCH_TMP/explain-$1.txt" "WITH c AS"; }
plain_plan() { plan_of "$BENCH_TMP/explain-$1.txt" "WITH cte AS"; }
# shared buffers touched by one claim: all of it (the top node), and its
# walk of the due events (the Limit node: the index, the rows it reads
# and locks)
buffers_after() {   # buffers_after PATTERN: hit + read of the first Buffers line after the node
    awk -v pat="$1" 'found && /Buffers: shared/ {
            for (i = 1; i <= NF; i++) { if ($i ~ /^hit=/) h = substr($i, 5); if ($i ~ /^read=/) r = substr($i, 6) }
            print h + r; exit }
        $0 ~ pat { found = 1 }'
}
claim_buffers() { claim_plan "$1" | buffers_after '^[A-Z]'; }
walk_buffers() { claim_plan "$1" | buffers_after '->  Limit'; }
# the claim's walk: the due index under LockRows under Limit (node lines
# only), no sort of the events it walks, no other scan of the table
claim_walks_index() {
    local nodes
    nodes=$(claim_plan "$1" | grep -E -- '^ *(->  )?[A-Z][A-Za-z ]+( on | using |$|  \()' | sed -E 's/  \(cost.*//; s/^ *(->  )?//')
    if grep -A2 -x 'Limit' <<<"$nodes" | tr '\n' '|' | grep -q '^Limit|LockRows|Index Scan using inbox_event_due on inbox_event d|' &&
        ! claim_plan "$1" | grep -q 'Sort Key: d\.' &&
        ! grep -Eq 'Seq Scan on inbox_event|Bitmap Heap Scan on inbox_event' <<<"$nodes"
    then echo yes; else echo no; fi
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A R_RECV R_CONS RECV CONS BUFS WBUFS WALK

# 1. receive, into a backlog of RECEIVE_BACKLOG events
reset_queues
for sys in plain earmark; do top_up "$sys" "$RECEIVE_BACKLOG"; done
settle
for c in $CLIENTS; do
    tx=$(( RECEIVE / c ))
    n=$(( tx * c ))
    for r in $(seq 1 "$ROUNDS"); do
        for sys in $(order "$r"); do
            em_log "receive: $sys, $c client(s), round $r: $n events"
            before=$(waiting "$sys")
            t0=$(now_ns)
            pgbench_run "$sys-receive-$c-$r" "${sys}_produce.sql" "$c" "$tx"
            t1=$(now_ns)
            got=$(( $(waiting "$sys") - before ))
            [ "$got" -eq "$n" ] || { em_log "$sys: $got events stored, expected $n"; exit 1; }
            R_RECV[$sys,$c]="${R_RECV[$sys,$c]:-} $(rate "$n" $(( t1 - t0 )))"
        done
    done
    for sys in plain earmark; do
        # shellcheck disable=SC2086
        RECV[$sys,$c]=$(echo ${R_RECV[$sys,$c]} | median "%.0f")
    done
done

# 2. claim + complete, from a backlog of B events
for b in $BACKLOGS; do
    reset_queues
    em_log "backlog $b: filling both queues"
    for sys in plain earmark; do top_up "$sys" "$b"; done
    settle
    explain_claim "$b"
    BUFS[$b]=$(claim_buffers "$b")
    WBUFS[$b]=$(walk_buffers "$b")
    WALK[$b]=$(claim_walks_index "$b")
    for c in $CLIENTS; do
        claimed=${CLAIMED:-$(( b / 5 ))}
        claims=$(( (claimed + 10 * c - 1) / (10 * c) ))
        runs=${CLAIM_RUNS:-$(( (20000 + claimed - 1) / claimed ))}
        for r in $(seq 1 "$ROUNDS"); do
            for sys in $(order "$r"); do
                em_log "claim + complete: $sys, backlog $b, $c client(s), round $r: $runs run(s) of $claimed"
                done_n=0
                ns=0
                for k in $(seq 1 "$runs"); do
                    top_up "$sys" "$b"
                    settle >/dev/null
                    before=$(waiting "$sys")
                    t0=$(now_ns)
                    pgbench_run "$sys-consume-$b-$c-$r-$k" "${sys}_consume.sql" "$c" "$claims"
                    t1=$(now_ns)
                    done_n=$(( done_n + before - $(waiting "$sys") ))
                    ns=$(( ns + t1 - t0 ))
                done
                R_CONS[$sys,$b,$c]="${R_CONS[$sys,$b,$c]:-} $(rate "$done_n" "$ns")"
            done
        done
        for sys in plain earmark; do
            # shellcheck disable=SC2086
            CONS[$sys,$b,$c]=$(echo ${R_CONS[$sys,$b,$c]} | median "%.0f")
        done
    done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

set -- $BACKLOGS
SMALL=$1
LARGE=${!#}
fmt() { printf "%'d" "$1"; }

echo
echo "Inbox throughput, PostgreSQL $(q "SHOW server_version_num" | sed -E 's/^([0-9]{2})0*([0-9]+)$/\1.\2/'), $(nproc) CPUs, fsync and synchronous_commit on;"
echo "median of $ROUNDS rounds, earmark and the plain queue interleaved. Load average of the machine before and"
echo "after: $LOAD_BEFORE; $LOAD_AFTER."
echo
echo "### Targets"
echo
echo "| target | measured | |"
echo "| --- | --- | --- |"
for c in $CLIENTS; do
    for b in $BACKLOGS; do
        rt=$(ratio "${CONS[earmark,$b,$c]}" "${CONS[plain,$b,$c]}")
        echo "| claim + complete, $(fmt "$b") waiting, $c client(s): earmark / plain >= $TARGET | $rt (${CONS[earmark,$b,$c]} / ${CONS[plain,$b,$c]} events/s) | $(mark "$rt" "$TARGET") |"
    done
    if [ "$SMALL" != "$LARGE" ]; then
        rs=$(ratio "${CONS[earmark,$SMALL,$c]}" "${CONS[plain,$SMALL,$c]}")
        rl=$(ratio "${CONS[earmark,$LARGE,$c]}" "${CONS[plain,$LARGE,$c]}")
        # "no worse": within the run-to-run spread of this machine (0.1)
        d=$(awk -v a="$rl" -v b="$rs" 'BEGIN { printf "%.2f", a - b }')
        echo "| claim + complete, $c client(s): ratio with $(fmt "$LARGE") waiting no worse than with $(fmt "$SMALL") (difference >= -0.10) | $rl - $rs = $d | $(mark "$d" -0.10) |"
    fi
    rt=$(ratio "${RECV[earmark,$c]}" "${RECV[plain,$c]}")
    echo "| receive, $c client(s): earmark / plain insert >= $TARGET | $rt (${RECV[earmark,$c]} / ${RECV[plain,$c]} events/s) | $(mark "$rt" "$TARGET") |"
done
for b in $BACKLOGS; do
    echo "| the claim walks \`inbox_event_due\` in claim order under LockRows and Limit, no sort of the backlog ($(fmt "$b") waiting) | ${WALK[$b]} | $( [ "${WALK[$b]}" = yes ] && echo pass || echo '**MISS**') |"
done
if [ "$SMALL" != "$LARGE" ]; then
    echo "| one claim's walk does not grow with the backlog: shared buffers of its Limit node with $(fmt "$LARGE") waiting <= 2 x with $(fmt "$SMALL") | ${WBUFS[$LARGE]} / ${WBUFS[$SMALL]} (the whole claim, index writes included: ${BUFS[$LARGE]} / ${BUFS[$SMALL]}) | $( [ "${WBUFS[$LARGE]}" -le $(( 2 * WBUFS[$SMALL] )) ] && echo pass || echo '**MISS**') |"
fi
echo
echo "### Events/s"
echo
echo "| clients | phase | events waiting | plain SKIP LOCKED (pgmq-style) | earmark inbox | earmark / plain |"
echo "| ---: | --- | ---: | ---: | ---: | ---: |"
for c in $CLIENTS; do
    echo "| $c | receive | $(fmt "$RECEIVE_BACKLOG") | ${RECV[plain,$c]} | ${RECV[earmark,$c]} | $(ratio "${RECV[earmark,$c]}" "${RECV[plain,$c]}") |"
    for b in $BACKLOGS; do
        echo "| $c | claim + complete | $(fmt "$b") | ${CONS[plain,$b,$c]} | ${CONS[earmark,$b,$c]} | $(ratio "${CONS[earmark,$b,$c]}" "${CONS[plain,$b,$c]}") |"
    done
done
echo
echo "Rounds (events/s, in order):"
echo
for c in $CLIENTS; do
    for sys in plain earmark; do echo "- receive, $c client(s), $sys:${R_RECV[$sys,$c]}"; done
    for b in $BACKLOGS; do
        for sys in plain earmark; do echo "- claim + complete, $(fmt "$b") waiting, $c client(s), $sys:${R_CONS[$sys,$b,$c]}"; done
    done
done
for b in $BACKLOGS; do
    echo
    echo "### One claim with $(fmt "$b") events waiting (EXPLAIN ANALYZE, BUFFERS, through auto_explain)"
    echo
    echo '```text'
    claim_plan "$b"
    echo '```'
    echo
    echo "The plain queue's read at the same backlog:"
    echo
    echo '```text'
    plain_plan "$b"
    echo '```'
done
