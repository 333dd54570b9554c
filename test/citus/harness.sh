#!/usr/bin/env bash
# test/citus/harness.sh: proves test/citus/cluster.sh (TAP): a coordinator
# and two workers with metadata, a table distributed by account, a function
# delegated to the worker that holds the account, and a worker killed with
# kill -9 and started again.  Prints "skipped: Citus is not installed" and
# passes when Citus is absent.
#
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55660 bash test/citus/harness.sh

source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_require_citus
source "$(dirname "${BASH_SOURCE[0]}")/../integration/tap.sh"

ct_start || { echo "Bail out! the Citus cluster did not start"; exit 1; }

is "$(ct_val 0 "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND hasmetadata AND metadatasynced AND groupid > 0")" 2 \
   "two workers are registered, with metadata"
is "$(ct_val 0 "SELECT citus_is_coordinator()")|$(ct_val 1 "SELECT citus_is_coordinator()")" "t|f" \
   "node 0 is the coordinator, node 1 a worker"

ct_sql 0 -q <<'SQL' >/dev/null
CREATE TABLE acct (account text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
SELECT create_distributed_table('acct', 'account');
INSERT INTO acct (account) SELECT 'a' || i FROM generate_series(1, 20) i;
CREATE FUNCTION bump(account text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE acct a SET n = a.n + 1 WHERE a.account = bump.account;
    RETURN current_setting('port');
END $$;
SELECT create_distributed_function('bump(text)', 'account', colocate_with := 'acct', force_delegation := true);
SQL
# an account whose shard is on worker 1
A=$(ct_val 0 "SELECT account FROM acct a JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('acct', a.account) WHERE p.groupid = 1 ORDER BY account LIMIT 1")
ok "$([ -n "$A" ]; echo $?)" "an account lives on worker 1 ($A)"
is "$(ct_val 0 "SELECT bump('$A')")" "$(ct_port 1)" "a call on the coordinator runs on the worker that holds the account"
is "$(ct_sql 0 -A -t -q -c "BEGIN" -c "SELECT bump('$A')" -c "COMMIT")" "$(ct_port 1)" "also inside a transaction block"

ct_kill_node 1
ok "$(ct_val 0 "SELECT bump('$A')" >/dev/null 2>&1; [ $? -ne 0 ]; echo $?)" "with worker 1 killed (kill -9), a call for its account fails"
ct_start_node 1
is "$(ct_val 0 "SELECT bump('$A')")" "$(ct_port 1)" "after worker 1 was started again the call runs there"
is "$(ct_val 0 "SELECT n FROM acct WHERE account = '$A'")" 3 "the three committed calls are there, the failed one is not"

done_testing
