-- The usage ledger and the meter (docs/design.md, "The ledger and the meter"):
-- earmark_record_usage (keyed, append-only, corrections in the cycle they
-- correct), the cycle's meter mark, earmark_report with the local provider
-- (earmark.local_meter), the review list of closed cycles, and
-- earmark_reconcile with its evidence.  The worker reports in another
-- database, so nothing is reported here unless a statement calls
-- earmark_report.
--
-- No output depends on today's date: open cycles belong to accounts whose
-- anchor lies 14 days back (pg_temp.mid_anchor, so the cycle began 14 to 17
-- days ago and ends at least 11 days from now), and their cycle bounds are
-- never printed; closed cycles use fixed dates in 2025.
SET client_min_messages = warning;
SET timezone = 'UTC';
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget,
         earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
UPDATE earmark.reporter_state SET blocked_until = NULL;

-- try(sql): the SQLSTATE and message of the error the statement raises
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- an anchor 14 days back (day 1-28, midnight UTC): today is mid-cycle
CREATE FUNCTION pg_temp.mid_anchor() RETURNS timestamptz LANGUAGE sql AS $$
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC')
FROM (SELECT (now() AT TIME ZONE 'UTC') - interval '14 days' AS a) s
$$;

-- an account's cycles: the ledger's sum (a scan), the counters (budget row,
-- slots, shards), the mark, the local meter and the number of sends
CREATE FUNCTION pg_temp.cycles(acct text)
RETURNS TABLE (feature text, ledger bigint, counters bigint, marked boolean,
               meter bigint, writes bigint, sends bigint)
LANGUAGE sql AS $$
SELECT b.feature,
       (SELECT coalesce(sum(l.units), 0) FROM earmark.ledger l WHERE l.budget_id = b.budget_id)::bigint,
       (b.used + coalesce((SELECT sum(s.used) FROM earmark.budget_slot s WHERE s.budget_id = b.budget_id), 0)
               + coalesce((SELECT sum(u.units) FROM earmark.usage_shard u WHERE u.budget_id = b.budget_id), 0))::bigint,
       EXISTS (SELECT 1 FROM earmark.meter_mark m WHERE m.budget_id = b.budget_id),
       lm.total, lm.writes,
       (SELECT count(*) FROM earmark.meter_send x WHERE x.budget_id = b.budget_id)
FROM earmark.budget b
LEFT JOIN earmark.local_meter lm
       ON (lm.account, lm.feature, lm.cycle_start) = (b.account, b.feature, b.cycle_start)
WHERE b.account = acct
ORDER BY b.cycle_start, b.feature
$$;

-- everything the ledger, the reporter and the reconciler write, to show
-- that a refused call changed nothing
CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql AS $$
SELECT concat_ws(' | ',
    (SELECT count(*) || ' accounts' FROM earmark.account),
    (SELECT count(*) || ' budgets ' || sum(used) || '/' || sum(held) FROM earmark.budget),
    (SELECT count(*) || ' ledger ' || coalesce(sum(units), 0) FROM earmark.ledger),
    (SELECT count(*) || ' shards ' || coalesce(sum(units), 0) FROM earmark.usage_shard),
    (SELECT count(*) || ' marks ' || coalesce(string_agg(budget_id || '@' || marked_at, ',' ORDER BY budget_id), '')
       FROM earmark.meter_mark),
    (SELECT count(*) || ' sends' FROM earmark.meter_send),
    (SELECT count(*) || ' reviews' FROM earmark.meter_review),
    (SELECT count(*) || ' meters ' || coalesce(sum(total), 0) || '/' || coalesce(sum(writes), 0)
       FROM earmark.local_meter),
    (SELECT count(*) || ' evidence' FROM earmark.evidence))
$$;

