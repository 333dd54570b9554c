-- test/pgtap/gate_rules.sql: the gate's rules of docs/api.md with
-- concrete numbers.  Each part uses its own account.  earmark reads the
-- wall clock, not now(); a lease is made to pass (or to end soon) by
-- writing its end into the job row relative to the wall clock, never by
-- sleeping, so that no machine is too slow or too fast for a test.
BEGIN;
SELECT plan(106);
-- holds outlive the slowest run (valgrind); part 7 checks the default
SET LOCAL earmark.lease = '1h';
-- every account's cycle began 14 to 17 days ago (midnight UTC, day 28 at
-- the latest): no cycle ends during the run, on any date
SELECT count(*) FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t,
       unnest(ARRAY['gr_arith', 'gr_idem', 'gr_cap', 'gr_step', 'gr_fail', 'gr_once', 'gr_lease', 'gr_late', 'gr_sweep', 'gr_reclaim', 'gr_limit', 'gr_unl', 'gr_ledger', 'gr_rate', 'gr_rate_other', 'gr_rate_idle', 'gr_rate_full']) acct,
       LATERAL earmark_set_account(acct, make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC')) \gset x_

-- job ids by label, kept by pg_temp.rsv
CREATE TEMP TABLE jobs (label text PRIMARY KEY, job_id bigint NOT NULL);

CREATE FUNCTION pg_temp.rsv(label text, acct text, amount bigint, key text,
                            feature text DEFAULT 'default', lease interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, admitted boolean, remaining bigint, reason text)
LANGUAGE sql AS $$
    WITH r AS (SELECT * FROM earmark_reserve(acct, amount, key, feature, lease)),
         i AS (INSERT INTO pg_temp.jobs
               SELECT label, r.job_id FROM r WHERE r.job_id IS NOT NULL
               ON CONFLICT (label) DO UPDATE SET job_id = excluded.job_id)
    SELECT * FROM r
$$;

CREATE FUNCTION pg_temp.jid(label text) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT job_id FROM pg_temp.jobs j WHERE j.label = $1 $$;

-- the lease of a job has passed: it ended a moment ago
CREATE FUNCTION pg_temp.pass_lease(label text) RETURNS void
LANGUAGE sql AS $$
    UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond'
    WHERE job_id = pg_temp.jid(label)
$$;
-- the lease of a job is about to end: a minute is left
CREATE FUNCTION pg_temp.end_soon(label text) RETURNS void
LANGUAGE sql AS $$
    UPDATE earmark.job SET lease_until = clock_timestamp() + interval '1 minute'
    WHERE job_id = pg_temp.jid(label)
$$;

-- ====================================================================
-- 1. admission arithmetic: remaining = max(0, limit - used - held)
-- ====================================================================
SELECT earmark_set_limit('gr_arith', 50000) \gset x_

SELECT results_eq($$SELECT admitted, remaining, reason FROM pg_temp.rsv('a1', 'gr_arith', 30000, 'arith-1')$$,
                  $$VALUES (true, 20000::bigint, NULL::text)$$,
                  'limit 50000: reserve 30000 is admitted and 20000 remain');
SELECT isnt(pg_temp.jid('a1'), NULL, 'the admission returns a job_id');
SELECT results_eq($$SELECT lim, used, held, remaining FROM earmark_budget('gr_arith')$$,
                  $$VALUES (50000::bigint, 0::bigint, 30000::bigint, 20000::bigint)$$,
                  'budget: held 30000, remaining 20000');
SELECT results_eq($$SELECT job_id, admitted, remaining, reason FROM earmark_reserve('gr_arith', 40000, 'arith-2')$$,
                  $$VALUES (NULL::bigint, false, 20000::bigint, 'the job needs 40000 and 20000 is left'::text)$$,
                  'reserve 40000 is refused with the numbers in the reason');
SELECT results_eq($$SELECT lim, used, held, remaining FROM earmark_budget('gr_arith')$$,
                  $$VALUES (50000::bigint, 0::bigint, 30000::bigint, 20000::bigint)$$,
                  'the refusal changed nothing in the budget');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_arith'), 1::bigint,
          'the refusal wrote no job');
SELECT results_eq($$SELECT admitted, remaining, reason FROM pg_temp.rsv('a3', 'gr_arith', 20000, 'arith-3')$$,
                  $$VALUES (true, 0::bigint, NULL::text)$$,
                  'reserve exactly the 20000 left is admitted, 0 remain');
