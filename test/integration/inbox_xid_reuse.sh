#!/usr/bin/env bash
# inbox_xid_reuse.sh: a delivery tells its own receipt from an old one
# without reading the receipt's xmin.  xmin is a row's raw 32-bit
# transaction id, kept when the row is frozen: 2^32 transaction ids later
# the same number is a new transaction's.  A key whose event was deleted
# without its receipts, with the event's id dealt again (identity
# restarted), delivered in the transaction whose 32-bit id equals the old
# receipt's xmin, must still have its stale key freed and the event stored,
# not be refused with 09000, "a trigger skipped its insert"
# (as it was while the inbox asked the receipt's xmin whose it was).
#
# A cluster of its own: one delivery, its event deleted, the identity
# restarted, every row frozen; then pg_resetwal moves the cluster to epoch 1
# with the next xid the receipt's xmin (2^32 ids later, the same 32 bits).
# The control: the same delivery at another xid stores the event.
source "$(dirname "$0")/tap.sh"
X=$(mktemp -d /tmp/earmark-inbox-xid.XXXXXX)
chown postgres "$X"; chmod 755 "$X"
XPORT=$((PGPORT + 11))
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }
cleanup() {
    as_pg "$EM_PGBIN/pg_ctl" -D "$X/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$X"
}
trap cleanup EXIT
xq() { PGHOST=$X PGPORT=$XPORT PGUSER=postgres q -d postgres "$@"; }
start() { as_pg "$EM_PGBIN/pg_ctl" -D "$X/data" -l "$X/log" -w -t 120 start >/dev/null; }

as_pg "$EM_PGBIN/initdb" -D "$X/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null 2>&1
{
    echo "port = $XPORT"
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$X'"
    # no background process may take a transaction id before the delivery
    # below: no autovacuum, no earmark worker (earmark not preloaded)
    echo "autovacuum = off"
} >>"$X/data/postgresql.conf"
start
xq -c "CREATE EXTENSION earmark" >/dev/null
ok $? "a cluster of its own with earmark"

# one delivery; its receipt's xmin; the event deleted without its receipt
# (docs/inbox.md asks not to)
xmin=$(xq <<'SQL'
SELECT event_id FROM earmark_inbox_receive('xr', 'k1', 'xr.t', '{}');
SELECT xmin FROM earmark.inbox_receipt WHERE dedupe_key = 'k1';
SQL
)
eid=$(echo "$xmin" | head -1); xmin=$(echo "$xmin" | tail -1)
xq -c "DELETE FROM earmark.inbox_event WHERE dedupe_key = 'k1'" >/dev/null

# the control, at a later xid: the stale key is freed and the event stored
# (rolled back, so that the case below starts from the same rows)
got=$(xq -c "BEGIN" -c "SELECT inserted FROM earmark_inbox_receive('xr', 'k1', 'xr.t', '{}')" -c "ROLLBACK" 2>&1)
is "$got" "t" "control: at another xid the delivery frees the stale key and stores the event"

# the event identity restarted (its next id is the deleted event's again),
# then every row frozen and every xid's outcome hinted, so that no xid after
# the receipt's is left in the rows when the count restarts from it
xq -c "ALTER TABLE earmark.inbox_event ALTER COLUMN event_id RESTART" -c "VACUUM FREEZE" >/dev/null
ok $? "event $eid's receipt written by xid $xmin, the event deleted, its id to be dealt again, all frozen"

as_pg "$EM_PGBIN/pg_ctl" -D "$X/data" -w -t 120 stop >/dev/null
# epoch 1, next xid the receipt's: 2^32 transaction ids on, the same 32 bits
as_pg "$EM_PGBIN/pg_resetwal" -e 1 -u "$xmin" -x "$xmin" -D "$X/data" >/dev/null
start
got=$(xq -c "BEGIN" -c "SELECT pg_current_xact_id()" \
         -c "SELECT inserted FROM earmark_inbox_receive('xr', 'k1', 'xr.t', '{}')" \
         -c "ROLLBACK" 2>&1)
echo "$got" | sed "s/^/# /"
xid=$(echo "$got" | head -1)
if [[ $xid =~ ^[0-9]+$ ]] && (( xid == (1 << 32) + xmin )); then r=0; else r=1; fi
ok "$r" "the delivery's transaction is $xid: 2^32 past the receipt's xmin $xmin"
is "$(echo "$got" | tail -1)" "t" "the same delivery 2^32 transactions later frees the stale key and stores the event"
done_testing
