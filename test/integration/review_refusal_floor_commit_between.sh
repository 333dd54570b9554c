#!/usr/bin/env bash
# A refusal without the budget row reads the budget's lease floor before
# its snapshot (gate.c, refused_unlocked): the floor then bounds every hold
# open or committing at that read.  A hold that commits between that read
# and the snapshot is in the snapshot but not in the floor read, so the
# refusal also needs that no hold of the floor's set reached PRE_COMMIT,
# COMMIT or PREPARE in between (the set's generation,
# em_budget_floor_unmoved).  Without that check such a hold, dead at its
# commit, would cause the refusal.
#
# Here: limit 100, a hold of 80 for an hour, the floor stored.  Session A is
# refused once (its hint).  T reserves 10 for one second and commits four
# seconds later (its hold dead by then).  A reserves 15 while T runs; gdb
# holds A just after its floor read until T has committed.  A's snapshot
# then counts T's dead hold (10 left); the locked path reclaims it (20 left)
# and admits A.  (Where the floor is read after the snapshot, as in the
# first version, A's snapshot does not see T's hold, finds room and takes
# the locked path, which waits for T: the same answer.)
#
# Runs on the test cluster, in a database of its own (the worker does not
# sweep there).  Needs gdb and root (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=refusal_floor_commit_between
fq() { q -d "$DBN" "$@"; }
work_dir ref-fcb

skip_unless_gdb

own_database "$DBN"
ok $? "database $DBN with earmark"

anchored_account "$DBN" cb <<'SQL'
SELECT earmark_set_limit('cb', 100);
SELECT admitted FROM earmark_reserve('cb', 80, 'cb-long', lease => '1 hour');
SQL
ok $? "a hold of 80 for an hour"

# refusals of 50 until one reads no hold: the floor is stored and trusted
is "$(floor_trusted "$DBN" cb 50 cb-r)" "false|0" "a refusal of 50 trusts the floor (reads no hold)"

# A: refused once (its hint), then, while T runs, reserves 15
backend a -c "SET earmark.rate_limit = 0" \
  -c "SELECT (SELECT admitted FROM earmark_reserve('cb', 30, 'cb-a0'))" \
  -c "SELECT pg_sleep(3)" \
  -c "SELECT (SELECT admitted::text || '|' || coalesce(reason, '') FROM earmark_reserve('cb', 15, 'cb-a'))"
APID=$SPID
# T: the last 10 for one second, committed four seconds later
q -d "$DBN" -c "SET earmark.rate_limit = 0" -c "BEGIN" \
  -c "SELECT admitted FROM earmark_reserve('cb', 10, 'cb-t', lease => '1 second')" \
  -c "SELECT pg_sleep(4)" -c "COMMIT" >"$WX/t.out" 2>"$WX/t.err" &
TPID=$!
# gdb holds A just after its floor read until T has committed
meanwhile wait_t <<'EOF'
for _ in $(seq 200); do [ -f "$WX/t.done" ] && break; sleep 0.05; done
EOF
gdb_hold "$BPID" "$WX/wait_t.sh" em_budget_none_dead finish
wait "$TPID"; tpid_rc=$?
touch "$WX/t.done"
wait "$APID"; apid_rc=$?
if gdb_held "^Value returned is .* = true"; then
    diag "gdb held A after its floor read (trusted) until T committed"
else
    diag "A did not trust a floor read while T ran (a floor read after the snapshot: A found room)"
fi
ok "$tpid_rc" "T's transaction ran and committed"
ok "$apid_rc" "A's session ran"
[ -s "$WX/a.err" ] && sed "s/^/# /" "$WX/a.err"
is "$(sed -n 1p "$WX/t.out")" "t" "T was admitted"
is "$(sed -n 2p "$WX/a.out")" "f" "A's first reserve of 30 is refused"
is "$(sed -n 4p "$WX/a.out")" "true|" "A's reserve of 15, with T's committed hold dead, is admitted"
is "$(fq -c "SELECT status FROM earmark.job WHERE idempotency_key = 'cb-t'")" "expired" \
    "T's dead hold was reclaimed"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "the books hold"

q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