SELECT results_eq($$SELECT admitted, remaining, reason FROM earmark_reserve('gr_arith', 1, 'arith-4')$$,
                  $$VALUES (false, 0::bigint, 'the job needs 1 and 0 is left'::text)$$,
                  'one unit more is refused');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_arith'', %s, 10000)', pg_temp.jid('a1')),
                  $$VALUES (10000::bigint, 20000::bigint, 'completed'::text)$$,
                  'settle the 30000 hold at 10000: charged 10000, released 20000');
SELECT results_eq($$SELECT lim, used, held, remaining FROM earmark_budget('gr_arith')$$,
                  $$VALUES (50000::bigint, 10000::bigint, 20000::bigint, 20000::bigint)$$,
                  'budget after settle: used 10000, held 20000, remaining 20000');

-- ====================================================================
-- 2. idempotency
-- ====================================================================
SELECT earmark_set_limit('gr_idem', 1000) \gset x_
SELECT earmark_set_limit('gr_idem', 1000, 'other') \gset x_

SELECT results_eq($$SELECT admitted, remaining FROM pg_temp.rsv('i1', 'gr_idem', 400, 'idem-1')$$,
                  $$VALUES (true, 600::bigint)$$, 'idem: first reserve of 400 admitted');
SELECT results_eq($$SELECT admitted, remaining FROM pg_temp.rsv('i1b', 'gr_idem', 400, 'idem-1')$$,
                  $$VALUES (true, 600::bigint)$$, 'idem: the same key again is admitted and holds nothing new');
SELECT is(pg_temp.jid('i1b'), pg_temp.jid('i1'), 'idem: the same key returns the same job_id');
SELECT results_eq($$SELECT held, remaining FROM earmark_budget('gr_idem')$$,
                  $$VALUES (400::bigint, 600::bigint)$$, 'idem: held is still 400');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_idem'), 1::bigint,
          'idem: one job row for the key');
SELECT throws_ok($$SELECT * FROM earmark_reserve('gr_idem', 500, 'idem-1')$$, 'EM001', NULL,
                 'idem: the same key with a different amount is error EM001');
SELECT throws_ok($$SELECT * FROM earmark_reserve('gr_idem', 400, 'idem-1', 'other')$$, 'EM001', NULL,
                 'idem: the same key with a different feature is error EM001');
SELECT is((SELECT held FROM earmark_budget('gr_idem', 'other')), 0::bigint,
          'idem: the conflicting call held nothing under the other feature');
SELECT results_eq($$SELECT job_id, admitted, reason FROM earmark_reserve('gr_idem', 700, 'idem-2')$$,
                  $$VALUES (NULL::bigint, false, 'the job needs 700 and 600 is left'::text)$$,
                  'idem: reserve 700 with key idem-2 is refused');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_idem' AND idempotency_key = 'idem-2'), 0::bigint,
          'idem: the refused key left no job');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_idem'', %s, 100)', pg_temp.jid('i1')),
                  $$VALUES (100::bigint, 300::bigint, 'completed'::text)$$,
                  'idem: settle the first job at 100');
SELECT results_eq($$SELECT admitted, remaining FROM pg_temp.rsv('i2', 'gr_idem', 700, 'idem-2')$$,
                  $$VALUES (true, 200::bigint)$$,
                  'idem: the refused key is admitted when tried again with room');
SELECT results_eq($$SELECT admitted FROM pg_temp.rsv('i1c', 'gr_idem', 400, 'idem-1')$$,
                  $$VALUES (true)$$, 'idem: the first key after its job settled is still that job');
SELECT is(pg_temp.jid('i1c'), pg_temp.jid('i1'), 'idem: ... with the same job_id');
SELECT results_eq($$SELECT used, held, remaining FROM earmark_budget('gr_idem')$$,
                  $$VALUES (100::bigint, 700::bigint, 200::bigint)$$,
                  'idem: the repeat of a settled key held nothing new');

-- ====================================================================
-- 3. the hold is the cap
-- ====================================================================
SELECT earmark_set_limit('gr_cap', 100000) \gset x_
SELECT pg_temp.rsv('c1', 'gr_cap', 10000, 'cap-1') \gset x_

