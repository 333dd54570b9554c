# test/integration/tap.sh: a few TAP helpers for the integration scripts.
#
# The runner (scripts/test.sh) sets PGHOST, PGPORT and PGUSER to the private
# cluster, whose earmark worker is connected to database "postgres", and
# EM_DATA to its data directory.  Each script prints TAP and is run by prove.

set -uo pipefail
EM_PGBIN=${EM_PGBIN:-/usr/lib/postgresql/15/bin}
_tap_n=0
_tap_failed=0

q() { "$EM_PGBIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 "$@"; }

ok() {   # ok CONDITION-EXIT-STATUS DESCRIPTION  (use: ok $? "desc" or ok "$(( a == b ))"...)
    _tap_n=$((_tap_n + 1))
    if [ "$1" = 0 ]; then echo "ok $_tap_n - $2"
    else echo "not ok $_tap_n - $2"; _tap_failed=$((_tap_failed + 1)); fi
}

is() {   # is GOT EXPECTED DESCRIPTION
    _tap_n=$((_tap_n + 1))
    if [ "$1" == "$2" ]; then echo "ok $_tap_n - $3"
    else
        echo "not ok $_tap_n - $3"
        echo "#   got:      '$1'"
        echo "#   expected: '$2'"
        _tap_failed=$((_tap_failed + 1))
    fi
}

diag() { echo "# $*"; }

# wait_for SECONDS SQL EXPECTED: poll until the query returns EXPECTED
wait_for() {
    local deadline=$(( $(date +%s) + $1 )) got
    while :; do
        got=$(q -d "${DB:-postgres}" -c "$2" 2>/dev/null || true)
        [ "$got" == "$3" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && { echo "$got"; return 1; }
        sleep 0.2
    done
}

# sqlstate SQL...: "ok", or the SQLSTATE of the error the statements raise
sqlstate() {
    local args=() s out
    for s in "$@"; do args+=(-c "$s"); done
    if out=$("$EM_PGBIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -d "${DB:-postgres}" "${args[@]}" 2>&1 >/dev/null); then
        echo ok
    else
        echo "$out" | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -1
        echo "$out" | sed 's/^/# /' >&2
    fi
}

done_testing() {
    echo "1..$_tap_n"
    [ "$_tap_failed" -eq 0 ]
}
