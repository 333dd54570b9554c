-- Statement-level AFTER INSERT triggers with transition tables on the
-- inbox's tables: an operator's audit that counts the rows each INSERT
-- statement wrote.  SPI stops a top-level INSERT ... RETURNING run with a
-- row count of 1 after that row, before its ModifyTable node sees the end
-- of its input, so the statement's AFTER STATEMENT triggers never fire;
-- store_delivery runs its statements with no count (each returns one row
-- at most), so a first delivery's event and receipt, and a copy's receipt,
-- each reach such a trigger.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE TABLE public.op_stmt_audit (tab text, n bigint);
CREATE FUNCTION public.op_stmt_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.op_stmt_audit SELECT TG_TABLE_NAME, count(*) FROM new_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER op_stmt_audit AFTER INSERT ON earmark.inbox_event
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.op_stmt_audit();
CREATE TRIGGER op_stmt_audit AFTER INSERT ON earmark.inbox_receipt
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.op_stmt_audit();
SELECT inserted FROM earmark_inbox_receive('src', 'stmt-1', 'note', '{}');
SELECT tab, sum(n) AS rows_seen FROM public.op_stmt_audit GROUP BY tab ORDER BY tab;
SELECT inserted FROM earmark_inbox_receive('src', 'stmt-1', 'note', '{}');
SELECT tab, sum(n) AS rows_seen FROM public.op_stmt_audit GROUP BY tab ORDER BY tab;
SELECT (SELECT count(*) FROM earmark.inbox_event) AS events,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts;
DROP TRIGGER op_stmt_audit ON earmark.inbox_event;
DROP TRIGGER op_stmt_audit ON earmark.inbox_receipt;
DROP FUNCTION public.op_stmt_audit();
DROP TABLE public.op_stmt_audit;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
