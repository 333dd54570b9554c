#!/usr/bin/env bash
# The worker applies inbox events that have a handler: in one transaction
# with the event's mark; a handler error rolls back the handler's writes
# and fails only that event, with its backoff; a handler runs as its owner
# with the ordinary search_path; a handler may ignore its event with a
# reason; events without a handler are left to the applications' claims.
# Verified and unverified events: the worker gives an unverified event only
# to a handler registered as accepting it; an application's unsigned plan
# change is refused and a signed one applied.  Handlers run restricted, and
# their settings are undone: after a non-superuser admin's handler sets
# default_transaction_read_only for the session, the worker still applies
# events and sweeps; a handler that makes a temporary table fails alone.
source "$(dirname "$0")/tap.sh"
DB=postgres
P="q -d postgres"
# first_row SECONDS SQL: the first non-empty answer of SQL, polled (a
# statement that finds its row only between the worker's attempts)
first_row() {
    local deadline got
    deadline=$(wait_deadline "$1")
    while :; do
        got=$($P -F ' ' -c "$2" 2>/dev/null)
        [ -n "$got" ] && { echo "$got"; return 0; }
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        sleep 0.2
    done
}

$P -c "CREATE EXTENSION IF NOT EXISTS earmark" >/dev/null
$P >/dev/null <<'SQL'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
DROP TABLE IF EXISTS iw_effects;
DROP FUNCTION IF EXISTS iw_ok(earmark.inbox_event), iw_boom(earmark.inbox_event),
                        iw_skip(earmark.inbox_event), iw_who(earmark.inbox_event),
                        iw_billing(earmark.inbox_event), iw_open(earmark.inbox_event),
                        iw_readonly(earmark.inbox_event), iw_temp(earmark.inbox_event);
DROP ROLE IF EXISTS iw_app;
DROP ROLE IF EXISTS iw_ops;
DELETE FROM earmark.account_limit WHERE account = 'iw';
UPDATE earmark.account SET plan = NULL, plan_changed_at = NULL WHERE account = 'iw';
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
# the worker may have tried it again meanwhile: the wait is read with the
# attempt it follows (5 s after the first, 30 s after the second, ...)
waits=(- 00:00:05 00:00:30 00:02:00 00:10:00 01:00:00)
read -r n w <<<"$(first_row 60 "SELECT attempts, next_attempt_at - updated_at FROM earmark.inbox_event WHERE dedupe_key = 'b' AND status = 'failed'")"
is "$n $w" "$n ${waits[${n:-0}]:-?}" "a failure waits by its attempt (attempt ${n:-?}: ${w:-?})"
is "$($P -c "SELECT count(*) FROM iw_effects WHERE what = 'half'")" 0 "the failed handler's insert was rolled back"
is "$($P -c "SELECT coalesce(plan, 'none') FROM earmark.account WHERE account = 'iw'")" none \
   "the failed handler's update was rolled back"
