#!/usr/bin/env bash
# The worker applies inbox events that have a handler: in one transaction
# with the event's mark; a handler error rolls back the handler's writes
# and fails only that event, with its backoff; a handler runs as its owner
# with the ordinary search_path; a handler may ignore its event with a
# reason; events without a handler are left to the applications' claims.
source "$(dirname "$0")/tap.sh"
DB=postgres
P="q -d postgres"

$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
DROP TABLE IF EXISTS iw_effects;
DROP FUNCTION IF EXISTS iw_ok(earmark.inbox_event), iw_boom(earmark.inbox_event),
                        iw_skip(earmark.inbox_event), iw_who(earmark.inbox_event);
CREATE TABLE iw_effects (event_id bigint, what text);
CREATE FUNCTION iw_ok(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO iw_effects VALUES (e.event_id, 'ok');   -- unqualified: the ordinary search_path
    RETURN 'done ' || e.dedupe_key;
END $$;
CREATE FUNCTION iw_boom(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO iw_effects VALUES (e.event_id, 'half');
    UPDATE earmark.account SET plan = 'half-applied' WHERE account = 'iw';
    RAISE EXCEPTION 'the handler broke halfway';
END $$;
CREATE FUNCTION iw_skip(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM earmark_inbox_ignore(e.event_id, 'nothing to do for ' || e.dedupe_key);
    RETURN 'ignored';
END $$;
SELECT earmark_set_account('iw');
SELECT earmark_inbox_set_handler('iw.ok', 'iw_ok(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('iw.boom', 'iw_boom(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('iw.skip', 'iw_skip(earmark.inbox_event)');
SQL

$P -c "SELECT earmark_inbox_receive('t', 'a', 'iw.ok', '{}')" -c "SELECT earmark_inbox_receive('t', 'b', 'iw.boom', '{}')" \
   -c "SELECT earmark_inbox_receive('t', 'c', 'iw.skip', '{}')" -c "SELECT earmark_inbox_receive('t', 'd', 'iw.none', '{}')" >/dev/null

got=$(wait_for 15 "SELECT status || ' ' || result FROM earmark.inbox_event WHERE dedupe_key = 'a'" "applied done a")
is "$got" "applied done a" "an event with a handler is applied by the worker, with the handler's result"
is "$($P -c "SELECT count(*) FROM iw_effects WHERE what = 'ok'")" 1 "its effect happened once"
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'b'" failed)
is "$got" failed "a handler error fails its event"
is "$($P -c "SELECT last_error FROM earmark.inbox_event WHERE dedupe_key = 'b'")" "the handler broke halfway" "the error is kept"
is "$($P -c "SELECT next_attempt_at - updated_at FROM earmark.inbox_event WHERE dedupe_key = 'b'")" "00:00:05" \
   "the first failure waits 5 s"
is "$($P -c "SELECT count(*) FROM iw_effects WHERE what = 'half'")" 0 "the failed handler's insert was rolled back"
is "$($P -c "SELECT coalesce(plan, 'none') FROM earmark.account WHERE account = 'iw'")" none \
   "the failed handler's update was rolled back"
got=$(wait_for 15 "SELECT status || ': ' || result FROM earmark.inbox_event WHERE dedupe_key = 'c'" "ignored: nothing to do for c")
is "$got" "ignored: nothing to do for c" "a handler may ignore its event, with the reason kept"
is "$($P -c "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'd'")" received "an event without a handler is left for the applications"
is "$($P -c "SELECT dedupe_key FROM earmark_inbox_claim(10)")" d "and an application's claim gets it"
sleep 6
is "$($P -c "SELECT attempts || ' ' || status FROM earmark.inbox_event WHERE dedupe_key = 'b'")" "2 failed" \
   "the failed event was tried again after its wait, and failed again"

# a handler runs as its owner: a role that cannot read earmark's tables
$P >/dev/null <<'SQL'
DROP ROLE IF EXISTS iw_owner;
CREATE ROLE iw_owner;
CREATE FUNCTION iw_who(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN current_user || ' ' || (SELECT count(*) FROM earmark.budget);
END $$;
ALTER FUNCTION iw_who(earmark.inbox_event) OWNER TO iw_owner;
SELECT earmark_inbox_set_handler('iw.who', 'iw_who(earmark.inbox_event)');
SELECT earmark_inbox_receive('t', 'e', 'iw.who', '{}');
SQL
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'e'" failed)
is "$got" failed "a handler owned by a plain role runs with that role's rights"
is "$($P -c "SELECT last_error FROM earmark.inbox_event WHERE dedupe_key = 'e'")" "permission denied for schema earmark" \
   "it was refused the tables the worker itself may read"

$P >/dev/null <<'SQL'
DELETE FROM earmark.inbox_handler WHERE event_type LIKE 'iw.%';
DROP FUNCTION iw_who(earmark.inbox_event);
DROP ROLE iw_owner;
SQL
done_testing
