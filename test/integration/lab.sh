#!/usr/bin/env bash
# test/integration/lab.sh: the Concurrency Lab and the load run, checked.
#
# Compiles test/lab/earmark_lab.c, runs it with --check --kv against a fresh
# database and asserts the numbers it reports: the earmark side admits
# exactly what the limit allows and holds nothing afterwards; the plain
# check overspends in the lab.

source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DB=earmark_lab
TMP=$(mktemp -d /tmp/earmark-lab-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

q -d postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1
q -d postgres -c "CREATE DATABASE $DB"
ok $? "database $DB created"
q -d "$DB" -c "CREATE EXTENSION earmark"
ok $? "extension created"

# the headers and libpq of the system's PostgreSQL: a private copy of it
# (EM_PREFIX) holds the server's programs and libraries only
PGC=/usr/lib/postgresql/15/bin/pg_config
[ -x "$PGC" ] || PGC="$EM_PGBIN/pg_config"
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$("$PGC" --includedir)" \
    "$ROOT/test/lab/earmark_lab.c" -L"$("$PGC" --libdir)" -lpq -lpthread \
    -o "$TMP/earmark_lab" 2>"$TMP/cc.log"
ok $? "lab program compiles without warnings"
[ -s "$TMP/cc.log" ] && sed 's/^/# /' "$TMP/cc.log"

"$TMP/earmark_lab" --db "$DB" --account-prefix itest --mode all --check --kv \
    >"$TMP/out" 2>"$TMP/err"
rc=$?
is "$rc" 0 "earmark_lab --check exits 0"
if [ "$rc" != 0 ]; then
    sed 's/^/# /' "$TMP/out" "$TMP/err"
fi

kv() { sed -n "s/^$1=//p" "$TMP/out" | tail -n 1; }

# the lab: 5 jobs of 40000 against 100000, all at once
is "$(kv lab.plain.admitted)"   5      "lab, plain check: all 5 jobs started"
is "$(kv lab.plain.spent)"      200000 "lab, plain check: spent 200000 against a plan of 100000"
is "$(kv lab.earmark.admitted)" 2      "lab, earmark: 2 admitted"
is "$(kv lab.earmark.refused)"  3      "lab, earmark: 3 refused"
is "$(kv lab.earmark.failed)"   0      "lab, earmark: no errors"
is "$(kv lab.earmark.spent)"    80000  "lab, earmark: 80000 spent (read back)"
is "$(kv lab.earmark.held)"     0      "lab, earmark: nothing held afterwards"
is "$(grep -c 'refused: the job needs 40000 and 20000 is left' "$TMP/out")" 3 \
    "lab, earmark: each refusal says why, with the numbers"

# the load: 120 jobs of 1000, 50 at a time, room for 100
is "$(kv load.earmark.admitted)" 100    "load, earmark: 100 admitted"
is "$(kv load.earmark.refused)"  20     "load, earmark: 20 refused"
is "$(kv load.earmark.failed)"   0      "load, earmark: no errors"
is "$(kv load.earmark.spent)"    100000 "load, earmark: 100000 spent (read back)"
is "$(kv load.earmark.held)"     0      "load, earmark: nothing held afterwards"
plain_spent=$(kv load.plain.spent)
ok "$([ -n "$plain_spent" ] && [ "$plain_spent" -ge 100000 ] && echo 0 || echo 1)" \
    "load, plain check: reported its spend (${plain_spent:-none})"
is "$(kv check)" pass "the program's own check passed"

# read back from the database, not from the program: no open holds left
is "$(q -d "$DB" -c "SELECT count(*) FROM earmark.job WHERE account LIKE 'itest-%' AND status IN ('running','capped')")" 0 \
    "no job of the run is still open"
is "$(q -d "$DB" -c "SELECT coalesce(sum(units), 0) FROM earmark.ledger l JOIN earmark.budget b USING (budget_id) WHERE b.account LIKE 'itest-%'")" 180000 \
    "the ledger holds the 80000 + 100000 the earmark jobs used"

q -d postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1
done_testing