got=$(wait_for 15 "SELECT status || ': ' || result FROM earmark.inbox_event WHERE dedupe_key = 'c'" "ignored: nothing to do for c")
is "$got" "ignored: nothing to do for c" "a handler may ignore its event, with the reason kept"
is "$($P -c "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'd'")" received "an event without a handler is left for the applications"
is "$($P -c "SELECT dedupe_key FROM earmark_inbox_claim(10)")" d "and an application's claim gets it"
# its wait has passed: written into the row (next_attempt_at), not waited for
n=$(first_row 60 "UPDATE earmark.inbox_event SET next_attempt_at = clock_timestamp() - interval '1 millisecond'
                  WHERE dedupe_key = 'b' AND status = 'failed' RETURNING attempts")
got=$(wait_for 60 "SELECT attempts || ' ' || status FROM earmark.inbox_event WHERE dedupe_key = 'b'" "$((${n:-0} + 1)) failed")
is "$got" "$((${n:-0} + 1)) failed" "the failed event was tried again once its wait had passed, and failed again"

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

# --- who may store what: the worker applies only verified events -----------
# An application (earmark_user) stores an event of a type that has no
# handler yet; then a handler that changes billing state is registered for
# it.  The worker refuses to run that handler on the unverified event; a
# handler registered as accepting unverified events runs on them.
$P >/dev/null <<'SQL'
CREATE ROLE iw_app IN ROLE earmark_user;
CREATE FUNCTION iw_billing(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO iw_effects VALUES (e.event_id, 'billing');
    RETURN 'billed';
END $$;
CREATE FUNCTION iw_open(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO iw_effects VALUES (e.event_id, 'open');
    RETURN 'opened';
END $$;
SELECT earmark_set_plan_limit('iw_unlimited', NULL);
SELECT earmark_set_plan_limit('iw_team', 7000);
SELECT earmark_set_account('iw', provider_customer => 'cus_iw');
SELECT earmark_set_limit('iw', 1000);
SELECT earmark_inbox_set_secret('iw_src', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SQL
is "$(sqlstate "SET ROLE iw_app" "SELECT earmark_inbox_receive('app', 'f', 'iw.billing', '{}')")" ok \
   "an application stores an unverified event of a type without a handler"
$P -c "SELECT earmark_inbox_set_handler('iw.billing', 'iw_billing(earmark.inbox_event)')" >/dev/null
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'f'" ignored)
is "$got" ignored "once a handler is registered for its type, the worker does not apply the unverified event"
is "$($P -c "SELECT result FROM earmark.inbox_event WHERE dedupe_key = 'f'")" \
   "not applied: the event is unverified, and its handler public.iw_billing(earmark.inbox_event) takes only verified events" \
   "... and says why"
is "$($P -c "SELECT count(*) FROM iw_effects WHERE what = 'billing'")" 0 "... and the handler never ran"
$P -c "SELECT earmark_inbox_set_handler('iw.open', 'iw_open(earmark.inbox_event)', accepts_unverified => true)" >/dev/null
is "$(sqlstate "SET ROLE iw_app" "SELECT earmark_inbox_receive('app', 'g', 'iw.open', '{}')")" ok \
   "an application stores an event whose handler accepts unverified events"
got=$(wait_for 15 "SELECT status || ' ' || result FROM earmark.inbox_event WHERE dedupe_key = 'g'" "applied opened")
is "$got" "applied opened" "... and the worker applies it"

# the plan change through the worker: made up by the application, refused;
# signed by the billing source, applied to the account it names
is "$(sqlstate "SET ROLE iw_app" "SELECT earmark_inbox_receive('app', 'iw-forged', 'customer.plan_changed',
        '{\"data\": {\"plan\": {\"key\": \"iw_unlimited\"}}}', now(), 'iw')")" 42501 \
   "an application cannot store an unsigned plan change (42501)"
TS=$(date +%s)
BODY='{"type":"customer.plan_changed","event_timestamp":"'$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)'","data":{"customer_id":"cus_iw","plan":{"key":"iw_team"}}}'
SIG=$(python3 -c 'import base64, hashlib, hmac, sys
key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
msg = ("%s.%s.%s" % tuple(sys.argv[1:4])).encode()
print("v1," + base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode())' iw-signed "$TS" "$BODY")
is "$(sqlstate "SET ROLE iw_app" "SELECT earmark_inbox_receive_signed('iw_src', 'iw-signed', '$TS', '$SIG', '$BODY')")" ok \
   "the application delivers a signed plan change"
got=$(wait_for 15 "SELECT status || ' ' || result FROM earmark.inbox_event WHERE dedupe_key = 'iw-signed'" "applied plan set to iw_team")
is "$got" "applied plan set to iw_team" "the worker applies the signed plan change"
is "$($P -c "SELECT a.plan || ' ' || coalesce(l.lim::text, 'unlimited') FROM earmark.account a
             JOIN earmark.account_limit l USING (account) WHERE account = 'iw'")" "iw_team 7000" \
   "... the account it names has that plan's limit, and nothing else moved it"

# --- handlers run like other owners' code: restricted, their settings undone --
# A handler owned by a non-superuser member of earmark_admin makes the
# session read-only with a session-level set_config; another tries to make
# a temporary table.  Handlers run as their owner in a security-restricted
# operation whose settings are rolled back when they return: the first
# changes nothing after it, the second fails its own event only, and the
# worker goes on applying events and sweeping holds.
$P >/dev/null <<'SQL'
CREATE ROLE iw_ops IN ROLE earmark_admin;
CREATE FUNCTION iw_readonly(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('default_transaction_read_only', 'on', false);
    RETURN 'session made read-only';
END $$;
CREATE FUNCTION iw_temp(e earmark.inbox_event) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    CREATE TEMP TABLE iw_scratch (x int);
    RETURN 'made a temporary table';
END $$;
ALTER FUNCTION iw_readonly(earmark.inbox_event) OWNER TO iw_ops;
ALTER FUNCTION iw_temp(earmark.inbox_event) OWNER TO iw_ops;
SET ROLE iw_ops;
SELECT earmark_inbox_set_handler('iw.readonly', 'iw_readonly(earmark.inbox_event)');
SELECT earmark_inbox_set_handler('iw.temp', 'iw_temp(earmark.inbox_event)');
RESET ROLE;
SQL
$P -c "SELECT earmark_inbox_receive('t', 'ro', 'iw.readonly', '{}')" -c "SELECT earmark_inbox_receive('t', 'tmp', 'iw.temp', '{}')" \
   -c "SELECT earmark_inbox_receive('t', 'ok-2', 'iw.ok', '{}')" >/dev/null
got=$(wait_for 15 "SELECT status || ' ' || result FROM earmark.inbox_event WHERE dedupe_key = 'ro'" "applied session made read-only")
is "$got" "applied session made read-only" "a non-superuser admin's handler ran set_config(default_transaction_read_only, on, false)"
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'tmp'" failed)
is "$got" failed "a handler that makes a temporary table fails its event"
is "$($P -c "SELECT last_error FROM earmark.inbox_event WHERE dedupe_key = 'tmp'")" \
   "cannot create temporary table within security-restricted operation" "... refused by the security-restricted operation"
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'ok-2'" applied)
is "$got" applied "... and only its event: the other event of the batch is applied"
$P -c "SELECT earmark_inbox_receive('t', 'ok-3', 'iw.ok', '{}')" >/dev/null
got=$(wait_for 15 "SELECT status FROM earmark.inbox_event WHERE dedupe_key = 'ok-3'" applied)
is "$got" applied "after the read-only handler the worker still applies events (its setting did not outlive its event)"
JOB=$($P -c "SELECT job_id FROM earmark_reserve('iw', 10, 'iw-sweep-$RANDOM', lease => '1 hour')")
# (its lease has passed: written into the row, not waited for)
$P -c "UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = $JOB" >/dev/null
got=$(wait_for 60 "SELECT status FROM earmark.job WHERE job_id = $JOB" expired)
is "$got" expired "... and still sweeps expired holds"

$P >/dev/null <<'SQL'
DELETE FROM earmark.inbox_handler WHERE event_type LIKE 'iw.%';
DROP FUNCTION iw_who(earmark.inbox_event), iw_readonly(earmark.inbox_event), iw_temp(earmark.inbox_event);
DROP ROLE iw_owner;
DROP ROLE iw_app;
DROP ROLE iw_ops;
SELECT earmark_inbox_drop_secret('iw_src', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SQL
done_testing
