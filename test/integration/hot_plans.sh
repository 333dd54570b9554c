#!/usr/bin/env bash
# The gate's saved plans are not made again when a session alternates
# entry points that share them.  earmark_reserve, earmark_charge and
# earmark_settle pin their search path in C for the call (src/spi.c);
# earmark_reserve_many and earmark_settle_many, which run the same
# statements (em_reserve_one, em_settle_one), keep a SET search_path clause.
# The plan cache makes a plan again when the search path it was made under
# differs from the active one, so the two must give the same path, also in
# a session that has a temporary schema.  Counted: the plans a session
# makes (debug_print_plan logs each one, the statements earmark runs
# through SPI included), for the same calls grouped by entry point and
# alternating between them.  A difference is a plan made again per switch.
source "$(dirname "$0")/tap.sh"
DB=hot_plans
N=12
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "DROP ROLE IF EXISTS hp_app" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" -c "CREATE ROLE hp_app IN ROLE earmark_user" \
    -c "SELECT earmark_set_limit('hp-grouped', 1000000000), earmark_set_limit('hp-alternating', 1000000000)" >/dev/null

one() {   # one KIND ACCOUNT I: the SQL of call I of a kind
    case $1 in
        pinned) echo "SELECT c.*, s.* FROM earmark_reserve('$2', 10, 'p$3') r,
                        LATERAL earmark_charge('$2', r.job_id, 5) c, LATERAL earmark_settle('$2', r.job_id, 5) s;" ;;
        clause) echo "SELECT s.* FROM earmark_reserve_many('$2', ARRAY[10::bigint], ARRAY['m$3']) r,
                        LATERAL earmark_settle_many('$2', ARRAY[r.job_id], ARRAY[5::bigint]) s;" ;;
    esac
}

# plans ORDER: the number of plans a session made for N calls of each kind
plans() {
    local order=$1 account=hp-$1 i
    {
        echo "SET ROLE hp_app;"
        echo "CREATE TEMP TABLE scratch (x int);"    # the session has a temporary schema
        echo "SET debug_print_plan = on; SET client_min_messages = log;"
        if [ "$order" = grouped ]; then
            for i in $(seq 1 $N); do one pinned "$account" "$i"; done
            for i in $(seq 1 $N); do one clause "$account" "$i"; done
        else
            for i in $(seq 1 $N); do one pinned "$account" "$i"; one clause "$account" "$i"; done
        fi
    } | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1 >/dev/null | grep -c 'LOG:  plan:'
}

grouped=$(plans grouped)
alternating=$(plans alternating)
ok "$(( grouped > 0 ? 0 : 1 ))" "debug_print_plan shows the plans made ($grouped for the grouped calls)"
is "$alternating" "$grouped" "alternating pinned and SET-clause entry points makes no plan more than grouping them"
is "$(q -d $DB -c "SELECT count(*) FILTER (WHERE status = 'completed') || '/' || count(*) FROM earmark.job")" \
    "$((4 * N))/$((4 * N))" "every job was reserved and settled"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
q -d postgres -c "DROP ROLE IF EXISTS hp_app" >/dev/null
done_testing
