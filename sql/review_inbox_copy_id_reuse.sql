-- A copy of a stored event whose id the identity deals again (an operator
-- restarted it).  A copy whose event has this round's event id is taken
-- for "a trigger stored the event its own way" (09000) only when this
-- round's receipt holds the key (key_is_ours, inbox.c); the id alone
-- cannot tell, as an id can be dealt again after a restart of the
-- identity.  A genuine redelivery of the event is counted as a copy.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
SELECT event_id AS first_id, inserted FROM earmark_inbox_receive('src', 'reuse-1', 'note', '{}') \gset
SELECT :first_id AS first_id, :'inserted' AS inserted;
-- the identity dealt the event's id again (restarted by an operator)
ALTER TABLE earmark.inbox_event ALTER COLUMN event_id RESTART WITH :first_id;
\set VERBOSITY sqlstate
SELECT event_id = :first_id AS same_event, inserted
FROM earmark_inbox_receive('src', 'reuse-1', 'note', '{}');
\set VERBOSITY default
SELECT count(*) AS events, sum(seen_count) AS seen FROM earmark.inbox_event WHERE dedupe_key = 'reuse-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