SELECT results_eq(format('SELECT charged, capped, room, status FROM earmark_charge(''gr_cap'', %s, 15000)', pg_temp.jid('c1')),
                  $$VALUES (10000::bigint, true, 0::bigint, 'capped'::text)$$,
                  'cap: charge 15000 on a 10000 hold charges 10000, capped');
SELECT results_eq(format('SELECT charged, capped, room, status FROM earmark_charge(''gr_cap'', %s, 1)', pg_temp.jid('c1')),
                  $$VALUES (0::bigint, true, 0::bigint, 'capped'::text)$$,
                  'cap: a capped job charges nothing more (charged 0 < tokens 1, so capped)');
SELECT is((SELECT used FROM earmark.job WHERE job_id = pg_temp.jid('c1')), 10000::bigint,
          'cap: the job recorded 10000, never more than its hold');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_cap'', %s)', pg_temp.jid('c1')),
                  $$VALUES (10000::bigint, 0::bigint, 'completed'::text)$$,
                  'cap: settle without used charges the recorded 10000');
SELECT pg_temp.rsv('c2', 'gr_cap', 5000, 'cap-2') \gset x_
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_cap'', %s, 20000)', pg_temp.jid('c2')),
                  $$VALUES (5000::bigint, 0::bigint, 'completed'::text)$$,
                  'cap: settle with used 20000 on a 5000 hold charges 5000');
SELECT results_eq($$SELECT used, held FROM earmark_budget('gr_cap')$$,
                  $$VALUES (15000::bigint, 0::bigint)$$, 'cap: budget used 15000 (10000 + 5000)');

-- ====================================================================
-- 4. steps: a retried step is a no-op
-- ====================================================================
SELECT earmark_set_limit('gr_step', 1000) \gset x_
SELECT pg_temp.rsv('s1', 'gr_step', 500, 'step-1') \gset x_

SELECT results_eq(format('SELECT charged, capped, room, status FROM earmark_charge(''gr_step'', %s, 100, 1)', pg_temp.jid('s1')),
                  $$VALUES (100::bigint, false, 400::bigint, 'running'::text)$$, 'step 1 charges 100');
SELECT results_eq(format('SELECT charged, capped, room, status FROM earmark_charge(''gr_step'', %s, 100, 1)', pg_temp.jid('s1')),
                  $$VALUES (0::bigint, false, 400::bigint, 'running'::text)$$, 'step 1 again is a no-op');
SELECT results_eq(format('SELECT charged, room FROM earmark_charge(''gr_step'', %s, 100, 0)', pg_temp.jid('s1')),
                  $$VALUES (0::bigint, 400::bigint)$$, 'a step below the last one is a no-op');
SELECT results_eq(format('SELECT charged, room FROM earmark_charge(''gr_step'', %s, 50, 2)', pg_temp.jid('s1')),
                  $$VALUES (50::bigint, 350::bigint)$$, 'step 2 charges 50');
SELECT results_eq(format('SELECT charged, room FROM earmark_charge(''gr_step'', %s, 10)', pg_temp.jid('s1')),
                  $$VALUES (10::bigint, 340::bigint)$$, 'a charge without a step always charges');
SELECT is((SELECT used FROM earmark.job WHERE job_id = pg_temp.jid('s1')), 160::bigint,
          'the job recorded 160 (100 + 50 + 10)');

-- ====================================================================
-- 5. failing at 60% charges 60%
-- ====================================================================
SELECT earmark_set_limit('gr_fail', 10000) \gset x_
SELECT pg_temp.rsv('f1', 'gr_fail', 1000, 'fail-1') \gset x_
SELECT earmark_charge('gr_fail', pg_temp.jid('f1'), 600) \gset x_

SELECT results_eq(format($q$SELECT charged, released, status FROM earmark_settle('gr_fail', %s, 600, 'failed')$q$, pg_temp.jid('f1')),
                  $$VALUES (600::bigint, 400::bigint, 'failed'::text)$$,
                  'a job failing at 60% of 1000 charges 600 and releases 400');
SELECT pg_temp.rsv('f2', 'gr_fail', 1000, 'fail-2') \gset x_
SELECT earmark_charge('gr_fail', pg_temp.jid('f2'), 600) \gset x_
SELECT results_eq(format($q$SELECT charged, released, status FROM earmark_settle('gr_fail', %s, NULL, 'cancelled')$q$, pg_temp.jid('f2')),
                  $$VALUES (600::bigint, 400::bigint, 'cancelled'::text)$$,
                  'settle with used NULL charges the recorded 600');
