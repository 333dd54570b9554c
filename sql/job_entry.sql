-- A settled job is its own ledger entry (issue 13): a settlement or an
-- expiry writes its charged units, budget and settled_at into the job row
-- and inserts no row into earmark.ledger_entry; the view earmark.ledger
-- shows both.  Here: what is an entry and what is not, that a settled job
-- row never changes again (every call that writes a job leaves it), that a
-- job with a row of its own (as 0.2.0 wrote them) counts once, through
-- that row, that earmark_check finds a row that disagrees with its job,
-- and that a correction counts against the cycle.
SET client_min_messages = warning;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('je', 100000);
-- a: charged 300; z: charged nothing; x: charged 40, then its lease passed
-- and the sweeper expired it; o: still open
SELECT job_id AS a FROM earmark_reserve('je', 1000, 'je-a') \gset
SELECT charged FROM earmark_charge('je', :a, 300);
SELECT charged, released, status FROM earmark_settle('je', :a);
SELECT job_id AS z FROM earmark_reserve('je', 500, 'je-z') \gset
SELECT charged, released, status FROM earmark_settle('je', :z, 0);
SELECT job_id AS x FROM earmark_reserve('je', 400, 'je-x') \gset
SELECT charged FROM earmark_charge('je', :x, 40);
UPDATE earmark.job SET lease_until = now() - interval '1 hour' WHERE job_id = :x;
SELECT earmark_sweep(100) AS swept;
SELECT job_id AS o FROM earmark_reserve('je', 200, 'je-o') \gset

-- the entries: a's 300 and x's 40, each its job row (no entry_id, at the
-- settlement); z charged nothing and o is open: no entry
SELECT j.idempotency_key, j.status, l.units, l.entry_id IS NULL AS job_row,
       l.occurred_at = j.settled_at AND l.recorded_at = j.settled_at AS at_settlement
  FROM earmark.ledger l JOIN earmark.job j USING (account, job_id) ORDER BY 1;
SELECT count(*) AS ledger_entry_rows FROM earmark.ledger_entry;
SELECT used, held FROM earmark_budget('je');
SELECT count(*) AS marked FROM earmark.meter_mark;
SELECT * FROM earmark_check();

-- a settled job row never changes again: a charge, a heartbeat, a second
-- settlement and the sweeper all leave a, z and x as they are
CREATE TEMP TABLE settled AS SELECT * FROM earmark.job WHERE job_id IN (:a, :z, :x);
SELECT charged, capped, status FROM earmark_charge('je', :a, 999);
SELECT earmark_heartbeat('je', :x);
SELECT charged, released, status FROM earmark_settle('je', :a, 1000);
SELECT charged, released, status FROM earmark_settle('je', :z, 10, 'failed');
UPDATE earmark.job SET lease_until = now() - interval '1 hour' WHERE job_id = :o;
SELECT earmark_sweep(100) AS swept;
SELECT count(*) AS changed
  FROM (SELECT * FROM earmark.job WHERE job_id IN (:a, :z, :x) EXCEPT SELECT * FROM settled) d;
SELECT count(*) AS entries, sum(units) AS units FROM earmark.ledger WHERE account = 'je';
SELECT used, held FROM earmark_budget('je');

-- a job settled before 0.3.0 has a row of its own in earmark.ledger_entry
-- (the same units): it counts through that row, once
INSERT INTO earmark.ledger_entry (account, budget_id, units, job_id, occurred_at)
SELECT account, budget_id, charged, job_id, settled_at FROM earmark.job WHERE job_id = :a;
SELECT count(*) AS entries, sum(units) AS units, bool_and(entry_id IS NOT NULL) AS its_row
  FROM earmark.ledger WHERE job_id = :a;
SELECT sum(units) AS ledger FROM earmark.ledger WHERE account = 'je';
SELECT * FROM earmark_check();

-- a correction: negative units in the cycle, recorded usage
SELECT earmark_record_usage('je', -15, 'fix-1');
SELECT sum(units) AS ledger FROM earmark.ledger WHERE account = 'je';
SELECT used FROM earmark_budget('je');
SELECT * FROM earmark_check();

-- a row that disagrees with its job (written by hand) is found, and is what
-- the ledger counts: the job's own units are not added to it
UPDATE earmark.ledger_entry SET units = 299 WHERE job_id = :a;
SELECT sum(units) AS ledger FROM earmark.ledger WHERE account = 'je';
SELECT invariant, account, detail FROM earmark_check() ORDER BY 1;
