#!/usr/bin/env bash
# An admission through escrow slots reads each of the budget's slot rows
# once: the fast path's numbers (escrow.c, fast_numbers) sum the slots'
# used, held and room, and reserve's totals (gate.c, budget_numbers) their
# used and held, each from one walk of the budget's slot rows.  Written as
# one subquery a sum, every sum walked them again: with 64 slots a
# reserve read 194 slot rows, three times the slot count, at every
# admission of a hot account.  Counted in the transaction by the slot
# table's primary key (pg_stat_get_xact_tuples_fetched); the counted
# session plans no sequential or bitmap scan, which a table with
# statistics may get (a walk that way is no cheaper per row, only not
# counted here).  The answers and the books are unchanged.
source "$(dirname "$0")/tap.sh"
DB=slot_reads
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" \
  -c "SET earmark.rate_limit = 0" \
  -c "SELECT earmark_set_limit('hot', 1000000)" \
  -c "SELECT earmark_set_escrow('hot', 64)" \
  -c "SELECT admitted FROM earmark_reserve('hot', 10, 'warm-1')" \
  -c "SELECT admitted FROM earmark_reserve('hot', 10, 'warm-2')" >/dev/null
ok $? "account hot: limit 1,000,000, 64 escrow slots, cut by its first reserves"
is "$(q -d $DB -c "SELECT count(*) FROM earmark.budget_slot WHERE account = 'hot'")" 64 "... the budget has 64 slot rows"

# 100 reserves of 10 in one transaction, then a repeat of the first key
# (answered from the budget's totals, gate.c's budget_numbers); the slot
# rows read, and what each reserve answered
out=$(q -d $DB <<'SQL'
SET earmark.rate_limit = 0;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
BEGIN;
CREATE TEMP TABLE answers AS
SELECT i, r.admitted, r.remaining FROM generate_series(1, 100) i, LATERAL earmark_reserve('hot', 10, 'k' || i) r;
SELECT 'repeat ' || admitted || ' ' || remaining FROM earmark_reserve('hot', 10, 'k1');
SELECT 'fetched ' || pg_stat_get_xact_tuples_fetched('earmark.budget_slot_pkey'::regclass);
SELECT 'admitted ' || count(*) FILTER (WHERE admitted) FROM answers;
-- a reserve's remaining is the limit less everything before it and itself
SELECT 'remaining ' || count(*) FILTER (WHERE remaining = 1000000 - 20 - 10 * i) FROM answers;
COMMIT;
SQL
)
ok $? "100 reserves of 10 in one transaction"
is "$(grep '^admitted ' <<<"$out")" "admitted 100" "every reserve admitted"
is "$(grep '^remaining ' <<<"$out")" "remaining 100" "each one's remaining: 1,000,000 less the 20 before and 10 a reserve up to it"
is "$(grep '^repeat ' <<<"$out")" "repeat true 998980" "the first key again: the same hold, remaining 998,980 (the budget's totals now)"
fetched=$(grep '^fetched ' <<<"$out" | cut -d' ' -f2)
# one walk of the 64 rows for the numbers, and the free-slot probe's row
# or two: from 64 to 64 + 8 a call; three walks were 3 x 64 and more
is "$([ -n "$fetched" ] && (( fetched >= 101 * 64 && fetched <= 101 * (64 + 8) )) && echo 1)" 1 \
    "slot rows read by the 101 calls: ${fetched:-none}, one walk of the 64 a call ($((101 * 64)) to $((101 * (64 + 8))))"

# the totals a caller reads back, and the books
is "$(q -d $DB -c "SELECT used || ' ' || held || ' ' || remaining FROM earmark_budget('hot')")" "0 1020 998980" \
    "earmark_budget('hot'): used 0, held 1,020 (102 holds of 10), remaining 998,980"
is "$(q -d $DB -c "SELECT count(*) FROM earmark_check()")" 0 "earmark_check() finds nothing"

# settles: each into a free slot of its generation; the totals after
q -d $DB -c "SELECT count(*) FROM earmark.job j, LATERAL earmark_settle('hot', j.job_id, 4) s
              WHERE j.account = 'hot' AND j.status = 'running'" >/dev/null
ok $? "the 102 holds settled at 4 units each"
is "$(q -d $DB -c "SELECT used || ' ' || held || ' ' || remaining FROM earmark_budget('hot')")" "408 0 999592" \
    "earmark_budget('hot'): used 408, held 0, remaining 999,592"
is "$(q -d $DB -c "SELECT count(*) FROM earmark_check()")" 0 "earmark_check() finds nothing"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
