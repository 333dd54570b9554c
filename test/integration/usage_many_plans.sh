#!/usr/bin/env bash
# earmark_record_usage_many reads the key index once per event, whatever
# the account's history: an account with 3,000 keyed rows, statistics taken
# when every account had one (as after a bulk load), then batches of 5 and
# 100 keys, some of them keys the ledger has, each call's statements
# logged with their plans as they ran (auto_explain, nested statements,
# ANALYZE).  The write (INSERT ... ON CONFLICT DO NOTHING) tries every key
# once and finds the ledger's keys itself; only those are then looked up,
# each with one probe of (account, entry_key) that filters nothing out.
# Before, a look-up of every key of the batch ran ahead of the write: each
# new key was read in the index twice, and that look-up, written as
# "entry_key = ANY ($2)", read every keyed row of the account and tested
# each against the whole array, at every call.  The batch's answers are
# unchanged: a key the ledger has is a repeat, a new one is recorded.
# Recorded usage writes no entry in the (account, job_id) index, whose rows
# (0.2.0's job rows) have job_id.
source "$(dirname "$0")/tap.sh"
DB=usage_many_plans
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" \
  -c "SELECT count(earmark_set_limit('um' || i, NULL)) FROM generate_series(1, 200) i" \
  -c "SELECT count(earmark_record_usage('um' || i, 1, 'first-' || i)) FROM generate_series(1, 200) i" \
  -c "ANALYZE" \
  -c "SELECT count(earmark_record_usage('um7', 1, 'old-' || i)) FROM generate_series(1, 3000) i" >/dev/null
ok $? "200 accounts with one keyed row each, analyzed; then 3,000 more keyed rows on um7"

# the key index's and the primary key's scans and the rows they returned,
# counted in the transaction (pg_stat_get_xact_*): a plan's choice of
# index does not hide here, nor does a read by index from C
counts() {
    echo "SELECT 'counts ' || pg_stat_get_xact_numscans('earmark.ledger_entry_key'::regclass)
              || ' ' || pg_stat_get_xact_tuples_returned('earmark.ledger_entry_key'::regclass)
              || ' ' || pg_stat_get_xact_numscans('earmark.ledger_pkey'::regclass)
              || ' ' || pg_stat_get_xact_tuples_returned('earmark.ledger_pkey'::regclass);"
}
out=$({
    explain_as_run
    echo "BEGIN;"
    for b in 1 2 3 4 5 6 7; do
        echo "SELECT count(*) FILTER (WHERE recorded) FROM earmark_record_usage_many('um7', array_fill(1::bigint, ARRAY[5]),
                  ARRAY['old-1$b', 'new-$b-1', 'new-$b-2', 'old-2$b', 'new-$b-3']);"
    done
    echo "SELECT count(*) FILTER (WHERE recorded) FROM earmark_record_usage_many('um7', array_fill(1::bigint, ARRAY[100]),
              ARRAY(SELECT CASE WHEN g % 10 = 0 THEN 'old-' || g ELSE 'big-' || g END FROM generate_series(1, 100) g));"
    counts
    echo "COMMIT;"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "eight batches on um7 (5 keys, then 100) in one transaction, their statements' plans logged"

# the batches' write, each logged as one line
writes=$(plans_as_lines 'WITH e AS [(]SELECT [*] FROM ROWS FROM' <<<"$out")
is "$(grep -c . <<<"$writes")" 8 "each batch's write logged"
is "$(grep -oE 'Conflict Arbiter Indexes: ledger_entry_key [|] Tuples Inserted: [0-9]+ [|] Conflicting Tuples: [0-9]+' <<<"$writes" |
      sed -E 's/.*Tuples Inserted: ([0-9]+) . Conflicting Tuples: ([0-9]+)/\1+\2/' | paste -sd,)" \
    "3+2,3+2,3+2,3+2,3+2,3+2,3+2,90+10" \
    "each write tries every key of its batch once on the key's index: the new ones inserted, the ledger's conflicting"
