/* earmark update script, 0.1.0 to 0.2.0
 *
 * Takes a 0.1.0 schema, with its data, to exactly what earmark--0.2.0.sql
 * creates: the limit cache's columns on earmark.account, the ledger's
 * account for keyed usage, the usage counters, the reporter's and the
 * reconciler's tables, their functions and views, earmark_check(), and the
 * tables pg_dump keeps.  Columns added here go at the end of their table;
 * the 0.2.0 install script puts them there too.
 *
 * 0.1.0 wrote a ledger row only for a settled job (job_id set, entry_key
 * never), and a meter mark for every cycle such a row changed; nothing ever
 * reported.  The marks are kept: once updated, the reporter sends each
 * open cycle's total and lists each closed one for review (review_list).
 */

\echo Use "ALTER EXTENSION earmark UPDATE TO '0.2.0'" to load this file. \quit

-- The limit cache (provider kinde or http).  NULL everywhere: a manual
-- limit never ages, and a provider's is read on the first admission.
ALTER TABLE earmark.account
    ADD COLUMN limits_fetched_at timestamptz,
    ADD COLUMN limits_wanted_at  timestamptz,
    ADD COLUMN limits_tried_at   timestamptz,
    ADD COLUMN limits_error      text;

-- The worker's limits pass looks for accounts an admission flagged.
CREATE INDEX account_limits_wanted ON earmark.account (limits_wanted_at)
    WHERE limits_wanted_at IS NOT NULL;

-- Slots, usage shards and meter marks go with their budget rows.
CREATE OR REPLACE FUNCTION earmark.truncate_slots() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM earmark.budget_slot;
    DELETE FROM earmark.usage_shard;
    DELETE FROM earmark.meter_mark;
    RETURN NULL;
END
$$;

-- The ledger's keyed rows (earmark_record_usage) carry their account, and
-- a key is unique per account.  A job's row has none, in 0.2.0 as well;
-- 0.1.0 wrote no keyed row, but should one be there its account is its
-- cycle's.
ALTER TABLE earmark.ledger ADD COLUMN account text;
UPDATE earmark.ledger l SET account = b.account
  FROM earmark.budget b
 WHERE l.entry_key IS NOT NULL AND b.budget_id = l.budget_id;
CREATE UNIQUE INDEX ledger_entry_key ON earmark.ledger (account, entry_key)
    WHERE entry_key IS NOT NULL;

-- The counters of recorded usage: a cycle's units from earmark_record_usage
-- split over 64 rows, one picked at random per write, added on read.  So
-- many concurrent writers on one account rarely touch the same row, and
-- reading a total never scans the ledger.  (Settled jobs count in the
-- budget row and its escrow slots, which their settlement locks anyway.)
CREATE TABLE earmark.usage_shard (
    budget_id   bigint NOT NULL,
    shard       int NOT NULL,
    units       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (budget_id, shard)
) WITH (fillfactor = 50);

-- the reporter claims the oldest marks first
CREATE INDEX meter_mark_order ON earmark.meter_mark (marked_at, budget_id);

