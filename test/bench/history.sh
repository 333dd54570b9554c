#!/usr/bin/env bash
# test/bench/history.sh: two costs that must not grow with the data, on
# statistics that do not know it (autovacuum off, ANALYZE when every
# account had one row: as after a bulk load, or one big account among many
# small ones).  Prints markdown; nothing is asserted.
#
# 1. earmark_reconcile() over every account: HISTORY_CYCLES ("4000 10000")
#    accounts, each with 11 recorded usages (one cycle each), the local
#    meter; seconds of one call.  A run must cost in proportion to its
#    cycles (each page of 50 walks on from the last one).
# 2. earmark_record_usage_many of 100 new keys on one account while its
#    keyed rows grow from 20,000 by 20,000 a round (HISTORY_ROUNDS, 5), 200
#    calls a round in one session: the median ms a call.  It must not grow
#    with the account's rows (one probe of the key's index a key).
#
#   sudo bash test/bench/history.sh         (about 2 minutes on 2 cores)
#   EM_PREFIX=/work/pfx/NAME HISTORY_PORT=55464 bash test/bench/history.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${HISTORY_PORT:-55464}
CYCLES=${HISTORY_CYCLES:-4000 10000}
ROUNDS=${HISTORY_ROUNDS:-5}

em_setup
Q() { em_psql -d postgres -A -t -q "$@"; }

start() {
    em_start_cluster "$PORT" \
        "shared_preload_libraries = 'earmark'" \
        "earmark.database = 'postgres'" \
        "earmark.report_interval = '1h'" \
        "earmark.rate_limit = 0" \
        "autovacuum = off" \
        "jit = off"
    Q -c "CREATE EXTENSION earmark"
}
trap 'em_stop_cluster' EXIT

echo "## Costs that must not grow with the data ($(date -u '+%Y-%m-%d %H:%M') UTC, earmark $(git -C "$EM_ROOT" rev-parse --short HEAD 2>/dev/null))"
echo
echo "| earmark_reconcile() over every account | cycles | seconds |"
echo "| --- | ---: | ---: |"
for n in $CYCLES; do
    start
    Q -c "SELECT count(earmark_set_account('acc' || i, NULL, 'cus' || i, 'agr' || i)) FROM generate_series(1, $n) i" \
      -c "SELECT count(earmark_set_limit('acc' || i, NULL)) FROM generate_series(1, $n) i" \
      -c "SELECT count(earmark_record_usage('acc' || i, 1, 'w')) FROM generate_series(1, $n) i" -c "ANALYZE" \
      -c "SELECT count(earmark_record_usage('acc' || (1 + i % $n), 1, 'm' || i)) FROM generate_series(1, $((n * 10))) i" >/dev/null
    t0=$(date +%s.%N)
    got=$(Q -c "SELECT count(*) FROM earmark_reconcile()")
    t1=$(date +%s.%N)
    echo "| local meter, every cycle under-billed and repaired | $got | $(python3 -c "print(f'{$t1 - $t0:.1f}')") |"
    em_stop_cluster
done

echo
echo "| earmark_record_usage_many, 100 new keys a call, one account | keyed rows on the account before the round | ms a call (median of 200) |"
echo "| --- | ---: | ---: |"
start
Q -c "SELECT count(earmark_set_limit('u' || i, NULL)) FROM generate_series(1, 1000) i" \
  -c "SELECT count(earmark_record_usage('u' || i, 1, 'w')) FROM generate_series(1, 1000) i" -c "ANALYZE" \
  -c "SELECT count(*) FROM earmark_record_usage_many('u7', array_fill(1::bigint, ARRAY[20000]), ARRAY(SELECT 'old' || g FROM generate_series(1, 20000) g))" >/dev/null
for r in $(seq 1 "$ROUNDS"); do
    rows=$(Q -c "SELECT count(*) FROM earmark.ledger_entry WHERE account = 'u7'")
    ms=$({
        echo "\\timing on"
        for i in $(seq 1 200); do
            echo "SELECT count(*) FROM earmark_record_usage_many('u7', array_fill(1::bigint, ARRAY[100]), ARRAY(SELECT 'r$r-$i-' || g FROM generate_series(1, 100) g));"
        done
    } | em_psql -d postgres -A -t -q 2>/dev/null | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | sort -n |
        awk '{a[NR] = $1} END {printf "%.2f", a[int(NR / 2) + 1]}')
    echo "| round $r | $rows | $ms |"
done
