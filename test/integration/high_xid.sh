#!/usr/bin/env bash
# Transaction ids past 2^31.  Escrow's fast path compares the xmin of the
# account's limit row, read from C (escrow.c, fast_read_direct: an
# unsigned 32-bit TransactionId widened to bigint), with the one the last
# rebalance stored (budget.slot_limx, from SQL's xmin::text::bigint).  The
# two agree only if both read the xid as unsigned; with one of them signed,
# every xid from 2^31 on would differ (a rebalance at every admission, the
# fast path never taken) or, worse, compare equal to the wrong version.
# Every other layer runs on a fresh cluster, whose xids are small.
#
# A cluster of its own, started once, every row frozen, then stopped and
# moved by pg_resetwal to next xid 2^31 + 100 (its commit log's segments
# made, as pg_resetwal's documentation says), and every database's frozen
# xid set to it, as pg_upgrade does.  On it, the
# isolation specs that tell a limit row's versions apart by xmin
# (review_limit_xmin: only xmin differs) and escrow's others, with their
# usual expected output.
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PGXS_DIR=$(dirname "$("$EM_PGBIN/pg_config" --pgxs)")/..
NEXT_XID=$((2147483648 + 100))
HX=$(mktemp -d /tmp/earmark-high-xid.XXXXXX)
chown postgres "$HX"; chmod 755 "$HX"
HPORT=$((PGPORT + 10))
as_pg() { runuser -u postgres -- "$@"; }
cleanup() {
    as_pg "$EM_PGBIN/pg_ctl" -D "$HX/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$HX"
}
trap cleanup EXIT
hq() { PGHOST=$HX PGPORT=$HPORT q "$@"; }

as_pg "$EM_PGBIN/initdb" -D "$HX/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null 2>&1
{
    echo "port = $HPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$HX'"
    echo "max_connections = 50"
    # no vacuum may recompute the xid limits before the databases' frozen
    # xids are set (below), as pg_upgrade keeps it off
    echo "autovacuum = off"
} >>"$HX/data/postgresql.conf"
start() { as_pg "$EM_PGBIN/pg_ctl" -D "$HX/data" -l "$HX/log" -w -t 120 ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null; }
start
# pageinspect before the freeze, so that its own catalog rows are frozen too
hq -d postgres -c "CREATE EXTENSION pageinspect" &&
    hq -d postgres -c "UPDATE pg_database SET datallowconn = true WHERE datname = 'template0'" &&
    for db in template0 template1 postgres; do hq -d $db -c "VACUUM FREEZE" || exit 1; done &&
    hq -d postgres -c "UPDATE pg_database SET datallowconn = false WHERE datname = 'template0'" &&
    hq -d postgres -c "VACUUM FREEZE pg_database"
ok $? "a cluster of its own, every row of every database frozen"
# every live row of pg_database (shared, the one catalog written after the
# freeze) is frozen: a row whose raw xmin is initdb's would, with a next xid
# more than 2^31 past it, be in the future (NEXT_XID at 2^31 + 100 leaves a
# margin of some 640 xids; at 2^31 + 2000 the UPDATE of pg_database below
# never returns)
unfrozen=$(hq -d postgres -c "
    SELECT count(*) FROM generate_series(0, pg_relation_size('pg_database')::int / 8192 - 1) AS p,
           LATERAL heap_page_items(get_raw_page('pg_database', p)) AS h
     WHERE h.lp_flags = 1 AND h.t_xmax = '0'::xid AND (h.t_infomask & 768) <> 768")
is "$unfrozen" "0" "no live row of pg_database left unfrozen before the move"
as_pg "$EM_PGBIN/pg_ctl" -D "$HX/data" -w -t 120 stop >/dev/null
# the commit log's segments around NEXT_XID: 4 xids a byte, 8192-byte
# pages, 32 pages a segment (1,048,576 xids); pg_resetwal makes none
for x in $((NEXT_XID - 1000)) $NEXT_XID; do
    seg=$(printf '%04X' $((x / 1048576)))
    [ -f "$HX/data/pg_xact/$seg" ] || as_pg dd if=/dev/zero of="$HX/data/pg_xact/$seg" bs=8192 count=32 status=none
done
# -u: the oldest xid is the next one, else pg_resetwal puts it 2 billion
# back, which starts a vacuum for wraparound at once, autovacuum off or not
as_pg "$EM_PGBIN/pg_resetwal" -u "$NEXT_XID" -x "$NEXT_XID" -D "$HX/data" >/dev/null
echo "shared_preload_libraries = 'earmark'" >>"$HX/data/postgresql.conf"
start
# every row is frozen: each database's oldest unfrozen xid is now the next
# one (as pg_upgrade sets them), so that no wraparound limit is computed
# from initdb's xids, 2^31 behind
hq -d postgres -c "UPDATE pg_database SET datfrozenxid = '$NEXT_XID'" &&
    for db in template1 postgres; do
        hq -d $db -c "UPDATE pg_class SET relfrozenxid = '$NEXT_XID' WHERE relkind IN ('r', 'm', 't')" || exit 1
    done
ok $? "moved to next xid $NEXT_XID, started with earmark preloaded, frozen xids set"
hq -d postgres -c "DROP EXTENSION pageinspect"

xid=$(hq -d postgres -c "SELECT txid_current()")
ok "$(( xid >= 2147483648 ? 0 : 1 ))" "its transactions' ids are past 2^31 ($xid)"

# the specs, as the isolation layer runs them, against this cluster
specs="review_limit_xmin review_limit_back review_limit_xid_reuse escrow escrow_recorded_fit review_fit_raise_lower"
out=$HX/isolation
mkdir -p "$out"; chmod 777 "$out"
(cd "$ROOT" && PGHOST=$HX PGPORT=$HPORT "$PGXS_DIR/test/isolation/pg_isolation_regress" \
    --inputdir=test/isolation --outputdir="$out" --bindir="$EM_PGBIN" --load-extension=earmark \
    --dbname=earmark_isolation $specs) >"$out/log" 2>&1
for s in $specs; do
    grep -Eq "^(ok|test) +[0-9]* *-? *$s +\.\.\. ok" "$out/log"
    ok $? "isolation spec $s at xids past 2^31"
done
[ -f "$out/regression.diffs" ] && sed 's/^/# /' "$out/regression.diffs" | head -80

# the versions the specs compared were past 2^31: the limit row a spec
# wrote last (each spec's teardown truncates; write one more and read it)
limx=$(hq -d earmark_isolation -At <<'SQL'
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SELECT earmark_set_limit('hx', 1000) IS NOT NULL;
SELECT earmark_set_escrow('hx', 2) IS NOT NULL;
SELECT admitted FROM earmark_reserve('hx', 10, 'hx-1');
SELECT (SELECT slot_limx FROM earmark.budget WHERE account = 'hx')
       = (SELECT xmin::text::bigint FROM earmark.account_limit WHERE account = 'hx')
       AND (SELECT slot_limx FROM earmark.budget WHERE account = 'hx') >= 2147483648;
SQL
)
is "$(echo "$limx" | tail -1)" "t" "a rebalance stored the limit row's xmin, past 2^31, as the row has it"
done_testing
