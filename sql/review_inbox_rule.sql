-- An ON INSERT ... DO ALSO NOTIFY rule on earmark.inbox_event, the rule
-- system's way to wake a LISTENer on each new row.  The event's insert is
-- store_first's top-level statement, so such a rule runs with it.  (In a
-- data-modifying WITH, PostgreSQL refuses DO ALSO rules with 0A000: every
-- delivery would fail.)
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE RULE op_notify_new AS ON INSERT TO earmark.inbox_event DO ALSO NOTIFY op_inbox_new;
\set VERBOSITY sqlstate
SELECT inserted FROM earmark_inbox_receive('src', 'rule-1', 'note', '{}');
SELECT inserted FROM earmark_inbox_receive('src', 'rule-1', 'note', '{}');
\set VERBOSITY default
DROP RULE op_notify_new ON earmark.inbox_event;
SELECT count(*) AS events, sum(seen_count) AS seen FROM earmark.inbox_event WHERE dedupe_key = 'rule-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
