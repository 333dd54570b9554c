#!/usr/bin/env bash
# A hold whose lease has passed never causes a refusal, also in the moment
# between its transaction's commit becoming visible and that transaction's
# commit callback lowering the budget's lease floor.
#
# leasefloor.c lowers a budget's floor in floor_xact_callback at
# XACT_EVENT_COMMIT, which PostgreSQL calls after ProcArrayEndTransaction:
# the hold is committed and visible to every new snapshot before the floor
# knows of it.  The generation argument keeps a *store* from leaving such a
# hold out, but nothing keeps a *use* of the floor (em_floor_none_dead)
# from trusting the old floor in that window.  leasefloor.c's header says
# "the row locks a waiter queues on are released after it"; that holds only
# for a waiter that queued before the commit.  A reserve R that arrives
# after ProcArrayEndTransaction does not wait at all: T's xid is no longer
# in progress, so the lock of the budget row T updated is granted at once.
# R reads T's hold (committed), finds no room, asks the floor, is told no
# hold can be dead, and refuses -- the dead hold the cause.  Without the
# floor (4c03404, or earmark.lease_floors off) R's search reclaims the hold
# and R is admitted.  (An escrow slot admission does not even lock the
# budget row.)  Once T's callback has run, the next reserve reclaims: the
# refusal is one of a window, but it is a refusal a dead hold caused.
#
# The hold is dead at its commit when its transaction runs longer than its
# lease (here a lease of one second, a transaction of three).  gdb holds
# T's backend in floor_xact_callback(XACT_EVENT_COMMIT) while R runs.
# Where there is no floor_xact_callback to break on, T just commits first.
#
# Runs on the test cluster, in a database of its own.  Needs gdb and root
# (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=floor_commit_window
fq() { q -d "$DBN" "$@"; }
work_dir floor-cw

skip_unless_gdb

own_database "$DBN"
ok $? "database $DBN with earmark"

# Limit 100 (no escrow: the plain budget row path); nine holds of 10 for
# an hour: 10 is free.
anchored_account "$DBN" cw <<'SQL'
SELECT earmark_set_limit('cw', 100);
SELECT count(*) FROM generate_series(1, 9) g,
       LATERAL earmark_reserve('cw', 10, 'cw-y' || g, lease => '1 hour');
SQL
ok $? "nine holds of an hour"

# refusals of 50 until one reads no hold: the floor is stored and trusted
is "$(floor_trusted "$DBN" cw 50 cw-r)" "false|0" "a refusal of 50 trusts the floor (reads no hold)"

# T: takes the last 10 with a lease of one second, and
# commits three seconds later (its hold is dead by then); gdb holds T in
# its commit callback, its commit visible, while R runs.
meanwhile r <<'EOF'
q -d "$DBN" >"$WX/r.out" 2>"$WX/r.err" <<'PSQL'
SET earmark.rate_limit = 0;
SET lock_timeout = '5s';
SELECT (SELECT count(*) FROM earmark.job WHERE idempotency_key = 'cw-t' AND status = 'running'
          AND lease_until < clock_timestamp())::text || '|' ||
       (SELECT admitted FROM earmark_reserve('cw', 10, 'cw-r', lease => '1 hour'))::text;
PSQL
EOF
backend t -c "SET earmark.rate_limit = 0" -c "BEGIN" \
  -c "SELECT admitted FROM earmark_reserve('cw', 10, 'cw-t', lease => '1 second')" \
  -c "SELECT pg_sleep(3)" -c "COMMIT"
gdb_hold "$BPID" "$WX/r.sh" "floor_xact_callback if event == 0"
wait "$SPID"; tpid_rc=$?
if gdb_held "floor_xact_callback (event=XACT_EVENT_COMMIT"; then
    diag "gdb held T in floor_xact_callback(XACT_EVENT_COMMIT) while R ran"
else
    diag "gdb did not hold T (no floor_xact_callback to break on): R after T"
    [ -f "$WX/r.done" ] || bash "$WX/r.sh"
fi
ok "$tpid_rc" "T's transaction ran and committed"
is "$(sed -n 2p "$WX/t.out")" "t" "T was admitted"
[ -s "$WX/r.err" ] && sed "s/^/# /" "$WX/gdb.log" "$WX/r.err"
is "$(cat "$WX/r.out")" "1|true" "R, with T's committed hold dead, reclaims it and is admitted"
is "$(fq -c "SELECT status FROM earmark.job WHERE idempotency_key = 'cw-t'")" "expired" \
    "T's dead hold was reclaimed before a refusal"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "the books hold"

q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
