#!/usr/bin/env bash
# review_receipt_logical_apply.sh: earmark's inbox replicated by logical
# replication (a subscriber kept as a reporting copy, or a blue/green
# major-version upgrade), with wal_level = logical actually decoding the
# changes.  The receipts' updates (a stale key freed) and deletes (an
# operator's pruning, docs/inbox.md) must reach the subscriber, and the
# subscriber must find each changed row by a key, as it finds the rows of
# every other earmark table: an apply that reads the whole table for each
# changed row makes a pruning of n receipts cost n times the table, and
# the publisher keeps the WAL until the subscriber catches up.
#
# With a primary key the apply looks each row up in its index.  With
# REPLICA IDENTITY FULL and no key (tried, not merged), PostgreSQL 15's apply reads
# the table sequentially for every changed row (RelationFindReplTupleSeq;
# only PostgreSQL 16 can use an index for FULL, and not a partial one
# such as inbox_receipt_key).
#
# A cluster of its own (wal_level = logical), two databases with earmark,
# a publication of the inbox's tables and a subscription in the other
# database (same cluster: the slot is made first).
source "$(dirname "$0")/tap.sh"
X=$(mktemp -d /tmp/earmark-receipt-lr.XXXXXX)
XPORT=$((PGPORT + 14))
trap 'own_stop immediate; rm -rf "$X"' EXIT
xq() { PGHOST=$X PGPORT=$XPORT q "$@"; }
own_cluster "$X" "$XPORT" "wal_level = logical" "max_replication_slots = 4" "max_wal_senders = 4"
xq -d postgres -c "CREATE DATABASE pub" -c "CREATE DATABASE sub" >/dev/null
xq -d pub -c "SET client_min_messages = warning" -c "CREATE EXTENSION earmark" >/dev/null &&
xq -d sub -c "SET client_min_messages = warning" -c "CREATE EXTENSION earmark" >/dev/null
ok $? "a cluster of its own with wal_level = logical, earmark in databases pub and sub"

xq -d pub -c "CREATE PUBLICATION rpub FOR TABLE earmark.inbox_event, earmark.inbox_receipt" \
          -c "SELECT pg_create_logical_replication_slot('rsub', 'pgoutput')" >/dev/null &&
xq -d sub -c "CREATE SUBSCRIPTION rsub CONNECTION 'host=$X port=$XPORT dbname=pub user=postgres'
              PUBLICATION rpub WITH (create_slot = false, slot_name = 'rsub', copy_data = false)" >/dev/null
ok $? "a publication of the inbox's tables and a subscription to it"

# sums DB: the receipts, in every column both sides have
sums() {
    xq -d "$1" -c "SELECT count(*) || ' ' || md5(coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), ''))
                     FROM (SELECT event_id, inserted, received_at, source, dedupe_key FROM earmark.inbox_receipt) r"
}
# caught_up: the subscriber has the publisher's receipts (60 s)
caught_up() {
    local want i
    want=$(sums pub)
    for i in $(seq 1 $((60 * EM_WAIT_SCALE))); do
        [ "$(sums sub)" = "$want" ] && return 0
        sleep 1
    done
    return 1
}
# stats WANT: the subscriber's counters of inbox_receipt once they show
# WANT updates and deletes (the apply worker reports them at most once a
# second): "seq_scan seq_tup_read idx_scan"
stats() {
    local i got
    for i in $(seq 1 $((30 * EM_WAIT_SCALE))); do
        got=$(xq -d sub -c "SELECT n_tup_upd + n_tup_del || ' ' || seq_scan || ' ' || seq_tup_read || ' ' || coalesce(idx_scan, 0)
                              FROM pg_stat_user_tables WHERE relid = 'earmark.inbox_receipt'::regclass")
        [ "${got%% *}" -ge "$1" ] && break
        sleep 1
    done
    echo "${got#* }"
}
# applied: the subscriber confirmed the publisher's WAL up to now (60 s),
# without reading the receipts (the counters above are the apply's)
applied() {
    local lsn i
    lsn=$(xq -d pub -c "SELECT pg_current_wal_lsn()")
    for i in $(seq 1 $((60 * EM_WAIT_SCALE))); do
        [ "$(xq -d pub -c "SELECT confirmed_flush_lsn >= '$lsn' FROM pg_replication_slots WHERE slot_name = 'rsub'")" = t ] && return 0
        sleep 1
    done
    return 1
}

# 3000 events, each delivered twice (a first receipt and a copy's)
N=3000
xq -d pub -c "SELECT count(*) FROM generate_series(1, $N) i, earmark_inbox_receive('lr', 'k' || i, 'lr.t', '{}') r" \
          -c "SELECT count(*) FROM generate_series(1, $N) i, earmark_inbox_receive('lr', 'k' || i, 'lr.t', '{}') r" >/dev/null
caught_up
ok $? "the subscriber has the $((2 * N)) receipts"

# a stale key freed: an event deleted without its receipts, delivered again
xq -d pub -c "DELETE FROM earmark.inbox_event WHERE dedupe_key = 'k$N'" >/dev/null
is "$(xq -d pub -c "SELECT inserted FROM earmark_inbox_receive('lr', 'k$N', 'lr.t', '{}')")" t \
   "publisher: the redelivery of a key whose event was deleted frees the key and stores the event"
caught_up
ok $? "... and the subscriber has the freed key (the receipt's update applied)"

base=$(stats 1)
# the operator prunes: 500 old events with their receipts (docs/inbox.md)
PRUNE=500
xq -d pub -c "WITH d AS (DELETE FROM earmark.inbox_event WHERE dedupe_key IN (SELECT 'k' || i FROM generate_series($((N - PRUNE)), $((N - 1))) i)
                         RETURNING event_id)
              DELETE FROM earmark.inbox_receipt WHERE event_id IN (SELECT event_id FROM d)" >/dev/null
applied
ok $? "the subscriber applied the pruning ($((2 * PRUNE)) receipts deleted)"
after=$(stats $((1 + 2 * PRUNE)))
read -r scans0 rows0 idx0 <<<"$base"
read -r scans1 rows1 idx1 <<<"$after"
scans=$((scans1 - scans0))
echo "# subscriber, inbox_receipt: seq_scan +$scans, seq_tup_read +$((rows1 - rows0)), idx_scan +$((idx1 - idx0)) for $((2 * PRUNE)) deleted receipts of $((2 * N + 1))"
ok "$(( scans <= 50 ? 0 : 1 ))" \
   "the subscriber found the $((2 * PRUNE)) deleted receipts by a key, not by a sequential scan of the table for each (seq_scan +$scans)"
caught_up
ok $? "... and has the publisher's receipts"

done_testing
