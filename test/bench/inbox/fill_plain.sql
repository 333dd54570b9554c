-- The plain queue's backlog for the benchmarks: messages :first .. :last
-- waiting, the rows plain_produce.sql's sends store (psql -v first=N
-- -v last=M, or \set before \i).
INSERT INTO plain_q (vt, message)
SELECT clock_timestamp(),
       jsonb_build_object('type', 'invoice.paid', 'key', 'fill-' || g,
                          'data', jsonb_build_object('customer_id', 'customer_' || g % 8,
                                                     'plan', jsonb_build_object('key', 'pro')))
  FROM generate_series(:first, :last) g;
