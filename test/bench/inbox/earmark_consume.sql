-- pgbench consumer: claim up to 10 events and complete them, one transaction
SELECT earmark_inbox_complete(event_id) FROM earmark_inbox_claim(10);
