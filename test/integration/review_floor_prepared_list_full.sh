#!/usr/bin/env bash
# The list of prepared transactions with holds (leasefloor.c) must not fill
# up with transactions that have ended: PREPARE TRANSACTION of a
# transaction with holds keeps working however many have been prepared
# and committed before, as long as fewer than max_prepared_transactions
# are prepared at once.
#
# list_prepared() makes room by prepared_busy(), which drops the listed
# xids that have ended; but prepared_busy() returns early, before that
# drop, while recovered_busy() says a transaction older than the first xid
# this start saw may run: a prepared transaction that recovery brought
# back (here one without holds, left prepared across a restart: an
# in-doubt transaction of a transaction manager), or any transaction that
# was running at the first look.  Each PREPARE with holds then adds an xid
# that is never dropped, and once max_prepared_transactions have been
# listed every further PREPARE of a transaction with holds fails with
# "earmark: too many prepared transactions with holds", although one
# transaction is prepared.
#
# A cluster of its own (max_prepared_transactions needs a restart), its
# worker in database postgres only.
source "$(dirname "$0")/tap.sh"
FX=$(mktemp -d /tmp/earmark-floor-list.XXXXXX)
FPORT=$((PGPORT + 13))
trap 'own_stop immediate; rm -rf "$FX"' EXIT
fq() { PGHOST=$FX PGPORT=$FPORT q -d floor "$@"; }
own_cluster "$FX" "$FPORT"
PGHOST=$FX PGPORT=$FPORT q -d postgres -c "CREATE DATABASE floor" &&
    fq -c "CREATE EXTENSION earmark" -c "CREATE TABLE other (x int)"
ok $? "a cluster of its own with max_prepared_transactions 4, earmark in database floor"

PGHOST=$FX PGPORT=$FPORT anchored_account floor pl <<'SQL'
SELECT earmark_set_limit('pl', 1000);
SQL
ok $? "an account"

# a transaction without holds, left prepared across a restart
fq -c "BEGIN" -c "INSERT INTO other VALUES (1)" -c "PREPARE TRANSACTION 'in-doubt'" >/dev/null
own_stop && own_start
ok $? "the cluster restarted"
is "$(fq -c "SELECT gid FROM pg_prepared_xacts")" "in-doubt" "the in-doubt transaction is prepared after the restart"

# six transactions with a hold each, prepared and committed one after
# another: never more than two prepared at once
for i in 1 2 3 4 5 6; do
    got=$(fq -c "SET earmark.rate_limit = 0" -c "BEGIN" \
             -c "SELECT admitted FROM earmark_reserve('pl', 10, 'pl-$i', lease => '1 hour')" \
             -c "PREPARE TRANSACTION 'pl-$i'" -c "COMMIT PREPARED 'pl-$i'" 2>&1)
    is "$got" "t" "transaction $i with a hold: prepared and committed"
done
is "$(fq -c "SELECT count(*) FROM earmark.job WHERE status = 'running'")" "6" "six holds committed"
fq -c "ROLLBACK PREPARED 'in-doubt'" >/dev/null
ok $? "the in-doubt transaction rolled back"

done_testing
