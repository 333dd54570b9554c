-- test/bench/floor.sql: the floor, a lower bound on what any gate costs.
--
-- A job of the benchmark is three calls, each in its own transaction, each
-- of which has to leave something durable behind (a hold, a charge, a
-- settlement).  The floor does the least that can be done for that: each
-- call is one prepared UPDATE of one row of a narrow table (a HOT update,
-- one WAL record besides the commit's) sent by pgbench itself (no function
-- call; see pgbench/floor_many.sql), and commits.  No checks, no limit, no job row, no
-- ledger.  Whatever earmark or the reference does on top costs more, so
-- the floor's jobs/s on the same machine, in the same run, is a ceiling
-- for both: a ratio to the reference that the floor itself cannot reach
-- cannot be reached by any implementation under this load.
CREATE SCHEMA IF NOT EXISTS floor;

CREATE TABLE IF NOT EXISTS floor.acct (
    account text PRIMARY KEY,
    n       bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

-- The design floor: the writes the design's gate asks for and nothing else.
-- reserve: a job row (its key unique per account: idempotency) and
-- held += amount on the account's row; charge: the job's use; settle: the
-- job's status, used/held on the account's row, and a ledger row keyed by
-- the job.  No limit check, no lease, no lock beyond what the writes take,
-- no cycle, no meter mark: each call is one prepared statement (see
-- pgbench/floor_design.sql).  Any implementation of the design writes at
-- least this, so this too is a ceiling for earmark and for the reference.
ALTER TABLE floor.acct ADD COLUMN IF NOT EXISTS used bigint NOT NULL DEFAULT 0;
ALTER TABLE floor.acct ADD COLUMN IF NOT EXISTS held bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS floor.job (
    job_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL,
    used            bigint NOT NULL DEFAULT 0,
    status          text NOT NULL DEFAULT 'running',
    UNIQUE (account, idempotency_key)
) WITH (fillfactor = 70);

CREATE TABLE IF NOT EXISTS floor.ledger (
    entry_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   bigint NOT NULL UNIQUE,
    units    bigint NOT NULL
);
