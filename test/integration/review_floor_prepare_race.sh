#!/usr/bin/env bash
# A PREPARE TRANSACTION that lands between em_floor_begin's check for
# prepared transactions and its read of the set's generation: a hold whose
# lease has passed never causes a refusal, also once that transaction is
# committed.
#
# em_floor_begin (leasefloor.c) asks prepared_busy() first and reads the
# set's generation after.  A transaction P with a hold that is prepared in
# between lists its xid and lowers the floor (moving the generation)
# before the search reads the generation: the search's token is valid, its
# later snapshot does not see P's hold (P is in progress), and its store
# is not stopped by the generation, which did not move after it was read.
# The floor it stores leaves P's hold out; COMMIT PREPARED runs no callback
# that could lower it.  Once P's hold's lease passes, a reserve trusts the
# floor and is refused while the dead hold stays open.
#
# The window is a few instructions wide, so the search's backend is held
# there with gdb (a breakpoint on prepared_busy, called from
# em_floor_begin, and "finish"); P is admitted through an escrow slot (its
# fast path locks the slot, not the budget row the search holds) and
# prepared while the search is held.  A correct em_floor_begin (the
# generation read before the check) does not store: the test passes.
#
# Runs on the test cluster (max_prepared_transactions 10, the worker in
# database postgres only), in a database of its own.  Needs gdb and root
# (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=floor_prepare_race
fq() { q -d "$DBN" "$@"; }
work_dir floor-race
at_exit() { q -d "$DBN" -c "ROLLBACK PREPARED 'race-p'" >/dev/null 2>&1; }

skip_unless_gdb

if [ "$(q -d postgres -c "SHOW max_prepared_transactions")" = 0 ]; then
    echo "1..1"
    echo "ok 1 # SKIP max_prepared_transactions is 0"
    exit 0
fi
own_database "$DBN"
ok $? "database $DBN with earmark"

# Limit 100 in 4 escrow slots; nine holds of 10 for an hour: 10 is free,
# in the slots.
anchored_account "$DBN" rc <<'SQL'
SELECT earmark_set_limit('rc', 100), earmark_set_escrow('rc', 4);
SELECT count(*) FROM generate_series(1, 9) g,
       LATERAL earmark_reserve('rc', 10, 'rc-y' || g, lease => '1 hour');
SQL
ok $? "nine holds of an hour"

# Two refusals on another account first: the floors are in use (no
# transaction from before the server's start runs, recovered_busy).
for i in 1 2; do
    fq -c "SET earmark.rate_limit = 0" -c "SELECT earmark_set_account('wu', now() - interval '1 day')" \
       -c "SELECT earmark_set_limit('wu', 1)" -c "SELECT admitted FROM earmark_reserve('wu', 5, 'wu-' || $i)" >/dev/null
done
ok $? "two refusals on another account"
is "$(fq -c "SELECT count(*) FROM earmark.job WHERE status = 'running'")" "9" "nine holds open"

# W: a reserve of 50 finds no room and searches for dead holds; held by
# gdb just after em_floor_begin's prepared_busy().
backend w -c "SET earmark.rate_limit = 0" \
  -c "SELECT pg_sleep(3)" -c "SELECT admitted FROM earmark_reserve('rc', 50, 'rc-w')"

# P: admitted 1 (lease 2 s) through a slot, prepared, while W is held
meanwhile p <<'EOF'
q -d "$DBN" >"$WX/p.out" 2>"$WX/p.err" <<'PSQL'
SET earmark.rate_limit = 0;
SET lock_timeout = '5s';
BEGIN;
SELECT admitted FROM earmark_reserve('rc', 1, 'rc-p', lease => '2 seconds') \gset
SELECT :'admitted' || '|' || (SELECT (slot IS NOT NULL)::text FROM earmark.job WHERE idempotency_key = 'rc-p');
PREPARE TRANSACTION 'race-p';
PSQL
EOF
gdb_hold "$BPID" "$WX/p.sh" em_floor_begin prepared_busy finish
wait "$SPID"; wpid_rc=$?
# an implementation without em_floor_begin or prepared_busy: P after W
if gdb_held "Value returned"; then
    diag "gdb held W just after em_floor_begin's prepared_busy() while P was prepared"
else
    diag "gdb did not hold W (no em_floor_begin/prepared_busy to break on): P prepared after W"
    [ -f "$WX/p.done" ] || bash "$WX/p.sh"
fi
ok "$wpid_rc" "W's reserve ran"
is "$(tail -1 "$WX/w.out")" "f" "W was refused (no room for 50)"
is "$([ -f "$WX/p.done" ] && cat "$WX/p.out")" "t|true" "P was admitted through a slot"
[ -s "$WX/p.err" ] && sed "s/^/# /" "$WX/gdb.log" "$WX/p.err" "$WX/w.err"
is "$(fq -c "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")" "race-p" "P is prepared"

fq -c "COMMIT PREPARED 'race-p'" >/dev/null
ok $? "P committed"
fq -c "SELECT pg_sleep(greatest(0, extract(epoch FROM (SELECT lease_until FROM earmark.job
                                                       WHERE idempotency_key = 'rc-p') - clock_timestamp())) + 0.3)" >/dev/null
is "$(fq -c "SELECT status, lease_until < clock_timestamp() FROM earmark.job WHERE idempotency_key = 'rc-p'")" \
    "running|t" "P's hold is open and its lease has passed"

# 9 is free; a reserve of 10 fits only once P's dead hold is reclaimed
is "$(fq -c "SET earmark.rate_limit = 0" -c "SELECT admitted FROM earmark_reserve('rc', 10, 'rc-after', lease => '1 hour')")" \
    "t" "a reserve that needs P's dead hold's room is admitted"
is "$(fq -c "SELECT status FROM earmark.job WHERE idempotency_key = 'rc-p'")" "expired" \
    "P's dead hold was reclaimed before a refusal"

q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
