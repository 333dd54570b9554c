-- review_escrow_full_edges: escrow.c refused_outright at the edges the
-- first file leaves out.  Each case shows the refusal (or not), that a
-- kept generation's refusal writes no budget or slot row, and the books.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset

-- the versions of an account's budget row and slot rows
CREATE FUNCTION pg_temp.versions(acct text) RETURNS TABLE (row_of text, slot int, version text)
LANGUAGE sql AS $$
  SELECT 'budget', 0, xmin::text FROM earmark.budget WHERE account = acct
  UNION ALL
  SELECT 'slot', slot, xmin::text FROM earmark.budget_slot WHERE account = acct
$$;
CREATE TEMP TABLE seen (acct text, row_of text, slot int, version text);
-- and the slot rows' xmax: a slot locked FOR UPDATE and not written keeps
-- its xmin but takes the locker's xid as its xmax
CREATE TEMP TABLE seen_xmax AS SELECT account, slot, xmax::text AS locker FROM earmark.budget_slot WHERE false;
CREATE FUNCTION pg_temp.remember_xmax(acct text) RETURNS void LANGUAGE sql AS $$
  DELETE FROM seen_xmax WHERE account = $1;
  INSERT INTO seen_xmax SELECT account, slot, xmax::text FROM earmark.budget_slot WHERE account = $1;
$$;
CREATE FUNCTION pg_temp.slots_locked(acct text) RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM (SELECT * FROM seen_xmax WHERE account = $1) b
    FULL JOIN (SELECT slot, xmax::text AS locker FROM earmark.budget_slot WHERE account = $1) a USING (slot)
   WHERE a.locker IS DISTINCT FROM b.locker;
$$;
CREATE FUNCTION pg_temp.remember(acct text) RETURNS void LANGUAGE sql AS $$
  DELETE FROM seen WHERE seen.acct = $1;
  INSERT INTO seen SELECT $1, v.* FROM pg_temp.versions($1) v;
$$;
CREATE FUNCTION pg_temp.rewritten(acct text) RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM (SELECT * FROM seen WHERE seen.acct = $1) b
    FULL JOIN pg_temp.versions($1) a USING (row_of, slot)
   WHERE a.version IS DISTINCT FROM b.version;
$$;
CREATE FUNCTION pg_temp.books(acct text) RETURNS TABLE (within boolean, held_ok boolean, used_ok boolean)
LANGUAGE sql AS $$
  SELECT b.lim IS NULL OR b.used + b.held <= b.lim,
         b.held = (SELECT coalesce(sum(amount), 0) FROM earmark.job
                    WHERE account = acct AND status IN ('running', 'capped')),
         b.used = (SELECT coalesce(sum(units), 0) FROM earmark.ledger l
                    JOIN earmark.budget x USING (budget_id) WHERE x.account = acct)
    FROM earmark_budget(acct) b
$$;

-- 1. partial room: 5 left, inside the slots; a job of 10 is refused
-- without a write, and a job of 1 still comes from a slot (fast path)
SELECT count(*) FROM earmark_set_account('part', :'anchor');
SELECT earmark_set_limit('part', 100) IS NOT NULL, earmark_set_escrow('part', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 19) g, LATERAL earmark_reserve('part', 5, 'p-' || g);
SELECT lim, used, held, remaining FROM earmark_budget('part');
SELECT pg_temp.remember('part'), pg_temp.remember_xmax('part');
SELECT admitted, remaining, reason FROM earmark_reserve('part', 10, 'p-big');
SELECT pg_temp.rewritten('part') AS rows_rewritten, pg_temp.slots_locked('part') AS slots_locked;
SELECT slot, gen, room, held FROM earmark.budget_slot WHERE account = 'part' ORDER BY slot;
SELECT admitted, remaining, reason FROM earmark_reserve('part', 1, 'p-small');
SELECT slot IS NOT NULL AS from_a_slot FROM earmark.job WHERE account = 'part' AND idempotency_key = 'p-small';
SELECT * FROM pg_temp.books('part');

