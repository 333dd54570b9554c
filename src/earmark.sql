/* earmark install script: the one source of the current version's install
 * script (the Makefile copies it to earmark--<version>.sql).  A change to
 * it goes into the upgrade script from the last released version too, and
 * test/integration/upgrade.sh proves the two give the same schema.
 *
 *
 * Tables live in schema "earmark" and are written only through the API
 * functions, which are SECURITY DEFINER with a pinned search_path.  Callers
 * get EXECUTE through the role earmark_user; nothing here is granted to
 * PUBLIC.
 */

\echo Use "CREATE EXTENSION earmark" to load this file. \quit

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

CREATE SCHEMA earmark;
REVOKE ALL ON SCHEMA earmark FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'earmark_user') THEN
        CREATE ROLE earmark_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'earmark_admin') THEN
        CREATE ROLE earmark_admin NOLOGIN;
    END IF;
END
$$;

-- One row per customer account: its billing cycle anchor and provider ids.
CREATE TABLE earmark.account (
    account             text PRIMARY KEY,
    cycle_anchor        timestamptz,
    provider_customer   text,
    provider_agreement  text,
    -- the plan as the provider's plan-change events last set it, and the
    -- event time of that change: an older change never overwrites it
    plan                text,
    plan_changed_at     timestamptz,
    -- escrow slots for this account's budgets (NULL: earmark.escrow_slots)
    escrow_slots        int CHECK (escrow_slots BETWEEN 0 AND 256),
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- the limit cache (provider kinde or http): when the provider's limits
    -- were last read, when an admission found them stale and asked the
    -- worker for a refresh, and the last failed read.  (Added in 0.2.0
    -- after updated_at, where ALTER EXTENSION UPDATE puts them too.)
    limits_fetched_at   timestamptz,
    limits_wanted_at    timestamptz,
    limits_tried_at     timestamptz,
    limits_error        text,
    CONSTRAINT account_name_ok CHECK (account <> '' AND pg_catalog.length(account) <= 255)
);

-- The limit the gate enforces for an account and feature.  No row means the
-- limit is unknown and the gate refuses ("limit unknown"); a row with a NULL
-- lim means unlimited.
CREATE TABLE earmark.account_limit (
    account     text NOT NULL REFERENCES earmark.account ON DELETE CASCADE,
    feature     text NOT NULL,
    lim         bigint CHECK (lim >= 0),
    source      text NOT NULL DEFAULT 'manual' CHECK (source IN ('manual', 'provider')),
    updated_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (account, feature)
);

-- Ids.  Every per-account table holds the account in every key (so that
-- Citus can distribute earmark by account: earmark_distribute()); an id is
-- unique within its account, and unique in the whole cluster by
-- construction: earmark.next_id puts the node's Citus group id (0 without
-- Citus) in the top 16 bits of the node's own sequence value.  The
-- sequences are owned by their columns (TRUNCATE ... RESTART IDENTITY
-- restarts them).
CREATE FUNCTION earmark.next_id(seq regclass) RETURNS bigint
AS 'MODULE_PATHNAME', 'earmark_next_id' LANGUAGE C VOLATILE CALLED ON NULL INPUT;
REVOKE ALL ON FUNCTION earmark.next_id(regclass) FROM PUBLIC;

CREATE SEQUENCE earmark.budget_id_seq;
CREATE SEQUENCE earmark.job_id_seq;
CREATE SEQUENCE earmark.entry_id_seq;
CREATE SEQUENCE earmark.send_id_seq;
CREATE SEQUENCE earmark.evidence_id_seq;

