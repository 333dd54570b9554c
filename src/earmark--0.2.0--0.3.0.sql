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
