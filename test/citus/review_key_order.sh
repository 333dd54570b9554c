#!/usr/bin/env bash
# test/citus/review_key_order.sh (review of 8f3e89e): earmark.ledger_entry's
# unique key index led by the key, (entry_key, account), distributed by
# account.  Citus accepts a unique index whose first column is not the
# distribution column when the distribution column is in it; each shard
# gets the index; earmark_record_usage's ON CONFLICT (account, entry_key)
# infers it on the shard; one key on two accounts (on both workers) is two
# rows, a repeat is none; after the account's shard moves (logical
# replication) the moved shard's index is the same and a repeat still
# adds nothing.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55840 bash test/citus/review_key_order.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin "wal_level = logical"

# two accounts, one on each worker
accts=$(ct_val 0 "SELECT string_agg(a, ' ') FROM (SELECT DISTINCT ON (p.nodeport) 'k' || i AS a
          FROM generate_series(1, 50) i,
               LATERAL (SELECT nodeport FROM pg_dist_shard_placement
                         WHERE shardid = get_shard_id_for_distribution_column('earmark.account', 'k' || i)) p
         ORDER BY p.nodeport, i) s")
read -r A B <<<"$accts"
ok "$([ -n "$A" ] && [ -n "$B" ] && echo 0 || echo 1)" "accounts $A and $B on the two workers"
for a in $A $B; do
    ct_sql 0 -q -c "SELECT earmark_set_account('$a', now() - interval '14 days')" -c "SELECT earmark_set_limit('$a', 100000)" >/dev/null
done
is "$(ct_val 0 "SELECT earmark_record_usage('$A', 7, 'same')")|$(ct_val 0 "SELECT earmark_record_usage('$A', 7, 'same')")|$(ct_val 0 "SELECT earmark_record_usage('$B', 9, 'same')")" \
   "t|f|t" "one key: recorded for $A, a repeat is not, the same key for $B is"
is "$(ct_val 0 "SELECT string_agg(account || ' ' || units, ',' ORDER BY account) FROM earmark.ledger WHERE entry_key = 'same'")" \
   "$(printf '%s\n' "$A 7" "$B 9" | LC_ALL=C sort | paste -sd,)" "... one row each"
got=$(ct_sql 0 -A -t -q -c "SELECT earmark_record_usage('$A', 8, 'same')" 2>&1)
diag "the same key with other units: $got"
is "$(ct_val 0 "SELECT run_command_on_shards('earmark.ledger_entry', \$\$SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass AND c.relname LIKE 'ledger_entry_key%%'\$\$)" \
      | sed 's/.*,"\(.*\)")$/\1/; s/_[0-9]\+ ON / ON /; s/ledger_entry_[0-9]\+ /ledger_entry /' | sort -u)" \
   "CREATE UNIQUE INDEX ledger_entry_key ON earmark.ledger_entry USING btree (entry_key, account) WHERE (entry_key IS NOT NULL)" \
   "every shard's key index is (entry_key, account) WHERE entry_key IS NOT NULL"
args=()
for i in $(seq 1 20); do args+=(-c "SELECT * FROM earmark_record_usage('$A', 1, 'm-$i')"); done
is "$(ct_sql 0 -A -t -q "${args[@]}" | grep -c '^t$')" 20 "20 more keys for $A, one call each"

shard=$(ct_val 0 "SELECT get_shard_id_for_distribution_column('earmark.account', '$A')")
from=$(ct_val 0 "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = $shard")
to=$(ct_val 0 "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 AND nodeport <> $from LIMIT 1")
out=$(ct_sql 0 -A -t -q -c "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from, '127.0.0.1', $to)" 2>&1)
ok $? "$A's shards move to the other worker"
[ -n "$out" ] && echo "$out" | sed 's/^/# /'
is "$(ct_val 0 "SELECT run_command_on_shards('earmark.ledger_entry', \$\$SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass AND c.relname LIKE 'ledger_entry_key%%'\$\$)" \
      | sed 's/.*,"\(.*\)")$/\1/; s/_[0-9]\+ ON / ON /; s/ledger_entry_[0-9]\+ /ledger_entry /' | sort -u)" \
   "CREATE UNIQUE INDEX ledger_entry_key ON earmark.ledger_entry USING btree (entry_key, account) WHERE (entry_key IS NOT NULL)" \
   "... after the move every shard's key index is still (entry_key, account)"
is "$(ct_val 0 "SELECT earmark_record_usage('$A', 7, 'same')")|$(ct_val 0 "SELECT earmark_record_usage('$A', 1, 'm-3')")|$(ct_val 0 "SELECT earmark_record_usage('$A', 2, 'after')")" \
   "f|f|t" "... repeats after the move add nothing, a new key is recorded"
is "$(ct_val 0 "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger WHERE account = '$A' AND entry_key IS NOT NULL")" "22 29" \
   "... $A's keyed rows: 22, 29 units"
is "$(ct_val 0 "SELECT count(*) FROM earmark_check()")" 0 "earmark_check() clean"
done_testing
