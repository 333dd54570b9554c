#!/usr/bin/env bash
# A rebalance that holds the budget row never waits for a transaction that
# holds an escrow slot (escrow.c: "it never waits for a slot"), also when
# the slot's version it found was being updated by a transaction that
# commits while the rebalance looks at it.
#
# FOR UPDATE SKIP LOCKED in PostgreSQL (heap_lock_tuple, READ COMMITTED,
# as ExecLockRows calls it with TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS):
# the version the scan found is being updated by T_a, so the lock asks
# ConditionalXactLockTableWait(T_a); when T_a has committed by then, the
# "wait" succeeds and heap_lock_updated_tuple follows T_a's update chain,
# and that walk waits for any running transaction that locks or updates a
# newer version (XactLockTableWait, "while locking updated version"), SKIP
# LOCKED or not.  A transaction T_b that took the slot's newest version in
# between (an admission through the slot, the fast path) is waited for, with
# the budget row held; when T_b reserves again and needs the budget row (its
# slot ran dry: the slow path), the two deadlock.  That is the cycle of
# escrow_stress.sh's "deadlock detected" (a single.sql reserve holding the
# budget row waits for the xid of a double.sql transaction whose first
# reserve went through a slot and whose second waits for the budget row).
#
# Here: limit 1000, one slot (499 in it after the warm-up).  A admits 10
# through the slot and stays open.  R reserves 600: no slot has the room, so
# its slow path locks the budget row, and its rebalance (the unallocated 501
# is too little) locks every free slot; gdb holds R in
# ConditionalXactLockTableWait, asked about A's update of the slot.
# Meanwhile A commits, and B (BEGIN) admits 10 through the slot's newest
# version.  Then R goes on, and B reserves 600 (the slow path: the budget
# row).  Neither may fail with a deadlock; R's rebalance passes over the
# slot B holds (R is refused after its retries: the room is inside B's
# slot), and B's second reserve gets the budget row.
#
# The same wait in earmark_set_account: an anchor change locks the account's
# budget rows, then every slot of the account SKIP LOCKED (account.c).  Held
# the same way (R is now the anchor change), it must pass the slot B holds
# over and refuse ("an admission is in progress"), and B go on.
#
# The same wait in the sweep's lock of a budget row: a sweep holds the budget
# rows it swept and locks each next one SKIP LOCKED (gate.c,
# lock_sweep_budget).  Here R is earmark_sweep() over two budgets of one
# account with a dead hold each, fa's the older: R holds fa's row, and gdb
# holds R in its lock of fb's, which A was writing.  Meanwhile A commits and
# B (BEGIN) reserves on fb; then B reserves on fa, whose row R holds.  R
# must pass fb's row over (it sweeps fa's dead hold only), and B wait for
# R's commit, not deadlock with it.
#
# Runs on the test cluster, a database of its own for each case.  Needs gdb
# and root (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=
fq() { q -d "$DBN" "$@"; }
work_dir skip-chain
WXROOT=$WX

skip_unless_gdb

RES="SELECT coalesce(r.admitted::text, '') || '|' || coalesce(r.reason, '') FROM earmark_reserve"
# whether the job of a key is in a slot (t), outside (f), or missing (none)
in_slot() { fq -c "SELECT coalesce((SELECT (slot IS NOT NULL)::text FROM earmark.job WHERE account = 'sc' AND idempotency_key = '$1'), 'none')"; }