-- One row per account, feature and billing cycle: the serial point of the
-- gate.  used is final usage (the sum of the cycle's ledger rows), held the
-- sum of the holds of running jobs.  Updated by every admission and
-- settlement, so it leaves room on its page for HOT updates.
--
-- The hot tables (budget, job, ledger, meter_mark) carry no foreign keys
-- and few CHECK constraints: each costs a trigger query or an expression
-- set-up on every write of the gate's hot path.  The gate's C code keeps
-- these rules, and earmark's tests check them after every scenario.
CREATE TABLE earmark.budget (
    budget_id   bigint NOT NULL DEFAULT earmark.next_id('earmark.budget_id_seq'),
    account     text NOT NULL REFERENCES earmark.account ON DELETE CASCADE,
    feature     text NOT NULL,
    cycle_start timestamptz NOT NULL,
    cycle_end   timestamptz NOT NULL,
    used        bigint NOT NULL DEFAULT 0,
    held        bigint NOT NULL DEFAULT 0,
    -- escrow: slots > 0 splits the budget's free room into that many
    -- earmark.budget_slot rows.  used and held above then count only what
    -- passed outside the slots; slot_lim and slot_gen are the limit and
    -- generation of the last rebalance; slot_cut counts the rebalances that
    -- cut room into slots (each stamps the slots it cuts, budget_slot.cut);
    -- slot_rec is the recorded usage the last rebalance read (NULL after a
    -- correction or a rebuild of the counters: not known); slot_limx and
    -- slot_limt the xmin and updated_at of the account's limit row as the
    -- last rebalance wrote (the version of the limit, whatever its value:
    -- an xid alone repeats after a restore or a wraparound).
    slots       int NOT NULL DEFAULT 0,
    slot_lim    bigint,
    slot_gen    bigint NOT NULL DEFAULT 0,
    slot_cut    bigint NOT NULL DEFAULT 0,
    slot_rec    bigint,
    slot_limx   bigint,
    slot_limt   timestamptz,
    UNIQUE (account, feature, cycle_start),
    PRIMARY KEY (account, budget_id)
) WITH (fillfactor = 50);
ALTER SEQUENCE earmark.budget_id_seq OWNED BY earmark.budget.budget_id;
-- earmark_reconcile walks every account's cycles in budget_id order, a
-- page at a time, each page starting after the last one's budget_id: the
-- primary key leads with the account, so without this index each page
-- sorted every cycle after it.  budget_id never changes: the budget row's
-- updates stay HOT, and only a new cycle's row writes an entry here.
CREATE INDEX budget_order ON earmark.budget (budget_id);

-- An escrow slot: part of a hot budget's room that admissions take without
-- locking the budget row.  room + held + used is the slot's allocation; an
-- admission moves room to held, a settlement held to used and back to
-- room, so only a rebalance (under the budget row's lock) changes it.  A
-- slot whose gen is not the budget's slot_gen admits nothing.  (No foreign
-- key: see escrow.c.  The account and cut columns are last: 0.3.0 added
-- them.)  cut is the budget's slot_cut of the rebalance that last cut the
-- slot's room: the fast path takes no room cut after its own read.
CREATE TABLE earmark.budget_slot (
    budget_id   bigint NOT NULL,
    slot        int NOT NULL,
    gen         bigint NOT NULL DEFAULT 0,
    room        bigint NOT NULL DEFAULT 0,
    held        bigint NOT NULL DEFAULT 0,
    used        bigint NOT NULL DEFAULT 0,
    account     text NOT NULL,
    cut         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (account, budget_id, slot)
) WITH (fillfactor = 50);

-- A job is a hold taken by earmark_reserve.  status is 'running' or
-- 'capped' while the hold is open, then one of 'completed', 'failed',
-- 'cancelled', 'expired'.
CREATE TABLE earmark.job (
    job_id          bigint NOT NULL DEFAULT earmark.next_id('earmark.job_id_seq'),
    budget_id       bigint NOT NULL,
    account         text NOT NULL,
    feature         text NOT NULL,
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL,                    -- > 0
    used            bigint NOT NULL DEFAULT 0,          -- 0 .. amount, what charges recorded
    last_step       bigint,
    status          text NOT NULL DEFAULT 'running',
    slot            int,                                -- the escrow slot that holds it, if any
    lease           interval NOT NULL,
    lease_until     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    settled_at      timestamptz,
    charged         bigint,
    released        bigint,
    UNIQUE (account, idempotency_key),
    -- a hold taken from an escrow slot: the slots' generation it was taken
    -- in; its settlement returns room only to a slot of that generation
    -- (added in 0.3.0, hence last)
    gen             bigint,
    -- Led by the account, not by job_id, although led by job_id (rising)
    -- a reserve's entry would go to the index's rightmost leaf and with a
    -- long history write fewer full-page images: under SERIALIZABLE a
    -- B-tree read locks the whole leaf, and a settlement reads and writes
    -- its job's leaf, so every open hold in the same few leaves made
    -- accounts that share no row fail one another with 40001
    -- (isolation spec serializable_accounts, docs/benchmarks.md).
    PRIMARY KEY (account, job_id)
) WITH (fillfactor = 70);
ALTER SEQUENCE earmark.job_id_seq OWNED BY earmark.job.job_id;

-- The worker's limits pass looks for accounts an admission flagged.
CREATE INDEX account_limits_wanted ON earmark.account (limits_wanted_at)
    WHERE limits_wanted_at IS NOT NULL;

-- The sweeper and reserve's reclaim look for open holds.  lease_until is
-- deliberately not indexed: every charge renews it, and an unindexed
-- column keeps that update HOT.
CREATE INDEX job_open ON earmark.job (account, budget_id)
    WHERE status IN ('running', 'capped');

-- A settled job that charged something is a ledger entry (earmark.ledger
-- below): a cycle's total (reconcile, earmark_check, an account's in-use
-- check) reads them by cycle here, not every job of the account.  The
-- settlement's update is not HOT anyway (job_open's predicate is on
-- status), so this costs one index entry a charged job.
CREATE INDEX job_entry ON earmark.job (account, budget_id)
    WHERE charged > 0;