SELECT results_eq($$SELECT used, held, remaining FROM earmark_budget('gr_fail')$$,
                  $$VALUES (1200::bigint, 0::bigint, 8800::bigint)$$,
                  'budget: used 1200, held 0, remaining 8800');

-- ====================================================================
-- 6. settle once
-- ====================================================================
SELECT earmark_set_limit('gr_once', 10000) \gset x_
SELECT pg_temp.rsv('o1', 'gr_once', 1000, 'once-1') \gset x_

SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_once'', %s, 300)', pg_temp.jid('o1')),
                  $$VALUES (300::bigint, 700::bigint, 'completed'::text)$$, 'first settle charges 300');
SELECT results_eq(format($q$SELECT charged, released, status FROM earmark_settle('gr_once', %s, 900, 'failed')$q$, pg_temp.jid('o1')),
                  $$VALUES (0::bigint, 0::bigint, 'completed'::text)$$,
                  'second settle charges and releases nothing and returns the first status');
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_once'', %s, 5)', pg_temp.jid('o1')),
                  $$VALUES (0::bigint, 'completed'::text)$$, 'a settled job charges nothing');
SELECT results_eq($$SELECT used, held FROM earmark_budget('gr_once')$$,
                  $$VALUES (300::bigint, 0::bigint)$$, 'budget counts the job once: used 300');
SELECT results_eq(format('SELECT units FROM earmark.ledger WHERE job_id = %s', pg_temp.jid('o1')),
                  $$VALUES (300::bigint)$$, 'one ledger row of 300 for the job');

-- ====================================================================
-- 7. leases: charge and heartbeat renew; a passed lease is dead
-- ====================================================================
SELECT earmark_set_limit('gr_lease', 10000) \gset x_
SELECT pg_temp.rsv('e1', 'gr_lease', 1000, 'lease-1', lease => '1 hour') \gset x_
SELECT pg_temp.pass_lease('e1') \gset x_

SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_lease'', %s, 100)', pg_temp.jid('e1')),
                  $$VALUES (0::bigint, 'expired'::text)$$,
                  'a charge after the lease passed charges nothing and says expired (before any sweep)');
SELECT is((SELECT used FROM earmark.job WHERE job_id = pg_temp.jid('e1')), 0::bigint,
          'the dead job recorded nothing');
SELECT earmark_heartbeat('gr_lease', pg_temp.jid('e1')) AS hb \gset x_
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_lease'', %s, 100)', pg_temp.jid('e1')),
                  $$VALUES (0::bigint, 'expired'::text)$$,
                  'a heartbeat does not revive a passed lease');

RESET earmark.lease;
SELECT pg_temp.rsv('d1', 'gr_lease', 10, 'lease-default') \gset x_
SELECT results_eq(format('SELECT lease, lease_until - created_at FROM earmark.job WHERE job_id = %s', pg_temp.jid('d1')),
                  $$VALUES (interval '2 minutes', interval '2 minutes')$$,
                  'a reserve without lease gets earmark.lease, 2 minutes by default');
SET LOCAL earmark.lease = '45s';
SELECT pg_temp.rsv('d2', 'gr_lease', 10, 'lease-guc') \gset x_
SELECT pg_temp.rsv('d3', 'gr_lease', 10, 'lease-arg', lease => '5 minutes') \gset x_
SET LOCAL earmark.lease = '1h';
SELECT results_eq(format('SELECT lease FROM earmark.job WHERE job_id IN (%s, %s) ORDER BY job_id', pg_temp.jid('d2'), pg_temp.jid('d3')),
                  $$VALUES (interval '45 seconds'), (interval '5 minutes')$$,
                  'earmark.lease sets the default lease; the lease argument overrides it');
SELECT earmark_settle('gr_lease', pg_temp.jid('d1'), 0) \gset x_
SELECT earmark_settle('gr_lease', pg_temp.jid('d2'), 0) \gset x_
SELECT earmark_settle('gr_lease', pg_temp.jid('d3'), 0) \gset x_