# race LABEL RSQL BREAK WHAT BSQL FRAME...: the hold the cases share.  R
# runs RSQL; gdb stops it at BREAK, then in ConditionalXactLockTableWait
# (WHAT), and runs WX/m.sh (A commits, B takes the row A wrote) before it
# lets R go on; then B, still open, runs BSQL, which needs a row R holds,
# and commits.  Checks that R was held in the lock meant (a line of the
# backtrace matches every FRAME regex: held anywhere else, say in a wait
# added before that lock, every later check would pass whatever the lock
# does), B's first answer, that B's second was answered, and that
# neither R nor B failed with a deadlock.
race() {
    local label=$1 rsql=$2 brk=$3 what=$4 bsql=$5 b2_ok frames f
    shift 5
    sess b
    say b b0
    # R's statement waits until gdb_hold's gdb has attached and set its first
    # breakpoint (tap.sh's gdb_armed_psql, run by R's psql; 60 s, scaled): a
    # fixed pause (1.5 s) let a slow attach miss R's call.  The pause's
    # statement stays as pg_sleep(0): its output line keeps R's answer on
    # the line the checks read (sed -n 3p).
    rm -f "$WX/gdb.armed"
    PGOPTIONS='-c earmark.rate_limit=0' backend r \
        -c "$(gdb_armed_psql)" -c "SELECT pg_sleep(0)" -c "$rsql"
    gdb_hold "$BPID" "$WX/m.sh" "$brk" ConditionalXactLockTableWait bt
    if gdb_held "in ConditionalXactLockTableWait" && [ -f "$WX/m.done" ]; then
        diag "gdb held R in ConditionalXactLockTableWait ($what) while A committed and B took the row"
    else
        diag "gdb did not hold R where expected:"; sed 's/^/#   /' "$WX/gdb.log" | tail -5
    fi
    frames=$(grep '^#[0-9]' "$WX/gdb.log")
    for f in "$@"; do frames=$(grep -E -- "$f" <<<"$frames"); done
    ok "$([ -n "$frames" ]; echo $?)" "$label: R was held in $what (its backtrace)"
    ok "$([ -f "$WX/m.done" ]; echo $?)" "$label: A committed and B admitted 10 while R was held"
    is "$(sed -n 2p "$WX/b.out")" "true|" "$label: B's first reserve admits 10 (open)"
    sleep 0.5
    say b b2 "$bsql"
    b2_ok=$?
    say b b3 "COMMIT;"
    wait "$SPID"
    ok "$b2_ok" "$label: B's second reserve answered"
    [ -s "$WX/r.err" ] && sed 's/^/# R: /' "$WX/r.err"
    [ -s "$WX/b.err" ] && sed 's/^/# B: /' "$WX/b.err"
    [ -s "$WX/a.err" ] && sed 's/^/# A: /' "$WX/a.err"
    diag "R: $(sed -n 3p "$WX/r.out")  B: $(sed -n 4p "$WX/b.out")"
    is "$(cat "$WX/r.err" "$WX/b.err" | grep -c 'deadlock detected')" "0" "$label: no deadlock between R and B"
}

# chain KIND: the scenario above with R the rebalance (reserve 600) or the
# anchor change, in a database and a directory of its own
chain() {
    local kind=$1 rsql brk frame
    DBN=slot_skip_chain_$kind
    WX=$WXROOT/$kind
    mkdir -p "$WX" && chmod 755 "$WX"
    case $kind in
        rebalance) rsql="$RES('sc', 600, 'r-600') r"; brk=em_escrow_rebalance ;;
        anchor) rsql="SELECT earmark_set_account('sc', date_trunc('month', now()) + interval '1 day')"; brk=earmark_set_account ;;
    esac
own_database "$DBN"
ok $? "$kind: database $DBN with earmark"
anchored_account "$DBN" sc <<'SQL'
SELECT earmark_set_limit('sc', 1000);
SELECT earmark_set_escrow('sc', 1);
SELECT earmark_settle('sc', r.job_id, 0) FROM earmark_reserve('sc', 1, 'warm-up') r;
SQL
ok $? "$kind: account sc: limit 1000, one escrow slot, warmed up"
is "$(fq -c "SELECT room, held FROM earmark.budget_slot WHERE account = 'sc'" | tr '|' ' ')" "499 0" \
   "$kind: the slot has 499, the budget row keeps the rest unallocated"

# A: 10 through the slot, left open
sess a
say a a1 "BEGIN; $RES('sc', 10, 'a-10') r;"
is "$(sed -n 1p "$WX/a.out")" "true|" "$kind: A admits 10 (open)"

# what gdb runs while it holds R: A commits, B admits 10 through the slot
meanwhile m <<EOF
say a a2 "COMMIT;"
say b b1 "BEGIN; $RES('sc', 10, 'b-10') r;"
EOF