-- The usage ledger: append-only, the record of what was used.  It is the
-- view earmark.ledger below, over two tables that nothing updates or
-- deletes a ledger row of:
--  * earmark.ledger_entry: usage that did not pass a hold
--    (earmark_record_usage), keyed by the caller's idempotency key, unique
--    per account, and corrections (negative units, in the cycle they
--    correct); and the rows settled jobs wrote before 0.3.0, keyed by
--    their job_id;
--  * earmark.job: since 0.3.0 a settled job that charged something is its
--    own ledger entry (charged units, budget_id, settled_at): the
--    settlement already writes that row, so it inserts no second one (a
--    heap row and an index entry fewer a job: job_entry's one entry for
--    the ledger row's two).  A settled job's row never changes again:
--    every UPDATE of earmark.job matches open jobs only (status 'running'
--    or 'capped') or follows a lock that found the job open, and nothing
--    deletes a job.
-- A job with a row of its own in earmark.ledger_entry (settled by 0.2.0)
-- counts through that row only, so nothing counts twice.
CREATE TABLE earmark.ledger_entry (
    entry_id        bigint NOT NULL DEFAULT earmark.next_id('earmark.entry_id_seq'),
    budget_id       bigint NOT NULL,
    units           bigint NOT NULL,
    job_id          bigint,                             -- a job's row (0.2.0), or
    entry_key       text,                               -- the caller's key and
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    account         text NOT NULL,                      -- (0.2.0 added it, hence last)
    -- led by budget_id, which the cycle totals read (with the account, the
    -- distribution column Citus wants in every unique key): no index of
    -- its own for them, one index write fewer per ledger row.  Led by the
    -- two bigints, not by the account: each comparison of an insert's
    -- descent is an integer one, where led by the account it compared two
    -- equal texts, then found budget_id past the account's variable length
    -- (a usage batch's event 9 % fewer instructions: docs/benchmarks.md).
    -- A cycle's id is its account's alone (earmark.next_id), so a read of
    -- (account, budget_id) reads only that cycle's rows.  (The names are
    -- those of 0.2.0's table, renamed by the upgrade.)
    CONSTRAINT ledger_pkey PRIMARY KEY (budget_id, entry_id, account)
);
ALTER SEQUENCE earmark.entry_id_seq OWNED BY earmark.ledger_entry.entry_id;
-- A job's row (0.2.0's) once: what the view earmark.ledger below looks up
-- to count such a job through its row only.  Partial: since 0.3.0 no row
-- has a job_id, and every recorded usage wrote a NULL entry here, one
-- index write per event that nothing reads (and a second index led by the
-- account, which a generic plan of a key's look-up could take).
CREATE UNIQUE INDEX ledger_account_job_id_key ON earmark.ledger_entry (account, job_id)
    WHERE job_id IS NOT NULL;
-- A key once per account.  Led by the key: each look-up of a key and each
-- uniqueness check of a new one compares the key first, and the account
-- only on a tie.  Led by the account, every comparison within an account
-- first compared two equal accounts, then found the key's column past the
-- account's variable length (comparisons were 21 % of a usage batch's
-- instructions; led by the key, an event costs 11 % fewer:
-- docs/benchmarks.md).
CREATE UNIQUE INDEX ledger_entry_key ON earmark.ledger_entry (entry_key, account)
    WHERE entry_key IS NOT NULL;

-- The ledger as one relation, with the columns of 0.2.0's table: a settled
-- job's entry has no entry_id (NULL), and its occurred_at and recorded_at
-- are its settled_at.  charged is set only by a settlement, so charged > 0
-- is a settled job that charged something.
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

-- The counters of recorded usage: a cycle's units from earmark_record_usage
-- split over 64 rows, one picked at random per write, added on read.  So
-- many concurrent writers on one account rarely touch the same row, and
-- reading a total never scans the ledger.  (Settled jobs count in the
-- budget row and its escrow slots, which their settlement locks anyway.)
CREATE TABLE earmark.usage_shard (
    budget_id   bigint NOT NULL,
    shard       int NOT NULL,
    units       bigint NOT NULL DEFAULT 0,
    account     text NOT NULL,
    PRIMARY KEY (account, budget_id, shard)
) WITH (fillfactor = 50);

-- Cycles whose ledger changed since the meter was last told.  A writer
-- inserts a mark when it sees none committed; more usage while the cycle
-- is marked writes nothing more.  No unique key: an insert never waits for
-- another writer's uncommitted mark (a wait that closed a cycle with that
-- writer's wait for a job row), so writers that ran together may each have
-- inserted one; a cycle is marked while it has any.  The reporter deletes
-- a cycle's marks only after the provider took the total, and only while
-- no writer that saw the cycle unmarked is still running (meter.c).
CREATE TABLE earmark.meter_mark (
    budget_id   bigint NOT NULL,
    marked_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    account     text NOT NULL
);
CREATE INDEX meter_mark_cycle ON earmark.meter_mark (account, budget_id);
CREATE INDEX meter_mark_order ON earmark.meter_mark (marked_at, account, budget_id);
-- Without a key, the whole row identifies a mark to logical replication:
-- Citus moves an account's shards that way (docs/scale-out.md), and only
-- the reporter deletes or updates marks.
ALTER TABLE earmark.meter_mark REPLICA IDENTITY FULL;

-- Every total sent to the provider's meter, by the reporter or by a
-- reconciliation's repair, with the answer.  The last row with ok is "the
-- last total sent".
CREATE TABLE earmark.meter_send (
    send_id     bigint NOT NULL DEFAULT earmark.next_id('earmark.send_id_seq'),
    budget_id   bigint NOT NULL,
    total       bigint NOT NULL,
    origin      text NOT NULL CHECK (origin IN ('report', 'repair')),
    ok          boolean NOT NULL,
    http_status int,
    error       text,
    duration_ms double precision,
    sent_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    account     text NOT NULL,
    PRIMARY KEY (account, send_id)
);
ALTER SEQUENCE earmark.send_id_seq OWNED BY earmark.meter_send.send_id;
CREATE INDEX meter_send_budget ON earmark.meter_send (account, budget_id, send_id);

-- Cycles that changed after they closed: the reporter does not write a
-- closed cycle (what that does to an invoice is the provider's business),
-- it lists it here for a person.
CREATE TABLE earmark.meter_review (
    budget_id    bigint NOT NULL,
    account      text NOT NULL,
    feature      text NOT NULL,
    cycle_start  timestamptz NOT NULL,
    cycle_end    timestamptz NOT NULL,
    ledger_total bigint NOT NULL,
    last_sent    bigint,
    reason       text NOT NULL,
    first_noted  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_noted   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (account, budget_id)
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
    evidence_id      bigint NOT NULL DEFAULT earmark.next_id('earmark.evidence_id_seq'),
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
                                                      'over_billed', 'under_billed', 'repaired')),
    cause            text,
    repaired_to      bigint,
    read_back        bigint,
    checked_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_checked_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (account, evidence_id)
);
ALTER SEQUENCE earmark.evidence_id_seq OWNED BY earmark.evidence.evidence_id;
CREATE INDEX evidence_budget ON earmark.evidence (account, budget_id, evidence_id);