SELECT pg_temp.rsv('h1', 'gr_lease', 100, 'lease-hb', lease => '1 hour') \gset x_
SELECT pg_temp.end_soon('h1') \gset x_
SELECT clock_timestamp() AS t1 \gset x_
SELECT ok(earmark_heartbeat('gr_lease', pg_temp.jid('h1')) >= :'x_t1'::timestamptz + interval '1 hour',
          'a heartbeat renews the lease by the job''s lease (a minute left: now it ends an hour after the call)');
SELECT is((SELECT used FROM earmark.job WHERE job_id = pg_temp.jid('h1')), 0::bigint,
          'a heartbeat charges nothing');
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_lease'', %s, 10)', pg_temp.jid('h1')),
                  $$VALUES (10::bigint, 'running'::text)$$,
                  'after the heartbeat the job charges');
SELECT pg_temp.end_soon('h1') \gset x_
SELECT clock_timestamp() AS t2 \gset x_
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_lease'', %s, 10)', pg_temp.jid('h1')),
                  $$VALUES (10::bigint, 'running'::text)$$,
                  'a job with a minute of lease left charges');
SELECT ok((SELECT lease_until FROM earmark.job WHERE job_id = pg_temp.jid('h1'))
              BETWEEN :'x_t2'::timestamptz + interval '1 hour' AND clock_timestamp() + interval '1 hour',
          'a charge renews the lease too (it ends an hour after the call)');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_lease'', %s, 15)', pg_temp.jid('h1')),
                  $$VALUES (15::bigint, 85::bigint, 'completed'::text)$$,
                  'a settle inside the lease uses its used argument');

-- ====================================================================
-- 8. a late settle ignores its used argument and ends expired
-- ====================================================================
SELECT earmark_set_limit('gr_late', 10000) \gset x_
SELECT pg_temp.rsv('l1', 'gr_late', 1000, 'late-1', lease => '1 hour') \gset x_
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_late'', %s, 250)', pg_temp.jid('l1')),
                  $$VALUES (250::bigint, 'running'::text)$$, 'late: charge 250 while the lease runs');
SELECT pg_temp.pass_lease('l1') \gset x_
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_late'', %s, 900)', pg_temp.jid('l1')),
                  $$VALUES (250::bigint, 750::bigint, 'expired'::text)$$,
                  'late: settle(used 900) after the lease ends expired at the recorded 250');
SELECT results_eq(format('SELECT status, charged, released FROM earmark.job WHERE job_id = %s', pg_temp.jid('l1')),
                  $$VALUES ('expired'::text, 250::bigint, 750::bigint)$$, 'late: the job row says expired, 250/750');
SELECT results_eq($$SELECT used, held FROM earmark_budget('gr_late')$$,
                  $$VALUES (250::bigint, 0::bigint)$$, 'late: budget used 250, held 0');
SELECT results_eq(format($q$SELECT charged, released, status FROM earmark_settle('gr_lease', %s, 900, 'failed')$q$, pg_temp.jid('e1')),
                  $$VALUES (0::bigint, 1000::bigint, 'expired'::text)$$,
                  'late: the unswept dead job settles expired at its recorded 0');

-- ====================================================================
-- 9. earmark_sweep settles expired holds at their recorded use
-- ====================================================================
SELECT earmark_set_limit('gr_sweep', 10000) \gset x_
SELECT earmark_sweep() AS before \gset x_
SELECT pg_temp.rsv('w1', 'gr_sweep', 1000, 'sweep-1', lease => '1 hour') \gset x_
SELECT earmark_charge('gr_sweep', pg_temp.jid('w1'), 400) \gset x_
SELECT pg_temp.rsv('w2', 'gr_sweep', 500, 'sweep-2', lease => '1 hour') \gset x_
SELECT pg_temp.rsv('w3', 'gr_sweep', 200, 'sweep-3', lease => '1 hour') \gset x_
SELECT pg_temp.pass_lease('w1'), pg_temp.pass_lease('w2') \gset x_

SELECT is(earmark_sweep(), 2, 'sweep settles the 2 holds whose lease passed');
SELECT results_eq($$SELECT idempotency_key, status, charged, released FROM earmark.job
                     WHERE account = 'gr_sweep' ORDER BY idempotency_key$$,
                  $$VALUES ('sweep-1'::text, 'expired'::text, 400::bigint, 600::bigint),
                           ('sweep-2', 'expired', 0::bigint, 500::bigint),
                           ('sweep-3', 'running', NULL, NULL)$$,
                  'sweep: expired at the recorded use (400 and 0); the live hold is untouched');
