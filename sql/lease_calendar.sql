-- A lease end is the call's clock plus the lease on the UTC calendar,
-- whatever the caller's TimeZone: the reserve's first end (earmark_reserve,
-- earmark_reserve_many, the escrow fast path) and every renewal (a charge
-- that fits, a charge that caps, a heartbeat) compute it the same way, so a
-- renewal never lands an hour before or after the end the reserve set.
-- timestamptz + interval would add days and months in the session's time
-- zone: across a daylight-saving change, an hour more or less.
SET client_min_messages = error;
SET earmark.rate_limit = 0;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('cal', 1000000) IS NULL AS set;
SELECT earmark_set_limit('cal_many', 1000000) IS NULL AS set;
SELECT earmark_set_limit('cal_escrow', 1000000) IS NULL AS set;
SELECT earmark_set_escrow('cal_escrow', 4) IS NULL AS set;
SET TimeZone = 'America/New_York';

-- The test means something whatever today's date: among leases of 1 to 11
-- months at least one ends on the other side of a daylight-saving change,
-- where the session's calendar and UTC's differ by an hour.
SELECT bool_or((now() + make_interval(months => k)) <>
               (((now() AT TIME ZONE 'UTC') + make_interval(months => k)) AT TIME ZONE 'UTC'))
       AS some_lease_crosses_a_change
FROM generate_series(1, 11) AS k;

-- An end on the UTC calendar: the call's clock is at or after the job's
-- created_at (its transaction's clock) and before this check's, and t + lease
-- on the UTC calendar only grows with t, so the end lies between the two
-- clocks' ends (seconds apart; the session's calendar is an hour off).
CREATE FUNCTION pg_temp.utc_end(t timestamptz, lease interval) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$ SELECT ((t AT TIME ZONE 'UTC') + lease) AT TIME ZONE 'UTC' $$;
CREATE FUNCTION pg_temp.on_utc_calendar(lease_until timestamptz, created_at timestamptz,
                                        lease interval) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT lease_until BETWEEN pg_temp.utc_end(created_at, lease)
                         AND pg_temp.utc_end(clock_timestamp(), lease) $$;

-- 1. earmark_reserve, one job a lease of k months, k = 1 .. 11
SELECT count(*) AS admitted
FROM generate_series(1, 11) AS k,
     LATERAL earmark_reserve('cal', 10, 'm' || k, lease => make_interval(months => k)) AS r
WHERE r.admitted;
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE pg_temp.on_utc_calendar(lease_until, created_at, lease)) AS ends_on_utc_calendar
FROM earmark.job WHERE account = 'cal';

-- 2. earmark_reserve_many: the same lease for every job of the call
SELECT count(*) AS admitted
FROM earmark_reserve_many('cal_many', ARRAY[10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10],
                          (SELECT array_agg('m' || k ORDER BY k) FROM generate_series(1, 11) AS k),
                          lease => interval '7 months')
WHERE admitted;
-- and one call a lease, 1 .. 11 months
SELECT count(*) AS admitted
FROM generate_series(1, 11) AS k,
     LATERAL earmark_reserve_many('cal_many', ARRAY[10], ARRAY['n' || k],
                                  lease => make_interval(months => k)) AS r
WHERE r.admitted;
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE pg_temp.on_utc_calendar(lease_until, created_at, lease)) AS ends_on_utc_calendar
FROM earmark.job WHERE account = 'cal_many';

-- 3. the escrow fast path (jobs taken from a slot)
SELECT count(*) AS admitted
FROM generate_series(1, 11) AS k,
     LATERAL earmark_reserve('cal_escrow', 10, 'm' || k, lease => make_interval(months => k)) AS r
WHERE r.admitted;
SELECT count(*) AS jobs, count(*) FILTER (WHERE slot IS NOT NULL) > 0 AS some_from_a_slot,
       count(*) FILTER (WHERE pg_temp.on_utc_calendar(lease_until, created_at, lease)) AS ends_on_utc_calendar
FROM earmark.job WHERE account = 'cal_escrow';

-- 4. renewals: a charge that fits (from C), a charge that caps (the
-- general path, in SQL), a heartbeat.  Each end is the renewal's clock on
-- the UTC calendar, never earlier than the end before it.
CREATE TEMP TABLE before_renewal AS
SELECT job_id, idempotency_key, lease_until FROM earmark.job WHERE account = 'cal';
SELECT count(*) FILTER (WHERE c.charged = 1 AND NOT c.capped) AS fitting_charges
FROM earmark.job j, LATERAL earmark_charge('cal', j.job_id, 1) AS c
WHERE j.account = 'cal' AND j.idempotency_key IN ('m1', 'm2', 'm3', 'm4');
SELECT count(*) FILTER (WHERE c.capped) AS capping_charges
FROM earmark.job j, LATERAL earmark_charge('cal', j.job_id, 100) AS c
WHERE j.account = 'cal' AND j.idempotency_key IN ('m5', 'm6', 'm7', 'm8');
SELECT count(h) AS heartbeats
FROM earmark.job j, LATERAL earmark_heartbeat('cal', j.job_id) AS h
WHERE j.account = 'cal' AND j.idempotency_key IN ('m9', 'm10', 'm11');
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE j.lease_until >= b.lease_until) AS never_earlier,
       count(*) FILTER (WHERE pg_temp.on_utc_calendar(j.lease_until, j.created_at, j.lease))
         AS ends_on_utc_calendar
FROM earmark.job j JOIN before_renewal b USING (job_id);

-- 5. the same calls from a session in UTC end on the same calendar
SET TimeZone = 'UTC';
SELECT count(*) AS admitted
FROM generate_series(1, 11) AS k,
     LATERAL earmark_reserve('cal', 10, 'u' || k, lease => make_interval(months => k)) AS r
WHERE r.admitted;
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE pg_temp.on_utc_calendar(lease_until, created_at, lease)) AS ends_on_utc_calendar
FROM earmark.job WHERE account = 'cal' AND idempotency_key LIKE 'u%';
RESET TimeZone;
