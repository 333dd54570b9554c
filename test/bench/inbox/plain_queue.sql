-- A plain SKIP LOCKED queue, written the usual way (modelled on pgmq's
-- queue table and its send / read / delete functions).  No dedupe key, no
-- receipts, no attempts or backoff: a message is deleted once handled.
CREATE TABLE plain_q (
    msg_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    read_ct     int NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    vt          timestamptz NOT NULL,
    message     jsonb
);
CREATE INDEX plain_q_vt ON plain_q (vt);

-- send: one INSERT
CREATE OR REPLACE FUNCTION plain_send(msg jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE id bigint;
BEGIN
    INSERT INTO plain_q (vt, message) VALUES (clock_timestamp(), msg) RETURNING msg_id INTO id;
    RETURN id;
END $$;

-- read: lock up to qty visible messages (SKIP LOCKED), hide them for vt
-- seconds and count the read
CREATE OR REPLACE FUNCTION plain_read(vt_s int, qty int)
RETURNS TABLE (msg_id bigint, read_ct int, enqueued_at timestamptz, vt timestamptz, message jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH cte AS (
        SELECT q.msg_id FROM plain_q q
         WHERE q.vt <= clock_timestamp()
         ORDER BY q.msg_id
         LIMIT qty
         FOR UPDATE SKIP LOCKED)
    UPDATE plain_q m
       SET vt = clock_timestamp() + make_interval(secs => vt_s),
           read_ct = m.read_ct + 1
      FROM cte
     WHERE m.msg_id = cte.msg_id
    RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message;
END $$;

-- delete: by id, once the message is handled
CREATE OR REPLACE FUNCTION plain_delete(id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM plain_q WHERE msg_id = id;
    RETURN FOUND;
END $$;
