/* earmark upgrade script, 0.2.0 to 0.3.0
 *
 * ALTER EXTENSION earmark UPDATE runs it on a 0.2.0 database.  Every change
 * made to src/earmark.sql since 0.2.0 is made here too, so that an updated
 * database has exactly the schema of a fresh install
 * (test/integration/upgrade.sh compares them).
 */

\echo Use "ALTER EXTENSION earmark UPDATE" to load this file. \quit

-- Without shared_preload_libraries no background worker runs: nothing
-- sweeps dead holds, reports to the meter or applies the inbox.  Say so
-- now, with the fix, rather than let it be found in the books later.
DO $$
BEGIN
    IF NOT pg_catalog.string_to_array(pg_catalog.replace(
               pg_catalog.current_setting('shared_preload_libraries'), ' ', ''), ',')
           OPERATOR(pg_catalog.&&) ARRAY['earmark', '$libdir/earmark'] THEN
        RAISE WARNING 'earmark is not in shared_preload_libraries: its background worker does not run'
            USING DETAIL = 'Holds whose lease passed are not swept, usage is not reported to the meter, inbox events are not applied, and the admission rate limit (it lives in shared memory) is not applied.',
                  HINT = 'Add earmark to shared_preload_libraries in postgresql.conf and restart the server.';
    END IF;
END
$$;

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
-- Account first.  Every per-account table is keyed by the account, so that
-- Citus can distribute earmark by account; ids come from earmark.next_id
-- (unique in a cluster by construction) instead of identity columns; the
-- sequences keep the identities' positions.  Rows whose budget is gone
-- (an account deleted under 0.2.0, which cascaded to its budgets only) are
-- dropped from the tables that now need the account: nothing reads them.
-- ---------------------------------------------------------------------------
CREATE FUNCTION earmark.next_id(seq regclass) RETURNS bigint
AS 'MODULE_PATHNAME', 'earmark_next_id' LANGUAGE C VOLATILE CALLED ON NULL INPUT;
REVOKE ALL ON FUNCTION earmark.next_id(regclass) FROM PUBLIC;

DROP TRIGGER budget_truncate_slots ON earmark.budget;
DROP FUNCTION earmark.truncate_slots();

CREATE SEQUENCE earmark.budget_id_seq;
CREATE SEQUENCE earmark.job_id_seq;
CREATE SEQUENCE earmark.entry_id_seq;
CREATE SEQUENCE earmark.send_id_seq;
CREATE SEQUENCE earmark.evidence_id_seq;
SELECT pg_catalog.setval('earmark.budget_id_seq', last_value, is_called) FROM earmark.budget_budget_id_seq;
SELECT pg_catalog.setval('earmark.job_id_seq', last_value, is_called) FROM earmark.job_job_id_seq;
SELECT pg_catalog.setval('earmark.entry_id_seq', last_value, is_called) FROM earmark.ledger_entry_id_seq;
SELECT pg_catalog.setval('earmark.send_id_seq', last_value, is_called) FROM earmark.meter_send_send_id_seq;
SELECT pg_catalog.setval('earmark.evidence_id_seq', last_value, is_called) FROM earmark.evidence_evidence_id_seq;
-- the identities' sequences leave pg_dump's list (and the extension) first:
-- dropping an identity does not take its sequence off the list
ALTER EXTENSION earmark DROP SEQUENCE earmark.budget_budget_id_seq;
ALTER EXTENSION earmark DROP SEQUENCE earmark.job_job_id_seq;
ALTER EXTENSION earmark DROP SEQUENCE earmark.ledger_entry_id_seq;
ALTER EXTENSION earmark DROP SEQUENCE earmark.meter_send_send_id_seq;
ALTER EXTENSION earmark DROP SEQUENCE earmark.evidence_evidence_id_seq;

-- budget
ALTER TABLE earmark.budget ALTER COLUMN budget_id DROP IDENTITY;
ALTER TABLE earmark.budget ALTER COLUMN budget_id SET DEFAULT earmark.next_id('earmark.budget_id_seq');
ALTER SEQUENCE earmark.budget_id_seq OWNED BY earmark.budget.budget_id;
ALTER TABLE earmark.budget DROP CONSTRAINT budget_pkey;
ALTER TABLE earmark.budget ADD PRIMARY KEY (account, budget_id);
-- earmark_reconcile's pages walk the cycles in budget_id order, which the
-- primary key no longer gives (earmark.sql)
CREATE INDEX budget_order ON earmark.budget (budget_id);

-- budget_slot
ALTER TABLE earmark.budget_slot ADD COLUMN account text;
UPDATE earmark.budget_slot s SET account = b.account FROM earmark.budget b WHERE b.budget_id = s.budget_id;
DELETE FROM earmark.budget_slot WHERE account IS NULL;
ALTER TABLE earmark.budget_slot ALTER COLUMN account SET NOT NULL;
ALTER TABLE earmark.budget_slot DROP CONSTRAINT budget_slot_pkey;
ALTER TABLE earmark.budget_slot ADD PRIMARY KEY (account, budget_id, slot);
-- the rebalance's cut counter and each slot's stamp (escrow.c: the fast
-- path takes no room cut after its read).  Added without a default and
-- filled, then given one: a column added with its default keeps that value
-- as the table's "missing value", which a fresh install does not have.
ALTER TABLE earmark.budget ADD COLUMN slot_cut bigint;
UPDATE earmark.budget SET slot_cut = 0;
ALTER TABLE earmark.budget ALTER COLUMN slot_cut SET DEFAULT 0;
ALTER TABLE earmark.budget ALTER COLUMN slot_cut SET NOT NULL;
ALTER TABLE earmark.budget_slot ADD COLUMN cut bigint;
UPDATE earmark.budget_slot SET cut = 0;
ALTER TABLE earmark.budget_slot ALTER COLUMN cut SET DEFAULT 0;
ALTER TABLE earmark.budget_slot ALTER COLUMN cut SET NOT NULL;
-- the recorded usage the last rebalance read (NULL: not known yet)
ALTER TABLE earmark.budget ADD COLUMN slot_rec bigint;
-- the version (xmin, updated_at) of the limit row the last rebalance saw
ALTER TABLE earmark.budget ADD COLUMN slot_limx bigint;
ALTER TABLE earmark.budget ADD COLUMN slot_limt timestamptz;

-- job
ALTER TABLE earmark.job ALTER COLUMN job_id DROP IDENTITY;
ALTER TABLE earmark.job ALTER COLUMN job_id SET DEFAULT earmark.next_id('earmark.job_id_seq');
ALTER SEQUENCE earmark.job_id_seq OWNED BY earmark.job.job_id;
ALTER TABLE earmark.job DROP CONSTRAINT job_pkey;
ALTER TABLE earmark.job ADD PRIMARY KEY (account, job_id);
DROP INDEX earmark.job_open;
CREATE INDEX job_open ON earmark.job (account, budget_id)
    WHERE status IN ('running', 'capped');