-- 1. A keyed row is written once: a repeat returns false and adds nothing,
--    whatever its occurred_at.
SELECT earmark_set_account('keys', pg_temp.mid_anchor());
SELECT earmark_set_limit('keys', 1000);
SELECT earmark_record_usage('keys', 30, 'click-1');
SELECT earmark_record_usage('keys', 30, 'click-1');
SELECT earmark_record_usage('keys', 12, 'click-2', occurred_at => now() - interval '1 hour');
SELECT earmark_record_usage('keys', 12, 'click-2', occurred_at => now() - interval '2 hours');
SELECT entry_key, units, job_id FROM earmark.ledger WHERE account = 'keys' ORDER BY entry_id;
SELECT * FROM pg_temp.cycles('keys');
-- the same key with other units or another feature is an error (EM001),
-- also as a correction, and nothing changes
SELECT pg_temp.state() AS before \gset
SELECT q, pg_temp.try(q) FROM (VALUES
    ($$SELECT earmark_record_usage('keys', 31, 'click-1')$$),
    ($$SELECT earmark_record_usage('keys', 30, 'click-1', 'images')$$),
    ($$SELECT earmark_record_usage('keys', -30, 'click-1')$$)
) AS t(q);
SELECT earmark_record_usage('keys', 31, 'click-1');
SELECT pg_temp.state() = :'before' AS nothing_changed;
-- a key belongs to its account: another account may use it
SELECT earmark_set_account('keys-2', pg_temp.mid_anchor());
SELECT earmark_record_usage('keys-2', 5, 'click-1');
SELECT account, entry_key, units FROM earmark.ledger WHERE entry_key = 'click-1' ORDER BY account;
-- a feature of its own is a cycle (budget row) of its own
SELECT earmark_record_usage('keys', 4, 'img-1', 'images');
SELECT * FROM pg_temp.cycles('keys');

-- 2. Recorded usage counts against the limit at the next admission.
SELECT earmark_set_account('metered', pg_temp.mid_anchor());
SELECT earmark_set_limit('metered', 100);
SELECT admitted, remaining FROM earmark_reserve('metered', 20, 'job-1');
SELECT earmark_record_usage('metered', 70, 'req-1');
SELECT lim, used, held, remaining FROM earmark_budget('metered');
-- 40 no longer fits: refused, with the numbers
SELECT admitted, remaining, reason FROM earmark_reserve('metered', 40, 'job-2');
SELECT admitted, remaining FROM earmark_reserve('metered', 10, 'job-3');
-- a correction gives the room back; the refused key may be tried again
SELECT earmark_record_usage('metered', -30, 'req-1-fix');
SELECT lim, used, held, remaining FROM earmark_budget('metered');
SELECT admitted, remaining FROM earmark_reserve('metered', 30, 'job-2');
-- a settled job's usage and the recorded usage add up in the same cycle
SELECT charged, released FROM earmark_settle('metered', (SELECT job_id FROM earmark.job WHERE account = 'metered' AND idempotency_key = 'job-1'), 15);
SELECT lim, used, held, remaining FROM earmark_budget('metered');
SELECT * FROM pg_temp.cycles('metered');

-- 3. The cycle's meter mark is written once: more usage while it is marked
--    writes no more (the same row, the same marked_at).
SELECT earmark_set_account('rep', pg_temp.mid_anchor());
SELECT earmark_set_limit('rep', 1000);
SELECT earmark_record_usage('rep', 10, 'r-1');
SELECT m.xmin AS mark_xmin, m.marked_at AS mark_at, m.budget_id AS rep_budget
FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id) WHERE b.account = 'rep' \gset
SELECT earmark_record_usage('rep', 20, 'r-2');
BEGIN;
SELECT earmark_record_usage('rep', 2, 'r-3');
SELECT earmark_record_usage('rep', 3, 'r-4');
COMMIT;
SELECT count(*) AS marks, bool_and(xmin::text = :'mark_xmin' AND marked_at = :'mark_at') AS same_mark
FROM earmark.meter_mark WHERE budget_id = :rep_budget;
SELECT * FROM pg_temp.cycles('rep');
SELECT marked_cycles, cycles_to_review FROM earmark.worker_status;