SELECT results_eq($$SELECT used, held, remaining FROM earmark_budget('gr_sweep')$$,
                  $$VALUES (400::bigint, 200::bigint, 9400::bigint)$$,
                  'sweep: budget used 400, held 200 (the live hold)');
SELECT results_eq($$SELECT l.job_id, l.units FROM earmark.ledger l JOIN earmark.budget b USING (budget_id)
                     WHERE b.account = 'gr_sweep' ORDER BY l.job_id$$,
                  format('VALUES (%s::bigint, 400::bigint)', pg_temp.jid('w1')),
                  'sweep: one ledger row, for the job that used 400');
SELECT is((SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'gr_sweep'), 1::bigint, 'sweep: the cycle is marked for the meter');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''gr_sweep'', %s, 999)', pg_temp.jid('w2')),
                  $$VALUES (0::bigint, 0::bigint, 'expired'::text)$$,
                  'sweep: a settle after the sweep changes nothing and returns expired');
SELECT is(earmark_sweep(), 0, 'sweep: a second sweep finds nothing');

-- ====================================================================
-- 10. reserve reclaims expired holds before it refuses
-- ====================================================================
SELECT earmark_set_limit('gr_reclaim', 1000) \gset x_
SELECT pg_temp.rsv('r1', 'gr_reclaim', 1000, 'reclaim-1', lease => '1 hour') \gset x_
SELECT results_eq(format('SELECT charged, status FROM earmark_charge(''gr_reclaim'', %s, 100)', pg_temp.jid('r1')),
                  $$VALUES (100::bigint, 'running'::text)$$, 'reclaim: the hold records 100 while its lease runs');
SELECT pg_temp.pass_lease('r1') \gset x_
SELECT results_eq($$SELECT admitted, remaining FROM earmark_reserve('gr_reclaim', 600, 'reclaim-2')$$,
                  $$VALUES (true, 300::bigint)$$,
                  'reclaim: the expired hold does not cause a refusal (1000 - 100 used - 600 = 300)');
SELECT results_eq(format('SELECT status FROM earmark.job WHERE job_id = %s', pg_temp.jid('r1')),
                  $$VALUES ('expired'::text)$$, 'reclaim: the dead hold was settled expired');

-- ====================================================================
-- 11. a limit change applies to the next admission, not to running holds
-- ====================================================================
SELECT earmark_set_limit('gr_limit', 1000) \gset x_
SELECT pg_temp.rsv('g1', 'gr_limit', 800, 'limit-1') \gset x_
SELECT earmark_set_limit('gr_limit', 500) \gset x_

SELECT results_eq($$SELECT lim, held, remaining FROM earmark_budget('gr_limit')$$,
                  $$VALUES (500::bigint, 800::bigint, 0::bigint)$$,
                  'limit lowered to 500 under a hold of 800: remaining is 0, not negative');
SELECT results_eq($$SELECT admitted, remaining, reason FROM earmark_reserve('gr_limit', 1, 'limit-2')$$,
                  $$VALUES (false, 0::bigint, 'the job needs 1 and 0 is left'::text)$$,
                  'the next admission sees the new limit');
SELECT results_eq(format('SELECT charged, capped, room FROM earmark_charge(''gr_limit'', %s, 800)', pg_temp.jid('g1')),
                  $$VALUES (800::bigint, false, 0::bigint)$$,
                  'the running hold keeps its 800');
SELECT earmark_set_limit('gr_limit', 2000) \gset x_
SELECT results_eq($$SELECT admitted, remaining FROM earmark_reserve('gr_limit', 1000, 'limit-3')$$,
                  $$VALUES (true, 200::bigint)$$, 'limit raised to 2000: reserve 1000 admitted, 200 left');
SELECT results_eq(format('SELECT charged, released FROM earmark_settle(''gr_limit'', %s)', pg_temp.jid('g1')),
                  $$VALUES (800::bigint, 0::bigint)$$, 'the old hold settles at 800');
SELECT results_eq($$SELECT lim, used, held, remaining FROM earmark_budget('gr_limit')$$,
                  $$VALUES (2000::bigint, 800::bigint, 1000::bigint, 200::bigint)$$,
                  'budget: used 800, held 1000, remaining 200');

