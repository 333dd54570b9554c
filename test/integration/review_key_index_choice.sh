#!/usr/bin/env bash
# review (8f3e89e): earmark_record_usage's key look-up from C (ledger.c
# row_of_key, keys (entry_key, account)) and the ON CONFLICT inference with
# indexes an operator added on earmark.ledger_entry: a unique
# (account, entry_key) WHERE entry_key IS NOT NULL (the old order: both are
# arbiters; the look-up keeps ledger_entry_key), a non-unique
# (entry_key, account, occurred_at) that fits the look-up too and, after a
# REINDEX CONCURRENTLY of ledger_entry_key (a new oid), comes first in the
# index list, and one in text_pattern_ops (never taken).  Each way a
# repeat adds nothing, another account's same key is its own row, the
# same key with other units is refused (23505-free), and the statement
# counts of the key indexes show which index the look-up read.
source "$(dirname "$0")/tap.sh"
DB=review_key_index_choice
P="q -d $DB"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$P -c "CREATE EXTENSION earmark" -c "SELECT earmark_set_limit('a1', NULL), earmark_set_limit('a2', NULL)" >/dev/null

round() {   # round TAG: a key recorded, repeated, for another account, refused with other units
    local t=$1
    is "$($P -c "SELECT earmark_record_usage('a1', 5, 'k-$t')" -c "SELECT earmark_record_usage('a1', 5, 'k-$t')" \
             -c "SELECT earmark_record_usage('a2', 6, 'k-$t')" | paste -sd' ')" "t f t" \
       "$t: recorded, a repeat is not, the other account's same key is"
    is "$($P -c "SELECT earmark_record_usage('a1', 9, 'k-$t')" 2>&1 | grep -o 'already used for other usage')" \
       "already used for other usage" "$t: the same key with other units is refused"
    is "$($P -c "SELECT count(*) || ' ' || sum(units) FROM earmark.ledger_entry WHERE entry_key = 'k-$t'")" "2 11" \
       "$t: two rows"
}
# which key index a repeat's look-up reads (pg_stat_get_xact_numscans in the call's transaction)
reads() {
    $P -c "BEGIN" -c "SELECT earmark_record_usage('a1', 5, 'k-$1')" \
       -c "SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = 'earmark.ledger_entry'::regclass AND pg_stat_get_xact_numscans(c.oid) > 0" -c "COMMIT" | tail -1
}
round plain
is "$(reads plain)" "ledger_entry_key" "plain: the repeat reads ledger_entry_key"

$P -c "CREATE UNIQUE INDEX op_account_key ON earmark.ledger_entry (account, entry_key) WHERE entry_key IS NOT NULL" \
   -c "CREATE INDEX op_key_pattern ON earmark.ledger_entry (entry_key text_pattern_ops, account)" >/dev/null
round opuniq
is "$(reads opuniq)" "ledger_entry_key" "with (account, entry_key) and a text_pattern_ops index: still ledger_entry_key"

$P -c "CREATE INDEX op_key_time ON earmark.ledger_entry (entry_key, account, occurred_at)" \
   -c "REINDEX INDEX CONCURRENTLY earmark.ledger_entry_key" >/dev/null
round reindexed
# direct.c resolve() takes the first fitting index in oid order: after the
# REINDEX (or after the 0.2.0 -> 0.3.0 upgrade's DROP and CREATE of
# ledger_entry_key, when the operator's index predates it) that is the
# operator's wider, non-unique index
is "$(reads reindexed)" "ledger_entry_key" "after REINDEX CONCURRENTLY of ledger_entry_key the repeat still reads it (not the operator's op_key_time)"
is "$($P -c "SELECT count(*) FROM earmark_check()")" 0 "earmark_check() clean"
q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
echo "1..$_tap_n"
[ "$_tap_failed" -eq 0 ]