-- 4. A report sends each marked open cycle's absolute total to the meter
--    (earmark.local_meter), logs it in earmark.send_log and deletes the mark.
SELECT earmark_report();
SELECT account, feature, total, origin, ok, http_status, error
FROM earmark.send_log ORDER BY account, feature;
SELECT account, feature, total, writes FROM earmark.local_meter ORDER BY account, feature;
SELECT count(*) AS marks_left FROM earmark.meter_mark;
SELECT marked_cycles, last_report_sent, last_report_failed, last_report_error, cycles_to_review
FROM earmark.worker_status;
-- nothing new: a second report sends nothing
SELECT earmark_report();
SELECT count(*) AS sends FROM earmark.meter_send;
SELECT * FROM pg_temp.cycles('rep');
-- usage after a report marks the cycle again; the next report carries the
-- new total
SELECT earmark_record_usage('rep', 7, 'r-5');
SELECT * FROM pg_temp.cycles('rep');
SELECT earmark_report();
SELECT * FROM pg_temp.cycles('rep');
SELECT total, origin FROM earmark.send_log WHERE account = 'rep' ORDER BY send_id;

-- 5. A correction (negative units) lands in the cycle of its occurred_at.
--    The agreement started on 15 January 2025: one cycle runs from 15
--    February, the next from 15 March.
SELECT earmark_set_account('fixes', '2025-01-15 00:00:00+00');
SELECT earmark_set_limit('fixes', 1000);
SELECT earmark_record_usage('fixes', 10, 'mar-10', occurred_at => '2025-03-10 12:00:00+00');
SELECT earmark_record_usage('fixes', 3, 'mar-20', occurred_at => '2025-03-20 12:00:00+00');
-- the correction of 10 March's usage, made on 12 March: the February cycle
SELECT earmark_record_usage('fixes', -4, 'mar-10-fix', occurred_at => '2025-03-12 00:00:00+00');
SELECT cycle_start, cycle_end, used FROM earmark_budget('fixes', at => '2025-03-01 00:00:00+00');
SELECT cycle_start, cycle_end, used FROM earmark_budget('fixes', at => '2025-04-01 00:00:00+00');
SELECT l.entry_key, l.units, l.occurred_at, b.cycle_start
FROM earmark.ledger l JOIN earmark.budget b USING (budget_id)
WHERE l.account = 'fixes' ORDER BY l.entry_id;
-- a correction larger than its cycle's total is refused (22023), though
-- the account's cycles together have enough; nothing is written
SELECT pg_temp.state() AS before \gset
SELECT pg_temp.try($$SELECT earmark_record_usage('fixes', -5, 'mar-20-fix', occurred_at => '2025-03-25 00:00:00+00')$$);
SELECT earmark_record_usage('fixes', -5, 'mar-20-fix', occurred_at => '2025-03-25 00:00:00+00');
SELECT pg_temp.state() = :'before' AS nothing_changed;
-- a correction into a cycle with no usage at all: refused, and no cycle
-- (budget row) is left behind
SELECT pg_temp.try($$SELECT earmark_record_usage('fixes', -1, 'may-fix', occurred_at => '2025-05-20 00:00:00+00')$$);
SELECT pg_temp.state() = :'before' AS nothing_changed;
-- down to exactly zero is fine
SELECT earmark_record_usage('fixes', -3, 'mar-20-fix', occurred_at => '2025-03-25 00:00:00+00');
SELECT cycle_start, used FROM earmark_budget('fixes', at => '2025-04-01 00:00:00+00');
-- the refused key was never used: it may be tried again (and was, above)
SELECT entry_key, units FROM earmark.ledger WHERE account = 'fixes' ORDER BY entry_id;

