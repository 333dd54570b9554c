#!/usr/bin/env bash
# The Engine Room: nine deliveries of three events through the real
# pipeline (receive -> worker -> handlers): the plan change three times,
# the payment five times, an old cancellation seventh; the worker is killed
# with kill -9 while it applies the first plan change.  Side by side, a
# naive handler that applies each delivery on arrival (and is stopped at the
# same point) ends with the wrong balance.
#
# The account starts on Free with a balance of 10; Pro's allowance tops it
# up to 500 (+490), once per account and month, by whichever of the payment
# or the plan change comes first (a keyed ledger row).
source "$(dirname "$0")/tap.sh"
DB=postgres
P="q -d postgres"
checkpointer() { $P -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'" 2>/dev/null; }
worker_state() { $P -c "SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE backend_type = 'earmark worker'"; }

$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
# The worker's claim lease is an hour, so that no claim passes while the
# test looks at it; the test passes it by writing locked_until.  (The
# worker must run with it before it claims the first plan change.)
reload_conf "ALTER SYSTEM SET earmark.inbox_lease = '1h'" "ALTER SYSTEM SET earmark.sweep_interval = '100ms'"
$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
UPDATE earmark.inbox_handler SET handler = 'earmark.apply_plan_change(earmark.inbox_event)';
DELETE FROM earmark.account_limit WHERE account = 'bottle';
DELETE FROM earmark.account WHERE account = 'bottle';
SELECT earmark_set_account('bottle', provider_customer => 'customer_0198');
UPDATE earmark.account SET plan = 'free' WHERE account = 'bottle';

DROP TABLE IF EXISTS engine_ledger, naive_account, engine_ctl;
CREATE TABLE engine_ledger (entry_key text PRIMARY KEY, account text, delta int);
INSERT INTO engine_ledger VALUES ('free:bottle:2026-10', 'bottle', 10);
-- while set, applying a Pro plan change stalls (the test kills the worker
-- there); the test clears it, in a transaction of its own, after the crash
CREATE TABLE engine_ctl (stall boolean);
INSERT INTO engine_ctl VALUES (true);

CREATE OR REPLACE FUNCTION engine_grant(acct text, at timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
    INSERT INTO engine_ledger VALUES ('pro:' || acct || ':' || to_char(at AT TIME ZONE 'UTC', 'YYYY-MM'), acct, 490)
    ON CONFLICT (entry_key) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END $$;

CREATE OR REPLACE FUNCTION engine_plan_changed(e earmark.inbox_event) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE r text;
BEGIN
    r := earmark.apply_plan_change(e);
    IF r = 'ignored' THEN
        RETURN r;
    END IF;
    IF e.payload #>> '{data,plan,key}' = 'pro' THEN
        IF (SELECT stall FROM engine_ctl) THEN
            PERFORM pg_sleep(60);          -- the worker is killed here
        END IF;
        RETURN r || CASE WHEN engine_grant(e.account, e.occurred_at)
                         THEN ', Pro allowance granted' ELSE ', allowance already granted' END;
    END IF;
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION engine_payment(e earmark.inbox_event) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN engine_grant(e.account, e.occurred_at)
                THEN 'Pro allowance granted' ELSE 'allowance already granted' END;
END $$;

SELECT earmark_inbox_set_handler('customer.plan_changed', 'engine_plan_changed(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('customer.payment_succeeded', 'engine_payment(earmark.inbox_event)');

-- the naive handler: applies each delivery on arrival, in steps that commit
CREATE TABLE naive_account (account text PRIMARY KEY, plan text, balance int);
INSERT INTO naive_account VALUES ('bottle', 'free', 10);
CREATE OR REPLACE PROCEDURE naive_apply(kind text, new_plan text, stall boolean DEFAULT false)
LANGUAGE plpgsql AS $$
BEGIN
    IF kind = 'plan' THEN
        IF (SELECT plan FROM naive_account) = new_plan THEN
            RETURN;                        -- "already on that plan"
        END IF;
        UPDATE naive_account SET plan = new_plan;
        COMMIT;
        IF stall THEN PERFORM pg_sleep(60); END IF;
        IF new_plan = 'pro' THEN UPDATE naive_account SET balance = balance + 490; END IF;
    ELSE
        UPDATE naive_account SET balance = balance + 490;
    END IF;
END $$;
SQL

T_PRO='2026-10-20 15:29:23.403633+00'      # the upgrade
T_CANCEL='2026-10-20 15:26:23+00'          # the Free plan it replaced, three minutes earlier
T_PAY='2026-10-20 15:29:40+00'

deliver() {   # deliver N KIND
    case "$2" in
        plan)   $P -c "SELECT inserted FROM earmark_inbox_receive('kinde', 'msg_plan', 'customer.plan_changed',
                   '{\"data\": {\"customer_id\": \"customer_0198\", \"plan\": {\"key\": \"pro\"}}}', '$T_PRO', 'bottle')" ;;
        pay)    $P -c "SELECT inserted FROM earmark_inbox_receive('kinde', 'msg_pay', 'customer.payment_succeeded',
                   '{\"data\": {\"customer_id\": \"customer_0198\"}}', '$T_PAY', 'bottle')" ;;
        cancel) $P -c "SELECT inserted FROM earmark_inbox_receive('kinde', 'msg_cancel', 'customer.plan_changed',
                   '{\"data\": {\"customer_id\": \"customer_0198\", \"plan\": {\"key\": \"free\"}}}', '$T_CANCEL', 'bottle')" ;;
    esac
}
naive() {     # naive N KIND [stall]
    case "$2" in
        plan)   $P -c "CALL naive_apply('plan', 'pro', ${3:-false})" ;;
        pay)    $P -c "CALL naive_apply('pay', NULL)" ;;
        cancel) $P -c "CALL naive_apply('plan', 'free')" ;;
    esac
}
naive_state() { $P -c "SELECT plan || ' ' || balance FROM naive_account"; }

