#!/usr/bin/env bash
# test/citus/review_batch_repeat.sh: usage batches' repeats on Citus (TAP).
# earmark_record_usage_many sends a key the ledger has to its write (ON
# CONFLICT DO NOTHING on the account's shard) and checks it as a repeat
# after it (key_row, SPI, on Citus); the repeat's lookup comes first only
# where the single call would write for a repeat.  The same rule as on a
# single node: a batch is the single calls one after another.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55790 bash test/citus/review_batch_repeat.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin
ct_sql 0 -q <<'SQL' >/dev/null
CREATE FUNCTION public.first_error(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    ctx text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, ctx = PG_EXCEPTION_CONTEXT;
    RETURN st || ' at ' || coalesce(substring(ctx from 'element [0-9]+'), 'no element');
END
$f$;
SELECT earmark_set_limit('acme', 100000);
SQL

B="SELECT string_agg(recorded::text, ' ' ORDER BY ord) FROM earmark_record_usage_many('acme', ARRAY[1, 2, 3], ARRAY['r1', 'r2', 'r3'])"
is "$(ct_val 0 "$B")" "true true true" "a batch of three new keys: recorded"
is "$(ct_val 0 "$B")" "false false false" "the same batch again: three repeats (found by the write on the shard)"
is "$(ct_val 0 "SELECT earmark_record_usage('acme', 2, 'r2')")" "f" "a single call of r2 again: a repeat (key_row on Citus)"
is "$(ct_sql 0 -A -t -q -v VERBOSITY=verbose -c "SELECT earmark_record_usage('acme', 5, 'r2')" 2>&1 | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p')" "EM001" \
   "a single call of r2 with other units: EM001"
budgets=$(ct_val 0 "SELECT count(*) FROM earmark.budget WHERE account = 'acme'")
is "$(ct_val 0 "SELECT string_agg(recorded::text, ' ' ORDER BY ord) FROM earmark_record_usage_many('acme', ARRAY[1, 2], ARRAY['r1', 'r2'], NULL, ARRAY[now() - interval '40 days', now() - interval '40 days'])")" \
   "false false" "r1, r2 again dated 40 days back (a cycle without a budget row): repeats"
is "$(ct_val 0 "SELECT count(*) FROM earmark.budget WHERE account = 'acme'")" "$budgets" "  ... which created no budget row"
is "$(ct_val 0 "SELECT first_error(\$\$SELECT * FROM earmark_record_usage_many('acme', ARRAY[3, 4], ARRAY['r1', 'r2'])\$\$)")" \
   "EM001 at element 1" "[r1 other units, r2 other units], cycle has its budget row: element 1's EM001"
is "$(ct_val 0 "SELECT first_error(\$\$SELECT * FROM earmark_record_usage_many('acme', ARRAY[3, 4], ARRAY['r1', 'r2'], ARRAY['default', 'video'])\$\$)")" \
   "EM001 at element 1" "[r1 other units, r2 for video (no budget row)]: element 1's EM001 first, as the single calls"
is "$(ct_val 0 "SELECT string_agg(recorded::text, ' ' ORDER BY ord) FROM earmark_record_usage_many('acme', ARRAY[4, 1, -2, -2], ARRAY['r4', 'r1', 'c1', 'c1'])")" \
   "true false true false" "new usage, a repeat, a correction, the correction again"
is "$(ct_val 0 "SELECT (SELECT sum(units) FROM earmark.ledger_entry WHERE account = 'acme') || ' ' || (SELECT sum(units) FROM earmark.usage_shard WHERE account = 'acme')")" \
   "8 8" "ledger and counters: 1 + 2 + 3 + 4 - 2"

done_testing