-- 6. A closed cycle is not written to the meter: the report lists it in
--    earmark.review_list and deletes its mark.
SELECT count(*) AS fixes_marks FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id)
WHERE b.account = 'fixes';
SELECT earmark_report();
SELECT account, feature, cycle_start, cycle_end, ledger_total, last_sent, unreported, reason
FROM earmark.review_list ORDER BY account, cycle_start;
SELECT count(*) AS fixes_marks FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id)
WHERE b.account = 'fixes';
SELECT count(*) AS fixes_meters FROM earmark.local_meter WHERE account = 'fixes';
SELECT count(*) AS fixes_sends FROM earmark.send_log WHERE account = 'fixes';
SELECT marked_cycles, last_report_sent, cycles_to_review FROM earmark.worker_status;
-- more late usage in a reviewed cycle: listed again with the new total
SELECT earmark_record_usage('fixes', 2, 'mar-11', occurred_at => '2025-03-11 00:00:00+00');
SELECT earmark_report();
SELECT account, cycle_start, ledger_total, unreported FROM earmark.review_list ORDER BY account, cycle_start;
SELECT count(*) AS marks_left FROM earmark.meter_mark;

-- 7. earmark_reconcile: the ledger total, the counters, the last total sent
--    and the meter's total read back.  Equal: match.
SELECT account, feature, closed, ledger_total, counter_total, counters_rebuilt, last_sent,
       provider_total, verdict, cause, repaired_to, read_back
FROM earmark_reconcile('rep');
-- the same numbers again: no new evidence row
SELECT verdict FROM earmark_reconcile('rep');
SELECT count(*) AS rep_evidence FROM earmark.evidence WHERE account = 'rep';

-- The meter moved without a report (by hand, as a superuser): over-billed,
-- repaired with an absolute write of the ledger total, confirmed by the
-- read back: the verdict is repaired, the drift is in its cause.
UPDATE earmark.local_meter SET total = total + 100 WHERE account = 'rep';
SELECT account, feature, closed, ledger_total, counter_total, counters_rebuilt, last_sent,
       provider_total, verdict, cause, repaired_to, read_back
FROM earmark_reconcile('rep');
SELECT * FROM pg_temp.cycles('rep');
SELECT total, origin, ok FROM earmark.send_log WHERE account = 'rep' ORDER BY send_id;
-- a second run adds no evidence row (it returns the stored one: repaired,
-- not a drift)
SELECT verdict, repaired_to FROM earmark_reconcile('rep');
SELECT count(*) AS rep_evidence FROM earmark.evidence WHERE account = 'rep';

-- The meter is behind: usage recorded after the last report.
-- Under-billed, repaired.
SELECT earmark_record_usage('rep', 8, 'r-6');
SELECT account, feature, closed, ledger_total, counter_total, counters_rebuilt, last_sent,
       provider_total, verdict, cause, repaired_to, read_back
FROM earmark_reconcile('rep');
SELECT * FROM pg_temp.cycles('rep');
SELECT verdict FROM earmark_reconcile('rep');
SELECT count(*) AS rep_evidence FROM earmark.evidence WHERE account = 'rep';
-- the repair left the mark: the next report sends the same total again
-- (an absolute write changes nothing) and deletes it
SELECT earmark_report();
SELECT * FROM pg_temp.cycles('rep');

-- Counters that disagree with the ledger are rebuilt from it, with a
-- WARNING; the verdict reads the ledger, not the counters.
DELETE FROM earmark.usage_shard WHERE account = 'rep' AND budget_id = :rep_budget;
INSERT INTO earmark.usage_shard (account, budget_id, shard, units) VALUES ('rep', :rep_budget, 9, 75);
SELECT used FROM earmark_budget('rep');
SELECT account, feature, closed, ledger_total, counter_total, counters_rebuilt, last_sent,
       provider_total, verdict, cause, repaired_to, read_back
