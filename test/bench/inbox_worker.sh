#!/usr/bin/env bash
# test/bench/inbox_worker.sh: what the earmark worker costs while
# applications' events wait in the inbox (types without a handler, which
# the worker never applies), on a private throwaway cluster.
#
#   sudo bash test/bench/inbox_worker.sh
#
# For each backlog B (EM_BENCH_BACKLOGS, default "0 20000 200000"): B
# events stored as receive stores them (a keyed receipt each), VACUUM
# ANALYZE, then nothing runs in the database but the worker (a pass every
# earmark.sweep_interval, 1 s by default) for EM_BENCH_SECONDS (default
# 10): printed are the worker process's CPU time over that time (utime +
# stime from /proc, in clock ticks of 10 ms: 100 a second is one core) and
# the index tuples and sequential-scan tuples of earmark.inbox_event its
# passes read (pg_stat_user_indexes, pg_stat_user_tables).  Port
# EM_BENCH_PORT (default 55457).  About a minute.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

BACKLOGS=${EM_BENCH_BACKLOGS:-"0 20000 200000"}
SECONDS_RUN=${EM_BENCH_SECONDS:-10}
PORT=${EM_BENCH_PORT:-55457}
DB=earmark_bench

em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'"
trap 'em_stop_cluster' EXIT
em_psql -d postgres -c "CREATE DATABASE $DB"
em_psql -d "$DB" -c "CREATE EXTENSION earmark"

q() { em_psql -d "$DB" -At -c "$1"; }
worker_pid() { q "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND datname = '$DB'"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
index_reads() { q "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE schemaname = 'earmark' AND relname = 'inbox_event'"; }
seq_reads() { q "SELECT seq_tup_read FROM pg_stat_user_tables WHERE schemaname = 'earmark' AND relname = 'inbox_event'"; }

for _ in $(seq 1 100); do [ -n "$(worker_pid)" ] && break; sleep 0.2; done
[ -n "$(worker_pid)" ] || { em_log "no earmark worker in $DB"; exit 1; }

echo
echo "The earmark worker with applications' events waiting, PostgreSQL $(q "SHOW server_version"), $(nproc) CPUs;"
echo "${SECONDS_RUN} s each, a pass every $(q "SHOW earmark.sweep_interval"), nothing else running in the database."
echo
echo "| events waiting | worker CPU (ticks; 100 = one core for 1 s) | share of one core | index tuples of inbox_event read | tuples read by sequential scans |"
echo "| ---: | ---: | ---: | ---: | ---: |"
for b in $BACKLOGS; do
    em_psql -d "$DB" -c "TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE" -c "
        WITH e AS (
            INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, verified_by)
            SELECT 'bench', 'fill-' || g, 'invoice.paid',
                   jsonb_build_object('type', 'invoice.paid',
                                      'data', jsonb_build_object('customer_id', 'customer_' || g % 8)),
                   clock_timestamp(), 'admin'
              FROM generate_series(1, $b) g
            RETURNING event_id, source, dedupe_key)
        INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
        SELECT event_id, true, source, dedupe_key FROM e" \
        -c "VACUUM ANALYZE earmark.inbox_event" -c "VACUUM ANALYZE earmark.inbox_receipt" >/dev/null
    # two passes to plan anew after the statistics changed, and a second
    # for the statistics the worker reports to reach the views
    sleep 3
    pid=$(worker_pid)
    t0=$(ticks "$pid"); i0=$(index_reads); s0=$(seq_reads)
    sleep "$SECONDS_RUN"
    t1=$(ticks "$pid"); i1=$(index_reads); s1=$(seq_reads)
    [ "$(worker_pid)" = "$pid" ] || { em_log "the worker restarted during the measurement"; exit 1; }
    printf "| %'d | %d | %s | %'d | %'d |\n" "$b" $(( t1 - t0 )) \
        "$(awk -v t=$(( t1 - t0 )) -v s="$SECONDS_RUN" 'BEGIN { printf "%.0f %%", t / s }')" \
        $(( i1 - i0 )) $(( s1 - s0 ))
done
