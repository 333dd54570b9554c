#!/usr/bin/env bash
# The inbox's statements are not planned again at every call: in one
# session, a dozen receives, claims and completions, as an application
# (earmark_user) and as an admin, each show their plans through
# auto_explain (nested statements), and every plan of the completion's
# UPDATE and of the claim is the generic one (the event id is "$1", not
# the value of the call).  The completion used to be planned for its
# parameters at every call, for good: its custom plan drops one side of
# "$4 OR NOT EXISTS (...)", so the plan cache always judged it cheaper,
# and planning was a seventh of a consumer's CPU (docs/inbox.md#benchmark).
# Only an application's completion reads inbox_handler (it may finish only
# events of types without a handler); an admin's plan has no such read,
# which it used to start and end at every call without running it.
source "$(dirname "$0")/tap.sh"
DB=inbox_plans
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "DROP ROLE IF EXISTS ip_app" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" -c "CREATE ROLE ip_app IN ROLE earmark_user" >/dev/null

# run ROLE N: N events stored, claimed and completed one by one in one
# session as ROLE, with auto_explain's notices (the plans) on stderr
run() {
    local role=$1 n=$2 i
    {
        echo "LOAD 'auto_explain';"
        echo "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
        echo "SET auto_explain.log_level = notice; SET client_min_messages = notice;"
        echo "SET ROLE $role;"
        for i in $(seq 1 "$n"); do
            echo "SELECT event_id FROM earmark_inbox_receive('ip-$role', 'k$i', 'ip.thing', '{}');"
        done
        for i in $(seq 1 "$n"); do
            echo "SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(1);"
        done
    } | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1 >/dev/null
}

# plans QUERY_START: the Index Cond lines on inbox_event's primary key of
# every logged plan whose query text starts with QUERY_START, one a line
plans() {
    awk -v q="$1" '/^(psql:.*)?NOTICE:/ { keep = 0 }
                   index($0, "Query Text: " q) == 1 { keep = 1; next }
                   keep && /Index Cond: \(event_id = / { sub(/^ */, ""); print }'
}

# handler_scans QUERY_START: how many logged plans of statements whose query
# text starts with QUERY_START read earmark.inbox_handler
handler_scans() {
    awk -v q="$1" '/^(psql:.*)?NOTICE:/ { if (keep && hit) n++; keep = 0; hit = 0 }
                   index($0, "Query Text: " q) == 1 { keep = 1; next }
                   keep && / on inbox_handler / { hit = 1 }
                   END { if (keep && hit) n++; print n + 0 }'
}

for role in ip_app postgres; do
    out=$(run "$role" 12)
    ok $? "$role: 12 events stored, claimed and completed one by one"
    completes=$(plans "UPDATE earmark.inbox_event AS e SET status = 'applied'" <<<"$out")
    is "$(wc -l <<<"$completes" | tr -d ' ')" 12 "$role: every completion's UPDATE is logged with its plan"
    is "$(sort -u <<<"$completes")" 'Index Cond: (event_id = $1)' \
        "$role: every completion runs the generic plan (no plan made for the call's event id)"
    # an application may finish only events of types without a handler, so
    # its completion reads inbox_handler; an admin's may finish any, and its
    # plan has no such read to start and end at every call
    if [ "$role" = ip_app ]; then want=12; else want=0; fi
    is "$(handler_scans "UPDATE earmark.inbox_event AS e SET status = 'applied'" <<<"$out")" "$want" \
        "$role: $want of the 12 completions' plans read inbox_handler"
    claims=$(awk '/Query Text: WITH c AS \(/ { n++ } END { print n + 0 }' <<<"$out")
    is "$claims" 12 "$role: every claim is logged with its plan"
    is "$(grep -c 'Index Cond: (ROW(occurred_at, event_id) > ROW(\$5, \$6))' <<<"$out")" 12 \
        "$role: every claim runs the generic plan"
    is "$(q -d $DB -c "SELECT count(*) FILTER (WHERE status = 'applied') || '/' || count(*)
                          FROM earmark.inbox_event WHERE source = 'ip-$role'")" 12/12 \
        "$role: all 12 events applied"
done

q -d postgres -c "DROP DATABASE $DB" >/dev/null
q -d postgres -c "DROP ROLE IF EXISTS ip_app" >/dev/null
done_testing
