-- Standard Webhooks intake: earmark_webhook_signature_valid and
-- earmark_inbox_receive_signed.  The spec's published example, tampering,
-- wrong and rotated secrets, the 5-minute tolerance in both directions,
-- malformed headers and bodies (each error with its own SQLSTATE, nothing
-- stored), and copies of a delivery counted once.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event, earmark.webhook_secret
    RESTART IDENTITY CASCADE;

-- try(sql): the SQLSTATE and message of the error the statement raises
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- HMAC-SHA256 (RFC 2104) in SQL, independent of the C code under test
CREATE FUNCTION pg_temp.hmac_sha256(key bytea, msg bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
    k bytea := CASE WHEN length(key) > 64 THEN sha256(key) ELSE key END;
    ipad bytea;
    opad bytea;
BEGIN
    k := k || decode(repeat('00', 64 - length(k)), 'hex');
    ipad := k;
    opad := k;
    FOR i IN 0..63 LOOP
        ipad := set_byte(ipad, i, get_byte(k, i) # 54);   -- 0x36
        opad := set_byte(opad, i, get_byte(k, i) # 92);   -- 0x5c
    END LOOP;
    RETURN sha256(opad || sha256(ipad || msg));
END
$$;

-- sig(secret, id, ts, body): the "v1,..." entry a sender writes
CREATE FUNCTION pg_temp.sig(secret text, id text, ts text, body text) RETURNS text LANGUAGE sql AS $$
SELECT 'v1,' || encode(pg_temp.hmac_sha256(decode(regexp_replace(secret, '^whsec_', ''), 'base64'),
                                           convert_to(id || '.' || ts || '.' || body, 'UTF8')),
                       'base64')
$$;

-- what the inbox holds, to show that a refused delivery stored nothing
CREATE FUNCTION pg_temp.inbox() RETURNS text LANGUAGE sql AS $$
SELECT (SELECT count(*) FROM earmark.inbox_event) || ' events, '
    || (SELECT coalesce(sum(seen_count), 0) FROM earmark.inbox_event) || ' seen, '
    || (SELECT count(*) FROM earmark.inbox_receipt) || ' receipts'
$$;

-- the spec's example (standard-webhooks/spec, "Verifying the signature")
\set s1 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
\set id 'msg_p5jXN8AQM9LWM0D4loKWxJek'
\set ts '1614265330'
\set body '{"test": 2432232314}'
\set good 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE='
SELECT 'whsec_' || encode(sha256('earmark second secret'), 'base64') AS s2,
       'whsec_' || encode(sha256('nobody knows this one'), 'base64') AS s3 \gset

-- the SQL HMAC reproduces the published signature, so it can sign below
SELECT pg_temp.sig(:'s1', :'id', :'ts', :'body') = :'good' AS helper_matches_spec;

------------------------------------------------------------------------------
-- 1. earmark_webhook_signature_valid
------------------------------------------------------------------------------
SELECT label, earmark_webhook_signature_valid(secret, id, ts, header, body, at) AS valid
FROM (VALUES
    ('spec vector at its own time',        :'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts)),
    ('secret without whsec_ prefix',       substr(:'s1', 7), :'id', :'ts', :'good', :'body', to_timestamp(:ts)),
    ('300 s later (inclusive)',            :'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts + 300)),
    ('301 s later: too old',               :'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts + 301)),
    ('300 s earlier (inclusive)',          :'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts - 300)),
    ('301 s earlier: too far ahead',       :'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts - 301)),
    ('one byte of the body changed',       :'s1', :'id', :'ts', :'good', '{"test": 2432232315}', to_timestamp(:ts)),
    ('a space added to the body',          :'s1', :'id', :'ts', :'good', '{"test":  2432232314}', to_timestamp(:ts)),
    ('another id',                         :'s1', 'msg_p5jXN8AQM9LWM0D4loKWxJeK', :'ts', :'good', :'body', to_timestamp(:ts)),
    ('another timestamp',                  :'s1', :'id', '1614265331', :'good', :'body', to_timestamp(:ts)),
    ('wrong secret',                       :'s2', :'id', :'ts', :'good', :'body', to_timestamp(:ts)),
    ('v1a entry skipped, v1 matches',      :'s1', :'id', :'ts', 'v1a,' || substr(:'good', 4) || ' ' || :'good', :'body', to_timestamp(:ts)),
    ('second of two v1 matches',           :'s1', :'id', :'ts', pg_temp.sig(:'s3', :'id', :'ts', :'body') || ' ' || :'good', :'body', to_timestamp(:ts)),
    ('first of two v1 matches',            :'s1', :'id', :'ts', :'good' || '  ' || pg_temp.sig(:'s3', :'id', :'ts', :'body'), :'body', to_timestamp(:ts)),
    ('neither of two v1 matches',          :'s1', :'id', :'ts', pg_temp.sig(:'s3', :'id', :'ts', :'body') || ' ' || pg_temp.sig(:'s2', :'id', :'ts', :'body'), :'body', to_timestamp(:ts)),
    ('signature of the spec body, now',    :'s1', :'id', :'ts', :'good', :'body', now())
) AS t(label, secret, id, ts, header, body, at);

-- the tolerance follows earmark.webhook_tolerance
SET earmark.webhook_tolerance = 600;
SELECT earmark_webhook_signature_valid(:'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts + 599)) AS within_600;
RESET earmark.webhook_tolerance;

-- malformed input is an error, not a "no"
SELECT label, pg_temp.try(format('SELECT earmark_webhook_signature_valid(%L, %L, %L, %L, %L, %L)',
                                 secret, id, ts, header, :'body', to_timestamp(:ts))) AS result
FROM (VALUES
    ('no v1 entry',              :'s1', :'id', :'ts', 'v2,' || substr(:'good', 4)),
    ('only a v1a entry',         :'s1', :'id', :'ts', 'v1a,' || substr(:'good', 4)),
    ('no comma',                 :'s1', :'id', :'ts', 'v1'),
    ('empty v1 signature',       :'s1', :'id', :'ts', 'v1,'),
    ('v1 not base64',            :'s1', :'id', :'ts', 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE!'),
    ('v1 base64url alphabet',    :'s1', :'id', :'ts', 'v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE='),
    ('v1 of 16 bytes',           :'s1', :'id', :'ts', 'v1,' || encode('0123456789abcdef'::bytea, 'base64')),
    ('a bad v1 beside a good',   :'s1', :'id', :'ts', :'good' || ' v1,%%%'),
    ('only spaces',              :'s1', :'id', :'ts', '   '),
    ('empty header',             :'s1', :'id', :'ts', ''),
    ('NULL header',              :'s1', :'id', :'ts', NULL),
    ('timestamp not a number',   :'s1', :'id', 'yesterday', :'good'),
    ('timestamp with fraction',  :'s1', :'id', '1614265330.5', :'good'),
    ('negative timestamp',       :'s1', :'id', '-1614265330', :'good'),
    ('timestamp with a space',   :'s1', :'id', ' 1614265330', :'good'),
    ('timestamp of 13 digits',   :'s1', :'id', '1614265330000', :'good'),
    ('empty timestamp',          :'s1', :'id', '', :'good'),
    ('secret not base64',        'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS!', :'id', :'ts', :'good'),
    ('secret only the prefix',   'whsec_', :'id', :'ts', :'good'),
    ('NULL secret',              NULL, :'id', :'ts', :'good'),
    ('empty id',                 :'s1', '', :'ts', :'good'),
    ('id of 256 characters',     :'s1', repeat('i', 256), :'ts', :'good')
) AS t(label, secret, id, ts, header);

SELECT pg_temp.try($$SELECT earmark_webhook_signature_valid('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'i', '1', 'v1,x', 'b', NULL)$$) AS null_at,
       pg_temp.try($$SELECT earmark_webhook_signature_valid('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'i', '1', 'v1,x', 'b', 'infinity')$$) AS infinite_at;

------------------------------------------------------------------------------
-- 2. secrets
------------------------------------------------------------------------------
SELECT label, pg_temp.try(q) AS result
FROM (VALUES
    ('8 bytes is too short',  $$SELECT earmark_inbox_set_secret('acme', 'whsec_' || encode('12345678'::bytea, 'base64'))$$),
    ('not base64',            $$SELECT earmark_inbox_set_secret('acme', 'whsec_not base64')$$),
    ('NULL secret',           $$SELECT earmark_inbox_set_secret('acme', NULL)$$),
    ('empty secret',          $$SELECT earmark_inbox_set_secret('acme', '')$$),
    ('NULL source',           $$SELECT earmark_inbox_set_secret(NULL, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')$$),
    ('source too long',       $$SELECT earmark_inbox_set_secret(repeat('s', 256), 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')$$)
) AS t(label, q);

-- with or without the prefix it is one secret, stored in one form
SELECT earmark_inbox_set_secret('acme', :'s1');
SELECT earmark_inbox_set_secret('acme', substr(:'s1', 7));
SELECT source, secret FROM earmark.webhook_secret ORDER BY source, secret;
SELECT earmark_inbox_drop_secret('acme', substr(:'s1', 7)) AS dropped,
       earmark_inbox_drop_secret('acme', :'s1') AS dropped_again;
SELECT count(*) AS secrets FROM earmark.webhook_secret;

------------------------------------------------------------------------------
-- 3. earmark_inbox_receive_signed
------------------------------------------------------------------------------
-- deliveries are signed for the current time
SELECT round(extract(epoch FROM now()))::bigint AS now_s \gset
\set ev '{"type": "invoice.paid", "timestamp": "2026-01-02T03:04:05Z", "data": {"n": 1}}'

-- a source without a secret verifies nothing
SELECT pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)',
                          'acme', 'msg_1', :now_s, pg_temp.sig(:'s1', 'msg_1', :'now_s', :'ev'), :'ev')) AS no_secret;

SELECT earmark_inbox_set_secret('acme', :'s1');

-- a delivery is stored once; its copy only counts
SELECT * FROM earmark_inbox_receive_signed('acme', 'msg_1', :'now_s',
                                           pg_temp.sig(:'s1', 'msg_1', :'now_s', :'ev'), :'ev');
SELECT * FROM earmark_inbox_receive_signed('acme', 'msg_1', :'now_s',
                                           pg_temp.sig(:'s1', 'msg_1', :'now_s', :'ev'), :'ev');
SELECT event_id, source, dedupe_key, event_type, payload, occurred_at, account, status, seen_count
  FROM earmark.inbox_event ORDER BY event_id;
SELECT pg_temp.inbox() AS after_copy;

-- refused deliveries, each with its SQLSTATE; none stores anything
SELECT label, pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)',
                                 source, id, ts, header, body)) AS result
FROM (VALUES
    ('one byte of the body changed', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', :'ev'), replace(:'ev', '"n": 1', '"n": 2')),
    ('signed by an unknown secret', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s2', 'msg_2', :'now_s', :'ev'), :'ev'),
    ('signed for another source', 'other', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', :'ev'), :'ev'),
    ('old timestamp, signature still right for it', 'acme', 'msg_2', (:now_s - 3600)::text,
        pg_temp.sig(:'s1', 'msg_2', (:now_s - 3600)::text, :'ev'), :'ev'),
    ('header without v1', 'acme', 'msg_2', :'now_s'::text,
        replace(pg_temp.sig(:'s1', 'msg_2', :'now_s', :'ev'), 'v1,', 'v2,'), :'ev'),
    ('header not base64', 'acme', 'msg_2', :'now_s'::text, 'v1,????', :'ev'),
    ('empty header', 'acme', 'msg_2', :'now_s'::text, '', :'ev'),
    ('timestamp not a number', 'acme', 'msg_2', 'now',
        pg_temp.sig(:'s1', 'msg_2', 'now', :'ev'), :'ev'),
    -- signed correctly, but the body is not an event
    ('body not JSON', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', 'type=invoice.paid'), 'type=invoice.paid'),
    ('body truncated JSON', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a"'), '{"type": "a"'),
    ('body a JSON array', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '[1, 2]'), '[1, 2]'),
    ('body without type', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', :'body'), :'body'),
    ('type not a string', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": 7}'), '{"type": 7}'),
    ('number out of numeric range', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a", "n": 1e200000}'), '{"type": "a", "n": 1e200000}'),
    ('arrays nested 100000 deep', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a", "n": ' || repeat('[', 100000)),
        '{"type": "a", "n": ' || repeat('[', 100000)),
    ('string with \u0000', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a\u0000"}'), '{"type": "a\u0000"}'),
    ('timestamp a word', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a", "timestamp": "now"}'), '{"type": "a", "timestamp": "now"}'),
    ('timestamp not a date', 'acme', 'msg_2', :'now_s'::text,
        pg_temp.sig(:'s1', 'msg_2', :'now_s', '{"type": "a", "timestamp": "2026-13-45T00:00:00Z"}'),
        '{"type": "a", "timestamp": "2026-13-45T00:00:00Z"}'),
    -- arguments
    ('NULL source', NULL, 'msg_2', :'now_s'::text, 'v1,x', :'ev'),
    ('NULL body', 'acme', 'msg_2', :'now_s'::text, 'v1,x', NULL),
    ('empty body', 'acme', 'msg_2', :'now_s'::text, 'v1,x', ''),
    ('body over 1 MB', 'acme', 'msg_2', :'now_s'::text, 'v1,x', '"' || repeat('x', 1048576) || '"'),
    ('id of 256 characters', 'acme', repeat('i', 256), :'now_s'::text, 'v1,x', :'ev'),
    ('header over 4 kB', 'acme', 'msg_2', :'now_s'::text, repeat('v1,x ', 820), :'ev')
) AS t(label, source, id, ts, header, body);
SELECT pg_temp.inbox() AS after_refusals;

-- the tolerance at the second: 301 s away is refused both ways, 299 s
-- passes both ways.  Each timestamp is taken just before its call and
-- rounded so that the time the call takes can only help the outcome.
SELECT floor(extract(epoch FROM clock_timestamp()))::bigint - 301 AS t \gset
SELECT pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)', 'acme', 'msg_2',
                          :t, pg_temp.sig(:'s1', 'msg_2', :'t', :'ev'), :'ev')) AS signed_301_s_ago;
SELECT ceil(extract(epoch FROM clock_timestamp()))::bigint + 301 AS t \gset
SELECT pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)', 'acme', 'msg_2',
                          :t, pg_temp.sig(:'s1', 'msg_2', :'t', :'ev'), :'ev')) AS signed_301_s_ahead;
SELECT ceil(extract(epoch FROM clock_timestamp()))::bigint - 299 AS t \gset
SELECT inserted AS signed_299_s_ago FROM earmark_inbox_receive_signed('acme', 'msg_old', :'t',
    pg_temp.sig(:'s1', 'msg_old', :'t', :'ev'), :'ev');
SELECT floor(extract(epoch FROM clock_timestamp()))::bigint + 299 AS t \gset
SELECT inserted AS signed_299_s_ahead FROM earmark_inbox_receive_signed('acme', 'msg_ahead', :'t',
    pg_temp.sig(:'s1', 'msg_ahead', :'t', :'ev'), :'ev');
SELECT pg_temp.inbox() AS after_tolerance;

-- rotation: a second secret is added; a delivery signed with either passes
-- (the older one is the second tried), and so does a header with two
-- signatures of which only the second matches
SELECT earmark_inbox_set_secret('acme', :'s2');
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_rot1', :'now_s',
    pg_temp.sig(:'s1', 'msg_rot1', :'now_s', :'ev'), :'ev');
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_rot2', :'now_s',
    pg_temp.sig(:'s2', 'msg_rot2', :'now_s', :'ev'), :'ev');
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_rot3', :'now_s',
    pg_temp.sig(:'s3', 'msg_rot3', :'now_s', :'ev') || ' ' || pg_temp.sig(:'s1', 'msg_rot3', :'now_s', :'ev'), :'ev');
-- the old secret is dropped: what it signs is refused from now on
SELECT earmark_inbox_drop_secret('acme', :'s1') AS dropped;
SELECT pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)', 'acme', 'msg_rot4',
                          :now_s, pg_temp.sig(:'s1', 'msg_rot4', :'now_s', :'ev'), :'ev')) AS old_secret;

-- the event's time: event_timestamp before timestamp, nine fractional
-- digits and an hours-only offset parse; without either, the arrival
\set ev2 '{"type": "customer.plan_changed", "timestamp": "2026-10-21T02:29:24.481368869+11:00", "event_timestamp": "2026-10-21T02:29:23.403633+11"}'
\set ev3 '{"type": "customer.plan_changed", "timestamp": "2026-10-21T02:29:24.481368869+11:00"}'
\set ev4 '{"type": "ping"}'
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_t2', :'now_s', pg_temp.sig(:'s2', 'msg_t2', :'now_s', :'ev2'), :'ev2');
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_t3', :'now_s', pg_temp.sig(:'s2', 'msg_t3', :'now_s', :'ev3'), :'ev3');
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_t4', :'now_s', pg_temp.sig(:'s2', 'msg_t4', :'now_s', :'ev4'), :'ev4');
SET TIME ZONE 'UTC';
SELECT dedupe_key, event_type,
       CASE WHEN dedupe_key = 'msg_t4' THEN (occurred_at > now() - interval '1 minute')::text
            ELSE occurred_at::text END AS occurred_at
  FROM earmark.inbox_event WHERE dedupe_key LIKE 'msg\_t_' ORDER BY dedupe_key;
RESET TIME ZONE;

-- a role with earmark_user receives, but cannot manage secrets
CREATE ROLE em_wh_user IN ROLE earmark_user;
SET ROLE em_wh_user;
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_role', :'now_s',
    pg_temp.sig(:'s2', 'msg_role', :'now_s', :'ev'), :'ev');
SELECT pg_temp.try($$SELECT earmark_inbox_set_secret('acme', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')$$) AS set_secret;
SELECT pg_temp.try($$SELECT * FROM earmark.webhook_secret$$) AS read_secrets;
RESET ROLE;
DROP ROLE em_wh_user;

SELECT dedupe_key, seen_count, (SELECT count(*) FROM earmark.inbox_receipt r WHERE r.event_id = e.event_id) AS receipts
  FROM earmark.inbox_event e ORDER BY event_id;

------------------------------------------------------------------------------
-- 4. secrets whose last base64 character has unused bits set
------------------------------------------------------------------------------
-- The reference libraries decode secrets leniently: Python's
-- base64.b64decode and Node's Buffer ignore the bits of the last character
-- that fall past the last byte.  earmark does too, and stores the secret in
-- its canonical form; signatures stay strict.
-- 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS': 31 characters, the last ('S')
-- carries two bits past the 23rd byte; 'Q' is the same bytes, canonical.
SELECT earmark_inbox_set_secret('lenient', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS');
SELECT earmark_inbox_set_secret('lenient', 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaT=');
SELECT earmark_inbox_set_secret('lenient', 'whsec_AAAAAAAAAAAAAAAAAAAAAB==');
SELECT source, secret FROM earmark.webhook_secret WHERE source = 'lenient' ORDER BY secret;
SELECT earmark_webhook_signature_valid('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS', :'id', :'ts',
           pg_temp.sig('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaQ=', :'id', :'ts', :'body'), :'body',
           to_timestamp(:ts)) AS lenient_secret_verifies;
SELECT pg_temp.try(format('SELECT earmark_webhook_signature_valid(%L, %L, %L, %L, %L, %L)', :'s1', :'id', :'ts',
                          'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OF=', :'body', to_timestamp(:ts))) AS signature_stays_strict;
SELECT earmark_inbox_drop_secret('lenient', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS') AS dropped,
       earmark_inbox_drop_secret('lenient', 'AAAAAAAAAAAAAAAAAAAAAC==') AS dropped_too;
SELECT count(*) AS lenient_secrets FROM earmark.webhook_secret WHERE source = 'lenient';

------------------------------------------------------------------------------
-- 5. a signed event is verified, names its account, and has a present time
------------------------------------------------------------------------------
SELECT earmark_set_account('acme_signed', provider_customer => 'cus_signed');
\set ev5 '{"type": "customer.plan_changed", "event_timestamp": "2026-11-20T00:00:00Z", "data": {"customer_id": "cus_signed", "plan": {"key": "pro"}}}'
SELECT inserted FROM earmark_inbox_receive_signed('acme', 'msg_acct', :'now_s',
    pg_temp.sig(:'s2', 'msg_acct', :'now_s', :'ev5'), :'ev5');
SELECT dedupe_key, account, verified_by FROM earmark.inbox_event
 WHERE dedupe_key IN ('msg_acct', 'msg_t2') ORDER BY dedupe_key;
-- an event time beyond earmark.webhook_tolerance ahead of now: EM108
\set ev6 '{"type": "customer.plan_changed", "event_timestamp": "2999-01-01T00:00:00Z"}'
SELECT pg_temp.try(format('SELECT earmark_inbox_receive_signed(%L, %L, %L, %L, %L)', 'acme', 'msg_2999',
                          :now_s, pg_temp.sig(:'s2', 'msg_2999', :'now_s', :'ev6'), :'ev6')) AS dated_2999;
SELECT count(*) AS stored_2999 FROM earmark.inbox_event WHERE dedupe_key = 'msg_2999';
