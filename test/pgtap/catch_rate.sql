-- test/pgtap/catch_rate.sql: bad input changes nothing, not even what no
-- table holds.  The admission rate limit's state is in shared memory, so
-- the "nothing changed" checks that compare tables (sql/badinput.sql,
-- test/integration/fuzz_sql.sh) cannot see a bad call that used up an
-- account's rate: it raised, its transaction rolled back, every table is as
-- it was, and the account's next good calls are refused "rate limited".
-- Here each bad call raises its documented SQLSTATE (in a subtransaction,
-- as throws_ok runs it), and the account's full rate is there afterwards.
BEGIN;
SELECT plan(15);
SET LOCAL earmark.rate_limit = 3;
SET LOCAL earmark.lease = '1h';

SELECT earmark_set_limit('catch_rl', 1000) \gset x_
SELECT earmark_set_limit('catch_rl_unl', NULL) \gset x_
-- one admission each: the key taken below, and unlimited holds near bigint's end
SELECT is((SELECT admitted FROM earmark_reserve('catch_rl', 100, 'ok-key')), true,
          'catch_rl: the first admission (1 of 3 a minute)');
SELECT is((SELECT admitted FROM earmark_reserve('catch_rl_unl', 9000000000000000000, 'huge')), true,
          'catch_rl_unl: the first admission holds 9e18 (1 of 3 a minute)');

-- bad calls, several of each, more than the rate allows
SELECT throws_ok($$SELECT earmark_reserve('catch_rl', 101, 'ok-key')$$, 'EM001', NULL,
                 'the same key with another amount: EM001') FROM generate_series(1, 3);
SELECT throws_ok($$SELECT earmark_reserve('catch_rl', -5, 'neg')$$, '22023', NULL,
                 'a negative amount: 22023');
SELECT throws_ok($$SELECT earmark_reserve('catch_rl', 1, 'zero-lease', lease => '0 seconds')$$, '22023', NULL,
                 'a zero lease: 22023');
SELECT throws_ok(format('SELECT earmark_reserve(%L, 9000000000000000000, %L)', 'catch_rl_unl', 'huge-' || i),
                 '22003', NULL, 'unlimited holds past bigint: 22003 (call ' || i || ')')
  FROM generate_series(2, 5) i;

-- the rate the bad calls left: 2 more admissions for each account
SELECT is((SELECT count(*) FILTER (WHERE r.admitted) FROM generate_series(1, 2) n,
                  LATERAL earmark_reserve('catch_rl', 1, 'good-' || n) r),
          2::bigint, 'catch_rl: after the bad calls, 2 more admissions (the bad calls used none of the rate)');
SELECT is((SELECT count(*) FILTER (WHERE r.admitted) FROM generate_series(1, 2) n,
                  LATERAL earmark_reserve('catch_rl_unl', 1, 'good-' || n) r),
          2::bigint, 'catch_rl_unl: after the bad calls, 2 more admissions (the bad calls used none of the rate)');
-- and then the rate is used up (so the checks above could see it)
SELECT is((SELECT reason FROM earmark_reserve('catch_rl', 1, 'good-3')), 'rate limited',
          'catch_rl: the 4th admission is rate limited');
SELECT is((SELECT reason FROM earmark_reserve('catch_rl_unl', 1, 'good-3')), 'rate limited',
          'catch_rl_unl: the 4th admission is rate limited');

SELECT * FROM finish();
ROLLBACK;
