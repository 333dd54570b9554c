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
# run itself wrote (tables an ANALYZE saw empty: they are planned at each
# call).  The rows come back in budget_id order, every cycle once.
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
# run wrote before each cycle.  Planned at each call, a look-up probes the
# index once the table is more than a few pages.
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

rows=$(grep -E '^[0-9]+\|' <<<"$out")
is "$(grep -c . <<<"$rows")" "$N" "one row for each of the $N cycles"
is "$(cut -d'|' -f1 <<<"$rows")" "$(cut -d'|' -f1 <<<"$rows" | sort -n -u)" "the rows in budget_id order, each cycle once"
is "$(cut -d'|' -f2 <<<"$rows" | sort -u | paste -sd,)" "repaired" \
    "every cycle read and repaired (none was reported to the local meter)"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
