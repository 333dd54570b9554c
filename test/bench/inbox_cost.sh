#!/usr/bin/env bash
# test/bench/inbox_cost.sh: what one event costs the server, for the inbox
# and the plain SKIP LOCKED queue of inbox.sh: the backend's CPU time
# (user + system, from /proc) and the WAL bytes, per event, in one session.
# Less sensitive to a busy machine than inbox.sh's events/s: neither
# counts the time a commit waits for its flush or for a core.
#
#   bash test/bench/inbox_cost.sh            (EM_PREFIX: this checkout's private PostgreSQL)
#
# On a private throwaway cluster, for each backlog B (EM_BENCH_BACKLOGS,
# default "20000 200000"): both queues filled with B events as inbox.sh
# fills them, VACUUM ANALYZE, then, each after a CHECKPOINT (as inbox.sh
# measures): 400 transactions of "claim 10, complete each" (plain: read 10,
# delete each), and 2,000 receives (plain: sends), one transaction each,
# every statement sent by one psql session.  Prints one line per
# measurement.  The ticks of /proc are 10 ms: 4,000 events of 100 us are
# 40 of them, so differences under about 5 % are noise.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

BACKLOGS=${EM_BENCH_BACKLOGS:-"20000 200000"}
PORT=${EM_BENCH_PORT:-55456}
DB=earmark_bench
BENCH_DIR=$EM_ROOT/test/bench/inbox

em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"
TMP=$(mktemp -d /tmp/earmark-cost.XXXXXX)
chmod 777 "$TMP"
trap 'rm -rf "$TMP"; em_stop_cluster' EXIT
em_psql -d postgres -c "CREATE DATABASE $DB"
em_psql -d "$DB" -c "CREATE EXTENSION earmark" -f "$BENCH_DIR/plain_queue.sql"

fill() {   # fill B
    em_psql -d "$DB" \
        -c "TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE" \
        -c "TRUNCATE plain_q RESTART IDENTITY" \
        -v first=1 -v last="$1" -f "$BENCH_DIR/fill_earmark.sql" -f "$BENCH_DIR/fill_plain.sql"
    for t in earmark.inbox_event earmark.inbox_receipt plain_q; do
        em_psql -d "$DB" -c "VACUUM ANALYZE $t"
    done
}

measure() {   # measure LABEL CALLS EVENTS SQL: SQL sent CALLS times in one session
    local f=$TMP/m.sql i ticks
    em_psql -d "$DB" -c "CHECKPOINT"
    {
        echo "SELECT pg_backend_pid() AS pid, pg_current_wal_insert_lsn() AS l0 \\gset"
        echo "\\setenv BPID :pid"
        echo "\\! awk '{ print \$14 + \$15 }' /proc/\$BPID/stat > $TMP/cpu0"
        echo "\\o /dev/null"
        for i in $(seq 1 "$2"); do echo "$4"; done
        echo "\\o"
        echo "\\! awk '{ print \$14 + \$15 }' /proc/\$BPID/stat > $TMP/cpu1"
        echo "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0') AS wal \\gset"
        echo "\\setenv WALB :wal"
        echo "\\! echo \$WALB > $TMP/wal"
    } >"$f"
    em_psql -d "$DB" -f "$f" >/dev/null
    ticks=$(( $(cat "$TMP/cpu1") - $(cat "$TMP/cpu0") ))
    awk -v l="$1" -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v w="$(cat "$TMP/wal")" -v n="$3" \
        'BEGIN { printf "%s: CPU %d us, WAL %d bytes per event\n", l, t / hz * 1e6 / n, w / n }'
}

PRODUCE="SELECT event_id, inserted FROM earmark_inbox_receive('bench', md5(random()::text), 'invoice.paid',
    jsonb_build_object('type', 'invoice.paid', 'data', jsonb_build_object('customer_id', 'customer_1',
                       'plan', jsonb_build_object('key', 'pro'))));"
PLAIN_SEND="SELECT plain_send(jsonb_build_object('type', 'invoice.paid', 'key', md5(random()::text),
    'data', jsonb_build_object('customer_id', 'customer_1', 'plan', jsonb_build_object('key', 'pro'))));"
for b in $BACKLOGS; do
    fill "$b"
    measure "$b waiting, earmark claim + complete" 400 4000 \
        "SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(10);"
    measure "$b waiting, plain read + delete" 400 4000 \
        "SELECT plain_delete(msg_id) FROM plain_read(30, 10);"
    measure "$b waiting, earmark receive" 2000 2000 "$(tr '\n' ' ' <<<"$PRODUCE")"
    measure "$b waiting, plain send" 2000 2000 "$(tr '\n' ' ' <<<"$PLAIN_SEND")"
done