------------------------------------------------------------------------------
-- Webhook inbox
------------------------------------------------------------------------------

-- One row per event, keyed by (source, dedupe_key): a copy of a delivery
-- adds one to seen_count and nothing else.  The key is kept unique by the
-- first delivery's receipt (earmark.inbox_receipt below), not here: a
-- completion's update of the event is not HOT (finished is in
-- inbox_event_due's predicate), and a unique index on the key here would
-- take a new entry on a scattered page at every completion (a full-page
-- image after each checkpoint).  occurred_at is the event's own
-- time, not the arrival.  status: received -> processing -> applied |
-- ignored | failed (waits next_attempt_at) -> dead after 6 attempts.
-- verified_by: how the event's source was verified (a signed intake, or a
-- member of earmark_admin who stored it); NULL: unverified, which a
-- handler takes only if it was registered as accepting unverified events.
-- finished: status is applied, ignored or dead (never claimed again).
-- (Both added in 0.3.0, hence last.)  No CHECK constraints: setting them
-- up cost every statement on the table more than a claim's walk, and only
-- inbox.c writes these columns, with its own constants (it refuses any
-- other status, verified_by or finished; docs/inbox.md#the-event-row).
CREATE TABLE earmark.inbox_event (
    event_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          text NOT NULL,
    dedupe_key      text NOT NULL,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    occurred_at     timestamptz NOT NULL,
    account         text,
    status          text NOT NULL DEFAULT 'received',
    attempts        int NOT NULL DEFAULT 0,
    seen_count      int NOT NULL DEFAULT 1,
    next_attempt_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    locked_until    timestamptz,
    result          text,
    last_error      text,
    received_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    verified_by     text,
    finished        boolean NOT NULL DEFAULT false
) WITH (fillfactor = 50);
-- Claims read due events in (occurred_at, event_id) order.  The predicate
-- is on finished, which a claim leaves alone, and no index holds status,
-- attempts or locked_until: a claim changes no indexed column, so its new
-- row version is a HOT update (no index entry) wherever the page has room,
-- which the fillfactor keeps for it.  A claim finds passed leases in this
-- same walk (docs/inbox.md#earmark_inbox_claim).
CREATE INDEX inbox_event_due ON earmark.inbox_event (occurred_at, event_id)
    WHERE NOT finished;
-- The worker's claim takes only events of types with a handler: it walks
-- this index once per handled type, so that a backlog of applications'
-- events is not read at each of its passes.  The same predicate: a claim
-- leaves it HOT, a completion writes no entry here.
CREATE INDEX inbox_event_typed_due ON earmark.inbox_event (event_type, occurred_at, event_id)
    WHERE NOT finished;
-- (no index on account: nothing in earmark looks events up by account,
-- and every index costs each receive, claim and completion a write)

-- Every delivery, copies included.  The first delivery's receipt
-- (inserted) carries the event's (source, dedupe_key), unique: it is the
-- key a copy finds, written once (a key whose event is gone is cleared
-- by the next delivery with it), so the event's own updates write no
-- entry in a key index.  A copy's receipt carries no key.  (source and
-- dedupe_key were added in 0.3.0, hence last.)  No foreign key to the
-- event: a receipt is written by the statement that stores the event or
-- counts the copy, with its id (store_first, store_copy in inbox.c), and
-- the key's check was a tenth of a receive.  No index on event_id:
-- nothing in earmark reads receipts by event, and every index costs each
-- receive a write.
CREATE TABLE earmark.inbox_receipt (
    receipt_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    bigint NOT NULL,
    inserted    boolean NOT NULL,
    received_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    source      text,
    dedupe_key  text
);
-- The key first: the source is the same in most entries, and each
-- comparison of a delivery's uniqueness check and of a copy's look-up
-- would compare it first, then read and compare the key.
CREATE UNIQUE INDEX inbox_receipt_key ON earmark.inbox_receipt (dedupe_key, source)
    WHERE dedupe_key IS NOT NULL;

-- Event types the worker applies, and the function that applies them:
-- handler(earmark.inbox_event) RETURNS text.  A handler is given only
-- verified events unless accepts_unverified (added in 0.3.0).
CREATE TABLE earmark.inbox_handler (
    event_type  text PRIMARY KEY,
    handler     regprocedure NOT NULL,
    accepts_unverified boolean NOT NULL DEFAULT false
);

-- Standard Webhooks secrets ("whsec_..."), per source; several rows for a
-- rotation.  Readable by superusers only.
CREATE TABLE earmark.webhook_secret (
    source      text NOT NULL,
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (source, secret)
);

-- The provider's JSON Web Key Set, as last fetched.
CREATE TABLE earmark.jwks (
    url         text PRIMARY KEY,
    keys        jsonb NOT NULL,
    fetched_at  timestamptz NOT NULL
);

REVOKE ALL ON ALL TABLES IN SCHEMA earmark FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA earmark FROM PUBLIC;

------------------------------------------------------------------------------
-- API
------------------------------------------------------------------------------

CREATE FUNCTION earmark_set_limit(account text, lim bigint, feature text DEFAULT 'default')
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_limit'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_set_account(account text,
                                    cycle_anchor timestamptz DEFAULT NULL,
                                    provider_customer text DEFAULT NULL,
                                    provider_agreement text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_account'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_budget(account text, feature text DEFAULT 'default', at timestamptz DEFAULT NULL)
RETURNS TABLE (cycle_start timestamptz, cycle_end timestamptz, lim bigint,
               used bigint, held bigint, remaining bigint, limit_state text)
AS 'MODULE_PATHNAME', 'earmark_budget'
LANGUAGE C CALLED ON NULL INPUT STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

-- reserve, charge, heartbeat and settle have no SET search_path clause: their
-- C code pins the same search path (pg_catalog, pg_temp) itself for exactly
-- the duration of the call, at a fraction of a SET clause's cost (spi.c,
-- em_call_pinned; docs/security.md).  Give none of them a SET clause back
-- without removing the pin.
CREATE FUNCTION earmark_reserve(account text, amount bigint, idempotency_key text,
                                feature text DEFAULT 'default', lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, admitted boolean, remaining bigint, reason text)
