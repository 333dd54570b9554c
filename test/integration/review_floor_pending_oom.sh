#!/usr/bin/env bash
# em_floor_note_hold (leasefloor.c) grows the transaction's list of holds
# by setting pending_size to its new size *before* the allocation:
#
#     pending_size = Max(16, pending_size * 2);
#     pending = pending == NULL ? MemoryContextAlloc(TopMemoryContext, ...)
#                               : repalloc(pending, ...);
#
# When the allocation fails (out of memory: an ERROR), the transaction
# aborts and npending is reset to 0, but pending_size keeps the new size:
# - the first growth failed: pending is NULL and pending_size 16, so the
#   next hold in any later transaction of the backend writes pending[0]
#   through a NULL pointer (the backend dies with SIGSEGV and the
#   postmaster restarts every backend, forgetting every floor);
# - a later growth failed: pending has n entries and pending_size says 2n,
#   so a transaction that holds in more than n budgets writes past the
#   chunk (TopMemoryContext's heap corrupted).
#
# The out-of-memory error is injected with gdb: a breakpoint on
# MemoryContextAlloc when called for the list's first 16 entries (256
# bytes, from em_floor_note_hold), its size argument set past
# MaxAllocSize, so that it raises "invalid memory alloc request size" as
# an allocation that fails raises "out of memory".  The backend's next
# admission must then work.  Without em_floor_note_hold (no floors) nothing
# is injected and the test passes.
#
# Runs on the test cluster, in a database of its own.  Needs gdb and root
# (ptrace); skips without them.
source "$(dirname "$0")/tap.sh"
DBN=floor_pending_oom
fq() { q -d "$DBN" "$@"; }
work_dir floor-oom

skip_unless_gdb

own_database "$DBN"
ok $? "database $DBN with earmark"
fq >/dev/null <<'SQL'
SET earmark.rate_limit = 0;
SELECT earmark_set_account('om', now() - interval '1 day');
SELECT earmark_set_limit('om', 100);
SQL
ok $? "account om, limit 100"
LOG=$(dirname "$EM_DATA")/server.log
CRASHES=$(grep -c "terminated by signal" "$LOG" 2>/dev/null)

# S: a fresh backend (no list yet); its first hold's list allocation fails
# (injected), its second hold, in the next transaction, must be admitted
backend s -v ON_ERROR_STOP=0 -c "SET earmark.rate_limit = 0" \
  -c "SELECT pg_sleep(2)" \
  -c "SELECT admitted FROM earmark_reserve('om', 1, 'om-1', lease => '1 hour')" \
  -c "SELECT 'second:' || admitted FROM earmark_reserve('om', 1, 'om-2', lease => '1 hour')"
gdb_hold "$BPID" "" em_floor_note_hold 'MemoryContextAlloc if $rsi == 256' 'set $rsi = 0x40000000'
wait "$SPID"
if gdb_held "Breakpoint 2"; then
    diag "the list's first allocation failed (injected): $(grep -m1 'invalid memory alloc' "$WX/s.err")"
else
    diag "nothing injected (no em_floor_note_hold to break on)"
fi
is "$(grep -c '^second:true$' "$WX/s.out")" "1" "the backend's next hold is admitted"
grep -q "terminated abnormally\|server closed the connection" "$WX/s.err" && sed "s/^/# /" "$WX/s.err"
wait_for 60 "SELECT 1" "1" >/dev/null
is "$(grep -c "terminated by signal" "$LOG" 2>/dev/null)" "$CRASHES" \
    "no backend died of a signal (the postmaster did not restart every backend)"
q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