-- ledger
UPDATE earmark.ledger l SET account = b.account
  FROM earmark.budget b WHERE b.budget_id = l.budget_id AND l.account IS NULL;
UPDATE earmark.ledger l SET account = j.account
  FROM earmark.job j WHERE j.job_id = l.job_id AND l.account IS NULL;
DELETE FROM earmark.ledger WHERE account IS NULL;
ALTER TABLE earmark.ledger ALTER COLUMN account SET NOT NULL;
ALTER TABLE earmark.ledger ALTER COLUMN entry_id DROP IDENTITY;
ALTER TABLE earmark.ledger ALTER COLUMN entry_id SET DEFAULT earmark.next_id('earmark.entry_id_seq');
ALTER SEQUENCE earmark.entry_id_seq OWNED BY earmark.ledger.entry_id;
-- The primary key is led by budget_id, which the cycle totals read, so
-- 0.2.0's ledger_budget goes: one index write fewer per ledger row.  Its
-- bigints lead, the account last (earmark.sql): an insert's descent
-- compares integers, not two equal accounts.  Built once, here: the
-- table is locked while its indexes are built.
ALTER TABLE earmark.ledger DROP CONSTRAINT ledger_pkey;
ALTER TABLE earmark.ledger ADD PRIMARY KEY (budget_id, entry_id, account);
ALTER TABLE earmark.ledger DROP CONSTRAINT ledger_job_id_key;
-- partial: 0.3.0 writes no row with a job_id (earmark.sql)
CREATE UNIQUE INDEX ledger_account_job_id_key ON earmark.ledger (account, job_id)
    WHERE job_id IS NOT NULL;
DROP INDEX earmark.ledger_budget;

-- usage_shard
ALTER TABLE earmark.usage_shard ADD COLUMN account text;
UPDATE earmark.usage_shard u SET account = b.account FROM earmark.budget b WHERE b.budget_id = u.budget_id;
DELETE FROM earmark.usage_shard WHERE account IS NULL;
ALTER TABLE earmark.usage_shard ALTER COLUMN account SET NOT NULL;
ALTER TABLE earmark.usage_shard DROP CONSTRAINT usage_shard_pkey;
ALTER TABLE earmark.usage_shard ADD PRIMARY KEY (account, budget_id, shard);

-- meter_mark
ALTER TABLE earmark.meter_mark ADD COLUMN account text;
UPDATE earmark.meter_mark m SET account = b.account FROM earmark.budget b WHERE b.budget_id = m.budget_id;
DELETE FROM earmark.meter_mark WHERE account IS NULL;
ALTER TABLE earmark.meter_mark ALTER COLUMN account SET NOT NULL;
ALTER TABLE earmark.meter_mark DROP CONSTRAINT meter_mark_pkey;
CREATE INDEX meter_mark_cycle ON earmark.meter_mark (account, budget_id);
DROP INDEX earmark.meter_mark_order;
CREATE INDEX meter_mark_order ON earmark.meter_mark (marked_at, account, budget_id);
ALTER TABLE earmark.meter_mark REPLICA IDENTITY FULL;
-- a cycle may have more than one mark now: worker_status counts cycles
CREATE OR REPLACE VIEW earmark.worker_status AS
    SELECT (SELECT pg_catalog.count(*) FROM (SELECT DISTINCT account, budget_id FROM earmark.meter_mark) c) AS marked_cycles,
           (SELECT pg_catalog.min(marked_at) FROM earmark.meter_mark) AS oldest_mark,
           r.last_pass_at AS last_report_at, r.last_pass_sent AS last_report_sent,
           r.last_pass_failed AS last_report_failed, r.last_error AS last_report_error,
           r.blocked_until AS report_blocked_until,
           (SELECT pg_catalog.count(*) FROM earmark.meter_review) AS cycles_to_review,
           (SELECT pg_catalog.count(*) FROM earmark.account WHERE limits_wanted_at IS NOT NULL) AS limits_wanted,
           (SELECT pg_catalog.count(*) FROM earmark.inbox_event WHERE status = 'dead') AS dead_events,
           earmark.workers_running() AS workers_running
      FROM earmark.reporter_state r;

-- meter_send
ALTER TABLE earmark.meter_send ADD COLUMN account text;
UPDATE earmark.meter_send x SET account = b.account FROM earmark.budget b WHERE b.budget_id = x.budget_id;
DELETE FROM earmark.meter_send WHERE account IS NULL;
ALTER TABLE earmark.meter_send ALTER COLUMN account SET NOT NULL;
ALTER TABLE earmark.meter_send ALTER COLUMN send_id DROP IDENTITY;
ALTER TABLE earmark.meter_send ALTER COLUMN send_id SET DEFAULT earmark.next_id('earmark.send_id_seq');
ALTER SEQUENCE earmark.send_id_seq OWNED BY earmark.meter_send.send_id;
ALTER TABLE earmark.meter_send DROP CONSTRAINT meter_send_pkey;
ALTER TABLE earmark.meter_send ADD PRIMARY KEY (account, send_id);
DROP INDEX earmark.meter_send_budget;
CREATE INDEX meter_send_budget ON earmark.meter_send (account, budget_id, send_id);

-- meter_review
ALTER TABLE earmark.meter_review DROP CONSTRAINT meter_review_pkey;
ALTER TABLE earmark.meter_review ADD PRIMARY KEY (account, budget_id);

-- evidence
ALTER TABLE earmark.evidence ALTER COLUMN evidence_id DROP IDENTITY;
ALTER TABLE earmark.evidence ALTER COLUMN evidence_id SET DEFAULT earmark.next_id('earmark.evidence_id_seq');
ALTER SEQUENCE earmark.evidence_id_seq OWNED BY earmark.evidence.evidence_id;
ALTER TABLE earmark.evidence DROP CONSTRAINT evidence_pkey;
ALTER TABLE earmark.evidence ADD PRIMARY KEY (account, evidence_id);
DROP INDEX earmark.evidence_budget;
CREATE INDEX evidence_budget ON earmark.evidence (account, budget_id, evidence_id);

REVOKE ALL ON ALL TABLES IN SCHEMA earmark FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA earmark FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('earmark.budget_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.send_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.evidence_id_seq', '');

-- the send log's join names the account
CREATE OR REPLACE VIEW earmark.send_log AS
    SELECT x.send_id, b.account, b.feature, b.cycle_start, x.total, x.origin, x.ok,
           x.http_status, x.error, x.duration_ms, x.sent_at, x.budget_id
      FROM earmark.meter_send x LEFT JOIN earmark.budget b USING (account, budget_id);