AS 'MODULE_PATHNAME', 'earmark_reserve'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1;

CREATE FUNCTION earmark_charge(account text, job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_charge'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1;

CREATE FUNCTION earmark_heartbeat(account text, job_id bigint)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'earmark_heartbeat'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER;

CREATE FUNCTION earmark_settle(account text, job_id bigint, used bigint DEFAULT NULL, outcome text DEFAULT 'completed')
RETURNS TABLE (charged bigint, released bigint, status text)
AS 'MODULE_PATHNAME', 'earmark_settle'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1;

-- The 0.2.0 forms of charge, heartbeat and settle took no account.  They
-- stay, so that a 0.2.0 caller gets a message that says what to change
-- instead of "function does not exist".
CREATE FUNCTION earmark_charge(job_id bigint, tokens bigint, step bigint DEFAULT NULL)
RETURNS TABLE (charged bigint, capped boolean, room bigint, status text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'earmark_charge takes the account first since earmark 0.3.0'
        USING ERRCODE = '42883',
              HINT = 'Call earmark_charge(account, job_id, tokens, step) with the account the job was reserved for.';
END
$$;
CREATE FUNCTION earmark_heartbeat(job_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'earmark_heartbeat takes the account first since earmark 0.3.0'
        USING ERRCODE = '42883',
              HINT = 'Call earmark_heartbeat(account, job_id) with the account the job was reserved for.';
END
$$;
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
REVOKE ALL ON FUNCTION earmark_charge(bigint, bigint, bigint), earmark_heartbeat(bigint),
    earmark_settle(bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark_charge(bigint, bigint, bigint), earmark_heartbeat(bigint),
    earmark_settle(bigint, bigint) TO earmark_user;

CREATE FUNCTION earmark_set_escrow(account text, slots int)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_set_escrow'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_sweep(max_jobs int DEFAULT 1000)
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_sweep'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

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

-- Inbox

-- earmark_inbox_receive, _complete, _ignore and _fail look at who calls
-- them (a member of earmark_admin may vouch for an event, and finish the
-- worker's events), which a SECURITY DEFINER function cannot: they are
-- SECURITY INVOKER, and switch to their owner in C for their statements.
--
-- Like reserve, charge, heartbeat and settle, those four, earmark_inbox_claim
-- and earmark_inbox_receive_signed have no SET search_path clause: their C
-- code pins the same search path (pg_catalog, pg_temp) for the call (spi.c,
-- em_call_pinned; docs/security.md).  None of them calls a handler; a
-- trigger of the user's that their statements run gets its own SET
-- search_path from spi.c's fmgr hook.  Give none of them a SET clause back
-- without removing the pin.
CREATE FUNCTION earmark_inbox_receive(source text, dedupe_key text, event_type text, payload jsonb,
                                      occurred_at timestamptz DEFAULT NULL, account text DEFAULT NULL)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY INVOKER ROWS 1;

CREATE FUNCTION earmark_inbox_claim(max_events int DEFAULT 25, lease interval DEFAULT '30 seconds')
RETURNS SETOF earmark.inbox_event
AS 'MODULE_PATHNAME', 'earmark_inbox_claim'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 25;

-- the claim's plan, as it runs: for admins who want to see that a claim
-- walks inbox_event_due and stops after its batch (docs/inbox.md)
CREATE FUNCTION earmark_inbox_claim_plan(max_events int DEFAULT 10, with_handler boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'earmark_inbox_claim_plan'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 30
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_complete(event_id bigint, result text DEFAULT 'applied')
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_complete'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY INVOKER;

CREATE FUNCTION earmark_inbox_ignore(event_id bigint, reason text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_ignore'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY INVOKER;

CREATE FUNCTION earmark_inbox_fail(event_id bigint, error text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_fail'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY INVOKER;

CREATE FUNCTION earmark_inbox_replay(event_id bigint, account text)
RETURNS text
AS 'MODULE_PATHNAME', 'earmark_inbox_replay'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_set_handler(event_type text, handler regprocedure,
                                          accepts_unverified boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_inbox_set_handler'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- The local provider's plans: the limits an account gets when a plan-change
-- event moves it to that plan.
CREATE TABLE earmark.plan_limit (
    plan        text NOT NULL,
    feature     text NOT NULL DEFAULT 'default',
    lim         bigint CHECK (lim >= 0),
    PRIMARY KEY (plan, feature)
);
REVOKE ALL ON earmark.plan_limit FROM PUBLIC;

CREATE FUNCTION earmark_set_plan_limit(plan text, lim bigint, feature text DEFAULT 'default')
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
CREATE FUNCTION earmark.apply_plan_change(e earmark.inbox_event)
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
REVOKE ALL ON FUNCTION earmark.apply_plan_change(earmark.inbox_event) FROM PUBLIC;
INSERT INTO earmark.inbox_handler VALUES ('customer.plan_changed', 'earmark.apply_plan_change(earmark.inbox_event)');

REVOKE ALL ON FUNCTION
    earmark_inbox_receive(text, text, text, jsonb, timestamptz, text),
    earmark_inbox_claim(int, interval),
    earmark_inbox_claim_plan(int, boolean),
    earmark_inbox_complete(bigint, text),
    earmark_inbox_ignore(bigint, text),
    earmark_inbox_fail(bigint, text),
    earmark_inbox_replay(bigint, text),
    earmark_inbox_set_handler(text, regprocedure, boolean),
    earmark_set_plan_limit(text, bigint, text)
FROM PUBLIC;
-- intake and the application's own consumers run as earmark_user; replay
-- and handlers are the admin's
GRANT EXECUTE ON FUNCTION
    earmark_inbox_receive(text, text, text, jsonb, timestamptz, text),
    earmark_inbox_claim(int, interval),
    earmark_inbox_complete(bigint, text),
    earmark_inbox_ignore(bigint, text),
    earmark_inbox_fail(bigint, text)
TO earmark_user;
GRANT EXECUTE ON FUNCTION
    earmark_inbox_claim_plan(int, boolean),
    earmark_inbox_replay(bigint, text),
    earmark_inbox_set_handler(text, regprocedure, boolean),
    earmark_set_plan_limit(text, bigint, text)
TO earmark_admin;

REVOKE ALL ON FUNCTION
    earmark_set_limit(text, bigint, text),
    earmark_set_account(text, timestamptz, text, text),
    earmark_budget(text, text, timestamptz),
    earmark_reserve(text, bigint, text, text, interval),
    earmark_charge(text, bigint, bigint, bigint),
    earmark_heartbeat(text, bigint),
    earmark_settle(text, bigint, bigint, text),
    earmark_set_escrow(text, int),
    earmark_sweep(int)
FROM PUBLIC;

-- earmark_user runs the gate; earmark_admin also sets limits, accounts
-- and may sweep by hand.
GRANT EXECUTE ON FUNCTION
    earmark_budget(text, text, timestamptz),
    earmark_reserve(text, bigint, text, text, interval),
    earmark_charge(text, bigint, bigint, bigint),
    earmark_heartbeat(text, bigint),
    earmark_settle(text, bigint, bigint, text)
TO earmark_user;

GRANT EXECUTE ON FUNCTION
    earmark_set_limit(text, bigint, text),
    earmark_set_account(text, timestamptz, text, text),
    earmark_set_escrow(text, int),
    earmark_sweep(int)
TO earmark_admin;
------------------------------------------------------------------------------
-- Signed webhook intake (src/intake.c)
------------------------------------------------------------------------------

CREATE FUNCTION earmark_inbox_receive_signed(source text, webhook_id text, webhook_timestamp text,
                                             webhook_signature text, body text)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive_signed'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1;

CREATE FUNCTION earmark_webhook_signature_valid(secret text, webhook_id text, webhook_timestamp text,
                                                webhook_signature text, body text,
                                                at timestamptz DEFAULT pg_catalog.now())
RETURNS boolean
AS 'MODULE_PATHNAME', 'earmark_webhook_signature_valid'
LANGUAGE C CALLED ON NULL INPUT STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_set_secret(source text, secret text)
RETURNS void
AS 'MODULE_PATHNAME', 'earmark_inbox_set_secret'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_drop_secret(source text, secret text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'earmark_inbox_drop_secret'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_inbox_receive_kinde(webhook_id text, token text)
RETURNS TABLE (event_id bigint, inserted boolean)
AS 'MODULE_PATHNAME', 'earmark_inbox_receive_kinde'
LANGUAGE C CALLED ON NULL INPUT VOLATILE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION earmark_refresh_jwks()
RETURNS int
AS 'MODULE_PATHNAME', 'earmark_refresh_jwks'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION
    earmark_inbox_receive_signed(text, text, text, text, text),
    earmark_webhook_signature_valid(text, text, text, text, text, timestamptz),
    earmark_inbox_set_secret(text, text),
    earmark_inbox_drop_secret(text, text),
    earmark_inbox_receive_kinde(text, text),
    earmark_refresh_jwks()
FROM PUBLIC;

-- earmark_user receives and verifies; earmark_admin manages the secrets
-- and may refresh the key set by hand.
GRANT EXECUTE ON FUNCTION
    earmark_inbox_receive_signed(text, text, text, text, text),
    earmark_webhook_signature_valid(text, text, text, text, text, timestamptz),
    earmark_inbox_receive_kinde(text, text)
TO earmark_user;

GRANT EXECUTE ON FUNCTION
    earmark_inbox_set_secret(text, text),
    earmark_inbox_drop_secret(text, text),
    earmark_refresh_jwks()
TO earmark_admin;

DO $$
BEGIN
    IF NOT pg_catalog.pg_has_role('earmark_admin', 'earmark_user', 'MEMBER') THEN
        GRANT earmark_user TO earmark_admin;
    END IF;
END
$$;

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

------------------------------------------------------------------------------
-- Batches (src/batch.c): many events of one account in one call
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
      FROM earmark.meter_send x LEFT JOIN earmark.budget b USING (account, budget_id);

-- The worker's backend, seen with the extension owner's rights: other roles
-- see no backend_type of another user's process in pg_stat_activity.
CREATE FUNCTION earmark.workers_running() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT count(*) FROM pg_catalog.pg_stat_activity
      WHERE backend_type = 'earmark worker' AND datname = pg_catalog.current_database() $$;
REVOKE ALL ON FUNCTION earmark.workers_running() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION earmark.workers_running() TO earmark_admin;

CREATE VIEW earmark.worker_status AS
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
-- Invariant check
------------------------------------------------------------------------------

-- One row per violated invariant; none when the books are sound.  Reads
-- every budget, open job and ledger row: a DBA's tool (and every fault
-- test's last step), not a hot path.  Under READ COMMITTED each statement
-- sees its own snapshot, so run it in a REPEATABLE READ transaction (as
-- the tests do) for one consistent picture.
--
-- over_limit is a state, not always a fault: a limit lowered under running
-- holds, or usage recorded without a hold, may take a cycle past its limit.
-- overspent is the fault: a cycle past its limit (recorded usage included)
-- that admitted a hold after the last thing that could have taken it there
-- legitimately (the limit's last change, the last usage recorded into the
-- cycle).  From then on every admission must have been refused, so the
-- newest one was admitted past the limit.  (Times are the calls' clock
-- times, so a hold whose call started while a lower limit or new usage was
-- being written, and that read the old numbers, can be reported too.)
-- cycle_overlap: an account whose cycle anchor moved under a hold has
-- holds or usage in two cycles that overlap, and each of them alone may
-- look within the limit.
CREATE FUNCTION earmark_check()
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
-- install's).  The built-in handler row is the install's too, so only the
-- other handlers are dumped.  The identity sequences go with their tables:
-- after a restore new ids follow the restored ones.
SELECT pg_catalog.pg_extension_config_dump('earmark.account', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.account_limit', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.plan_limit', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.budget', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.budget_slot', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.job', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.ledger_entry', '');
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
SELECT pg_catalog.pg_extension_config_dump('earmark.budget_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.send_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('earmark.evidence_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.inbox_event', 'event_id')::regclass, '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('earmark.inbox_receipt', 'receipt_id')::regclass, '');

-- The launcher (launcher.c) starts this database's worker now rather than
-- at its next look at the databases.
CREATE FUNCTION earmark.wake_launcher() RETURNS void
AS 'MODULE_PATHNAME', 'earmark_wake_launcher' LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION earmark.wake_launcher() FROM PUBLIC;
SELECT earmark.wake_launcher();
