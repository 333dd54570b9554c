#!/usr/bin/env bash
# earmark_reconcile() over every account reads each page of cycles with a
# walk that starts where the last page stopped and ends at the page's last
# cycle: 600 accounts with usage, 12 pages of 50, each page's statement
# logged with its plan as it ran (auto_explain, nested statements,
# ANALYZE): every page walks budget_order in budget_id order under its
# Limit, reads at most a page of budget rows, and sorts nothing.  Before,
# the primary key (account, budget_id) gave no budget_id order, so each
# page sorted every cycle after the last page (a run over N cycles read
# about N * N / 100 budget rows), and the generic plan's
# "$1 IS NULL OR account = $1" made the planner join each budget row to a
# scan of every account: a run over 10,000 accounts took minutes.  Nor
# does a page hash the whole send log to test each budget row for a send
# (it grows with every report, and with the run's own repairs).  Nor does
# the look-up of each cycle's last send and last evidence scan what the
# run itself wrote (tables an ANALYZE saw empty: they are planned again
# for each page, not at each call).  The rows come back in budget_id order, every cycle once.
source "$(dirname "$0")/tap.sh"
DB=reconcile_pages
N=600
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
# account names that sort against their budget ids: a walk in account
# order would return the rows out of budget_id order
q -d $DB -c "CREATE EXTENSION earmark" \
  -c "SELECT count(earmark_set_limit('rp' || lpad(($N - i)::text, 4, '0'), NULL)) FROM generate_series(0, $N - 1) i" \
  -c "SELECT count(earmark_record_usage('rp' || lpad(($N - i)::text, 4, '0'), 1 + i % 7, 'k' || i)) FROM generate_series(0, $N - 1) i" \
  -c "ANALYZE" >/dev/null
ok $? "$N accounts, each with one recorded usage (a cycle with a ledger row)"

