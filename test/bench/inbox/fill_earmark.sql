-- The earmark inbox's backlog for the benchmarks: events :first .. :last
-- waiting, each with its key receipt, the rows earmark_produce.sql's
-- deliveries store (psql -v first=N -v last=M, or \set before \i).
WITH e AS (
    INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, verified_by)
    SELECT 'bench', 'fill-' || g, 'invoice.paid',
           jsonb_build_object('type', 'invoice.paid',
                              'data', jsonb_build_object('customer_id', 'customer_' || g % 8,
                                                         'plan', jsonb_build_object('key', 'pro'))),
           clock_timestamp(), 'admin'
      FROM generate_series(:first, :last) g
    RETURNING event_id, source, dedupe_key)
INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
SELECT event_id, true, source, dedupe_key FROM e;
