-- A first delivery's receipt and event are one statement (store_first in
-- src/inbox.c, a data-modifying WITH), so whatever runs at the end of the
-- receipt's insert (a foreign key's check, an AFTER trigger) finds the
-- event, and the event takes the id the receipt was written with
-- (RETURNING r.event_id).  Each case stores and deduplicates the event;
-- a delivery that inserted the receipt by a statement (or from C) before
-- the event fails them:
-- 1. an operator's foreign key from inbox_receipt.event_id to the event
--    (earmark has none, for cost; an operator may add one): every first
--    delivery would fail with 23503;
-- 2. an operator's AFTER INSERT trigger on inbox_receipt that reads the
--    receipt's event (an audit copy, a notification with the event type)
--    would find no event;
-- 3. a BEFORE INSERT trigger on inbox_receipt that changes the event id
--    it carries: an event stored under another id than its key's receipt
--    names would make the next copy of the key a second event (a
--    duplicate) instead of a copy counted.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 1. a foreign key from the receipt to its event
ALTER TABLE earmark.inbox_receipt ADD CONSTRAINT op_receipt_event
    FOREIGN KEY (event_id) REFERENCES earmark.inbox_event;
\set VERBOSITY sqlstate
SELECT inserted FROM earmark_inbox_receive('src', 'fk-1', 'note', '{}');
\set VERBOSITY default
SELECT inserted FROM earmark_inbox_receive('src', 'fk-1', 'note', '{}');
SELECT (SELECT count(*) FROM earmark.inbox_event WHERE dedupe_key = 'fk-1') AS events,
       (SELECT seen_count FROM earmark.inbox_event WHERE dedupe_key = 'fk-1') AS seen;
ALTER TABLE earmark.inbox_receipt DROP CONSTRAINT op_receipt_event;

-- 2. an AFTER INSERT trigger on the receipt that reads its event
CREATE TABLE public.op_receipt_audit (event_id bigint, event_type text);
CREATE FUNCTION public.op_receipt_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.op_receipt_audit
    SELECT NEW.event_id, (SELECT e.event_type FROM earmark.inbox_event e WHERE e.event_id = NEW.event_id);
    RETURN NULL;
END $$;
CREATE TRIGGER op_receipt_audit AFTER INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION public.op_receipt_audit();
SELECT inserted FROM earmark_inbox_receive('src', 'audit-1', 'note.audited', '{}');
SELECT inserted FROM earmark_inbox_receive('src', 'audit-1', 'note.audited', '{}');
SELECT event_type FROM public.op_receipt_audit ORDER BY event_id;
DROP TRIGGER op_receipt_audit ON earmark.inbox_receipt;
DROP FUNCTION public.op_receipt_audit();
DROP TABLE public.op_receipt_audit;

-- 3. a trigger on the receipt that changes the event id it carries
CREATE FUNCTION public.op_receipt_shift() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_id := NEW.event_id + 1000;
    RETURN NEW;
END $$;
CREATE TRIGGER op_receipt_shift BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION public.op_receipt_shift();
SELECT inserted FROM earmark_inbox_receive('src', 'shift-1', 'note', '{}');
SELECT inserted FROM earmark_inbox_receive('src', 'shift-1', 'note', '{}');
DROP TRIGGER op_receipt_shift ON earmark.inbox_receipt;
DROP FUNCTION public.op_receipt_shift();
SELECT count(*) AS events, sum(seen_count) AS seen,
       bool_and(EXISTS (SELECT 1 FROM earmark.inbox_receipt r
                         WHERE r.event_id = e.event_id AND r.dedupe_key = e.dedupe_key)) AS key_names_event
FROM earmark.inbox_event e WHERE dedupe_key = 'shift-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
