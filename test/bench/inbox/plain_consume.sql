-- pgbench consumer: read up to 10 messages and delete them, one transaction
SELECT plain_delete(msg_id) FROM plain_read(30, 10);