-- ====================================================================
-- 12. NULL limit = unlimited; no limit row = limit unknown
-- ====================================================================
SELECT earmark_set_limit('gr_unl', NULL) \gset x_
SELECT results_eq($$SELECT admitted, remaining, reason FROM earmark_reserve('gr_unl', 1000000000000, 'unl-1')$$,
                  $$VALUES (true, NULL::bigint, NULL::text)$$,
                  'NULL limit: reserve 10^12 admitted, remaining NULL');
SELECT results_eq($$SELECT lim, held, remaining FROM earmark_budget('gr_unl')$$,
                  $$VALUES (NULL::bigint, 1000000000000::bigint, NULL::bigint)$$,
                  'NULL limit: budget lim and remaining are NULL');
SELECT earmark_set_limit('gr_unl', 10) \gset x_
SELECT results_eq($$SELECT admitted, reason FROM earmark_reserve('gr_unl', 5, 'unl-2')$$,
                  $$VALUES (false, 'the job needs 5 and 0 is left'::text)$$,
                  'a limit set after unlimited applies to the next admission');

SELECT results_eq($$SELECT job_id, admitted, reason FROM earmark_reserve('gr_never_seen', 1, 'none-1')$$,
                  $$VALUES (NULL::bigint, false, 'limit unknown'::text)$$,
                  'an account never seen is refused: limit unknown');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_never_seen')
          + (SELECT count(*) FROM earmark.budget WHERE account = 'gr_never_seen'), 0::bigint,
          'limit unknown wrote no job and no budget');
SELECT earmark_set_account('gr_nolimit') \gset x_
SELECT results_eq($$SELECT admitted, reason FROM earmark_reserve('gr_nolimit', 1, 'none-2')$$,
                  $$VALUES (false, 'limit unknown'::text)$$,
                  'an account without a limit row is refused: limit unknown');
SELECT results_eq($$SELECT admitted, reason FROM earmark_reserve('gr_arith', 1, 'none-3', 'images')$$,
                  $$VALUES (false, 'limit unknown'::text)$$,
                  'a feature without a limit row is refused: limit unknown');
SELECT results_eq($$SELECT lim, used, held FROM earmark_budget('gr_never_seen')$$,
                  $$VALUES (NULL::bigint, 0::bigint, 0::bigint)$$,
                  'budget of an unknown account: no limit, nothing used or held');

-- ====================================================================
-- 13. ledger and meter mark
-- ====================================================================
SELECT earmark_set_limit('gr_ledger', 100000) \gset x_
SELECT pg_temp.rsv('m1', 'gr_ledger', 1000, 'ledger-1') \gset x_
SELECT pg_temp.rsv('m2', 'gr_ledger', 1000, 'ledger-2') \gset x_
SELECT pg_temp.rsv('m3', 'gr_ledger', 1000, 'ledger-3') \gset x_
SELECT pg_temp.rsv('m4', 'gr_ledger', 1000, 'ledger-4') \gset x_
SELECT earmark_charge('gr_ledger', pg_temp.jid('m3'), 200) \gset x_

SELECT is((SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'gr_ledger'), 0::bigint, 'ledger: no mark before anything settled');
SELECT earmark_settle('gr_ledger', pg_temp.jid('m1'), 300) \gset x_
SELECT earmark_settle('gr_ledger', pg_temp.jid('m2'), 0) \gset x_
SELECT earmark_settle('gr_ledger', pg_temp.jid('m3')) \gset x_
SELECT earmark_settle('gr_ledger', pg_temp.jid('m4'), 500, 'failed') \gset x_
SELECT earmark_settle('gr_ledger', pg_temp.jid('m1'), 300) \gset x_

SELECT results_eq($$SELECT j.label, l.units FROM earmark.ledger l JOIN pg_temp.jobs j USING (job_id)
                     WHERE j.label LIKE 'm_' ORDER BY j.label$$,
                  $$VALUES ('m1'::text, 300::bigint), ('m3', 200::bigint), ('m4', 500::bigint)$$,
                  'ledger: one row per settled job with used > 0 (none for the job that used 0, none for the repeat)');
SELECT is((SELECT count(*) FROM earmark.ledger l JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'gr_ledger'), 3::bigint, 'ledger: 3 rows for the cycle');
SELECT is((SELECT sum(l.units) FROM earmark.ledger l JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'gr_ledger')::bigint,
          (SELECT used FROM earmark_budget('gr_ledger')), 'ledger: the ledger total equals the budget''s used (1000)');