-- Every total sent to the provider's meter, by the reporter or by a
-- reconciliation's repair, with the answer.  The last row with ok is "the
-- last total sent".
CREATE TABLE earmark.meter_send (
    send_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id   bigint NOT NULL,
    total       bigint NOT NULL,
    origin      text NOT NULL CHECK (origin IN ('report', 'repair')),
    ok          boolean NOT NULL,
    http_status int,
    error       text,
    duration_ms double precision,
    sent_at     timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX meter_send_budget ON earmark.meter_send (budget_id, send_id);

-- Cycles that changed after they closed: the reporter does not write a
-- closed cycle (what that does to an invoice is the provider's business),
-- it lists it here for a person.
CREATE TABLE earmark.meter_review (
    budget_id    bigint PRIMARY KEY,
    account      text NOT NULL,
    feature      text NOT NULL,
    cycle_start  timestamptz NOT NULL,
    cycle_end    timestamptz NOT NULL,
    ledger_total bigint NOT NULL,
    last_sent    bigint,
    reason       text NOT NULL,
    first_noted  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_noted   timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- The local provider's meter: a stand-in that takes absolute totals and
-- reads them back, so that everything runs with no billing account.
CREATE TABLE earmark.local_meter (
    account     text NOT NULL,
    feature     text NOT NULL,
    cycle_start timestamptz NOT NULL,
    total       bigint NOT NULL,
    writes      bigint NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (account, feature, cycle_start)
);

-- The reporter's state: one row.  blocked_until is the provider's
-- RateLimit-Reset / Retry-After after a 429: no request goes out before.
CREATE TABLE earmark.reporter_state (
    only_row        boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    blocked_until   timestamptz,
    last_pass_at    timestamptz,
    last_pass_sent  int,
    last_pass_failed int,
    last_error      text
);
INSERT INTO earmark.reporter_state DEFAULT VALUES;

-- Reconciliation evidence: one row per cycle and distinct set of numbers.
-- A run on the same numbers as the cycle's last row adds none.
CREATE TABLE earmark.evidence (
    evidence_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_id        bigint NOT NULL,
    account          text NOT NULL,
    feature          text NOT NULL,
    cycle_start      timestamptz NOT NULL,
    cycle_end        timestamptz NOT NULL,
    closed           boolean NOT NULL,
    ledger_total     bigint NOT NULL,
    counter_total    bigint NOT NULL,            -- before a rebuild
    counters_rebuilt boolean NOT NULL,
    last_sent        bigint,
    provider_total   bigint,                     -- NULL: unreadable
    verdict          text NOT NULL CHECK (verdict IN ('match', 'unreadable', 'closed_cycle_drift',
                                                      'over_billed', 'under_billed')),
    cause            text,
    repaired_to      bigint,
    read_back        bigint,
    checked_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_checked_at  timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX evidence_budget ON earmark.evidence (budget_id, evidence_id);

-- as earmark--0.2.0.sql does for every table and sequence of the schema
REVOKE ALL ON earmark.usage_shard, earmark.meter_send, earmark.meter_review, earmark.local_meter,
              earmark.reporter_state, earmark.evidence FROM PUBLIC;
REVOKE ALL ON SEQUENCE earmark.meter_send_send_id_seq, earmark.evidence_evidence_id_seq FROM PUBLIC;

------------------------------------------------------------------------------
-- Usage ledger, meter and reconciliation (src/ledger.c, meter.c,
-- provider.c, reconcile.c)
------------------------------------------------------------------------------

CREATE FUNCTION earmark_record_usage(account text, units bigint, idempotency_key text,
                                     feature text DEFAULT 'default',
                                     occurred_at timestamptz DEFAULT pg_catalog.now())
RETURNS boolean
AS 'MODULE_PATHNAME', 'earmark_record_usage'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION earmark_record_usage(text, bigint, text, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_record_usage(text, bigint, text, text, timestamptz) TO earmark_user;

CREATE FUNCTION earmark_report(max_cycles int DEFAULT NULL)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_report'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_refresh_limits(account text)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_refresh_limits'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_reconcile(account text DEFAULT NULL, feature text DEFAULT NULL)
RETURNS SETOF earmark.evidence
AS 'MODULE_PATHNAME', 'earmark_reconcile'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 10
SET search_path = pg_catalog, pg_temp;

-- Monitoring: what the reporter and reconciler did and what waits for a
-- person.
CREATE VIEW earmark.review_list AS
    SELECT r.account, r.feature, r.cycle_start, r.cycle_end, r.ledger_total, r.last_sent,
           r.ledger_total - coalesce(r.last_sent, 0) AS unreported, r.reason,
           r.first_noted, r.last_noted, r.budget_id
      FROM earmark.meter_review r;

CREATE VIEW earmark.send_log AS
    SELECT x.send_id, b.account, b.feature, b.cycle_start, x.total, x.origin, x.ok,
           x.http_status, x.error, x.duration_ms, x.sent_at, x.budget_id
      FROM earmark.meter_send x LEFT JOIN earmark.budget b USING (budget_id);

-- The worker's backend, seen with the extension owner's rights: other roles
-- see no backend_type of another user's process in pg_stat_activity.
CREATE FUNCTION earmark.workers_running() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'earmark worker' $$;
REVOKE ALL ON FUNCTION earmark.workers_running() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark.workers_running() TO earmark_admin;

CREATE VIEW earmark.worker_status AS
    SELECT (SELECT pg_catalog.count(*) FROM earmark.meter_mark) AS marked_cycles,
           (SELECT pg_catalog.min(marked_at) FROM earmark.meter_mark) AS oldest_mark,
           r.last_pass_at AS last_report_at, r.last_pass_sent AS last_report_sent,
           r.last_pass_failed AS last_report_failed, r.last_error AS last_report_error,
           r.blocked_until AS report_blocked_until,
           (SELECT pg_catalog.count(*) FROM earmark.meter_review) AS cycles_to_review,
           (SELECT pg_catalog.count(*) FROM earmark.account WHERE limits_wanted_at IS NOT NULL) AS limits_wanted,
           (SELECT pg_catalog.count(*) FROM earmark.inbox_event WHERE status = 'dead') AS dead_events,
           earmark.workers_running() AS workers_running
      FROM earmark.reporter_state r;

REVOKE ALL ON earmark.review_list, earmark.send_log, earmark.worker_status FROM PUBLIC;
GRANT USAGE ON SCHEMA earmark TO earmark_admin;
GRANT SELECT ON earmark.review_list, earmark.send_log, earmark.worker_status, earmark.evidence
    TO earmark_admin;

REVOKE ALL ON FUNCTION
    earmark_report(int),
    earmark_refresh_limits(text),
    earmark_reconcile(text, text)
FROM PUBLIC;
-- sign-up flows read limits as the application; reports and
-- reconciliation are the admin's
GRANT EXECUTE ON FUNCTION earmark_refresh_limits(text) TO earmark_user;
GRANT EXECUTE ON FUNCTION earmark_report(int), earmark_reconcile(text, text) TO earmark_admin;

------------------------------------------------------------------------------
-- Invariant check (docs/design.md, "Invariants")
------------------------------------------------------------------------------

-- One row per violated invariant; none when the books are sound.  Reads
-- every budget, open job and ledger row: a DBA's tool (and every fault
-- test's last step), not a hot path.  Under READ COMMITTED each statement
-- sees its own snapshot, so run it in a REPEATABLE READ transaction (as
-- the tests do) for one consistent picture.
CREATE FUNCTION earmark_check()
RETURNS TABLE (invariant text, account text, feature text, cycle_start timestamptz, detail text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH b AS (
    SELECT b.budget_id, b.account, b.feature, b.cycle_start,
           b.used + coalesce((SELECT sum(s.used) FROM earmark.budget_slot s WHERE s.budget_id = b.budget_id), 0)::bigint AS job_used,
           b.held + coalesce((SELECT sum(s.held) FROM earmark.budget_slot s WHERE s.budget_id = b.budget_id), 0)::bigint AS held,
           coalesce((SELECT sum(u.units) FROM earmark.usage_shard u WHERE u.budget_id = b.budget_id), 0)::bigint AS recorded,
           coalesce((SELECT sum(j.amount) FROM earmark.job j
                      WHERE j.budget_id = b.budget_id AND j.status IN ('running', 'capped')), 0)::bigint AS open_holds,
           coalesce((SELECT sum(l.units) FROM earmark.ledger l WHERE l.budget_id = b.budget_id), 0)::bigint AS ledger,
           coalesce((SELECT sum(l.units) FROM earmark.ledger l
                      WHERE l.budget_id = b.budget_id AND l.job_id IS NOT NULL), 0)::bigint AS ledger_jobs,
           lim.lim, lim.account IS NOT NULL AS has_limit
      FROM earmark.budget b
      LEFT JOIN earmark.account_limit lim ON lim.account = b.account AND lim.feature = b.feature
)
SELECT 'over_limit', b.account, b.feature, b.cycle_start,
       format('used by jobs %s + held %s > limit %s (a limit lowered below what was already admitted also shows here)',
              b.job_used, b.held, b.lim)
  FROM b WHERE b.has_limit AND b.lim IS NOT NULL AND b.job_used + b.held > b.lim
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
REVOKE ALL ON FUNCTION earmark_check() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_check() TO earmark_admin;

------------------------------------------------------------------------------
-- Backups: what pg_dump keeps
------------------------------------------------------------------------------

-- pg_dump leaves an extension's tables to CREATE EXTENSION and dumps no
-- rows of them, except those of the tables registered here: the billing
-- state.  A restore creates the extension, then loads these rows into it.
-- Left out: earmark.jwks (a cache the worker fetches again) and
-- earmark.reporter_state (the reporter's last pass; its one row is the
-- install's, or this script's).  The built-in handler row is the install's
-- too, so only the other handlers are dumped.  The identity sequences go with their tables:
-- after a restore new ids follow the restored ones.
SELECT pg_catalog.pg_extension_config_dump('earmark.account', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.account_limit', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.plan_limit', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.budget', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.budget_slot', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.job', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.ledger', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.usage_shard', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.meter_mark', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.meter_send', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.meter_review', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.local_meter', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.evidence', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.inbox_event', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.inbox_receipt', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.inbox_handler',
                                           'WHERE event_type <> ''customer.plan_changed''');
SELECT pg_catalog.pg_extension_config_dump('earmark.webhook_secret', '');
-- (one call a statement: each updates the extension's catalog row)
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.budget', 'budget_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.job', 'job_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.ledger', 'entry_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.meter_send', 'send_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.evidence', 'evidence_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.inbox_event', 'event_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.inbox_receipt', 'receipt_id')::regclass, '');

-- earmark_set_plan_limit checks its arguments as the C functions do
CREATE OR REPLACE FUNCTION earmark_set_plan_limit(plan text, lim bigint, feature text DEFAULT 'default')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
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
    INSERT INTO earmark.plan_limit AS p (plan, feature, lim)
    VALUES (earmark_set_plan_limit.plan, earmark_set_plan_limit.feature, earmark_set_plan_limit.lim)
    ON CONFLICT ON CONSTRAINT plan_limit_pkey DO UPDATE SET lim = excluded.lim;
END
$$;
