#!/usr/bin/env bash
# test/bench/inbox.sh: throughput of the webhook inbox, side by side with a
# plain SKIP LOCKED queue written the usual way (pgmq's send / read /
# delete), in the same run, on a private throwaway cluster.
#
#   sudo bash test/bench/inbox.sh
#
# For each number of events N (20,000 and 2,000), each number of clients C
# (1 and 8) and each queue, with pgbench (-M prepared, one transaction per
# call, default durability: fsync and synchronous_commit on):
#   1. receive: C producers store N events between them, one delivery per
#      transaction, each with a unique dedupe key (client_id + a random
#      63-bit number); the two queues are filled in 4 alternating turns so
#      that the disk's slow moments fall on both;
#   2. claim + complete: then C consumers loop "claim 10, complete each" in
#      one transaction until every event is handled (they start with all N
#      waiting):
#        earmark: SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(10)
#        plain:   SELECT plain_delete(msg_id) FROM plain_read(30, 10)
#      pgbench runs ceil(N / (10 C)) transactions a client; the few events
#      a short claim left behind at the very end are drained by one more
#      client, inside the timed phase.
# Each phase is timed by the wall clock around it (connections included).
# Printed (markdown): events/s for receive, for claim + complete, and for
# the three together (N / (receive time + claim + complete time)), and the
# ratio earmark / plain.  Nothing is hard-coded: every number is measured.
#
# Settings (environment): EM_BENCH_EVENTS (default "20000 2000"),
# EM_BENCH_CLIENTS (default "1 8"), EM_BENCH_PORT (default 55456).  About
# two minutes on a 2-core machine with the defaults.
#
# The queues differ in what they keep: earmark stores each event once per
# (source, dedupe_key) with a receipt per delivery, and keeps the event
# (status applied) with its attempts and result; the plain queue inserts
# every delivery (no dedupe) and deletes a message once it is handled.
# The SQL files are in test/bench/inbox/.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

EVENTS=${EM_BENCH_EVENTS:-"20000 2000"}
CLIENTS=${EM_BENCH_CLIENTS:-"1 8"}
PORT=${EM_BENCH_PORT:-55456}
ROUNDS=4
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

consume_sql() {
    case $1 in
        earmark) echo "SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(10)" ;;
        plain)   echo "SELECT plain_delete(msg_id) FROM plain_read(30, 10)" ;;
    esac
}
stored() {
    case $1 in
        earmark) q "SELECT count(*) FROM earmark.inbox_event" ;;
        plain)   q "SELECT count(*) FROM plain_q" ;;
    esac
}
pending() {
    case $1 in
        earmark) q "SELECT count(*) FROM earmark.inbox_event WHERE status <> 'applied'" ;;
        plain)   q "SELECT count(*) FROM plain_q" ;;
    esac
}

reset_queues() {
    em_psql -d "$DB" \
        -c "TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE" \
        -c "TRUNCATE plain_q RESTART IDENTITY" \
        -c "CHECKPOINT"
}

pgbench_run() {   # pgbench_run LABEL SCRIPT CLIENTS TRANSACTIONS_PER_CLIENT
    if ! "$EM_PGBIN/pgbench" -n -M prepared -c "$3" -j "$3" -t "$4" \
            -f "$BENCH_DIR/$2" "$DB" >"$BENCH_TMP/$1.log" 2>&1; then
        cat "$BENCH_TMP/$1.log" >&2
        em_log "pgbench failed: $1"
        exit 1
    fi
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A RECV CONS ALL T_RECV
for events in $EVENTS; do
for c in $CLIENTS; do
    per_client=$(( events / c ))
    n=$(( per_client * c ))
    claims=$(( (n + 10 * c - 1) / (10 * c) ))
    reset_queues

    # receive: both queues fill in turns (ROUNDS each), so that a slow
    # moment of the machine's disk falls on both rather than on one
    T_RECV[plain]=0
    T_RECV[earmark]=0
    em_log "$c client(s): receive $n events into each queue, in $ROUNDS turns"
    for r in $(seq 1 "$ROUNDS"); do
        tx=$(( per_client * r / ROUNDS - per_client * (r - 1) / ROUNDS ))
        [ "$tx" -gt 0 ] || continue
        for sys in plain earmark; do
            t0=$(now_ns)
            pgbench_run "$sys-$events-$c-receive-$r" "${sys}_produce.sql" "$c" "$tx"
            t1=$(now_ns)
            T_RECV[$sys]=$(( T_RECV[$sys] + t1 - t0 ))
        done
    done
    for sys in plain earmark; do
        got=$(stored "$sys")
        [ "$got" -eq "$n" ] || { em_log "$sys: $got events stored, expected $n"; exit 1; }
    done
    q "ANALYZE" >/dev/null

    # claim + complete: each queue drained from a full backlog
    for sys in plain earmark; do
        q "CHECKPOINT" >/dev/null
        em_log "$sys, $c client(s): claim + complete"
        t2=$(now_ns)
        pgbench_run "$sys-$events-$c-consume" "${sys}_consume.sql" "$c" "$claims"
        left=$(pending "$sys")
        drained=0
        while [ "$left" -gt 0 ]; do
            q "$(consume_sql "$sys")" >/dev/null
            drained=$(( drained + left - $(pending "$sys") ))
            left=$(pending "$sys")
        done
        t3=$(now_ns)
        [ "$drained" -eq 0 ] || em_log "$sys, $c client(s): $drained events left by short claims, drained in the timed phase"

        RECV[$sys,$events,$c]=$(rate "$n" "${T_RECV[$sys]}")
        CONS[$sys,$events,$c]=$(rate "$n" $(( t3 - t2 )))
        ALL[$sys,$events,$c]=$(rate "$n" $(( T_RECV[$sys] + t3 - t2 )))
    done
done
done

echo
echo "Inbox throughput, PostgreSQL $(q "SHOW server_version_num" | sed -E 's/^([0-9]{2})0*([0-9]+)$/\1.\2/'), $(nproc) CPUs, fsync and synchronous_commit on."
echo "C clients: C producers store the events (one per transaction), then C consumers claim 10 at a time"
echo "and complete each (one transaction per claim) until none is left; the consumers start with all"
echo "events waiting. Load average of the machine before and after: $LOAD_BEFORE; $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "| events | clients | queue | receive (events/s) | claim + complete (events/s) | receive + claim + complete (events/s) |"
echo "| ---: | ---: | --- | ---: | ---: | ---: |"
for events in $EVENTS; do
    for c in $CLIENTS; do
        k=$events,$c
        echo "| $events | $c | plain SKIP LOCKED (pgmq-style) | ${RECV[plain,$k]} | ${CONS[plain,$k]} | ${ALL[plain,$k]} |"
        echo "| $events | $c | earmark inbox | ${RECV[earmark,$k]} | ${CONS[earmark,$k]} | ${ALL[earmark,$k]} |"
        echo "| $events | $c | **earmark / plain** | $(ratio "${RECV[earmark,$k]}" "${RECV[plain,$k]}") | $(ratio "${CONS[earmark,$k]}" "${CONS[plain,$k]}") | $(ratio "${ALL[earmark,$k]}" "${ALL[plain,$k]}") |"
    done
done
