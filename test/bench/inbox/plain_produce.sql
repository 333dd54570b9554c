-- pgbench producer: one message per transaction (the key is only carried)
\set k random(1, 9000000000000000000)
SELECT plain_send(jsonb_build_object('type', 'invoice.paid', 'key', :client_id::text || '-' || :k::text,
                                     'data', jsonb_build_object('customer_id', 'customer_' || :client_id::text,
                                                                'plan', jsonb_build_object('key', 'pro'))));
