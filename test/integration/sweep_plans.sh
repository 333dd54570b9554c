#!/usr/bin/env bash
# The sweep expires a dead hold by its job row's primary key, whatever the
# account's history: an account with 3,000 jobs (settled ones among them),
# statistics taken when every account had one job (as after a bulk load),
# then 150 of its holds and one of five other accounts' past their lease,
# and earmark_sweep in a transaction of its own.  On a single node each
# locked job row is written from C (src/direct.c, em_direct_update) by
# (account, job_id): one probe of job_pkey a job.  Before, one UPDATE a
# budget expired them, "account = $1 AND job_id = ANY ($2)", and with these
# statistics its plan read the account's every job in the idempotency
# key's index and tested each against the array, at every sweep of every
# budget.  With a trigger on earmark.job (which an UPDATE would fire) the
# sweep runs that UPDATE again, and expires the same way.  Counted: the
# scans of earmark.job's indexes and the rows they returned, in the
# sweep's transaction (pg_stat_get_xact_*: a plan's choice of index does
# not hide there, nor does a read by index from C), and the UPDATEs of
# earmark.job the sweep runs through SPI (auto_explain, nested statements).
source "$(dirname "$0")/tap.sh"
DB=sweep_plans
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
# autovacuum would analyze earmark.job again after the load: kept off there
q -d $DB -c "CREATE EXTENSION earmark" -c "ALTER TABLE earmark.job SET (autovacuum_enabled = off)" \
  -c "SELECT count(earmark_set_limit('sw' || i, NULL)) FROM generate_series(1, 200) i" \
  -c "SELECT count(*) FROM generate_series(1, 200) i, earmark_reserve('sw' || i, 1, 'first-' || i) r" \
  -c "ANALYZE" \
  -c "SET earmark.rate_limit = 0" \
  -c "SELECT count(*) FROM generate_series(1, 3000) i, earmark_reserve('sw7', 10, 'k-' || i) r WHERE r.admitted" \
  -c "SELECT count(*) FROM earmark.job j, earmark_charge('sw7', j.job_id, 3) c
       WHERE j.account = 'sw7' AND j.idempotency_key LIKE 'k-%' AND substr(j.idempotency_key, 3)::int % 3 = 0" \
  -c "SELECT count(*) FROM earmark.job j, earmark_settle('sw7', j.job_id) s
       WHERE j.account = 'sw7' AND j.idempotency_key LIKE 'k-%' AND substr(j.idempotency_key, 3)::int % 4 = 0" \
  -c "SELECT count(*) FROM earmark_charge('sw1', (SELECT job_id FROM earmark.job WHERE account = 'sw1'), 1)" >/dev/null
ok $? "200 accounts with one job each, analyzed; then 3,000 jobs on sw7, a third charged, a quarter settled"

# the job indexes' scans and the rows they returned in this transaction
counts() {
    local i
    for i in job_account_idempotency_key_key job_pkey job_open; do
        echo "SELECT 'counts $i ' || pg_stat_get_xact_numscans('earmark.$i'::regclass)
                  || ' ' || pg_stat_get_xact_tuples_returned('earmark.$i'::regclass);"
    done
}
# count OUT INDEX: the rows INDEX returned (count OUT INDEX scans: its scans)
count() { awk -v i="$2" -v f="${3:-returned}" '$1 == "counts" && $2 == i { print (f == "scans" ? $3 : $4) }' <<<"$1"; }

# sweep WHERE: the open jobs matching WHERE made dead (a past lease, as
# before the fix's table "dead"), the budgets' numbers kept ("budget_before"),
# then earmark_sweep in a fresh session whose first statement is BEGIN (the
# pg_stat_get_xact_* counts are this backend's unflushed ones), its
# statements' plans logged; prints the session's output
sweep() {
    q -d $DB -c "DROP TABLE IF EXISTS dead, budget_before" \
      -c "UPDATE earmark.job SET lease_until = now() - interval '1 hour'
           WHERE status IN ('running', 'capped') AND ($1)" \
      -c "CREATE TABLE dead AS SELECT account, budget_id, job_id, amount, used, lease_until FROM earmark.job
           WHERE status IN ('running', 'capped') AND lease_until < now()" \
      -c "CREATE TABLE budget_before AS SELECT account, budget_id, used, held FROM earmark.budget" >/dev/null
    {
        echo "BEGIN;"
        echo "SELECT 'started ' || now();"
        explain_as_run
        echo "SELECT 'swept ' || earmark_sweep(100000);"
        counts
        echo "COMMIT;"
    } | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1
}