SELECT results_eq($$SELECT used, held FROM earmark_budget('gr_ledger')$$,
                  $$VALUES (1000::bigint, 0::bigint)$$, 'ledger: used 1000, held 0');
SELECT is((SELECT count(*) FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'gr_ledger'), 1::bigint, 'ledger: the cycle is marked for the meter once');

-- ====================================================================
-- 14. rate limit: earmark.rate_limit admissions a minute per account
-- ====================================================================
SET LOCAL earmark.rate_limit = 3;
SELECT earmark_set_limit('gr_rate', 1000000) \gset x_
SELECT earmark_set_limit('gr_rate_other', 1000000) \gset x_
SELECT earmark_set_limit('gr_rate', 1000000, 'other') \gset x_

SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-1')$$,
                  $$VALUES (true)$$, 'rate 3/min: 1st admitted');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-1')$$,
                  $$VALUES (true)$$, 'rate: a repeat of the 1st key is answered');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-2')$$,
                  $$VALUES (true)$$, 'rate: 2nd admitted');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-2')$$,
                  $$VALUES (true)$$, 'rate: a repeat of the 2nd key is answered');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-3')$$,
                  $$VALUES (true)$$, 'rate: 3rd admitted (the repeats did not count)');
SELECT results_eq($$SELECT job_id, admitted, remaining, reason FROM earmark_reserve('gr_rate', 1, 'rate-4')$$,
                  $$VALUES (NULL::bigint, false, 999997::bigint, 'rate limited'::text)$$,
                  'rate: the 4th is refused: rate limited');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate', 1, 'rate-3')$$,
                  $$VALUES (true)$$, 'rate: a repeat of an admitted key still answers when rate limited');
SELECT results_eq($$SELECT held FROM earmark_budget('gr_rate')$$,
                  $$VALUES (3::bigint)$$, 'rate: the refusal held nothing');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_rate'), 3::bigint, 'rate: 3 job rows');
SELECT results_eq($$SELECT admitted, reason FROM earmark_reserve('gr_rate', 1, 'rate-5', 'other')$$,
                  $$VALUES (false, 'rate limited'::text)$$,
                  'rate: the limit is per account: another feature of the same account is rate limited too');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('gr_rate_other', 1, 'rate-1')$$,
                  $$VALUES (true)$$, 'rate: another account has its own allowance');
-- the rate is counted before the room is looked at (0.3.0): an account
-- over its rate that also has no room left is refused as rate limited
SELECT earmark_set_limit('gr_rate_full', 3) \gset x_
SELECT is((SELECT count(*) FILTER (WHERE r.admitted) FROM generate_series(1, 3) i,
                  LATERAL earmark_reserve('gr_rate_full', 1, 'full-' || i) r),
          3::bigint, 'rate: 3 admissions use the rate and the whole limit');
SELECT results_eq($$SELECT job_id, admitted, remaining, reason FROM earmark_reserve('gr_rate_full', 1, 'full-4')$$,
                  $$VALUES (NULL::bigint, false, 0::bigint, 'rate limited'::text)$$,
                  'rate: over its rate and without room, the 4th is refused as rate limited');
-- an idle account does not bank a bigger burst: its state an hour old
-- (GCRA takes max(tat, now) before it adds), five reserves at once admit 3.
-- The rate limit's state is in shared memory: the hour passes for it by
-- shifting the clock it reads (superuser), not by writing a row.
SELECT earmark_set_limit('gr_rate_idle', 1000000) \gset x_
SELECT admitted FROM earmark_reserve('gr_rate_idle', 1, 'idle-0') \gset x_
SET LOCAL earmark.debug_rate_clock_shift = '1h';
SELECT is((SELECT count(*) FILTER (WHERE r.admitted) FROM generate_series(1, 5) i,
                  LATERAL earmark_reserve('gr_rate_idle', 1, 'idle-' || i) r),
          3::bigint, 'rate: after an hour idle, a burst is still 3 (no banked allowance)');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'gr_rate_idle'), 4::bigint,
          'rate: ... 4 jobs in all (the one before the idle hour, and 3)');

SELECT * FROM finish();
ROLLBACK;
