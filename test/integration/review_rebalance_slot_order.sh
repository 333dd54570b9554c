#!/usr/bin/env bash
# The rebalance's slots are locked and handed to cut_slots in slot order
# (lock_free_slots' ORDER BY slot; cut gives the remainder to $3[1], the
# lowest slot), also when the index the C lock goes by is not the primary
# key: em_direct_lock_skip_all walks whichever index choose_index ranked
# first, and an operator's index on (account, budget_id, ...) ties with
# the primary key (both rank 1 for the two-key read) and wins once a
# REINDEX CONCURRENTLY gave the primary key the higher OID.
#
# limit 10, three slots; the first reserve (8) gathers: the pool left is 2,
# per slot at most 2 / 6 = 0, so share 0 and the remainder 2 goes to the
# first slot of the locked array: slot 0 by ORDER BY slot.
source "$(dirname "$0")/tap.sh"
DBN=rebalance_slot_order
fq() { q -d "$DBN" "$@"; }

own_database "$DBN"
ok $? "database $DBN with earmark"

run() {   # run ACCOUNT: the first reserve's rebalance, then the slots' room by slot
    fq >/dev/null <<SQL
SET earmark.rate_limit = 0;
SELECT earmark_set_limit('$1', 10);
SELECT earmark_set_escrow('$1', 3);
SELECT earmark_reserve('$1', 8, 'first');
SQL
    fq -c "SELECT string_agg(slot || ':' || room, ' ' ORDER BY slot) FROM earmark.budget_slot WHERE account = '$1'"
}

is "$(run plain)" "0:2 1:0 2:0" "primary key only: the remainder in slot 0"

fq >/dev/null <<'SQL'
CREATE INDEX budget_slot_by_slot_desc ON earmark.budget_slot (account, budget_id, slot DESC);
REINDEX INDEX CONCURRENTLY earmark.budget_slot_pkey;
SQL
ok $? "an operator's index on (account, budget_id, slot DESC); the primary key reindexed concurrently"
is "$(run other)" "0:2 1:0 2:0" "with the operator's index: the remainder still in slot 0 (ORDER BY slot)"
is "$(fq -c "SELECT count(*) FROM earmark_check()")" "0" "the books hold"

q -d postgres -c "DROP DATABASE $DBN" >/dev/null 2>&1
done_testing