# expired WHAT OUT: the dead jobs were expired at their recorded use, their
# budgets' held dropped by their holds and used grew by it, and the books hold
expired() {
    local what=$1 out=$2 n started
    n=$(q -d $DB -c "SELECT count(*) FROM dead")
    started=$(sed -n 's/^started //p' <<<"$out")
    is "$(sed -n 's/^swept //p' <<<"$out")" "$n" "$what: the sweep expired the $n dead jobs"
    is "$(q -d $DB -c "SELECT count(*) FROM dead d JOIN earmark.job j USING (account, job_id)
                        WHERE j.status = 'expired' AND j.used = d.used AND j.charged = d.used
                          AND j.released = d.amount - d.used AND j.amount = d.amount
                          AND j.settled_at BETWEEN '$started' AND now()")" "$n" \
        "$what: each one 'expired', charged = used, released = amount - used, settled_at the sweep's time"
    is "$(q -d $DB -c "SELECT count(*) FROM budget_before b0 JOIN earmark.budget b USING (account, budget_id)
                        LEFT JOIN (SELECT account, budget_id, sum(amount) AS amount, sum(used) AS used
                                     FROM dead GROUP BY 1, 2) d USING (account, budget_id)
                        WHERE b.held = b0.held - coalesce(d.amount, 0) AND b.used = b0.used + coalesce(d.used, 0)")" \
        "$(q -d $DB -c "SELECT count(*) FROM earmark.budget")" \
        "$what: every budget's held dropped by its expired holds, its used grew by their use"
    is "$(q -d $DB -c "SELECT count(*) FROM earmark.budget b
                        WHERE b.held <> (SELECT coalesce(sum(amount), 0) FROM earmark.job j
                                          WHERE j.account = b.account AND j.budget_id = b.budget_id
                                            AND j.status IN ('running', 'capped'))")" 0 \
        "$what: every budget's held is the sum of its open holds"
    is "$(q -d $DB -c "SELECT count(*) FROM earmark_check()")" 0 "$what: earmark_check() finds nothing"
}

# the direct path: 150 holds of sw7 (50 of them charged) and the first
# hold of sw1 .. sw5 (sw1's charged)
out=$(sweep "(account = 'sw7' AND idempotency_key LIKE 'k-%' AND substr(idempotency_key, 3)::int % 20 = 1)
             OR account IN ('sw1', 'sw2', 'sw3', 'sw4', 'sw5')")
ok $? "earmark_sweep in a transaction of its own, its index counts read in it"
is "$(q -d $DB -c "SELECT count(*) || ' ' || sum(amount) || ' ' || sum(used) FROM dead WHERE account = 'sw7'")" \
    "150 1500 150" "150 holds of sw7 were dead, 1,500 held, 150 used"
is "$(count "$out" job_account_idempotency_key_key)" 0 "the idempotency key's index returned no row"
is "$(count "$out" job_pkey)" 155 "job_pkey returned one row per expired job"
diag "index scans/rows: $(grep '^counts ' <<<"$out" | cut -d' ' -f2- | paste -sd,)"
is "$(grep -cE 'Update on (earmark\.)?job( |$)' <<<"$out")" 0 "no UPDATE of earmark.job ran through SPI"
plans_as_lines 'UPDATE earmark.job SET status' <<<"$out" | cut -c1-300 | sed 's/^/# /'
expired "direct" "$out"
is "$(q -d $DB -c "SELECT string_agg(account, ',' ORDER BY account) FROM earmark.meter_mark
                    WHERE account IN ('sw1', 'sw2', 'sw3', 'sw4', 'sw5')")" "sw1" \
    "the cycle of sw1, whose expired hold had used something, is marked; the others are not"

# the SQL path: a trigger on earmark.job that an UPDATE fires (it does
# nothing), and 150 more holds of sw7 (50 charged)
q -d $DB -c "CREATE FUNCTION public.nothing() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'" \
  -c "CREATE TRIGGER nothing BEFORE UPDATE ON earmark.job FOR EACH ROW EXECUTE FUNCTION public.nothing()" >/dev/null
out=$(sweep "account = 'sw7' AND idempotency_key LIKE 'k-%' AND substr(idempotency_key, 3)::int % 20 = 2")
ok $? "with a trigger on earmark.job: earmark_sweep in a transaction of its own"
is "$(q -d $DB -c "SELECT count(*) || ' ' || sum(amount) || ' ' || sum(used) FROM dead")" "150 1500 150" \
    "150 holds of sw7 were dead, 1,500 held, 150 used"
is "$(grep -cE 'Update on (earmark\.)?job( |$)' <<<"$out")" 1 "the sweep's UPDATE of earmark.job ran through SPI, once"
expired "trigger" "$out"
q -d $DB -c "DROP TRIGGER nothing ON earmark.job" -c "DROP FUNCTION public.nothing()" >/dev/null

# the trigger gone: from C again
out=$(sweep "account = 'sw7' AND idempotency_key LIKE 'k-%' AND substr(idempotency_key, 3)::int % 20 = 3")
ok $? "the trigger dropped: earmark_sweep in a transaction of its own"
is "$(count "$out" job_account_idempotency_key_key) $(count "$out" job_pkey)" "0 150" \
    "the idempotency key's index returned no row, job_pkey one per expired job"
is "$(grep -cE 'Update on (earmark\.)?job( |$)' <<<"$out")" 0 "no UPDATE of earmark.job ran through SPI"
expired "after the trigger" "$out"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
