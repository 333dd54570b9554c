-- test/pgtap/catch.sql: rules whose deliberate breakage no other test
-- caught (issue 14).
--
-- Webhook signatures: the HMAC-SHA256 of a Standard Webhooks delivery is
-- compared over all of its 32 bytes.  A compare of only the first 16 (or
-- of any prefix) takes a signature that is half right.  The vector is the
-- Standard Webhooks spec's published example (also in sql/webhook_signed.sql).
--
-- The rate limit's banked burst after idle time (GCRA without
-- max(tat, now)) is checked in test/pgtap/gate_rules.sql, part 14.
BEGIN;
SELECT plan(10);

\set s1 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
\set id 'msg_p5jXN8AQM9LWM0D4loKWxJek'
\set ts '1614265330'
\set body '{"test": 2432232314}'
\set good 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE='

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

-- a signature with bytes [from, to] (1-based) inverted
CREATE FUNCTION pg_temp.spoil(sig text, first int, last int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    mac bytea := decode(substr(sig, 4), 'base64');
BEGIN
    FOR i IN first..last LOOP
        mac := set_byte(mac, i - 1, get_byte(mac, i - 1) # 255);
    END LOOP;
    RETURN 'v1,' || encode(mac, 'base64');
END
$$;

SELECT is(earmark_webhook_signature_valid(:'s1', :'id', :'ts', :'good', :'body', to_timestamp(:ts)),
          true, 'the spec''s signature is valid (the vector works)');
SELECT is(length(decode(substr(pg_temp.spoil(:'good', 17, 32), 4), 'base64')), 32,
          'a spoiled signature is still 32 bytes (so it is compared, not refused as malformed)');
SELECT is(earmark_webhook_signature_valid(:'s1', :'id', :'ts', pg_temp.spoil(:'good', 17, 32), :'body', to_timestamp(:ts)),
          false, 'first 16 bytes right, last 16 wrong: refused');
SELECT is(earmark_webhook_signature_valid(:'s1', :'id', :'ts', pg_temp.spoil(:'good', 1, 16), :'body', to_timestamp(:ts)),
          false, 'last 16 bytes right, first 16 wrong: refused');
SELECT is(earmark_webhook_signature_valid(:'s1', :'id', :'ts', pg_temp.spoil(:'good', 32, 32), :'body', to_timestamp(:ts)),
          false, 'only the last byte wrong: refused');
SELECT is(earmark_webhook_signature_valid(:'s1', :'id', :'ts', pg_temp.spoil(:'good', 1, 1), :'body', to_timestamp(:ts)),
          false, 'only the first byte wrong: refused');

-- the intake refuses it too, and stores nothing (signed now, with the SQL HMAC)
SELECT earmark_inbox_set_secret('catch_sig', :'s1');
SELECT extract(epoch FROM now())::bigint::text AS now_s \gset
\set ev '{"type": "catch.test"}'
SELECT throws_ok(format('SELECT * FROM earmark_inbox_receive_signed(%L, %L, %L, %L, %L)',
                        'catch_sig', 'msg_catch_half', :'now_s',
                        pg_temp.spoil(pg_temp.sig(:'s1', 'msg_catch_half', :'now_s', :'ev'), 17, 32), :'ev'),
                 'EM101', NULL,
                 'earmark_inbox_receive_signed: a signature with its first 16 bytes right is refused (EM101)');
SELECT is((SELECT count(*) FROM earmark.inbox_event WHERE source = 'catch_sig'), 0::bigint,
          '... and nothing was stored');
SELECT is(pg_temp.sig(:'s1', :'id', :'ts', :'body'), :'good',
          'the SQL HMAC reproduces the spec''s signature (so the spoiled one above had its first 16 bytes right)');
SELECT lives_ok(format('SELECT * FROM earmark_inbox_receive_signed(%L, %L, %L, %L, %L)',
                       'catch_sig', 'msg_catch_half', :'now_s',
                       pg_temp.sig(:'s1', 'msg_catch_half', :'now_s', :'ev'), :'ev'),
                'the same delivery signed right is taken');

SELECT * FROM finish();
ROLLBACK;
