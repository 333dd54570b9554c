-- An account's cycle anchor cannot move while its ledger has a row in one
-- of its cycles (account.c account_in_use): recorded usage alone, which
-- leaves the budget row's numbers at zero, locks it, and so does a
-- correction that brings the cycle's usage back to zero.  The ledger is
-- found by cycle (its primary key is led by budget_id, earmark.sql), each
-- of the account's cycles probed by index: with 4,000 rows of other
-- accounts, analyzed, the check of an account with two cycles and no
-- ledger row reads no ledger row and scans the table zero times.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- 40 accounts with 100 recorded usages each
SELECT count(earmark_set_limit('other-' || a, 1000000)) FROM generate_series(1, 40) a;
SELECT count(*) FROM generate_series(1, 40) a,
  LATERAL earmark_record_usage_many('other-' || a, array_fill(1::bigint, ARRAY[100]),
                                    ARRAY(SELECT 'k' || g FROM generate_series(1, 100) g)) u;
ANALYZE earmark.ledger_entry, earmark.budget, earmark.job;

-- recorded usage alone locks the anchor: refused with EM002
SELECT earmark_set_limit('recorded', 1000);
SELECT earmark_record_usage('recorded', 5, 'one');
SELECT used, held FROM earmark.budget WHERE account = 'recorded';
\set VERBOSITY sqlstate
SELECT earmark_set_account('recorded', '2026-10-05 00:00:00+00');
\set VERBOSITY default
SELECT cycle_anchor FROM earmark.account WHERE account = 'recorded';
-- so does a correction back to zero: the ledger still has the cycle's rows
SELECT earmark_set_limit('corrected', 1000);
SELECT earmark_record_usage('corrected', 5, 'one');
SELECT earmark_record_usage('corrected', -5, 'one-undone');
\set VERBOSITY sqlstate
SELECT earmark_set_account('corrected', '2026-10-05 00:00:00+00');
\set VERBOSITY default

-- two cycles (of two features) with budget rows and no ledger row: the
-- anchor moves, and the check read the ledger by index only
SELECT earmark_set_limit('quiet', 1000);
SELECT earmark_set_limit('quiet', 1000, 'images');
SELECT count(*) FROM (VALUES ('default'), ('images')) f(feature),
  LATERAL earmark_reserve('quiet', 10, 'nothing-' || f.feature, feature => f.feature) r,
  LATERAL earmark_settle('quiet', r.job_id, 0, 'cancelled') s;
SELECT count(*) AS cycles FROM earmark.budget WHERE account = 'quiet';
BEGIN;
SELECT pg_stat_get_xact_numscans('earmark.ledger_entry'::regclass) AS scans0,
       pg_stat_get_xact_tuples_returned('earmark.ledger_entry'::regclass) AS returned0,
       pg_stat_get_xact_numscans('earmark.ledger_pkey'::regclass) AS pkey0 \gset
SELECT earmark_set_account('quiet', '2026-10-05 00:00:00+00');
SELECT pg_stat_get_xact_numscans('earmark.ledger_entry'::regclass) - :scans0 AS table_scans,
       pg_stat_get_xact_tuples_returned('earmark.ledger_entry'::regclass) - :returned0 AS rows_scanned,
       pg_stat_get_xact_numscans('earmark.ledger_pkey'::regclass) - :pkey0 AS pkey_probes;
COMMIT;
SELECT cycle_anchor FROM earmark.account WHERE account = 'quiet';