FROM earmark_reconcile('rep');
SELECT * FROM pg_temp.cycles('rep');
SELECT used FROM earmark_budget('rep');
SELECT verdict, counters_rebuilt FROM earmark_reconcile('rep');
SELECT count(*) AS rep_evidence FROM earmark.evidence WHERE account = 'rep';

-- Job rows count too: a cycle with a settled job only (never reported, so
-- it is also under_billed), whose budget row drifted.
SELECT earmark_set_account('jobs', pg_temp.mid_anchor());
SELECT earmark_set_limit('jobs', 1000);
SELECT job_id AS jobs_job FROM earmark_reserve('jobs', 50, 'jobs-1') \gset
SELECT charged, released FROM earmark_settle('jobs', :jobs_job, 20);
SELECT budget_id AS jobs_budget FROM earmark.budget WHERE account = 'jobs' \gset
UPDATE earmark.budget SET used = used + 1000 WHERE account = 'jobs' AND budget_id = :jobs_budget;
SELECT lim, used, held, remaining FROM earmark_budget('jobs');
SELECT account, ledger_total, counter_total, counters_rebuilt, last_sent, provider_total, verdict,
       cause, repaired_to, read_back
FROM earmark_reconcile('jobs');
SELECT * FROM pg_temp.cycles('jobs');
SELECT lim, used, held, remaining FROM earmark_budget('jobs');

-- A closed cycle whose meter differs: closed_cycle_drift, and the meter is
-- not written (a person decides).  Here the February cycle's meter was
-- never written (it reads 0); the March cycle is at 0 and matches.
SELECT account, cycle_start, closed, ledger_total, counter_total, last_sent, provider_total,
       verdict, cause, repaired_to, read_back
FROM earmark_reconcile('fixes') ORDER BY cycle_start;
SELECT count(*) AS fixes_meters FROM earmark.local_meter WHERE account = 'fixes';
SELECT count(*) AS fixes_sends FROM earmark.send_log WHERE account = 'fixes';
-- a meter that holds another total for it (written by hand) stays as it is
INSERT INTO earmark.local_meter (account, feature, cycle_start, total)
VALUES ('fixes', 'default', '2025-02-15 00:00:00+00', 9);
SELECT account, cycle_start, ledger_total, provider_total, verdict, repaired_to, read_back
FROM earmark_reconcile('fixes') ORDER BY cycle_start;
SELECT cycle_start, total, writes FROM earmark.local_meter WHERE account = 'fixes';
SELECT count(*) AS fixes_sends FROM earmark.send_log WHERE account = 'fixes';
SELECT count(*) AS fixes_evidence FROM earmark.evidence WHERE account = 'fixes';

-- 8. Bad input: every argument error has its SQLSTATE, and changes nothing.
SELECT pg_temp.state() AS before \gset
SELECT q, pg_temp.try(q) FROM (VALUES
    -- NULL arguments (22004)
    ($$SELECT earmark_record_usage(NULL, 1, 'k')$$),
    ($$SELECT earmark_record_usage('keys', NULL, 'k')$$),
    ($$SELECT earmark_record_usage('keys', 1, NULL)$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', NULL)$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', occurred_at => NULL)$$),
    -- empty (22023) and too long (22001) names
    ($$SELECT earmark_record_usage('', 1, 'k')$$),
    ($$SELECT earmark_record_usage('keys', 1, '')$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', '')$$),
    ($$SELECT earmark_record_usage(repeat('a', 256), 1, 'k')$$),
    ($$SELECT earmark_record_usage('keys', 1, repeat('k', 256))$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', repeat('f', 256))$$),
    -- units: zero (22023), the smallest bigint (22003)
    ($$SELECT earmark_record_usage('keys', 0, 'k')$$),
    ($$SELECT earmark_record_usage('keys', -9223372036854775808, 'k')$$),
    -- occurred_at: not finite, or more than 5 minutes ahead (22023)
    ($$SELECT earmark_record_usage('keys', 1, 'k', occurred_at => 'infinity')$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', occurred_at => '-infinity')$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', occurred_at => now() + interval '6 minutes')$$),
    ($$SELECT earmark_record_usage('keys', 1, 'k', occurred_at => now() + interval '1 day')$$),
    -- an account that does not exist (EM007)
    ($$SELECT earmark_record_usage('nobody', 1, 'k')$$),
    -- a correction larger than the cycle (22023)
    ($$SELECT earmark_record_usage('keys', -1000, 'k')$$),
    -- report: at least one cycle (22023)
    ($$SELECT earmark_report(0)$$),
    ($$SELECT earmark_report(-1)$$),
    -- reconcile: empty names (22023)
    ($$SELECT earmark_reconcile('')$$),
    ($$SELECT earmark_reconcile('keys', '')$$)
) AS t(q);
SELECT pg_temp.state() = :'before' AS nothing_changed;
SELECT count(*) AS accounts_created FROM earmark.account WHERE account = 'nobody';