out=$({
    explain_as_run
    echo "SELECT budget_id, verdict FROM earmark_reconcile();"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "earmark_reconcile() over every account, its statements' plans logged"

# the logged plans of the page statement, each as one line
pages=$(plans_as_lines 'SELECT b[.]budget_id, b[.]account, b[.]feature' <<<"$out")
is "$(grep -c . <<<"$pages")" 13 "12 pages of 50 and the empty one after them, each page's statement logged"
is "$(grep -c 'Limit .*Index Scan using budget_order on budget b' <<<"$pages")" 13 \
    "every page walks budget_order under its Limit"
is "$(grep -c -e '-> *Sort' -e '| Sort' <<<"$pages")" 0 "no page sorts"
read_rows=$(grep -o 'Index Scan using budget_order on budget b *([^)]*) (actual rows=[0-9]*' <<<"$pages" |
    sed 's/.*rows=//' | sort -n | tail -1)
ok "$(( ${read_rows:-999999} <= 50 ? 0 : 1 ))" \
    "no page reads more budget rows than a page (at most ${read_rows:-none read}), not every cycle after it"
is "$(grep -c 'Seq Scan on account' <<<"$pages")" 0 "no page scans the accounts"
is "$(grep -c 'hashed SubPlan' <<<"$pages")" 0 \
    "no page hashes the whole send log or ledger (a repair adds sends: each page would read more)"

# the rows each look-up of a cycle threw away, in the order they ran: the
# cycle's numbers (with its last send), its last evidence, the local
# meter's total.  Those tables are filled by this run (the ANALYZE above
# saw them empty): a plan made at the first cycle and kept scans all the
# run wrote before each cycle.  Planned again for each page, a look-up
# probes the index once the table is more than a few pages.
thrown=$(awk '/^(psql:.*)?NOTICE:/ { if (kind != "") print kind, n; kind = ""; n = 0 }
              /^Query Text: SELECT \(SELECT coalesce/ { kind = "numbers" }
              /^Query Text: SELECT ledger_total/ { kind = "evidence" }
              /^Query Text: SELECT total FROM earmark.local_meter/ { kind = "meter" }
              /Rows Removed by Filter:/ { n += $NF }
              END { if (kind != "") print kind, n }' <<<"$out")
for kind in numbers evidence meter; do
    last=$(grep "^$kind " <<<"$thrown" | tail -100 | awk '{n += $2} END {print n + 0}')
    is "$last" 0 "the last 100 look-ups of the cycles' $kind read no row they threw away"
done
# ...and planned once a page, not at each call (planning costs more than
# the look-up): each runs a generic plan, its conditions on "$1", not on
# the call's values
for look in 'SELECT \(SELECT coalesce' 'SELECT ledger_total' 'SELECT total FROM earmark[.]local_meter'; do
    plans=$(plans_as_lines "$look" <<<"$out")
    ok "$(( $(grep -c . <<<"$plans") >= N ? 0 : 1 ))" "the look-ups '$look' are logged, at least one a cycle"
    is "$(grep -c -v '[$]1' <<<"$plans")" 0 "... and each runs a generic plan (on \$1, not on the call's values)"
done

rows=$(grep -E '^[0-9]+\|' <<<"$out")
is "$(grep -c . <<<"$rows")" "$N" "one row for each of the $N cycles"
is "$(cut -d'|' -f1 <<<"$rows")" "$(cut -d'|' -f1 <<<"$rows" | sort -n -u)" "the rows in budget_id order, each cycle once"
is "$(cut -d'|' -f2 <<<"$rows" | sort -u | paste -sd,)" "repaired" \
    "every cycle read and repaired (none was reported to the local meter)"

# --- a feature filter.  A feature launched since the others: each
# account's cycle of it comes after every other cycle (the highest budget
# ids), the others (10 a account, usage on one in ten) before them, and
# fresh statistics.  The planner takes "feature = 'new'" (a few percent of
# the table) and "budget_id > last page" as independent and expects fewer
# rows than a page: it sorted every page, read every cycle of the feature
# after the last page (and scanned the whole (account, feature,
# cycle_start) index for the feature) and hashed every account, each
# page: a run over N cycles of the feature read N * N / 100 of them.
q -d $DB -c "INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end)
               SELECT a.account, 'f' || f, b.cycle_start, b.cycle_end
                 FROM earmark.account a JOIN earmark.budget b ON b.account = a.account, generate_series(1, 10) f
                ORDER BY hashint4(f * 7919 + length(a.account)), a.account" \
  -c "INSERT INTO earmark.ledger_entry (account, budget_id, units, entry_key, occurred_at)
        SELECT account, budget_id, 1, 'old' || budget_id, cycle_start FROM earmark.budget
         WHERE feature <> 'default' AND budget_id % 10 = 0" \
  -c "SELECT count(earmark_record_usage('rp' || lpad(($N - i)::text, 4, '0'), 1 + i % 5, 'n' || i, 'new')) FROM generate_series(0, $N - 1) i" \
  -c "ANALYZE" >/dev/null
ok $? "10 more features' cycles for each account, then a new feature's, each with a usage"

out=$({
    explain_as_run
    echo "SELECT budget_id, verdict FROM earmark_reconcile(NULL, 'new');"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "earmark_reconcile(NULL, 'new'), its statements' plans logged"
pages=$(plans_as_lines 'SELECT b[.]budget_id, b[.]account, b[.]feature' <<<"$out")
ok "$(( $(grep -c . <<<"$pages") >= 13 ? 0 : 1 ))" "feature 'new': at least 12 pages of 50 and the empty one, each logged"
is "$(grep -c -e '-> *Sort' -e '| Sort' <<<"$pages")" 0 "feature 'new': no page sorts"
is "$(grep -c 'Seq Scan on account' <<<"$pages")" 0 "feature 'new': no page scans the accounts"
is "$(grep -c 'hashed SubPlan' <<<"$pages")" 0 "feature 'new': no page hashes the send log or the ledger"
is "$(grep -c 'Limit .*Index Scan using budget_order on budget b' <<<"$pages")" "$(grep -c . <<<"$pages")" \
    "feature 'new': every page walks budget_order under its Limit"
rows=$(grep -E '^[0-9]+\|' <<<"$out")
is "$(grep -c . <<<"$rows")" "$N" "feature 'new': one row for each of the $N cycles"
is "$(cut -d'|' -f1 <<<"$rows")" "$(cut -d'|' -f1 <<<"$rows" | sort -n -u)" "feature 'new': the rows in budget_id order, each cycle once"

# --- one account's cycles.  page_of_account_cycles took the
# account's cycles "IN (every ledger row and send of the account)": each
# page read every ledger row of the account, a run over an account with C
# cycles and L ledger rows read L * C / 50 of them.  An account with 200
# cycles (20 features, 10 months) of 20 ledger rows each: the pages
# together read no more ledger rows than the account has.
q -d $DB -c "SELECT earmark_set_limit('rpbig', NULL)" \
  -c "INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end)
        SELECT 'rpbig', 'g' || f, date_trunc('month', now()) - make_interval(months => m),
               date_trunc('month', now()) - make_interval(months => m - 1)
          FROM generate_series(9, 0, -1) m, generate_series(1, 20) f ORDER BY m DESC, f" \
  -c "INSERT INTO earmark.ledger_entry (account, budget_id, units, entry_key, occurred_at)
        SELECT 'rpbig', budget_id, 1, 'big' || budget_id || '-' || g, cycle_start
          FROM earmark.budget, generate_series(1, 20) g WHERE account = 'rpbig'" \
  -c "ANALYZE" >/dev/null
ok $? "an account with 200 cycles of 20 ledger rows each"
out=$({
    explain_as_run
    echo "SELECT budget_id, verdict FROM earmark_reconcile('rpbig');"
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "earmark_reconcile('rpbig'), its statements' plans logged"
pages=$(plans_as_lines 'SELECT b[.]budget_id, b[.]account, b[.]feature' <<<"$out")
ledger_read=$(grep -oE 'on ledger_entry e [^|]*\(actual rows=[0-9]+ loops=[0-9]+\)' <<<"$pages" |
    sed -E 's/.*rows=([0-9]+) loops=([0-9]+).*/\1 \2/' | awk '{ s += $1 * $2 } END { print s + 0 }')
ok "$(( ledger_read <= 4000 ? 0 : 1 ))" \
    "one account: the pages read no more ledger rows than the account has (read $ledger_read, has 4000)"
rows=$(grep -E '^[0-9]+\|' <<<"$out")
is "$(grep -c . <<<"$rows")" 200 "one account: one row for each of its 200 cycles"
is "$(cut -d'|' -f1 <<<"$rows")" "$(cut -d'|' -f1 <<<"$rows" | sort -n -u)" "one account: the rows in budget_id order, each cycle once"

# the run's memory does not grow with its cycles: a trigger on the evidence
# notes the backend's memory (its contexts' total) at each cycle's
# evidence, written or touched in the run's last phase, after every
# cycle's look-ups.  Each cycle's statements ran in the one SPI connection
# of the run, whose result tables SPI keeps until the connection ends
# (a subtransaction's commit frees none): 600 cycles held about 21 MB,
# 100,000 cycles would hold gigabytes.
q -d $DB >/dev/null <<'SQL'
CREATE TABLE public.mem_seen (bytes bigint);
CREATE FUNCTION public.mem_note() RETURNS trigger LANGUAGE plpgsql SET search_path = public, pg_catalog AS $$
BEGIN
    INSERT INTO public.mem_seen SELECT sum(total_bytes) FROM pg_catalog.pg_backend_memory_contexts;
    RETURN NULL;
END $$;
CREATE TRIGGER mem_note AFTER INSERT OR UPDATE ON earmark.evidence FOR EACH ROW EXECUTE FUNCTION public.mem_note();
SQL
grown=$(q -d $DB -c "CREATE TEMP TABLE base AS SELECT sum(total_bytes) AS bytes FROM pg_backend_memory_contexts" \
             -c "SELECT count(*) FROM earmark_reconcile()" \
             -c "SELECT ((max(m.bytes) - min(b.bytes)) / 1024)::bigint FROM public.mem_seen m, base b" | tail -1)
ok "$(( ${grown:-999999} < 8192 ? 0 : 1 ))" \
    "a run over every cycle (about 2,000) holds less than 8 MB more than before it (${grown:-?} kB at its last cycle)"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