-- charge, heartbeat and settle take the account first (0.2.0 callers add
-- it: the job's account, as they reserved it)
-- (the 0.2.0 forms become functions that say how to call them now; their
-- grants stay)
-- The 0.2.0 forms of charge, heartbeat and settle took no account.  They
-- stay, so that a 0.2.0 caller gets a message that says what to change
-- instead of "function does not exist".
CREATE OR REPLACE FUNCTION earmark_charge(job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'earmark_charge takes the account first since earmark 0.3.0'
        USING ERRCODE = '42883',
              HINT = 'Call earmark_charge(account, job_id, tokens, step) with the account the job was reserved for.';
END
$$;
CREATE OR REPLACE FUNCTION earmark_heartbeat(job_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'earmark_heartbeat takes the account first since earmark 0.3.0'
        USING ERRCODE = '42883',
              HINT = 'Call earmark_heartbeat(account, job_id) with the account the job was reserved for.';
END
$$;
DROP FUNCTION earmark_settle(bigint, bigint, text);
-- (without the 0.2.0 form's third argument: earmark_settle('acme', 6, NULL)
-- would fit both forms and fail with 42725; a 0.2.0 call that names an
-- outcome gets PostgreSQL's own 42883)
CREATE FUNCTION earmark_settle(job_id bigint, used bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, released bigint, status text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'earmark_settle takes the account first since earmark 0.3.0'
        USING ERRCODE = '42883',
              HINT = 'Call earmark_settle(account, job_id, used, outcome) with the account the job was reserved for.';
END
$$;
REVOKE ALL ON FUNCTION earmark_settle(bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_settle(bigint, bigint) TO earmark_user;
CREATE FUNCTION earmark_charge(account text, job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_charge'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_heartbeat(account text, job_id bigint)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'earmark_heartbeat'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_settle(account text, job_id bigint, used bigint DEFAULT NULL, outcome text DEFAULT 'completed')
RETURNS TABLE (charged bigint, released bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_settle'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION
    earmark_charge(text, bigint, bigint, bigint),
    earmark_heartbeat(text, bigint),
    earmark_settle(text, bigint, bigint, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    earmark_charge(text, bigint, bigint, bigint),
    earmark_heartbeat(text, bigint),
    earmark_settle(text, bigint, bigint, text)
TO earmark_user;

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
WITH s AS (SELECT s.account, s.budget_id, sum(s.used) AS used, sum(s.held) AS held
             FROM earmark.budget_slot s GROUP BY s.account, s.budget_id),
u AS (SELECT u.account, u.budget_id, sum(u.units) AS units
        FROM earmark.usage_shard u GROUP BY u.account, u.budget_id),
j AS (SELECT j.account, j.budget_id,
             sum(j.amount) FILTER (WHERE j.status IN ('running', 'capped')) AS open_holds,
             max(j.created_at) AS last_admitted
        FROM earmark.job j GROUP BY j.account, j.budget_id),
l AS (SELECT l.account, l.budget_id, sum(l.units) AS units,
             sum(l.units) FILTER (WHERE l.job_id IS NOT NULL) AS job_units,
             max(l.recorded_at) FILTER (WHERE l.entry_key IS NOT NULL) AS last_recorded
        FROM earmark.ledger l GROUP BY l.account, l.budget_id),
-- numeric sums: an unlimited account's used and recorded usage may add up
-- past the largest bigint, which must show as that account's finding, not
-- fail the check of every account
b AS (
    SELECT b.budget_id, b.account, b.feature, b.cycle_start, b.cycle_end,
           b.used + coalesce(s.used, 0) AS job_used,
           b.held + coalesce(s.held, 0) AS held,
           coalesce(u.units, 0) AS recorded,
           coalesce(j.open_holds, 0) AS open_holds,
           coalesce(l.units, 0) AS ledger,
           coalesce(l.job_units, 0) AS ledger_jobs,
           j.last_admitted,
           greatest(lim.updated_at, l.last_recorded) AS last_cause,
           lim.lim, lim.account IS NOT NULL AS has_limit
      FROM earmark.budget b
      LEFT JOIN s ON s.account = b.account AND s.budget_id = b.budget_id
      LEFT JOIN u ON u.account = b.account AND u.budget_id = b.budget_id
      LEFT JOIN j ON j.account = b.account AND j.budget_id = b.budget_id
      LEFT JOIN l ON l.account = b.account AND l.budget_id = b.budget_id
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
SELECT 'overdue_hold', j.account, j.feature, NULL::timestamptz,
       format('job %s is %s, but its lease ended at %s: the background worker has not swept it',
              j.job_id, j.status, j.lease_until)
  FROM earmark.job j
 WHERE j.status IN ('running', 'capped')
   AND j.lease_until < now() - greatest(interval '1 minute',
                                        10 * coalesce(pg_catalog.current_setting('earmark.sweep_interval', true), '1s')::interval)
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
              j.job_id, j.status, j.charged, coalesce(sum(l.units), 0), count(l.budget_id))
  FROM earmark.job j LEFT JOIN earmark.ledger l ON l.account = j.account AND l.job_id = j.job_id
 WHERE j.status NOT IN ('running', 'capped')
 GROUP BY j.account, j.job_id
HAVING count(l.budget_id) > 1 OR coalesce(sum(l.units), 0) <> coalesce(j.charged, 0)
    OR j.charged IS NULL OR j.settled_at IS NULL
UNION ALL
SELECT 'open_job_settled', j.account, j.feature, NULL::timestamptz,
       format('job %s is %s but has a ledger row or a settlement', j.job_id, j.status)
  FROM earmark.job j LEFT JOIN earmark.ledger l ON l.account = j.account AND l.job_id = j.job_id
 WHERE j.status IN ('running', 'capped') AND (j.settled_at IS NOT NULL OR l.budget_id IS NOT NULL)
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
  JOIN (SELECT DISTINCT ON (s.account, s.budget_id) s.account, s.budget_id, s.total
          FROM earmark.meter_send s WHERE s.ok
         ORDER BY s.account, s.budget_id, s.send_id DESC) x
    ON x.account = b.account AND x.budget_id = b.budget_id
  LEFT JOIN earmark.meter_mark m ON m.account = b.account AND m.budget_id = b.budget_id
  LEFT JOIN earmark.meter_review r ON r.account = b.account AND r.budget_id = b.budget_id
 WHERE x.total <> b.ledger AND m.budget_id IS NULL AND r.budget_id IS NULL
$$;

-- One account's holds whose lease has passed: what the worker calls per
-- account on a distributed install (Citus runs it on the account's node).
CREATE FUNCTION earmark.sweep_account(account text, max_jobs int)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_sweep_account'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION earmark.sweep_account(text, int) FROM PUBLIC;

-- One account's limit read, stored: what the worker calls per account on a
-- distributed install (Citus runs it on the account's node, where
-- earmark_refresh_limits takes the account's refresh lock).  A NULL limit
-- is unlimited.
CREATE FUNCTION earmark.store_limits(account text, features text[], limits bigint[])
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_store_limits'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION earmark.store_limits(text, text[], bigint[]) FROM PUBLIC;

-- One cycle's last report step: what the worker calls per cycle on a
-- distributed install (Citus runs it on the account's node, where the
-- cycle's writers take its mark lock).
CREATE FUNCTION earmark.report_cycle(account text, budget_id bigint, cycle_account text, total bigint,
                                     ok boolean, http_status int, error text, duration_ms double precision,
                                     closed boolean, too_large boolean, last_sent bigint, feature text,
                                     cycle_start timestamptz, cycle_end timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_report_cycle'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION earmark.report_cycle(text, bigint, text, bigint, boolean, int, text,
    double precision, boolean, boolean, bigint, text, timestamptz, timestamptz) FROM PUBLIC;

------------------------------------------------------------------------------
-- Citus: earmark distributed by account
------------------------------------------------------------------------------

-- earmark.distribution_lock(): earmark_distribute's first step.  The
-- database's distribution lock, exclusive, until the transaction ends: a
-- lock in earmark's own key space that every transaction of the earmark
-- worker takes shared before any table, so that a distribution waits for
-- the worker's transaction that runs and the worker's next one waits for
-- the distribution, before either holds a table (cluster.c).  Refuses
-- REPEATABLE READ and SERIALIZABLE (25000): the caller's snapshot, taken
-- before the wait, would hide what it waited for.
CREATE FUNCTION earmark.distribution_lock() RETURNS void
AS 'MODULE_PATHNAME', 'earmark_distribution_lock' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION earmark.distribution_lock() FROM PUBLIC;

-- earmark_distribute(): run once on a Citus coordinator after CREATE
-- EXTENSION earmark (docs/scale-out.md).  Every per-account table becomes
-- a distributed table by account, all colocated with earmark.account; the
-- plans and webhook secrets become reference tables; the inbox, the key
-- set cache and the reporter's state stay on the coordinator (the worker
-- that applies the inbox and reports runs there).  Every function that
-- takes an account is distributed by it, with force_delegation, so that a
-- call runs on the account's node inside the caller's transaction.
-- The workers' own copies of the coordinator's tables are emptied (the
-- install script's rows there are not the install's), and each node's id
-- sequences are moved past the ids its group already issued (after a
-- restore they start again at 1).
-- Idempotent: a second run finds everything in place and changes nothing;
-- run it again after citus_add_node and after a restore.
-- Refuses, changing nothing, without Citus, off the coordinator, with
-- nodes whose metadata is not synced, whose earmark differs or is not
-- preloaded, on a half-distributed install (some tables distributed, or
-- distributed otherwise than this function does), and when a worker's own
-- copy of an earmark table holds rows a call wrote there.
-- Waits for a transaction of this node's earmark worker to end, and holds
-- the worker's next ones until it ends (earmark.distribution_lock above);
-- READ COMMITTED only.
CREATE FUNCTION earmark_distribute()
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    per_account text[] := ARRAY['earmark.account', 'earmark.account_limit', 'earmark.budget',
        'earmark.budget_slot', 'earmark.job', 'earmark.ledger_entry', 'earmark.usage_shard',
        'earmark.meter_mark', 'earmark.meter_send', 'earmark.meter_review', 'earmark.evidence',
        'earmark.local_meter'];
    reference text[] := ARRAY['earmark.plan_limit', 'earmark.webhook_secret'];
    -- the coordinator's own tables; reporter_state last (its one row is
    -- each node's state, not data)
    coord_only text[] := ARRAY['earmark.inbox_event', 'earmark.inbox_receipt', 'earmark.jwks',
        'earmark.inbox_handler', 'earmark.reporter_state'];
    functions text[] := ARRAY[
        'earmark_reserve(text, bigint, text, text, interval)',
        'earmark_charge(text, bigint, bigint, bigint)',
        'earmark_heartbeat(text, bigint)',
        'earmark_settle(text, bigint, bigint, text)',
        'earmark_budget(text, text, timestamptz)',
        'earmark_record_usage(text, bigint, text, text, timestamptz)',
        'earmark_record_usage_many(text, bigint[], text[], text[], timestamptz[])',
        'earmark_reserve_many(text, bigint[], text[], text[], interval)',
        'earmark_settle_many(text, bigint[], bigint[], text[])',
        'earmark_set_limit(text, bigint, text)',
        'earmark_set_account(text, timestamptz, text, text)',
        'earmark_set_escrow(text, int)',
        'earmark_reconcile(text, text)',
        'earmark_refresh_limits(text)',
        'earmark.sweep_account(text, int)',
        'earmark.store_limits(text, text[], bigint[])',
        'earmark.report_cycle(text, bigint, text, bigint, boolean, integer, text, double precision, boolean, boolean, bigint, text, timestamptz, timestamptz)'];
    t text;
    f text;
    n_dist int;
    colocation int;
    bad text;
    n_rows bigint;
    ids text;
    w record;
BEGIN
    -- before any table is locked: a pass of the worker that had read a
    -- table and then waited for one distributed here deadlocked with this
    PERFORM earmark.distribution_lock();
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'earmark_distribute needs Citus'
            USING ERRCODE = '55000',
                  HINT = 'Create the extension citus in this database first; earmark runs on one node without it.';
    END IF;
    IF NOT (SELECT citus_is_coordinator()) THEN
        RAISE EXCEPTION 'earmark_distribute runs on the Citus coordinator'
            USING ERRCODE = '55000', HINT = 'Connect to the coordinator and run it there.';
    END IF;
    SELECT string_agg(nodename || ':' || nodeport, ', ') INTO bad
      FROM pg_dist_node WHERE noderole = 'primary' AND NOT (hasmetadata AND metadatasynced)
       AND groupid <> 0;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'the metadata of Citus nodes % is not synced', bad
            USING ERRCODE = '55000', HINT = 'Wait for citus_add_node to finish, or run start_metadata_sync_to_node.';
    END IF;
    SELECT string_agg(nodename || ':' || nodeport || ' has ' || coalesce(result, '?'), ', ') INTO bad
      FROM run_command_on_workers($c$SELECT extversion FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'earmark'$c$)
     WHERE NOT success OR result IS DISTINCT FROM (SELECT extversion FROM pg_extension WHERE extname = 'earmark');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'earmark is not the same version on every node: %', bad
            USING ERRCODE = '55000',
                  HINT = 'Install the same earmark library on every node and run ALTER EXTENSION earmark UPDATE on the coordinator.';
    END IF;

    -- earmark's planner hook (installed only when the library is preloaded)
    -- keeps Citus from crashing on a call that planning made bare: every
    -- node must preload it.  earmark.database is a postmaster setting only
    -- when the library was preloaded.
    SELECT string_agg(n, ', ') INTO bad FROM (
        SELECT 'the coordinator' AS n
         WHERE (SELECT context FROM pg_settings WHERE name = 'earmark.database')
               IS DISTINCT FROM 'postmaster'
        UNION ALL
        SELECT nodename || ':' || nodeport
          FROM run_command_on_workers($c$SELECT context FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'earmark.database'$c$)
         WHERE NOT success OR result IS DISTINCT FROM 'postmaster') s;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'earmark is not in shared_preload_libraries on every node: %', bad
            USING ERRCODE = '55000',
                  HINT = 'Set shared_preload_libraries = ''citus,earmark'' on every node, restart them, and run earmark_distribute() again.';
    END IF;

    -- whole or nothing: a half-distributed install is refused
    SELECT count(*) INTO n_dist FROM pg_dist_partition
     WHERE logicalrelid::text = ANY (per_account || reference);
    IF n_dist > 0 AND n_dist < cardinality(per_account) + cardinality(reference) THEN
        RAISE EXCEPTION 'earmark is half-distributed: % of its % tables are distributed',
                        n_dist, cardinality(per_account) + cardinality(reference)
            USING ERRCODE = '55000',
                  HINT = 'SELECT logicalrelid FROM pg_dist_partition shows which; undistribute them (undistribute_table) and run earmark_distribute() again.';
    END IF;
    -- a worker's own copy of a coordinator table is never read: rows a call
    -- stored there (an inbox event, a key set) would be lost, refuse.  The
    -- install script's handler row and the worker's own reporter state are
    -- not data (emptied at the end).
    SELECT string_agg(r.nodename || ':' || r.nodeport || ' ' || u.rel || ' (' || coalesce(r.result, '?') || ' rows)', ', ')
      INTO bad
      FROM unnest(coord_only[1:4]) AS u (rel),
           LATERAL run_command_on_workers(format('SELECT pg_catalog.count(*) FROM ONLY %s %s', u.rel,
               CASE WHEN u.rel = 'earmark.inbox_handler'
                    THEN $w$WHERE (event_type, handler::oid, accepts_unverified) IS DISTINCT FROM
                                  ('customer.plan_changed'::text, 'earmark.apply_plan_change(earmark.inbox_event)'::regprocedure::oid, false)$w$
                    ELSE '' END)) r
     WHERE NOT r.success OR r.result <> '0';
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'earmark tables on worker nodes hold rows of their own: %', bad
            USING ERRCODE = '55000',
                  HINT = 'Those rows were written by calls that ran on a worker, where the coordinator''s tables are not read; move them to the coordinator or delete them, then run it again.';
    END IF;

    IF n_dist = 0 THEN
        -- rows a call wrote into a worker's own copy before distribution
        -- would be hidden by the distributed table: refuse instead
        SELECT string_agg(r.nodename || ':' || r.nodeport || ' ' || u.rel || ' (' || r.result || ' rows)', ', ')
          INTO bad
          FROM unnest(per_account || reference) AS u (rel),
               LATERAL run_command_on_workers(format('SELECT pg_catalog.count(*) FROM ONLY %s', u.rel)) r
         WHERE NOT r.success OR r.result <> '0';
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION 'earmark tables on worker nodes hold rows of their own: %', bad
                USING ERRCODE = '55000',
                      HINT = 'Those rows were written by calls that ran on a worker before earmark was distributed; move them to the coordinator or delete them, then run it again.';
        END IF;
        FOREACH t IN ARRAY per_account LOOP
            IF t = 'earmark.account' THEN
                PERFORM create_distributed_table(t, 'account');
            ELSE
                PERFORM create_distributed_table(t, 'account', colocate_with => 'earmark.account');
            END IF;
            object := t; action := 'distributed by account'; RETURN NEXT;
        END LOOP;
        FOREACH t IN ARRAY reference LOOP
            PERFORM create_reference_table(t);
            object := t; action := 'reference table'; RETURN NEXT;
        END LOOP;
        FOREACH t IN ARRAY per_account || reference LOOP
            PERFORM truncate_local_data_after_distributing_table(t);
        END LOOP;
    END IF;

    SELECT colocationid INTO colocation FROM pg_dist_partition
     WHERE logicalrelid = 'earmark.account'::regclass;
    SELECT string_agg(logicalrelid::text, ', ') INTO bad FROM pg_dist_partition
     WHERE logicalrelid::text = ANY (per_account)
       AND (partmethod <> 'h' OR colocationid <> colocation
            OR column_to_column_name(logicalrelid, partkey) <> 'account');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'earmark tables % are distributed otherwise than by account with earmark.account', bad
            USING ERRCODE = '55000', HINT = 'Undistribute them and run earmark_distribute() again.';
    END IF;

    FOREACH f IN ARRAY functions LOOP
        -- the API functions are in the schema the extension was created in
        IF f NOT LIKE 'earmark.%' THEN
            f := format('%I.%s', (SELECT n.nspname FROM pg_extension e
                                    JOIN pg_namespace n ON n.oid = e.extnamespace
                                   WHERE e.extname = 'earmark'), f);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_dist_object o
                        WHERE o.classid = 'pg_proc'::regclass AND o.objid = f::regprocedure
                          AND o.distribution_argument_index = 0 AND o.colocationid = colocation
                          AND o.force_delegation) THEN
            PERFORM create_distributed_function(f::regprocedure, distribution_arg_name => 'account',
                                                colocate_with => 'earmark.account',
                                                force_delegation => true);
            object := f; action := 'distributed by account, delegated'; RETURN NEXT;
        END IF;
    END LOOP;

    -- ids are the node's group over the node's own sequence (next_id):
    -- each node's sequences move past the largest id its group issued,
    -- which after a restore are in the tables but not in the sequences
    SELECT string_agg(format('(%s, %L, %s)', g, seq, m), ', ') INTO ids FROM (
        SELECT job_id >> 48 AS g, 'earmark.job_id_seq' AS seq, max(job_id & 281474976710655) AS m
          FROM earmark.job GROUP BY 1
        UNION ALL
        SELECT budget_id >> 48, 'earmark.budget_id_seq', max(budget_id & 281474976710655)
          FROM earmark.budget GROUP BY 1
        UNION ALL
        SELECT entry_id >> 48, 'earmark.entry_id_seq', max(entry_id & 281474976710655)
          FROM earmark.ledger_entry GROUP BY 1
        UNION ALL
        SELECT send_id >> 48, 'earmark.send_id_seq', max(send_id & 281474976710655)
          FROM earmark.meter_send GROUP BY 1
        UNION ALL
        SELECT evidence_id >> 48, 'earmark.evidence_id_seq', max(evidence_id & 281474976710655)
          FROM earmark.evidence GROUP BY 1) s;
    IF ids IS NOT NULL THEN
        ids := format($q$SELECT pg_catalog.count(pg_catalog.setval(v.seq::regclass, v.m))
                           FROM (VALUES %s) v (g, seq, m)
                          WHERE v.g OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group)
                            AND v.m OPERATOR(pg_catalog.>) coalesce(pg_catalog.pg_sequence_last_value(v.seq::regclass), 0)$q$, ids);
        EXECUTE ids INTO n_rows;
        IF n_rows > 0 THEN
            object := 'the coordinator'; action := format('%s id sequences moved past its ids', n_rows);
            RETURN NEXT;
        END IF;
        FOR w IN SELECT * FROM run_command_on_workers(ids) LOOP
            IF NOT w.success THEN
                RAISE EXCEPTION 'could not set the id sequences of %:%: %', w.nodename, w.nodeport, w.result
                    USING ERRCODE = '55000';
            END IF;
            IF w.result <> '0' THEN
                object := w.nodename || ':' || w.nodeport;
                action := format('%s id sequences moved past its ids', w.result);
                RETURN NEXT;
            END IF;
        END LOOP;
    END IF;

    -- last: the workers' own copies of the coordinator's tables hold the
    -- install script's rows (reporter_state, inbox_handler), emptied there
    -- (a TRUNCATE there is not Citus's to propagate)
    SELECT sum(r.result::bigint) INTO n_rows
      FROM unnest(coord_only) AS u (rel),
           LATERAL run_command_on_workers(format('SELECT pg_catalog.count(*) FROM ONLY %s', u.rel)) r
     WHERE r.success;
    IF n_rows > 0 THEN
        FOR w IN SELECT * FROM run_command_on_workers(format(
                     $q$DO $d$ BEGIN SET LOCAL citus.enable_ddl_propagation = off; TRUNCATE ONLY %s; END $d$ $q$,
                     array_to_string(coord_only, ', '))) LOOP
            IF NOT w.success THEN
                RAISE EXCEPTION 'could not empty the coordinator''s tables on %:%: %', w.nodename, w.nodeport, w.result
                    USING ERRCODE = '55000';
            END IF;
        END LOOP;
        object := array_to_string(coord_only, ', '); action := 'emptied on the workers'; RETURN NEXT;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION earmark_distribute() FROM PUBLIC;

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

-- earmark_inbox_ignore under a name in earmark's own schema, for
-- apply_plan_change: a role that may create in the extension's schema
-- (public's owner) could add an overload of earmark_inbox_ignore there
-- with a defaulted third argument, which makes a call of two arguments
-- ambiguous (42725) and would fail every plan change it should ignore.
-- No role but earmark's owner creates in schema earmark.
CREATE FUNCTION earmark.inbox_ignore(event_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_ignore'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY INVOKER;
REVOKE ALL ON FUNCTION earmark.inbox_ignore(bigint, text) FROM PUBLIC;

-- The built-in handler of the provider's plan change
-- (customer.plan_changed): it records the plan only when the event is newer
-- than the stored change (a tie is ignored), and gives the account the
-- plan's limits, so that the next admission uses the new plan: a feature
-- that some plan sets and the new one does not loses its limit row (its
-- admissions are refused), unless the new plan sets no limit at all,
-- which leaves the account's limits as they were.  A feature no plan sets
-- keeps its limit (set by hand), and a row the provider gave (source
-- 'provider') is not removed: the limit refresh owns it.
--
-- Only a verified event may change a plan (the worker gives it no other,
-- and it checks again).  Intake refuses an event time ahead of the clock by
-- more than earmark.webhook_tolerance (EM108); here the bound is 24 h, the
-- greatest allowance, so that an event taken under a larger allowance
-- still applies, and a stored time taken so still guards, when the
-- allowance was lowered since or the clock stepped back.  An older
-- version may have stored a time further ahead: it guards nothing.
--
-- Locks: the account's earmark.account_limit rows first, its
-- earmark.account row last, the order of the limit refresh
-- (em_refresh_account_limits in limit_cache.c), so that the two never
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
    -- further ahead than any allowance could have let in (24 h, the
    -- greatest earmark.webhook_tolerance): an event time is not applied, a
    -- stored one guards nothing
    horizon timestamptz := clock_timestamp() + interval '24 hours';
    stored timestamptz;
    lim_row record;
    n int;
BEGIN
    IF e.verified_by IS NULL THEN
        PERFORM earmark.inbox_ignore(e.event_id,
            'not applied: an unverified plan change (only a signed event, or one a member of earmark_admin stored, may change a plan)');
        RETURN 'ignored';
    END IF;
    SELECT a.plan_changed_at INTO stored FROM earmark.account a WHERE a.account = e.account;
    IF e.account IS NULL OR NOT FOUND THEN
        PERFORM earmark.inbox_ignore(e.event_id, 'the event names no known account');
        RETURN 'ignored';
    END IF;
    IF new_plan IS NULL THEN
        RAISE EXCEPTION 'plan change event % has no data.plan.key', e.event_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF e.occurred_at > horizon THEN
        PERFORM earmark.inbox_ignore(e.event_id, 'not applied: the event time is in the future');
        RETURN 'ignored';
    END IF;
    IF stored > horizon THEN
        stored := NULL;                 -- a time from the future guards nothing
    END IF;
    IF stored >= e.occurred_at THEN
        PERFORM earmark.inbox_ignore(e.event_id, 'a newer plan change is already stored');
        RETURN 'ignored';
    END IF;
    BEGIN
        -- the new plan's limits, and no limit for a feature that another
        -- plan sets and this one does not (it is refused from now on: fail
        -- closed), one feature at a time in feature order
        FOR lim_row IN
            SELECT x.* FROM (
                SELECT p.feature, p.lim, true AS kept
                  FROM earmark.plan_limit p WHERE p.plan = new_plan
                UNION ALL
                SELECT DISTINCT o.feature, NULL::bigint, false
                  FROM earmark.plan_limit o
                 WHERE EXISTS (SELECT 1 FROM earmark.plan_limit p WHERE p.plan = new_plan)
                   AND NOT EXISTS (SELECT 1 FROM earmark.plan_limit p
                                    WHERE p.plan = new_plan AND p.feature = o.feature)) x
             ORDER BY x.feature COLLATE "C"
        LOOP
            IF lim_row.kept THEN
                INSERT INTO earmark.account_limit AS l (account, feature, lim, source, updated_at)
                VALUES (e.account, lim_row.feature, lim_row.lim, 'manual', now())
                ON CONFLICT (account, feature) DO UPDATE SET lim = excluded.lim, updated_at = excluded.updated_at;
            ELSE
                DELETE FROM earmark.account_limit l
                 WHERE l.account = e.account AND l.feature = lim_row.feature AND l.source = 'manual';
            END IF;
        END LOOP;
        UPDATE earmark.account
           SET plan = new_plan, plan_changed_at = e.occurred_at, updated_at = now()
         WHERE account = e.account
           AND (plan_changed_at IS NULL OR plan_changed_at < e.occurred_at OR plan_changed_at > horizon);
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 0 THEN
            RAISE EXCEPTION 'a newer plan change was stored meanwhile' USING ERRCODE = 'EMP01';
        END IF;
    EXCEPTION WHEN SQLSTATE 'EMP01' THEN
        PERFORM earmark.inbox_ignore(e.event_id, 'a newer plan change is already stored');
        RETURN 'ignored';
    END;
    RETURN 'plan set to ' || new_plan;
END
$$;

-- ---------------------------------------------------------------------------
-- The admission rate limit keeps its state in shared memory (ratelimit.c),
-- not in a row every admission of the account would update.
-- ---------------------------------------------------------------------------
ALTER TABLE earmark.account DROP COLUMN rate_tat;

-- ---------------------------------------------------------------------------
-- A worker per database (launcher.c): workers_running counts this
-- database's.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION earmark.workers_running() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT count(*) FROM pg_catalog.pg_stat_activity
      WHERE backend_type = 'earmark worker' AND datname = pg_catalog.current_database() $$;

-- The launcher (launcher.c) starts this database's worker now rather than
-- at its next look at the databases.
CREATE FUNCTION earmark.wake_launcher() RETURNS void
AS 'MODULE_PATHNAME', 'earmark_wake_launcher' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION earmark.wake_launcher() FROM PUBLIC;
SELECT earmark.wake_launcher();

------------------------------------------------------------------------------
-- Batches (src/batch.c), issue 13: many events of one account in one call.
-- (earmark_distribute above lists them.)
------------------------------------------------------------------------------

-- One account per call, so that on Citus a call runs on that account's
-- node alone (earmark_distribute distributes them by account).  Parallel
-- arrays, a row per element with its 1-based position (ord); the same
-- rules, idempotency and errors as the single calls one after another in
-- one transaction (docs/api.md "Batches").
CREATE FUNCTION earmark_record_usage_many(account text, units bigint[], idempotency_keys text[],
                                          features text[] DEFAULT NULL,
                                          occurred_at timestamptz[] DEFAULT NULL)
RETURNS TABLE (ord int, idempotency_key text, recorded boolean)
AS 'MODULE_PATHNAME', 'earmark_record_usage_many'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_reserve_many(account text, amounts bigint[], idempotency_keys text[],
                                     features text[] DEFAULT NULL, lease interval DEFAULT NULL)
RETURNS TABLE (ord int, idempotency_key text, job_id bigint, admitted boolean, remaining bigint,
               reason text)
AS 'MODULE_PATHNAME', 'earmark_reserve_many'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_settle_many(account text, job_ids bigint[], used bigint[] DEFAULT NULL,
                                    outcomes text[] DEFAULT NULL)
RETURNS TABLE (ord int, job_id bigint, charged bigint, released bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_settle_many'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 100
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION
    earmark_record_usage_many(text, bigint[], text[], text[], timestamptz[]),
    earmark_reserve_many(text, bigint[], text[], text[], interval),
    earmark_settle_many(text, bigint[], bigint[], text[])
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    earmark_record_usage_many(text, bigint[], text[], text[], timestamptz[]),
    earmark_reserve_many(text, bigint[], text[], text[], interval),
    earmark_settle_many(text, bigint[], bigint[], text[])
TO earmark_user;

-- ---------------------------------------------------------------------------
-- Citus: earmark_set_plan_limit refuses on a worker node of a distributed
-- install (plans are set on the coordinator).
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION earmark_set_plan_limit(plan text, lim bigint, feature text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    off_coordinator boolean;
BEGIN
    -- the same argument rules as the C functions' names and limits
    IF plan IS NULL OR feature IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN plan IS NULL THEN 'plan' ELSE 'feature' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF plan = '' OR feature = '' THEN
        RAISE EXCEPTION '% must not be empty', CASE WHEN plan = '' THEN 'plan' ELSE 'feature' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(plan) > 255 OR length(feature) > 255 THEN
        RAISE EXCEPTION '% is too long', CASE WHEN length(plan) > 255 THEN 'plan' ELSE 'feature' END
            USING ERRCODE = 'string_data_right_truncation',
                  DETAIL = 'The most is 255 characters.';
    END IF;
    IF lim < 0 THEN
        RAISE EXCEPTION 'lim must not be negative' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'NULL means unlimited.';
    END IF;
    -- on a distributed install plans are the coordinator's to set, as the
    -- inbox and the webhook secrets are (docs/scale-out.md)
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE $q$SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                                    WHERE logicalrelid = 'earmark.account'::regclass)
                          AND (SELECT groupid <> 0 FROM pg_catalog.pg_dist_local_group)$q$
           INTO off_coordinator;
        IF off_coordinator THEN
            RAISE EXCEPTION 'earmark_set_plan_limit runs on the Citus coordinator'
                USING ERRCODE = 'feature_not_supported',
                      DETAIL = 'On a distributed install the plans, the inbox, the key set cache and the reporter''s state are set on the coordinator.',
                      HINT = 'Connect to the coordinator and call it there.';
        END IF;
    END IF;
    INSERT INTO earmark.plan_limit AS p (plan, feature, lim)
    VALUES (earmark_set_plan_limit.plan, earmark_set_plan_limit.feature, earmark_set_plan_limit.lim)
    ON CONFLICT ON CONSTRAINT plan_limit_pkey DO UPDATE SET lim = excluded.lim;
END
$$;

------------------------------------------------------------------------------
-- Reconciliation: a proven repair's evidence row has the verdict 'repaired'
-- (the drift it fixed is in its cause), so that later runs, which return
-- that row while the meter equals the ledger, do not read as a drift.
-- Rows written by 0.2.0 keep their verdicts.
------------------------------------------------------------------------------
ALTER TABLE earmark.evidence DROP CONSTRAINT evidence_verdict_check;
ALTER TABLE earmark.evidence ADD CONSTRAINT evidence_verdict_check
    CHECK (verdict IN ('match', 'unreadable', 'closed_cycle_drift',
                       'over_billed', 'under_billed', 'repaired'));

-- ---------------------------------------------------------------------------
-- Inbox: the claim's plan (src/inbox.c).  earmark_inbox_claim_plan shows
-- the plan a claim runs, for admins.  No index on the events' account:
-- nothing looks events up by it, and every index costs each receive,
-- claim and completion a write.
-- ---------------------------------------------------------------------------
DROP INDEX earmark.inbox_event_account;
CREATE FUNCTION earmark_inbox_claim_plan(max_events int DEFAULT 10, with_handler boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'earmark_inbox_claim_plan'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 30
SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION earmark_inbox_claim_plan(int, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_inbox_claim_plan(int, boolean) TO earmark_admin;

-- ---------------------------------------------------------------------
-- The key's index is led by the key (earmark.sql): a key's look-up and
-- uniqueness check compare the key first, the account only on a tie.
DROP INDEX earmark.ledger_entry_key;
CREATE UNIQUE INDEX ledger_entry_key ON earmark.ledger (entry_key, account)
    WHERE entry_key IS NOT NULL;

-- ---------------------------------------------------------------------------
-- Inbox: claims as HOT updates (src/inbox.c, docs/inbox.md#benchmark).  The
-- due index's predicate moves from status to finished (status applied,
-- ignored or dead), which a claim leaves alone; inbox_event_leased goes (a
-- claim finds passed leases in its walk of inbox_event_due); the fillfactor
-- leaves room on each page for the claims' new row versions (on the pages
-- written from now on; VACUUM FULL applies it to the old ones).  The CHECK
-- constraints on status and verified_by go: only inbox.c writes them, with
-- its own constants.  (finished is added without a default, then filled,
-- so that the table has no "missing value" a fresh install's does not have.)
-- ---------------------------------------------------------------------------
ALTER TABLE earmark.inbox_event ADD COLUMN finished boolean;
UPDATE earmark.inbox_event SET finished = status IN ('applied', 'ignored', 'dead');
ALTER TABLE earmark.inbox_event ALTER COLUMN finished SET DEFAULT false,
                                ALTER COLUMN finished SET NOT NULL;
ALTER TABLE earmark.inbox_event DROP CONSTRAINT inbox_event_status_check,
                                DROP CONSTRAINT inbox_event_verified_by_check;
ALTER TABLE earmark.inbox_event SET (fillfactor = 50);
DROP INDEX earmark.inbox_event_leased;
DROP INDEX earmark.inbox_event_due;
CREATE INDEX inbox_event_due ON earmark.inbox_event (occurred_at, event_id)
    WHERE NOT finished;
-- the worker's claim walks the handled types' due events only (src/earmark.sql)
CREATE INDEX inbox_event_typed_due ON earmark.inbox_event (event_type, occurred_at, event_id)
    WHERE NOT finished;

-- ---------------------------------------------------------------------------
-- Inbox: no foreign key from a receipt to its event, and no index on the
-- receipts' event_id (src/earmark.sql says why; docs/inbox.md#the-event-row).
-- ---------------------------------------------------------------------------
ALTER TABLE earmark.inbox_receipt DROP CONSTRAINT inbox_receipt_event_id_fkey;
DROP INDEX earmark.inbox_receipt_event;

-- ---------------------------------------------------------------------------
-- Inbox: the event's key moves to the first delivery's receipt, which is
-- written once (src/earmark.sql says why).  Each event's first receipt
-- with inserted takes the event's key; an event without one (its receipts
-- deleted by hand, or the event inserted by hand) gets one, dated at its
-- arrival.
-- ---------------------------------------------------------------------------
ALTER TABLE earmark.inbox_receipt ADD COLUMN source text, ADD COLUMN dedupe_key text;
UPDATE earmark.inbox_receipt r
   SET source = e.source, dedupe_key = e.dedupe_key
  FROM (SELECT pg_catalog.min(receipt_id) AS receipt_id, event_id
          FROM earmark.inbox_receipt WHERE inserted GROUP BY event_id) f
  JOIN earmark.inbox_event e ON e.event_id = f.event_id
 WHERE r.receipt_id = f.receipt_id;
INSERT INTO earmark.inbox_receipt (event_id, inserted, received_at, source, dedupe_key)
SELECT e.event_id, true, e.received_at, e.source, e.dedupe_key
  FROM earmark.inbox_event e
 WHERE NOT EXISTS (SELECT 1 FROM earmark.inbox_receipt r
                    WHERE r.event_id = e.event_id AND r.dedupe_key IS NOT NULL);
CREATE UNIQUE INDEX inbox_receipt_key ON earmark.inbox_receipt (dedupe_key, source)
    WHERE dedupe_key IS NOT NULL;
ALTER TABLE earmark.inbox_event DROP CONSTRAINT inbox_event_source_dedupe_key_key;

-- ---------------------------------------------------------------------
-- A settled job is its own ledger entry.  A settlement (or an
-- expiry) writes its charged units, budget and settled_at into the job
-- row it updates anyway, and inserts no ledger row.  The table becomes
-- earmark.ledger_entry (recorded usage, corrections, and the job rows
-- 0.2.0 wrote, all kept as they are), and earmark.ledger a view of it and
-- of the settled jobs that charged something and have no row of their own
-- there: a job 0.2.0 settled counts through its row, once.
-- ---------------------------------------------------------------------
ALTER TABLE earmark.ledger RENAME TO ledger_entry;
CREATE VIEW earmark.ledger AS
SELECT e.entry_id, e.budget_id, e.units, e.job_id, e.entry_key, e.occurred_at, e.recorded_at,
       e.account
  FROM earmark.ledger_entry e
UNION ALL
SELECT NULL::bigint, j.budget_id, j.charged, j.job_id, NULL::text, j.settled_at, j.settled_at,
       j.account
  FROM earmark.job j
 WHERE j.charged > 0
   AND NOT EXISTS (SELECT 1 FROM earmark.ledger_entry o
                    WHERE o.account = j.account AND o.job_id = j.job_id);
REVOKE ALL ON earmark.ledger FROM PUBLIC;
-- a cycle's settled jobs, read by cycle (src/earmark.sql says why)
CREATE INDEX job_entry ON earmark.job (account, budget_id)
    WHERE charged > 0;

-- ---------------------------------------------------------------------------
-- The hot entry points pin their search path in C (src/spi.c,
-- em_call_pinned) instead of with a SET clause, which cost a GUC nesting
-- level and two recomputations of the namespace path a call.
-- ---------------------------------------------------------------------------
ALTER FUNCTION earmark_reserve(text, bigint, text, text, interval) RESET search_path;
ALTER FUNCTION earmark_charge(text, bigint, bigint, bigint) RESET search_path;
ALTER FUNCTION earmark_heartbeat(text, bigint) RESET search_path;
ALTER FUNCTION earmark_settle(text, bigint, bigint, text) RESET search_path;

-- ---------------------------------------------------------------------------
-- The inbox's entry points on the delivery and consumer paths pin their
-- search path in C too (src/spi.c, em_call_pinned; src/earmark.sql says
-- which and why none of them may run user code).
-- ---------------------------------------------------------------------------
ALTER FUNCTION earmark_inbox_receive(text, text, text, jsonb, timestamptz, text) RESET search_path;
ALTER FUNCTION earmark_inbox_receive_signed(text, text, text, text, text) RESET search_path;
ALTER FUNCTION earmark_inbox_claim(int, interval) RESET search_path;
ALTER FUNCTION earmark_inbox_complete(bigint, text) RESET search_path;
ALTER FUNCTION earmark_inbox_ignore(bigint, text) RESET search_path;
ALTER FUNCTION earmark_inbox_fail(bigint, text) RESET search_path;
