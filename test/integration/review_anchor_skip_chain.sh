#!/usr/bin/env bash
# The same wait as review_slot_skip_chain.sh, in earmark_set_account: an
# anchor change locks the account's budget rows, then every slot of the
# account FOR UPDATE SKIP LOCKED (account.c, lock_account_slots, SQL).  When
# the slot version its scan found was being updated by a transaction (A)
# that commits while the lock looks at it, PostgreSQL's heap_lock_tuple
# follows A's update chain and waits for B, which took the slot's newest
# version (a fast-path admission, open).  B's next reserve needs the budget
# row the anchor change holds: a deadlock.  The anchor change must instead
# pass the slot over and refuse ("an admission is in progress"), and B go on.
#
# Needs gdb and root (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=anchor_skip_chain
fq() { q -d "$DBN" "$@"; }
WX=$(mktemp -d /tmp/earmark-anchor-chain.XXXXXX)
chmod 755 "$WX"
PIDS=()
cleanup() {
    exec 3>&- 4>&- 2>/dev/null
    for p in "${PIDS[@]}" ${GPID:-}; do kill "$p" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$WX"
}
trap cleanup EXIT

skip_unless_gdb

own_database "$DBN"
ok $? "database $DBN with earmark"

fq >/dev/null <<'SQL'
SET earmark.rate_limit = 0;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT earmark_set_account('sc', :'anchor');
SELECT earmark_set_limit('sc', 1000);
SELECT earmark_set_escrow('sc', 1);
SELECT earmark_settle('sc', r.job_id, 0) FROM earmark_reserve('sc', 1, 'warm-up') r;
SQL
ok $? "account sc: limit 1000, one escrow slot, warmed up"
is "$(fq -c "SELECT room, held FROM earmark.budget_slot WHERE account = 'sc'" | tr '|' ' ')" "499 0" \
   "the slot has 499, the budget row keeps the rest unallocated"

# a session of its own, fed through a fifo: sess NAME FD
sess() {
    mkfifo "$WX/$1.in"
    PGOPTIONS='-c earmark.rate_limit=0 -c lock_timeout=60s' \
        "$EM_PGBIN/psql" -X -A -t -q -d "$DBN" <"$WX/$1.in" >"$WX/$1.out" 2>"$WX/$1.err" &
    PIDS+=($!)
}
# wait_mark NAME MARK: until the session printed MARK (60 s at most)
wait_mark() {
    local end
    end=$(wait_deadline 60)
    until grep -q "^$2\$" "$WX/$1.out" 2>/dev/null; do
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.05
    done
}
RES="SELECT coalesce(r.admitted::text, '') || '|' || coalesce(r.reason, '') FROM earmark_reserve"
# whether the job of a key is in a slot (t), outside (f), or missing (none)
in_slot() { fq -c "SELECT coalesce((SELECT (slot IS NOT NULL)::text FROM earmark.job WHERE account = 'sc' AND idempotency_key = '$1'), 'none')"; }

# A: 10 through the slot, left open
sess a
exec 3>"$WX/a.in"
printf '%s\n' "BEGIN; $RES('sc', 10, 'a-10') r;" '\echo a1' >&3
wait_mark a a1
is "$(sed -n 1p "$WX/a.out")" "true|" "A admits 10 (open)"

# what gdb runs while it holds R: A commits, B admits 10 through the slot
cat >"$WX/meanwhile.sh" <<EOF
source "$(cd "$(dirname "$0")" && pwd)/tap.sh"
WX=$WX
$(declare -f wait_mark)
exec 3>"\$WX/a.in" 4>"\$WX/b.in"
printf '%s\\n' "COMMIT;" '\\echo a2' >&3
wait_mark a a2
printf '%s\\n' "BEGIN; $(echo "$RES" | tr '\n' ' ')('sc', 10, 'b-10') r;" '\\echo b1' >&4
wait_mark b b1
touch "$WX/m.done"
EOF

sess b
exec 4>"$WX/b.in"
printf '%s\n' '\echo b0' >&4
wait_mark b b0

# R: reserves 600 (slow path, the gathering rebalance)
PGOPTIONS='-c earmark.rate_limit=0' \
    "$EM_PGBIN/psql" -X -A -t -q -d "$DBN" -c "SELECT pg_backend_pid()" -c "SELECT pg_sleep(1.5)" \
    -c "SELECT earmark_set_account('sc', date_trunc('month', now()) + interval '1 day')" >"$WX/r.out" 2>"$WX/r.err" &
RPID_SHELL=$!
PIDS+=($RPID_SHELL)
for _ in $(seq 50); do [ -s "$WX/r.out" ] && break; sleep 0.1; done
RPID=$(head -1 "$WX/r.out")
cat >"$WX/gdb.cmd" <<EOF
set pagination off
set confirm off
break earmark_set_account
continue
delete
break ConditionalXactLockTableWait
continue
shell bash $WX/meanwhile.sh
delete
detach
quit
EOF
timeout 90 gdb -q -batch -p "$RPID" -x "$WX/gdb.cmd" >"$WX/gdb.log" 2>&1 &
GPID=$!
wait "$GPID"; GPID=
if grep -q "in ConditionalXactLockTableWait" "$WX/gdb.log" && [ -f "$WX/m.done" ]; then
    diag "gdb held R in ConditionalXactLockTableWait (its rebalance's lock of the slot A was writing) while A committed and B took the slot"
else
    diag "gdb did not hold R where expected:"; sed 's/^/#   /' "$WX/gdb.log" | tail -5
fi
ok "$([ -f "$WX/m.done" ]; echo $?)" "A committed and B admitted 10 while R was held"
is "$(sed -n 2p "$WX/b.out")" "true|" "B's first reserve admits 10 (open)"

# B reserves 600 (its slot is short of it: the slow path, the budget row)
sleep 0.5
printf '%s\n' "$(echo "$RES" | tr '\n' ' ')('sc', 600, 'b-600') r;" '\echo b2' >&4
wait_mark b b2
b2_ok=$?
printf '%s\n' "COMMIT;" '\echo b3' >&4
wait_mark b b3
wait "$RPID_SHELL"
ok "$b2_ok" "B's second reserve answered"
[ -s "$WX/r.err" ] && sed 's/^/# R: /' "$WX/r.err"
[ -s "$WX/b.err" ] && sed 's/^/# B: /' "$WX/b.err"
[ -s "$WX/a.err" ] && sed 's/^/# A: /' "$WX/a.err"
diag "R: $(sed -n 3p "$WX/r.out")  B: $(sed -n 4p "$WX/b.out")"
is "$(cat "$WX/r.err" "$WX/b.err" | grep -c 'deadlock detected')" "0" "no deadlock between R's anchor change and B"
is "$(grep -c 'an admission is in progress' "$WX/r.err")" "1" \
   "R's anchor change is refused (B holds the slot; R passed it over)"
is "$(sed -n 4p "$WX/b.out")" "true|" "B's second reserve is admitted"
is "$(in_slot a-10) $(in_slot b-10) $(in_slot b-600)" "true true false" \
   "A's and B's first holds are in the slot, B's second in the budget row"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "the books hold"

exec 3>&- 4>&-
q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
