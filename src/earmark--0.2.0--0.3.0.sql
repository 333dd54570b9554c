/* earmark upgrade script, 0.2.0 to 0.3.0
 *
 * ALTER EXTENSION earmark UPDATE runs it on a 0.2.0 database.  Every change
 * made to src/earmark.sql since 0.2.0 is made here too, so that an updated
 * database has exactly the schema of a fresh install
 * (test/integration/upgrade.sh compares them).
 */

\echo Use "ALTER EXTENSION earmark UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The gate: a hold taken from an escrow slot remembers the slots'
-- generation, so that its settlement never gives room to slots cut for
-- another limit.  Holds from 0.2.0 have none and settle into the budget row.
-- ---------------------------------------------------------------------------
ALTER TABLE earmark.job ADD COLUMN gen bigint;
-- 0.2.0 may have left released room in slots of the current generation
-- while the budget was over a lowered limit: a new generation makes every
-- slot of 0.2.0 admit nothing, and the next slow path cuts them again
-- from what the limit leaves.
UPDATE earmark.budget SET slot_gen = slot_gen + 1 WHERE slot_gen > 0;

-- ---------------------------------------------------------------------------
-- earmark_check(): over_limit counts recorded usage; overspent (a hold
-- admitted while the cycle was past its limit) and cycle_overlap (holds or
-- usage in two overlapping cycles of one account) are new.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION earmark_check()
RETURNS TABLE (invariant text, account text, feature text, cycle_start timestamptz, detail text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH b AS (
    SELECT b.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end,
           b.used + coalesce((SELECT sum(s.used) FROM earmark.budget_slot s WHERE s.budget_id = b.budget_id), 0)::bigint AS job_used,
           b.held + coalesce((SELECT sum(s.held) FROM earmark.budget_slot s WHERE s.budget_id = b.budget_id), 0)::bigint AS held,
           coalesce((SELECT sum(u.units) FROM earmark.usage_shard u WHERE u.budget_id = b.budget_id), 0)::bigint AS recorded,
           coalesce((SELECT sum(j.amount) FROM earmark.job j
                      WHERE j.budget_id = b.budget_id AND j.status IN ('running', 'capped')), 0)::bigint AS open_holds,
           coalesce((SELECT sum(l.units) FROM earmark.ledger l WHERE l.budget_id = b.budget_id), 0)::bigint AS ledger,
           coalesce((SELECT sum(l.units) FROM earmark.ledger l
                      WHERE l.budget_id = b.budget_id AND l.job_id IS NOT NULL), 0)::bigint AS ledger_jobs,
           (SELECT max(j.created_at) FROM earmark.job j WHERE j.budget_id = b.budget_id) AS last_admitted,
           greatest(lim.updated_at,
                    (SELECT max(l.recorded_at) FROM earmark.ledger l
                      WHERE l.budget_id = b.budget_id AND l.entry_key IS NOT NULL)) AS last_cause,
           lim.lim, lim.account IS NOT NULL AS has_limit
      FROM earmark.budget b
      LEFT JOIN earmark.account_limit lim ON lim.account = b.account AND lim.feature = b.feature
)
SELECT 'over_limit', b.account, b.feature, b.cycle_start,
       format('used %s (jobs %s, recorded %s) + held %s > limit %s (a limit lowered below what was already admitted, '
              'or usage recorded without a hold, also shows here)',
              b.job_used + b.recorded, b.job_used, b.recorded, b.held, b.lim)
  FROM b WHERE b.has_limit AND b.lim IS NOT NULL AND b.job_used + b.recorded + b.held > b.lim
UNION ALL
SELECT 'overspent', b.account, b.feature, b.cycle_start,
       format('used %s + held %s > limit %s, and a hold was admitted at %s, after the limit was last set '
              'and usage last recorded (%s)',
              b.job_used + b.recorded, b.held, b.lim, b.last_admitted, b.last_cause)
  FROM b WHERE b.has_limit AND b.lim IS NOT NULL AND b.job_used + b.recorded + b.held > b.lim
   AND b.last_admitted > b.last_cause
UNION ALL
SELECT 'cycle_overlap', b.account, b.feature, b.cycle_start,
       format('the cycle %s - %s and the cycle %s - %s overlap and both have usage or holds',
              b.cycle_start, b.cycle_end, o.cycle_start, o.cycle_end)
  FROM b JOIN b AS o ON o.account = b.account AND o.feature = b.feature AND o.budget_id <> b.budget_id
                    AND o.cycle_start < b.cycle_end AND b.cycle_start < o.cycle_end
                    AND o.cycle_start > b.cycle_start
 WHERE (b.ledger <> 0 OR b.open_holds <> 0) AND (o.ledger <> 0 OR o.open_holds <> 0)
UNION ALL
SELECT 'held_mismatch', b.account, b.feature, b.cycle_start,
       format('held %s, but the open holds add up to %s', b.held, b.open_holds)
  FROM b WHERE b.held <> b.open_holds
UNION ALL
SELECT 'used_mismatch', b.account, b.feature, b.cycle_start,
       format('counters %s (jobs %s, recorded %s), but the ledger adds up to %s (jobs %s)',
              b.job_used + b.recorded, b.job_used, b.recorded, b.ledger, b.ledger_jobs)
  FROM b WHERE b.job_used + b.recorded <> b.ledger OR b.job_used <> b.ledger_jobs
UNION ALL
SELECT 'settled_twice', j.account, j.feature, NULL::timestamptz,
       format('job %s (%s) charged %s, its ledger rows add up to %s in %s rows',
              j.job_id, j.status, j.charged, coalesce(sum(l.units), 0), count(l.entry_id))
  FROM earmark.job j LEFT JOIN earmark.ledger l ON l.job_id = j.job_id
 WHERE j.status NOT IN ('running', 'capped')
 GROUP BY j.job_id
HAVING count(l.entry_id) > 1 OR coalesce(sum(l.units), 0) <> coalesce(j.charged, 0)
    OR j.charged IS NULL OR j.settled_at IS NULL
UNION ALL
SELECT 'open_job_settled', j.account, j.feature, NULL::timestamptz,
       format('job %s is %s but has a ledger row or a settlement', j.job_id, j.status)
  FROM earmark.job j
 WHERE j.status IN ('running', 'capped')
   AND (j.settled_at IS NOT NULL OR EXISTS (SELECT 1 FROM earmark.ledger l WHERE l.job_id = j.job_id))
UNION ALL
SELECT 'charge_over_hold', j.account, j.feature, NULL::timestamptz,
       format('job %s: hold %s, recorded use %s, charged %s, released %s',
              j.job_id, j.amount, j.used, j.charged, j.released)
  FROM earmark.job j
 WHERE j.used < 0 OR j.used > j.amount OR j.charged > j.amount OR j.charged < 0
    OR (j.charged IS NOT NULL AND j.charged + j.released <> j.amount)
UNION ALL
SELECT 'key_twice', l.account, NULL, NULL::timestamptz,
       format('idempotency key %s has %s ledger rows', l.entry_key, count(*))
  FROM earmark.ledger l WHERE l.entry_key IS NOT NULL
 GROUP BY l.account, l.entry_key HAVING count(*) > 1
UNION ALL
SELECT 'unmarked_change', b.account, b.feature, b.cycle_start,
       format('the ledger total %s differs from the last total sent %s, and the cycle is not marked',
              b.ledger, x.total)
  FROM b
  JOIN LATERAL (SELECT s.total FROM earmark.meter_send s WHERE s.budget_id = b.budget_id AND s.ok
                 ORDER BY s.send_id DESC LIMIT 1) x ON true
 WHERE x.total <> b.ledger
   AND NOT EXISTS (SELECT 1 FROM earmark.meter_mark m WHERE m.budget_id = b.budget_id)
   AND NOT EXISTS (SELECT 1 FROM earmark.meter_review r WHERE r.budget_id = b.budget_id)
$$;

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
          FROM earmark.plan_limit p WHERE p.plan = new_plan ORDER BY p.feature COLLATE "C"
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
