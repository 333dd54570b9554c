#!/usr/bin/env bash
# A hold whose lease has passed never causes a refusal, also for a refusal
# without the budget row (gate.c, refused_unlocked).
#
# refused_unlocked sums the budget's holds in a snapshot (room_unlocked),
# then reads the budget's lease floor (em_budget_none_dead).  The floor is a
# lower bound of the lease ends of the holds open when it is read, not of
# those the older snapshot counted: a dead hold the snapshot counts may be
# expired (by the sweeper, earmark_sweep, or another reserve's reclaim)
# after the snapshot, and a search that runs after that expiry stores a
# floor from the holds still open, later than now.  The refusal then trusts
# that floor for a sum that still counts the dead hold.  At every moment of
# the call the locked path would have admitted the job: before the expiry
# it reclaims the dead hold, after it the room is there.
#
# Here: limit 100, a hold of 50 for an hour and one of 50 for one second.
# Session A is refused once (the locked path: its hint), the short hold's
# lease passes, and A reserves 10 again; gdb holds A in em_budget_none_dead
# (as first written, after its snapshot counted the dead hold).  Meanwhile
# earmark_sweep() expires the dead hold (50 free), and a reserve of 60 by
# another session is refused by the locked path, whose search finds no dead
# hold and stores the floor (the hour-long hold's lease end).  A then
# refused ("0 is left"), though 50 is free and the job needs 10.  (With the
# floor read before the snapshot, em_budget_none_dead comes first: A's
# snapshot, taken after the sweep, finds the room.)
#
# Runs on the test cluster, in a database of its own (the worker does not
# sweep there).  Needs gdb and root (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=refusal_floor_after_snapshot
fq() { q -d "$DBN" "$@"; }
work_dir ref-fas

skip_unless_gdb

own_database "$DBN"
ok $? "database $DBN with earmark"

anchored_account "$DBN" fs <<'SQL'
SELECT earmark_set_limit('fs', 100);
SELECT admitted FROM earmark_reserve('fs', 50, 'fs-long', lease => '1 hour');
SELECT admitted FROM earmark_reserve('fs', 50, 'fs-short', lease => '1 second');
SQL
ok $? "a hold of 50 for an hour, one of 50 for a second: the budget is full"

# what gdb runs while it holds A after A's snapshot: the sweep expires the
# dead hold; then a refusal of 60 on the locked path stores the floor
meanwhile m <<'EOF'
q -d "$DBN" >"$WX/m.out" 2>"$WX/m.err" <<'PSQL'
SELECT earmark_sweep();
SET earmark.rate_limit = 0;
SELECT admitted FROM earmark_reserve('fs', 60, 'fs-c1');
PSQL
EOF

# A: refused once (the locked path sets the hint), waits for gdb to attach
# (gdb_armed_psql, run by A's psql; a fixed 3 s let a slow attach miss A's call,
# and the sweep then ran after A: check 5 failed) and for the short lease to
# pass, then reserves 10 again
rm -f "$WX/gdb.armed"
backend a -c "SET earmark.rate_limit = 0" \
  -c "SELECT (SELECT admitted FROM earmark_reserve('fs', 10, 'fs-a1'))" \
  -c "$(gdb_armed_psql)" \
  -c "SELECT pg_sleep(greatest(0, extract(epoch FROM (SELECT lease_until FROM earmark.job WHERE idempotency_key = 'fs-short')
                                                  - clock_timestamp())) + 0.2)" \
  -c "SELECT (SELECT count(*) FROM earmark.job WHERE idempotency_key = 'fs-short' AND status = 'running'
                 AND lease_until < clock_timestamp())::text || '|' ||
             (SELECT admitted::text || '|' || coalesce(reason, '') FROM earmark_reserve('fs', 10, 'fs-a2'))"
# (gdb only after A's first reserve has answered: its breakpoint is for the second)
for _ in $(seq 600); do [ -n "$(sed -n 2p "$WX/a.out")" ] && break; sleep 0.05; done
gdb_hold "$BPID" "$WX/m.sh" em_budget_none_dead
wait "$SPID"; apid_rc=$?
if gdb_held "em_budget_none_dead ("; then
    diag "gdb held A in em_budget_none_dead while the sweep and the other refusal ran"
else
    diag "gdb did not hold A (no em_budget_none_dead to break on): the sweep after A"
    [ -f "$WX/m.done" ] || bash "$WX/m.sh"
fi
ok "$apid_rc" "A's session ran"
[ -s "$WX/a.err" ] && sed "s/^/# /" "$WX/a.err"
[ -s "$WX/m.err" ] && sed "s/^/# /" "$WX/m.err"
is "$(sed -n 2p "$WX/a.out")" "f" "A's first reserve of 10 is refused (the budget is full)"
is "$(sed -n 1,2p "$WX/m.out" | tr "\n" " ")" "1 f " "the sweep expires the dead hold; a reserve of 60 is refused"
is "$(sed -n 4p "$WX/a.out")" "1|true|" \
    "A's reserve of 10, with the hold it counted dead, is admitted"
is "$(fq -c "SELECT remaining FROM earmark_budget('fs')")" "40" "the budget has 40 left after A's hold"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "the books hold"

q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