-- within the limits: 255 characters, a few minutes of clock skew, the
-- largest units
SELECT earmark_set_account(repeat('a', 255), pg_temp.mid_anchor());
SELECT earmark_record_usage(repeat('a', 255), 1, repeat('k', 255), repeat('f', 255));
SELECT earmark_record_usage('keys', 1, 'skew', occurred_at => now() + interval '4 minutes');
SELECT earmark_record_usage('keys', 1000000000000000, 'most', 'images');
SELECT * FROM pg_temp.cycles('keys');

-- 9. Counters rebuilt once are rebuilt again when they drift again (the
--    first rebuild put the cycle's recorded usage into one counter row).
UPDATE earmark.usage_shard SET units = units - 20 WHERE account = 'rep' AND budget_id = :rep_budget;
SELECT account, ledger_total, counter_total, counters_rebuilt, verdict
FROM earmark_reconcile('rep');
SELECT * FROM pg_temp.cycles('rep');
SELECT used FROM earmark_budget('rep');

-- 10. One call records at most 10^15 units either way: more is refused
--     (22003) and writes nothing, and the other accounts' reports go on.
SELECT earmark_set_account('huge', pg_temp.mid_anchor());
SELECT earmark_set_account('small', pg_temp.mid_anchor());
SELECT earmark_report();
SELECT earmark_record_usage('huge', 1000000000000000, 'h-1');
SELECT pg_temp.state() AS before \gset
SELECT pg_temp.try($$SELECT earmark_record_usage('huge', 1000000000000001, 'h-2')$$);
SELECT pg_temp.try($$SELECT earmark_record_usage('huge', -1000000000000001, 'h-3')$$);
SELECT pg_temp.try($$SELECT earmark_record_usage('huge', 9223372036854775807, 'h-4')$$);
SELECT pg_temp.state() = :'before' AS nothing_changed;
SELECT earmark_record_usage('small', 6, 's-1');
SELECT earmark_report();
SELECT account, total FROM earmark.local_meter WHERE account IN ('huge', 'small') ORDER BY account;

-- 11. The reporter and the reconciler compare totals with what writers
--     committed a moment ago: under a transaction snapshot they refuse
--     (25000) and change nothing.
SELECT earmark_record_usage('small', 1, 's-2');
SELECT pg_temp.state() AS before \gset
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_temp.try($$SELECT earmark_report()$$);
SELECT pg_temp.try($$SELECT count(*) FROM earmark_reconcile()$$);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT pg_temp.try($$SELECT earmark_report()$$);
COMMIT;
SELECT pg_temp.state() = :'before' AS nothing_changed;
SELECT earmark_report();

-- 12. Escrow: usage recorded without a hold takes its part of the limit
--     before the slots hand out room.  Four slots, limit 1,000: a reserve
--     of 100 cuts the slots, 900 are recorded (more than the room left
--     unallocated), and the next reserves find the slots no longer fit
--     (they go to the slow path, which cuts the slots again from what is
--     left); the books never pass the limit.
SET earmark.rate_limit = 0;
SELECT earmark_set_account('esc', pg_temp.mid_anchor());
SELECT earmark_set_limit('esc', 1000);
SELECT earmark_set_escrow('esc', 4);
SELECT admitted, remaining FROM earmark_reserve('esc', 100, 'e-1');
SELECT count(*) > 0 AS slots_cut FROM earmark.budget_slot s JOIN earmark.budget b USING (budget_id) WHERE b.account = 'esc';
SELECT earmark_record_usage('esc', 900, 'esc-usage');
SELECT admitted, remaining, reason FROM earmark_reserve('esc', 100, 'e-2');
SELECT admitted, remaining, reason FROM earmark_reserve('esc', 1, 'e-3');
SELECT used, held, remaining FROM earmark_budget('esc');
SELECT used + held <= 1000 AS within_limit FROM earmark_budget('esc');
RESET earmark.rate_limit;

-- 13. Each cycle is its own unit.  A repair the meter does not take as
--     written (a trigger keeps the local meter of one cycle one below) is
--     that cycle's evidence, not an error: read_back differs from
--     repaired_to, the cause says so, and the other cycle of the call is
--     repaired.
SELECT earmark_set_account('units', pg_temp.mid_anchor());
SELECT earmark_record_usage('units', 10, 'u-1');
SELECT earmark_record_usage('units', 4, 'u-2', 'images');
CREATE FUNCTION public.units_off_by_one() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.account = 'units' AND NEW.feature = 'default' THEN
        NEW.total := NEW.total - 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER units_off_by_one BEFORE INSERT OR UPDATE ON earmark.local_meter
    FOR EACH ROW EXECUTE FUNCTION public.units_off_by_one();
SELECT feature, verdict, ledger_total, provider_total, repaired_to, read_back, cause
FROM earmark_reconcile('units') ORDER BY feature;
SELECT feature, total, origin, ok FROM earmark.send_log WHERE account = 'units' ORDER BY send_id;
-- the next run tries again (a repair attempt always adds a row; the upsert
-- fires the trigger twice, so the meter now reads 8)
SELECT feature, verdict, repaired_to, read_back FROM earmark_reconcile('units') ORDER BY feature;
DROP TRIGGER units_off_by_one ON earmark.local_meter;
DROP FUNCTION public.units_off_by_one();
SELECT feature, verdict, repaired_to, read_back FROM earmark_reconcile('units') ORDER BY feature;
SELECT feature, count(*) AS evidence_rows FROM earmark.evidence WHERE account = 'units' GROUP BY feature ORDER BY feature;

--     A cycle whose step fails (here a trigger refuses its evidence row) is
--     rolled back alone, with a WARNING that names it; the other cycles of
--     the call are reconciled and returned.  (Closed cycles of April 2025,
--     so that the WARNING's date is fixed.)
SELECT earmark_set_account('units_old');
SELECT earmark_record_usage('units_old', 2, 'o-1', occurred_at => '2025-04-10 00:00:00+00');
SELECT earmark_record_usage('units_old', 3, 'o-2', 'images', occurred_at => '2025-04-10 00:00:00+00');
CREATE FUNCTION public.refuse_evidence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.account = 'units_old' AND NEW.feature = 'default' THEN
        RAISE EXCEPTION 'evidence refused by a test trigger';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_evidence BEFORE INSERT OR UPDATE ON earmark.evidence
    FOR EACH ROW EXECUTE FUNCTION public.refuse_evidence();
SELECT feature, cycle_start, verdict, ledger_total, provider_total
FROM earmark_reconcile('units_old') ORDER BY feature;
DROP TRIGGER refuse_evidence ON earmark.evidence;
DROP FUNCTION public.refuse_evidence();
SELECT feature, verdict FROM earmark_reconcile('units_old') ORDER BY feature;
