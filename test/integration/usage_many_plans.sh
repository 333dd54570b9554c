#!/usr/bin/env bash
# earmark_record_usage_many finds which of its keys the ledger has with one
# probe of the key's index for each key, whatever the account's history:
# an account with 3,000 keyed rows, statistics taken when every account had
# one (as after a bulk load), then batches of 5 and 100 new keys, each call's
# statements logged with their plans as they ran (auto_explain, nested
# statements, ANALYZE).  The look-up of the batch's keys reads no other row
# of the account: its plan probes (account, entry_key) per key and filters
# nothing out.  Written as "entry_key = ANY ($2)" its generic plan read
# every keyed row of the account and tested each against the whole array,
# at every call.  The batch's answers are unchanged: a key the ledger has
# is a repeat, a new one is recorded.  Recorded usage writes no entry in
# the (account, job_id) index, whose rows (0.2.0's job rows) have job_id.
source "$(dirname "$0")/tap.sh"
DB=usage_many_plans
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" \
  -c "SELECT count(earmark_set_limit('um' || i, NULL)) FROM generate_series(1, 200) i" \
  -c "SELECT count(earmark_record_usage('um' || i, 1, 'first-' || i)) FROM generate_series(1, 200) i" \
  -c "ANALYZE" \
  -c "SELECT count(earmark_record_usage('um7', 1, 'old-' || i)) FROM generate_series(1, 3000) i" >/dev/null
ok $? "200 accounts with one keyed row each, analyzed; then 3,000 more keyed rows on um7"

out=$({
    explain_as_run
    for b in 1 2 3 4 5 6 7; do
        echo "SELECT count(*) FILTER (WHERE recorded) FROM earmark_record_usage_many('um7', array_fill(1::bigint, ARRAY[5]),
                  ARRAY['old-1$b', 'new-$b-1', 'new-$b-2', 'old-2$b', 'new-$b-3']);"
    done
    echo "SELECT count(*) FILTER (WHERE recorded) FROM earmark_record_usage_many('um7', array_fill(1::bigint, ARRAY[100]),
              ARRAY(SELECT CASE WHEN g % 10 = 0 THEN 'old-' || g ELSE 'big-' || g END FROM generate_series(1, 100) g));"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "eight batches on um7 (5 keys, then 100), their statements' plans logged"

# the logged plans of the key look-up (the one statement that selects
# entry_key alone: as it was, or as it is), each as one line
looks=$(plans_as_lines 'SELECT (e[.])?entry_key FROM' <<<"$out")
is "$(grep -c . <<<"$looks")" 8 "each batch's key look-up logged"
is "$(grep -c 'Index Cond: ((account = [^)]*) AND (entry_key = k.entry_key))' <<<"$looks")" 8 \
    "each look-up probes the key's index with the account and the key (custom plans, then the generic one)"
is "$(grep -c 'Rows Removed by Filter' <<<"$looks")" 0 "no look-up reads a row of the account it then filters out"
is "$(grep -o 'Index[ A-Za-z]* Scan using ledger_entry_key on ledger_entry l *([^)]*) (actual rows=[0-9]* loops=[0-9]*' <<<"$looks" |
      sed 's/.*(actual //' | paste -sd,)" \
    "rows=0 loops=5,rows=0 loops=5,rows=0 loops=5,rows=0 loops=5,rows=0 loops=5,rows=0 loops=5,rows=0 loops=5,rows=0 loops=100" \
    "one probe per key (loops: 5 a batch, then 100), each finding at most its own row"

answers=$(grep -E '^[0-9]+$' <<<"$out" | paste -sd,)
is "$answers" "3,3,3,3,3,3,3,90" "each batch records its new keys and answers the old ones as repeats"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.ledger_entry WHERE account = 'um7'")" "$((1 + 3000 + 7 * 3 + 90))" \
    "the ledger of um7: its rows before, and one for each new key"
# recorded usage has no job_id: the (account, job_id) index of 0.2.0's job
# rows is partial and gets no entry from it (it had one NULL entry a row)
is "$(q -d $DB -c "SELECT pg_relation_size('earmark.ledger_account_job_id_key') <= 2 * current_setting('block_size')::int")" t \
    "3,311 recorded usages wrote no entry in ledger_account_job_id_key (at most its meta page and root)"

# a key repeated in a batch is looked up once: 2,000 repeats of a key the
# ledger has (a client resending one event) come back as one row, not one
# a repeat (mark_seen_keys marks every event of the key for each row it
# gets: n rows for n repeats were n * n key comparisons; 40,000 repeats
# took 10.5 s of CPU where 10,000 took 1.0 s)
out=$({
    explain_as_run
    echo "SELECT count(*) FILTER (WHERE recorded) || '/' || count(*) FROM earmark_record_usage_many('um7',
              array_fill(1::bigint, ARRAY[2000]), array_fill('old-5'::text, ARRAY[2000]));"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
is "$(grep -E '^[0-9]+/[0-9]+$' <<<"$out")" "0/2000" "2,000 repeats of a known key: each a repeat, none recorded"
is "$(plans_as_lines 'SELECT (e[.])?entry_key FROM' <<<"$out" | grep -o '^ | [^|]*(actual rows=[0-9]* loops=[0-9]*' | sed 's/.*(actual //')" \
    "rows=1 loops=1" "... the key look-up returns the key once (not once a repeat)"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.ledger_entry WHERE account = 'um7'")" "$((1 + 3000 + 7 * 3 + 90))" \
    "... and the ledger of um7 is unchanged"
q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
