#!/usr/bin/env bash
# test/bench/one_account.sh: do many calls on one account in one
# transaction cost the same each as the first ones?  On a private
# throwaway cluster.
#
#   sudo bash test/bench/one_account.sh
#
# For each n of ONE_SIZES, three statements, each its own transaction, on
# one account ('one', a limit of 10^12, earmark.rate_limit = 0):
#   - n earmark_reserve calls (SELECT ... FROM generate_series(1, n),
#     LATERAL earmark_reserve(...)),
#   - the earmark_settle calls of those n jobs,
#   - one earmark_reserve_many of n keys.
# Each writes the account's budget row n times in one transaction: the
# versions it makes cannot be pruned before it ends, so a look-up of the row
# that walks them makes the statement quadratic (docs/benchmarks.md, "Found
# along the way").  Prints the wall-clock milliseconds of each statement
# and microseconds a call.  Timings, not instruction counts: compare
# builds side by side (EM_PREFIX of each, one after the other, twice).
#
# Environment: ONE_PORT (55463), ONE_SIZES ("1000 4000 16000").  Under a
# minute on 2 cores.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${ONE_PORT:-55463}
SIZES=${ONE_SIZES:-1000 4000 16000}

em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" "jit = off"
em_psql -d postgres -c "CREATE EXTENSION earmark" \
    -c "SELECT earmark_set_limit('one', 1000000000000)" >/dev/null

# ms STATEMENT: runs it, prints its wall-clock milliseconds
ms() {
    local t0 t1
    t0=$(date +%s%N)
    em_psql -d postgres -c "$1" >/dev/null || exit 1
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000000 ))
}

echo "| n, one account, one statement | reserves (ms) | µs a reserve | settles (ms) | µs a settle | earmark_reserve_many (ms) | µs a job |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in $SIZES; do
    r=$(ms "SELECT count(*) FROM generate_series(1, $n) i,
                 LATERAL earmark_reserve('one', 10, 'r$n-' || i, lease => interval '1 hour') x
             WHERE x.admitted")
    s=$(ms "SELECT count(*) FROM earmark.job j, LATERAL earmark_settle('one', j.job_id, 5) x
             WHERE j.account = 'one' AND j.idempotency_key LIKE 'r$n-%'")
    m=$(ms "SELECT count(*) FROM earmark_reserve_many('one', array_fill(10::bigint, ARRAY[$n]),
                 ARRAY(SELECT 'm$n-' || i FROM generate_series(1, $n) i))")
    echo "| $n | $r | $((r * 1000 / n)) | $s | $((s * 1000 / n)) | $m | $((m * 1000 / n)) |"
done
# the books: held is the sum of the open holds
bad=$(em_psql -d postgres -At -c "SELECT count(*) FROM earmark.budget b
    WHERE b.held <> (SELECT coalesce(sum(amount), 0) FROM earmark.job j
                      WHERE j.account = b.account AND j.budget_id = b.budget_id
                        AND j.status IN ('running', 'capped'))")
echo
echo "books: $bad budget rows whose held is not the sum of their open holds"
[ "$bad" = 0 ]