# 135 events: the write's check of each key (one scan; the 24 keys it
# finds taken return their row), and a look-up of each of those 24 (one
# scan, one row each)
is "$(grep '^counts ' <<<"$out")" "counts $((135 + 24)) $((24 + 24)) 0 0" \
    "the key index scanned once per event and once more per repeat; the primary key not at all"
others=$(awk '/^(psql:.*)?NOTICE:/ { q = "" } /^Query Text: / { q = $0 }
              q != "" && / on ledger_entry / { print q; q = "" }' <<<"$out" |
         grep -v -e 'WITH e AS (SELECT [*] FROM ROWS FROM' -e 'earmark_record_usage_many(')
is "$others" "" "no other statement of the batches reads the ledger"

answers=$(grep -E '^[0-9]+$' <<<"$out" | paste -sd,)
is "$answers" "3,3,3,3,3,3,3,90" "each batch records its new keys and answers the old ones as repeats"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.ledger_entry WHERE account = 'um7'")" "$((1 + 3000 + 7 * 3 + 90))" \
    "the ledger of um7: its rows before, and one for each new key of the batches"
# single calls look their key up by the key's index too: 20 new keys and
# 20 repeats (the plan of "account = $1 AND entry_key = $2" made with these
# statistics took the primary key and read every row of um7 at each call)
out=$(q -d $DB -c "BEGIN" \
        -c "SELECT count(*) FILTER (WHERE r) || '/' || count(*) FROM (SELECT earmark_record_usage('um7', 1, 'single-' || g) AS r FROM generate_series(1, 20) g) s" \
        -c "SELECT count(*) FILTER (WHERE r) || '/' || count(*) FROM (SELECT earmark_record_usage('um7', 1, 'old-' || g) AS r FROM generate_series(101, 120) g) s" \
        -c "$(counts)" -c "COMMIT")
is "$(grep -v '^counts' <<<"$out" | paste -sd,)" "20/20,0/20" "single calls: 20 new keys recorded, 20 repeats"
is "$(grep '^counts ' <<<"$out")" "counts 60 20 0 0" \
    "single calls: the key index scanned twice a new key (its look-up, the write's check) and once a repeat; the primary key not at all"

# recorded usage has no job_id: the (account, job_id) index of 0.2.0's job
# rows is partial and gets no entry from it (it had one NULL entry a row)
is "$(q -d $DB -c "SELECT pg_relation_size('earmark.ledger_account_job_id_key') <= 2 * current_setting('block_size')::int")" t \
    "3,331 recorded usages wrote no entry in ledger_account_job_id_key (at most its meta page and root)"

# a key repeated in a batch is tried by the write once: 2,000 repeats of
# a key the ledger has (a client resending one event); the others are
# repeats of that first one within the batch
out=$({
    explain_as_run
    echo "SELECT count(*) FILTER (WHERE recorded) || '/' || count(*) FROM earmark_record_usage_many('um7',
              array_fill(1::bigint, ARRAY[2000]), array_fill('old-5'::text, ARRAY[2000]));"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
is "$(grep -E '^[0-9]+/[0-9]+$' <<<"$out")" "0/2000" "2,000 repeats of a known key: each a repeat, none recorded"
is "$(plans_as_lines 'WITH e AS [(]SELECT [*] FROM ROWS FROM' <<<"$out" |
      grep -oE 'ledger_entry_key [|] Tuples Inserted: [0-9]+ [|] Conflicting Tuples: [0-9]+')" \
    "ledger_entry_key | Tuples Inserted: 0 | Conflicting Tuples: 1" "... the write tries the key once (not once a repeat)"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.ledger_entry WHERE account = 'um7'")" "$((1 + 3000 + 7 * 3 + 90 + 20))" \
    "... and the ledger of um7 is unchanged"
q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