-- 2. full through recorded usage (cap = limit - recorded)
SELECT count(*) FROM earmark_set_account('rec', :'anchor');
SELECT earmark_set_limit('rec', 100) IS NOT NULL, earmark_set_escrow('rec', 2) IS NOT NULL;
SELECT admitted FROM earmark_reserve('rec', 10, 'r-1');
SELECT earmark_record_usage('rec', 85, 'r-usage') IS NOT NULL AS recorded;
SELECT admitted, remaining FROM earmark_reserve('rec', 5, 'r-2');
SELECT pg_temp.remember('rec');
SELECT admitted, remaining, reason FROM earmark_reserve('rec', 1, 'r-3');
SELECT pg_temp.rewritten('rec') AS rows_rewritten;
SELECT lim, used, held, remaining FROM earmark_budget('rec');
SELECT * FROM pg_temp.books('rec');

-- 3. more slots on a full account: the refusal creates the missing rows and
-- cuts none; a later admission cuts them
SELECT count(*) FROM earmark_set_account('more', :'anchor');
SELECT earmark_set_limit('more', 40) IS NOT NULL, earmark_set_escrow('more', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 4) g, LATERAL earmark_reserve('more', 10, 'm-' || g);
SELECT earmark_set_escrow('more', 4) IS NOT NULL;
SELECT admitted, remaining, reason FROM earmark_reserve('more', 10, 'm-refused');
SELECT count(*) AS slot_rows, count(*) FILTER (WHERE gen = 0) AS uncut,
       sum(room) AS room FROM earmark.budget_slot WHERE account = 'more';
SELECT charged FROM earmark_settle('more', (SELECT job_id FROM earmark.job
                                             WHERE account = 'more' AND idempotency_key = 'm-1'), 0);
SELECT admitted, remaining FROM earmark_reserve('more', 10, 'm-after');
SELECT * FROM pg_temp.books('more');

-- 4. the largest limit: the sums do not overflow
SELECT count(*) FROM earmark_set_account('huge', :'anchor');
SELECT earmark_set_limit('huge', 9223372036854775807) IS NOT NULL, earmark_set_escrow('huge', 2) IS NOT NULL;
SELECT admitted FROM earmark_reserve('huge', 9223372036854775800, 'h-1');
SELECT admitted FROM earmark_reserve('huge', 7, 'h-2');
SELECT pg_temp.remember('huge');
SELECT admitted, remaining, reason FROM earmark_reserve('huge', 1, 'h-3');
SELECT pg_temp.rewritten('huge') AS rows_rewritten;
SELECT * FROM pg_temp.books('huge');

-- 5. unlimited with escrow: a job past the room an unlimited budget is
-- treated as having (PG_INT64_MAX / 4) is refused, as before the change
SELECT count(*) FROM earmark_set_account('unl', :'anchor');
SELECT earmark_set_limit('unl', NULL) IS NOT NULL, earmark_set_escrow('unl', 2) IS NOT NULL;
SELECT admitted FROM earmark_reserve('unl', 10, 'u-1');
SELECT pg_temp.remember('unl');
SELECT admitted, remaining, reason FROM earmark_reserve('unl', 4611686018427387904, 'u-2');
SELECT pg_temp.rewritten('unl') AS rows_rewritten;
SELECT * FROM pg_temp.books('unl');

-- 6. a dead hold reclaimed by the early step that frees too little: the
-- gathering then refuses (and may reclaim again); nothing counted twice
SELECT count(*) FROM earmark_set_account('dead', :'anchor');
SELECT earmark_set_limit('dead', 100) IS NOT NULL, earmark_set_escrow('dead', 2) IS NOT NULL;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 10) g, LATERAL earmark_reserve('dead', 10, 'd-' || g);
UPDATE earmark.job SET lease_until = now() - interval '1 minute'
 WHERE account = 'dead' AND idempotency_key IN ('d-2', 'd-7');
SELECT admitted, remaining, reason FROM earmark_reserve('dead', 30, 'd-big');
SELECT status, count(*), sum(released) AS released FROM earmark.job
 WHERE account = 'dead' GROUP BY status ORDER BY status;
SELECT lim, used, held, remaining FROM earmark_budget('dead');
SELECT * FROM pg_temp.books('dead');
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;