# --- the naive handler, stopped in the middle of the first plan change ---
naive 1 plan true >/dev/null 2>&1 &
npid=$!
wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL naive_apply(''plan'', ''pro'', true)%' AND wait_event = 'PgSleep'" 1 >/dev/null
$P -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'CALL naive_apply(''plan'', ''pro'', true)%'" >/dev/null
wait $npid 2>/dev/null
naive 2 plan; after2=$(naive_state)
for n in 3 4 5 6; do naive $n pay; done
naive 7 cancel; after7=$(naive_state)
naive 8 pay
naive 9 plan; after9=$(naive_state)
is "$after2" "pro 10" "naive: after delivery 2 the plan is Pro but the balance is still 10"
is "$after7" "free 1970" "naive: after delivery 7 the old cancellation has won"
is "$after9" "pro 2950" "naive: after delivery 9 the balance is 2,950 (2,450 more than the plan allows)"

# --- the pipeline ---
deliver 1 plan >/dev/null
st=$(wait_for 60 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND wait_event = 'PgSleep'" 1)
is "$st" 1 "the worker is applying the first plan change"
is "$($P -c "SELECT plan FROM earmark.account WHERE account = 'bottle'")" "free" "nothing of it is visible yet"
old=$($P -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'earmark worker'")
ckpt=$(checkpointer)
kill -9 "$old"
# the postmaster resets the cluster after a crash: the server is back once
# a new checkpointer runs, and the worker once a new one runs
got=$(wait_for 120 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'checkpointer' AND pid <> $ckpt" 1)
is "$got" 1 "the server is back after kill -9 of the worker"
got=$(wait_for 120 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'earmark worker' AND pid <> $old" 1)
is "$got" 1 "... and so is the worker"
$P -c "UPDATE engine_ctl SET stall = false" >/dev/null
is "$(deliver 2 plan)" f "delivery 2: the plan change again, a copy"
# the claim of the killed worker holds the event for its lease (an hour):
# none of the plan change is there, never half of it
st=$($P -c "SELECT plan || ' ' || (SELECT sum(delta) FROM engine_ledger) FROM earmark.account WHERE account = 'bottle'")
is "$st" "free 10" "after the crash none of the plan change is there, never Pro with 10"
is "$($P -c "SELECT status || ' ' || attempts || ' ' || (locked_until > clock_timestamp()) FROM earmark.inbox_event WHERE dedupe_key = 'msg_plan'")" \
   "processing 1 true" "... and the killed worker's claim still holds it"
for n in 3 4 5 6; do deliver $n pay >/dev/null; done
# the claim's lease passes: written into the row, not waited for
$P -c "UPDATE earmark.inbox_event SET locked_until = clock_timestamp() - interval '1 millisecond' WHERE dedupe_key = 'msg_plan'" >/dev/null
got=$(wait_for 60 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'msg_plan'" applied)
is "$got" applied "the restarted worker applied the plan change once its lease passed"
deliver 7 cancel >/dev/null
deliver 8 pay >/dev/null
deliver 9 plan >/dev/null
got=$(wait_for 60 "SELECT count(*) FROM earmark.inbox_event WHERE status IN ('applied', 'ignored')" 3)
is "$got" 3 "all three events reached a final state"

is "$($P -c "SELECT count(*) FROM earmark.inbox_receipt")" 9 "9 receipts"
is "$($P -c "SELECT count(*) FROM earmark.inbox_event")" 3 "3 events stored"
is "$($P -c "SELECT sum(seen_count) - count(*) FROM earmark.inbox_event")" 6 "6 copies counted"
is "$($P -c "SELECT status || ': ' || result FROM earmark.inbox_event WHERE dedupe_key = 'msg_cancel'")" \
   "ignored: a newer plan change is already stored" "the late cancellation is ignored, with its reason"
is "$($P -c "SELECT attempts > 1 FROM earmark.inbox_event WHERE dedupe_key = 'msg_plan'")" t \
   "the plan change ran again after the crash"
is "$($P -c "SELECT left(result, 15) FROM earmark.inbox_event WHERE dedupe_key = 'msg_plan'")" \
   "plan set to pro" "the plan change set the plan"
is "$($P -c "SELECT count(*) FILTER (WHERE result LIKE '%Pro allowance granted') || ' ' ||
                    count(*) FILTER (WHERE result LIKE '%allowance already granted')
             FROM earmark.inbox_event WHERE dedupe_key IN ('msg_plan', 'msg_pay')")" \
   "1 1" "whichever of plan change and payment came first granted the allowance, the other found it"
is "$($P -c "SELECT plan FROM earmark.account WHERE account = 'bottle'")" pro "the account is on Pro"
is "$($P -c "SELECT sum(delta) FROM engine_ledger WHERE account = 'bottle'")" 500 "the balance is 500"
is "$($P -c "SELECT count(*) FROM engine_ledger WHERE entry_key LIKE 'pro:%'")" 1 "the allowance was granted once"

# replay is safe: the effects are keyed and time-guarded
id=$($P -c "SELECT event_id FROM earmark.inbox_event WHERE dedupe_key = 'msg_cancel'")
$P -c "SELECT earmark_inbox_replay($id, 'bottle')" >/dev/null
got=$(wait_for 60 "SELECT status FROM earmark.inbox_event WHERE event_id = $id" ignored)
is "$got" ignored "a replayed old cancellation is ignored again"
is "$($P -c "SELECT plan || ' ' || (SELECT sum(delta) FROM engine_ledger) FROM earmark.account WHERE account = 'bottle'")" \
   "pro 500" "and the account is unchanged"

echo "# Engine Room: 9 deliveries of 3 events, the worker killed once"
echo "#   naive apply-on-arrival: $after9 (plan, balance)"
echo "#   earmark inbox:          $($P -c "SELECT plan || ' ' || (SELECT sum(delta) FROM engine_ledger) FROM earmark.account WHERE account = 'bottle'")"

reload_conf "ALTER SYSTEM RESET earmark.inbox_lease" "ALTER SYSTEM RESET earmark.sweep_interval"
$P -c "SELECT earmark_inbox_set_handler('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)')" \
   -c "SELECT earmark_inbox_set_handler('customer.payment_succeeded', NULL)" >/dev/null
done_testing
