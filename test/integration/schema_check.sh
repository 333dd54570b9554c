#!/usr/bin/env bash
# The schema version check (em_require_schema, src/cluster.c) refuses a
# call with EM008 when the installed extension is not this library's
# version, and accepts it again once it is, within one backend that has
# already accepted calls: the backend remembers where the row it accepted
# is and reads that one tuple again in each transaction, so a change of
# the row, by this session or another, must be seen at the next call.
# Another version is installed as the existing tests do it: DROP EXTENSION
# and CREATE EXTENSION earmark VERSION '0.2.0', then ALTER EXTENSION
# earmark UPDATE back to the library's version.
source "$(dirname "$0")/tap.sh"
DB=schema_check
q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
q -d $DB -c "CREATE EXTENSION earmark" -c "CREATE EXTENSION pageinspect" >/dev/null
VERSION=$(q -d $DB -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'")

# a call, in a transaction of its own: "accepted" or "refused SQLSTATE"
call() {
    local key=$1
    echo "DO \$\$ BEGIN PERFORM * FROM earmark_reserve('sc', 10, '$key');
          RAISE NOTICE 'call $key: accepted';
          EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'call $key: refused %', SQLSTATE; END \$\$;"
}
other() {   # SQL run by another backend, while this one is idle
    echo "\\! \"$EM_PGBIN/psql\" -X -q -v ON_ERROR_STOP=1 -d $DB -c \"$1\" >/dev/null 2>&1 || echo OTHER-FAILED"
}

out=$({
    echo "SET client_min_messages = notice;"
    call a1; call a2
    # this backend changes the version itself
    echo "DROP EXTENSION earmark; CREATE EXTENSION earmark VERSION '0.2.0';"
    call b1
    echo "ALTER EXTENSION earmark UPDATE;"
    call c1; call c2
    # another backend changes it
    other "DROP EXTENSION earmark; CREATE EXTENSION earmark VERSION '0.2.0';"
    call d1
    other "ALTER EXTENSION earmark UPDATE;"
    call e1
    other "DROP EXTENSION earmark;"
    echo "CREATE EXTENSION earmark VERSION '0.2.0'; ALTER EXTENSION earmark UPDATE;"
    call f1
    # changes rolled back: the row accepted in the rolled-back transaction
    # is no longer visible, the one before it is again; then, after VACUUM
    # may have given the rolled-back row's slot to another row, a 0.2.0 row
    echo "BEGIN; DROP EXTENSION earmark; CREATE EXTENSION earmark VERSION '0.2.0';"
    call g1
    echo "ROLLBACK;"
    call g2
    echo "BEGIN; DROP EXTENSION earmark; CREATE EXTENSION earmark;"
    call h1
    echo "ROLLBACK;"
    call h2
    other "VACUUM pg_catalog.pg_extension;"
    other "DROP EXTENSION earmark; CREATE EXTENSION earmark VERSION '0.2.0';"
    call h3
    other "VACUUM pg_catalog.pg_extension;"
    other "ALTER EXTENSION earmark UPDATE;"
    call h4
    # the accepted row's slot given to another row: VACUUM FULL packs the
    # rows (the backend finds earmark's by the index again), then DROP,
    # VACUUM and CREATE of 0.2.0 put that install's first version (updated
    # by its scripts, so no longer visible) where it was: refused; then an
    # install at this version: accepted
    other "VACUUM FULL pg_catalog.pg_extension;"
    call i1
    echo "SELECT ctid AS acc FROM pg_catalog.pg_extension WHERE extname = 'earmark' \\gset"
    other "DROP EXTENSION earmark;"
    other "VACUUM pg_catalog.pg_extension;"
    other "CREATE EXTENSION earmark VERSION '0.2.0';"
    echo "SELECT 'slot i2: ' || coalesce(pg_catalog.string_agg(pg_catalog.convert_from(pg_catalog.substr(t_data, 5, 7), 'UTF8'), ','), 'empty')
            FROM heap_page_items(get_raw_page('pg_catalog.pg_extension', (:'acc'::text::point)[0]::int))
           WHERE lp = (:'acc'::text::point)[1]::int AND t_data IS NOT NULL;"
    call i2
    other "DROP EXTENSION earmark;"
    other "VACUUM pg_catalog.pg_extension;"
    other "CREATE EXTENSION earmark;"
    call i3
} | "$EM_PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d $DB 2>&1)
ok $? "the session ran to its end"
calls=$(grep -o 'call [a-z0-9]*: .*' <<<"$out" | tr '\n' ';')
is "$(grep -c OTHER-FAILED <<<"$out")" 0 "the other backend's changes were made"
is "$calls" "call a1: accepted;call a2: accepted;call b1: refused EM008;call c1: accepted;call c2: accepted;call d1: refused EM008;call e1: accepted;call f1: accepted;call g1: refused EM008;call g2: accepted;call h1: accepted;call h2: accepted;call h3: refused EM008;call h4: accepted;call i1: accepted;call i2: refused EM008;call i3: accepted;" \
    "accepted at $VERSION; refused after this backend installed 0.2.0, accepted after its update; the same when another backend changes it; the same after changes rolled back and VACUUM, and with other rows in the accepted row's slot"
is "$(grep -o 'slot i2: .*' <<<"$out")" "slot i2: earmark" \
   "at i2 the slot of the row the backend accepted holds another earmark tuple (a 0.2.0 install's first, updated, version)"
is "$(q -d $DB -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'")" "$VERSION" "earmark is at $VERSION at the end"

q -d postgres -c "DROP DATABASE $DB" >/dev/null
done_testing
