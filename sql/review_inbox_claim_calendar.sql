-- An inbox claim's lease (earmark_inbox_claim) ends on the UTC calendar,
-- as a job's lease does (regress lease_calendar): the claim's end
-- (locked_until) is the claim's clock (updated_at) plus the lease added
-- to the UTC wall clock, whatever the session's TimeZone.  timestamptz +
-- interval would add it on the session's calendar: across a daylight-saving
-- change of the session's zone an hour early or late, so the same claim
-- would end at another instant depending on the caller's TimeZone.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
SET TimeZone = 'America/New_York';

-- among leases of 1 to 11 months at least one crosses a change
SELECT bool_or((now() + make_interval(months => k)) <>
               (((now() AT TIME ZONE 'UTC') + make_interval(months => k)) AT TIME ZONE 'UTC'))
       AS some_lease_crosses_a_change
FROM generate_series(1, 11) AS k;

SELECT count(*) AS received
FROM generate_series(1, 11) AS k,
     LATERAL earmark_inbox_receive('kinde', 'cal-' || k, 'customer.note', '{}',
                                   '2026-09-01 00:00+00'::timestamptz + make_interval(mins => k), 'acme');

-- claim them one at a time, the k-th with a lease of k months
CREATE TEMP TABLE claimed (k int, event_id bigint, updated_at timestamptz, locked_until timestamptz);
DO $$
BEGIN
  FOR k IN 1 .. 11 LOOP
    INSERT INTO claimed
    SELECT k, c.event_id, c.updated_at, c.locked_until
    FROM earmark_inbox_claim(1, make_interval(months => k)) AS c;
  END LOOP;
END
$$;
SELECT count(*) AS claims,
       count(*) FILTER (WHERE locked_until =
                        ((updated_at AT TIME ZONE 'UTC') + make_interval(months => k)) AT TIME ZONE 'UTC')
         AS ends_on_utc_calendar
FROM claimed;
RESET TimeZone;