# R: reserves 600 (slow path, the gathering rebalance), then B reserves 600
# (its slot is short of it: the slow path, the budget row)
case $kind in
    rebalance) frame=' lock_slots \(' ;;
    anchor) frame=' lock_slots_of_account \(' ;;
esac
race "$kind" "$rsql" "$brk" "its lock of the slot A was writing" "$RES('sc', 600, 'b-600') r;" "$frame"
if [ "$kind" = rebalance ]; then
    is "$(sed -n 3p "$WX/r.out" | cut -d'|' -f1)" "false" \
       "$kind: R is refused (the room it lacks is in the slot B holds; R's rebalance passed it over)"
else
    is "$(grep -c 'an admission is in progress' "$WX/r.err")" "1" \
       "$kind: R's anchor change is refused (B holds the slot; R passed it over)"
fi
is "$(sed -n 4p "$WX/b.out")" "true|" "$kind: B's second reserve is admitted"
is "$(in_slot a-10) $(in_slot b-10) $(in_slot b-600)" "true true false" \
   "$kind: A's and B's first holds are in the slot, B's second in the budget row"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "$kind: the books hold"
sess_close
q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
}

# sweep: the sweep holds the budget rows it swept and passes a busy one
# over; the same wait in its lock of the next budget row (gate.c,
# lock_sweep_budget)
sweep_chain() {
    DBN=slot_skip_chain_sweep
    WX=$WXROOT/sweep
    mkdir -p "$WX" && chmod 755 "$WX"
own_database "$DBN"
ok $? "sweep: database $DBN with earmark"
anchored_account "$DBN" sw <<'SQL'
SELECT earmark_set_limit('sw', 1000, 'fa');
SELECT earmark_set_limit('sw', 1000, 'fb');
SELECT admitted FROM earmark_reserve('sw', 10, 'fa-dead', 'fa', lease => '1 second');
SELECT pg_sleep(0.2);
SELECT admitted FROM earmark_reserve('sw', 10, 'fb-dead', 'fb', lease => '1 second');
SELECT pg_sleep(1.2);
SQL
ok $? "sweep: account sw, features fa and fb (limit 1000 each), a dead hold of 10 on each, fa's the older"

# A: 10 on fb (updates fb's budget row), left open
sess a
say a a1 "BEGIN; $RES('sw', 10, 'a-10', 'fb') r;"
is "$(sed -n 1p "$WX/a.out")" "true|" "sweep: A admits 10 on fb (open)"

# what gdb runs while it holds R: A commits, B reserves on fb (its row's newest version)
meanwhile m <<EOF
say a a2 "COMMIT;"
say b b1 "BEGIN; $RES('sw', 10, 'b-10', 'fb') r;"
EOF

# R: the sweep (fa first: it holds fa's budget row, then locks fb's); then
# B reserves on fa, whose budget row the sweep holds until it commits
FB=$(fq -c "SELECT budget_id FROM earmark.budget WHERE account = 'sw' AND feature = 'fb'")
race sweep "SELECT earmark_sweep(100)" earmark_sweep "its lock of fb's budget row, which A was writing" \
    "$RES('sw', 10, 'b-fa', 'fa') r;" ' lock_sweep_budget \(' 'wait=false' "budget_id=$FB[,)]"
is "$(sed -n 3p "$WX/r.out")" "1" "sweep: R swept fa's dead hold and passed fb's budget row over"
is "$(sed -n 4p "$WX/b.out")" "true|" "sweep: B's reserve on fa is admitted"
is "$(fq -c "SELECT string_agg(idempotency_key || '=' || status, ' ' ORDER BY idempotency_key) FROM earmark.job WHERE account = 'sw'")" \
   "a-10=running b-10=running b-fa=running fa-dead=expired fb-dead=running" \
   "sweep: fa's dead hold expired, fb's left for the next sweep"
is "$(fq -c "SELECT earmark_sweep(100)")" "1" "sweep: the next sweep expires fb's"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "sweep: the books hold"
sess_close
q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
}

chain rebalance
chain anchor
sweep_chain
done_testing
