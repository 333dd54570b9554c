#!/usr/bin/env bash
# test/citus/mark_shard_move.sh: an account's shards move to another
# worker (docs/scale-out.md, "After citus_add_node": accounts move when you
# move shards, with the rebalancer) while its cycle is marked (TAP).
#
# Citus moves a shard group by logical replication (shard_transfer_mode
# 'auto', the default of citus_move_shard_placement and of the
# rebalancer), which needs a replica identity on every table of the group:
# earmark's tables are all colocated with earmark.account, and each has a
# primary key except earmark.meter_mark, which has no unique key (a mark's
# insert never waits for another's) and so has REPLICA IDENTITY FULL.
# Without it the move of any account refused.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55910 bash test/citus/mark_shard_move.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin "wal_level = logical"

ct_sql 0 -q -c "SELECT earmark_set_account('acme', now() - interval '14 days')" \
            -c "SELECT earmark_set_limit('acme', 1000)" \
            -c "SELECT earmark_record_usage('acme', 10, 'u-1')" >/dev/null
ok $? "usage recorded for acme (its cycle is marked)"

is "$(ct_val 0 "SELECT string_agg(t.relname, ',' ORDER BY t.relname)
                  FROM pg_dist_partition p JOIN pg_class t ON t.oid = p.logicalrelid
                 WHERE t.relnamespace = 'earmark'::regnamespace AND p.partmethod = 'h'
                   AND t.relreplident = 'd'
                   AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = t.oid AND i.indisprimary)")" \
   "" "every distributed table of earmark has a replica identity (a primary key, or FULL)"

is "$(ct_val 0 "SELECT marked_cycles FROM earmark.worker_status" 2>&1)" 1 "worker_status on the coordinator counts acme's marked cycle"

shard=$(ct_val 0 "SELECT get_shard_id_for_distribution_column('earmark.account', 'acme')")
from=$(ct_val 0 "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $shard")
to=$(ct_val 0 "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 AND nodeport <> $from LIMIT 1")
out=$(ct_sql 0 -A -t -q -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to)" 2>&1)
ok $? "acme's shards move to the other worker (citus_move_shard_placement, shard_transfer_mode auto)"
[ -n "$out" ] && echo "$out" | sed 's/^/# /'
is "$(ct_val 0 "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $shard")" "$to" "... acme's shard is on the other worker"
is "$(ct_val 0 "SELECT count(*) FROM earmark.meter_mark WHERE account = 'acme'")" 1 "... with its mark"

# on Citus a writer checks for a committed mark in its insert (READ
# COMMITTED): more usage on the marked cycle adds no mark
ct_sql 0 -q -c "SELECT earmark_record_usage('acme', 5, 'u-2')" >/dev/null
ok $? "more usage for acme after the move"
is "$(ct_val 0 "SELECT count(*) || ' ' || (SELECT marked_cycles FROM earmark.worker_status) FROM earmark.meter_mark WHERE account = 'acme'")" "1 1" \
   "... one mark, one marked cycle"

done_testing
