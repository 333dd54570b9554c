#!/usr/bin/env bash
# On a single node a reserve, a charge and a settlement write the budget
# row's used and held and the job row from C (src/direct.c,
# em_direct_update), not by SQL UPDATEs; where the table has something an
# UPDATE would run (here a trigger an operator added on the budget row), by
# the SQL UPDATE again, and from C once it is gone.  Counted: the UPDATEs
# of earmark.budget and earmark.job that earmark runs through SPI, which
# auto_explain logs with log_nested_statements (each statement's plan,
# "Update on budget").  Charges and settlements are of 0, so no cycle's
# mark is written (its statement updates the budget row too, and stays
# SQL).
source "$(dirname "$0")/tap.sh"
DB=direct_write
N=5
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" -c "SELECT earmark_set_limit('dw', 1000000)" \
    -c "CREATE TABLE seen (n int)" \
    -c "CREATE FUNCTION seen() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN INSERT INTO public.seen VALUES (1); RETURN NEW; END \$\$" >/dev/null

# updates TABLE TAG: the UPDATEs of earmark.TABLE run for N reserves, charges and settlements
updates() {
    local table=$1 i
    shift
    {
        echo "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
        echo "SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice;"
        echo "SET client_min_messages = notice; SET earmark.rate_limit = 0;"
        for i in $(seq 1 $N); do
            echo "SELECT s.status FROM earmark_reserve('dw', 10, '$1-$i') r,
                    LATERAL earmark_charge('dw', r.job_id, 0) c, LATERAL earmark_settle('dw', r.job_id, 0) s;"
        done
    } | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1 >/dev/null \
      | grep -cE "Update on (earmark\.)?$table( |\$)"
}
books() {
    q -d $DB -c "SELECT used || '/' || held FROM earmark.budget WHERE account = 'dw'"
}

n=$(updates budget a)
is "$n" "0" "no SQL UPDATE of the budget row for $N reserves, charges and settlements: written from C"
n=$(updates job a2)
is "$n" "0" "nor of the job row"
is "$(books)" "0/0" "the budget row's numbers after them"

q -d $DB -c "CREATE TRIGGER seen BEFORE UPDATE ON earmark.budget FOR EACH ROW EXECUTE FUNCTION seen()" >/dev/null
n=$(updates budget b)
is "$n" "$((2 * N))" "with a trigger on the budget row, each of its writes is the SQL UPDATE"
is "$(q -d $DB -c "SELECT count(*) FROM seen")" "$((2 * N))" "and the trigger fired for each"
is "$(books)" "0/0" "the budget row's numbers after them"
n=$(updates job b2)
is "$n" "0" "the job row's writes still from C (its table has no trigger)"

q -d $DB -c "DROP TRIGGER seen ON earmark.budget" >/dev/null
n=$(updates budget c)
is "$n" "0" "the trigger dropped: written from C again"
is "$(q -d $DB -c "SELECT count(*) FILTER (WHERE status = 'completed') || '/' || count(*) FROM earmark.job")" \
    "$((5 * N))/$((5 * N))" "every job was reserved and settled"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
