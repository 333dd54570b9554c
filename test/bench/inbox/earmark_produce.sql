-- pgbench producer: one webhook delivery per transaction, a unique dedupe key
\set k random(1, 9000000000000000000)
SELECT event_id, inserted FROM earmark_inbox_receive('bench', :client_id::text || '-' || :k::text,
    'invoice.paid',
    jsonb_build_object('type', 'invoice.paid',
                       'data', jsonb_build_object('customer_id', 'customer_' || :client_id::text,
                                                  'plan', jsonb_build_object('key', 'pro'))));
