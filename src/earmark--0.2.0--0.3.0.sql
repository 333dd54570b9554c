/* earmark upgrade script, 0.2.0 to 0.3.0
 *
 * ALTER EXTENSION earmark UPDATE runs it on a 0.2.0 database.  Every change
 * made to src/earmark.sql since 0.2.0 is made here too, so that an updated
 * database has exactly the schema of a fresh install
 * (test/integration/upgrade.sh compares them).
 */

\echo Use "ALTER EXTENSION earmark UPDATE" to load this file. \quit

------------------------------------------------------------------------------
-- Inbox: who may store what (src/inbox.c, src/intake.c)
------------------------------------------------------------------------------

-- How each event's source was verified.  Events stored before 0.3.0 get
-- NULL: 0.2.0 did not record it, and earmark_inbox_receive let any
-- earmark_user store any event, so they count as unverified.  A pending
-- plan change among them is ignored by the built-in handler, with the
-- reason; docs/inbox.md says how a superuser vouches for one.
ALTER TABLE earmark.inbox_event
    ADD COLUMN verified_by text CHECK (verified_by IN ('standard_webhooks', 'kinde_jwt', 'admin'));

-- A handler takes only verified events unless registered otherwise.  (Added
-- without a default, then filled, so that the table has no "missing value"
-- a fresh install's does not have.)
ALTER TABLE earmark.inbox_handler ADD COLUMN accepts_unverified boolean;
UPDATE earmark.inbox_handler SET accepts_unverified = false;
ALTER TABLE earmark.inbox_handler ALTER COLUMN accepts_unverified SET DEFAULT false,
                                  ALTER COLUMN accepts_unverified SET NOT NULL;

DROP FUNCTION earmark_inbox_set_handler(text, regprocedure);
CREATE FUNCTION earmark_inbox_set_handler(event_type text, handler regprocedure,
                                          accepts_unverified boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_inbox_set_handler'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION earmark_inbox_set_handler(text, regprocedure, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_inbox_set_handler(text, regprocedure, boolean) TO earmark_admin;

-- They look at who calls them, so they switch to their owner themselves.
ALTER FUNCTION earmark_inbox_receive(text, text, text, jsonb, timestamptz, text) SECURITY INVOKER;
ALTER FUNCTION earmark_inbox_complete(bigint, text) SECURITY INVOKER;
ALTER FUNCTION earmark_inbox_ignore(bigint, text) SECURITY INVOKER;
ALTER FUNCTION earmark_inbox_fail(bigint, text) SECURITY INVOKER;

-- The built-in handler of the provider's plan change
-- (customer.plan_changed): it records the plan only when the event is newer
-- than the stored change (a tie is ignored), and gives the account the
-- plan's limits, so that the next admission uses the new plan.
--
-- Only a verified event may change a plan (the worker gives it no other,
-- and it checks again), and only one whose time is not ahead of the clock
-- by more than earmark.webhook_tolerance: intake refuses those (EM108); an
-- older version may have stored one, or written such a time into the
-- guard, which is then taken for no guard at all.
--
-- Locks: the account's earmark.account_limit rows first, its
-- earmark.account row last, the order of the limit refresh
-- (em_refresh_account_limits in limits.c), so that the two never
-- deadlock.  The guard is read first without a lock; the guarded update
-- re-checks it after the limits are written, and a newer change that
-- committed in between rolls the limits back (the inner block).
CREATE OR REPLACE FUNCTION earmark.apply_plan_change(e earmark.inbox_event)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_plan text := e.payload #>> '{data,plan,key}';
    -- the clock skew allowed: earmark.webhook_tolerance (300 s by default)
    skew interval := coalesce(current_setting('earmark.webhook_tolerance', true), '300')::interval;
    horizon timestamptz := clock_timestamp() + skew;
    stored timestamptz;
    n int;
BEGIN
    IF e.verified_by IS NULL THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id,
            'not applied: an unverified plan change (only a signed event, or one a member of earmark_admin stored, may change a plan)');
        RETURN 'ignored';
    END IF;
    SELECT a.plan_changed_at INTO stored FROM earmark.account a WHERE a.account = e.account;
    IF e.account IS NULL OR NOT FOUND THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'the event names no known account');
        RETURN 'ignored';
    END IF;
    IF new_plan IS NULL THEN
        RAISE EXCEPTION 'plan change event % has no data.plan.key', e.event_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF e.occurred_at > horizon THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'not applied: the event time is in the future');
        RETURN 'ignored';
    END IF;
    IF stored > horizon THEN
        stored := NULL;                 -- a time from the future guards nothing
    END IF;
    IF stored >= e.occurred_at THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'a newer plan change is already stored');
        RETURN 'ignored';
    END IF;
    BEGIN
        INSERT INTO earmark.account_limit AS l (account, feature, lim, source, updated_at)
        SELECT e.account, p.feature, p.lim, 'manual', now()
          FROM earmark.plan_limit p WHERE p.plan = new_plan ORDER BY p.feature
        ON CONFLICT (account, feature) DO UPDATE SET lim = excluded.lim, updated_at = excluded.updated_at;
        UPDATE earmark.account
           SET plan = new_plan, plan_changed_at = e.occurred_at, updated_at = now()
         WHERE account = e.account
           AND (plan_changed_at IS NULL OR plan_changed_at < e.occurred_at OR plan_changed_at > horizon);
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 0 THEN
            RAISE EXCEPTION 'a newer plan change was stored meanwhile' USING ERRCODE = 'EMP01';
        END IF;
    EXCEPTION WHEN SQLSTATE 'EMP01' THEN
        PERFORM @extschema@.earmark_inbox_ignore(e.event_id, 'a newer plan change is already stored');
        RETURN 'ignored';
    END;
    RETURN 'plan set to ' || new_plan;
END
$$;
