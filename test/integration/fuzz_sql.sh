#!/usr/bin/env bash
# Bad input at every SQL function of the extension: at least 100,000 calls
# generated from one seed (test/integration/fuzz_sql.py) with NULL in each
# argument, empty, 255/256-character and 1 MB strings, control characters
# and odd Unicode, numeric extremes, zero, negative and huge intervals,
# infinite and edge timestamps, odd jsonb payloads and event times, broken
# and forged JWTs, Standard Webhooks deliveries with bad timestamps and
# signature headers, unknown job and event ids, handlers that are not
# handlers, and callers without the right role.  The calls run against a
# fixture with every kind of state (jobs running, capped, settled and dead,
# events in every status, secrets, a key set with good and broken keys),
# each in a transaction of its own.  A call whose arguments the docs refuse
# (fuzz_sql.py's REFUSED: a NULL that means nothing, an empty, 256-character
# or 1 MB name) must fail; if it succeeds, what it did is committed.  Any
# other call (its values may be valid) runs in a subtransaction that is
# rolled back after it, so that every call meets the same fixture.
#
# Checks: the server never crashed (same postmaster, no backend killed by a
# signal in the log); no internal error (XX000); every SQLSTATE raised is
# one that the docs give for that function (docs/api.md's error table and
# the function's own section, docs/inbox.md for the inbox); every call the
# docs refuse failed; every table in schema earmark is byte for byte what
# it was (md5 of its rows, ordered), which a refused call that succeeded
# would have changed; earmark_check() returns no row.
#
# Runs in its own database (earmark_fuzz), where the background worker does
# nothing.  EM_FUZZ_SEED replays a run; EM_FUZZ_CALLS changes the number of
# calls (default 100000); EM_FUZZ_KEEP=1 keeps the database for a look.
source "$(dirname "$0")/tap.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FZDB=earmark_fuzz
SEED=${EM_FUZZ_SEED:-$(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 2147483647 ))}
CALLS=${EM_FUZZ_CALLS:-100000}
BATCH=${EM_FUZZ_BATCH:-2000}
WORK=$(mktemp -d /tmp/earmark-fuzz.XXXXXX)
chmod 755 "$WORK"
ROLES=(earmark_fuzz_nobody earmark_fuzz_user earmark_fuzz_admin)
T0=$(date +%s)

# a commit per call: not waiting for the WAL flush keeps 100,000 of them fast
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=error -c synchronous_commit=off"
fz() { q -d "$FZDB" "$@"; }

cleanup() {
    if [ -z "${EM_FUZZ_KEEP:-}" ]; then
        q -d postgres -c "DROP DATABASE IF EXISTS $FZDB WITH (FORCE)" >/dev/null 2>&1
        for r in "${ROLES[@]}"; do q -d postgres -c "DROP ROLE IF EXISTS $r" >/dev/null 2>&1; done
    else
        diag "kept database $FZDB and $WORK"
        return
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

diag "seed $SEED (replay: EM_FUZZ_SEED=$SEED bash test/integration/fuzz_sql.sh), $CALLS calls"

# --- a database of its own, the extension, the harness -------------------------
q -d postgres -c "DROP DATABASE IF EXISTS $FZDB WITH (FORCE)" -c "CREATE DATABASE $FZDB" >/dev/null || exit 1
for r in "${ROLES[@]}"; do
    q -d postgres -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$r') THEN CREATE ROLE $r NOLOGIN; END IF; END \$\$" >/dev/null
done
fz -c "CREATE EXTENSION earmark" >/dev/null || exit 1
# (the extension creates earmark_user and earmark_admin when they do not exist yet)
q -d postgres -c "GRANT earmark_user TO earmark_fuzz_user" -c "GRANT earmark_admin TO earmark_fuzz_admin" >/dev/null || exit 1
fz >/dev/null <<'SQL' || exit 1
CREATE SCHEMA fuzz;
GRANT USAGE ON SCHEMA fuzz TO PUBLIC;
CREATE TABLE fuzz.call (id int PRIMARY KEY, fn text NOT NULL, cls text NOT NULL, refuse boolean NOT NULL,
                        pre text, sql text NOT NULL);
CREATE TABLE fuzz.result (id int PRIMARY KEY, state text NOT NULL, msg text);
CREATE TABLE fuzz.val (name text PRIMARY KEY, v text NOT NULL);
CREATE TABLE fuzz.allowed (fn text, state text, source text, PRIMARY KEY (fn, state));
CREATE TABLE fuzz.cast_check (kind text, expr text);
-- large values, read by the calls (also by callers without rights on anything else)
CREATE FUNCTION fuzz.v(n text) RETURNS text LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog AS $$ SELECT v FROM fuzz.val WHERE name = n $$;
GRANT EXECUTE ON FUNCTION fuzz.v(text) TO PUBLIC;
-- handler candidates: one good, the others not handlers
CREATE FUNCTION fuzz.h_ok(e earmark.inbox_event) RETURNS text LANGUAGE sql AS $$ SELECT 'ok' $$;
CREATE FUNCTION fuzz.h_int(e earmark.inbox_event) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE FUNCTION fuzz.h_set(e earmark.inbox_event) RETURNS SETOF text LANGUAGE sql AS $$ SELECT 'a' $$;
CREATE FUNCTION fuzz.h_two(e earmark.inbox_event, n int) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION fuzz.h_text(t text) RETURNS text LANGUAGE sql AS $$ SELECT t $$;
CREATE FUNCTION fuzz.h_other(e earmark.inbox_event) RETURNS text LANGUAGE sql AS $$ SELECT 'other' $$;
ALTER FUNCTION fuzz.h_other(earmark.inbox_event) OWNER TO earmark_fuzz_user;
CREATE PROCEDURE fuzz.h_proc(e earmark.inbox_event) LANGUAGE sql AS $$ SELECT 1 $$;

-- one row per table of schema earmark: its name and the md5 of its rows in order
CREATE FUNCTION fuzz.checksum() RETURNS TABLE (rel text, md5 text, n bigint) LANGUAGE plpgsql AS $$
DECLARE t record;
BEGIN
    FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
              WHERE s.nspname = 'earmark' AND c.relkind IN ('r', 'p') ORDER BY c.relname LOOP
        rel := t.relname;
        EXECUTE format('SELECT md5(coalesce(string_agg(x::text, E''\n'' ORDER BY x::text), '''')), count(*) FROM earmark.%I x',
                       t.relname) INTO md5, n;
        RETURN NEXT;
    END LOOP;
END $$;

-- run calls lo..hi, each in a transaction of its own (CALL it outside a
-- transaction block): a call the docs refuse keeps what it did if it
-- succeeds (its transaction commits), any other call is rolled back
-- (FZ000) so that the next one meets the same fixture
CREATE PROCEDURE fuzz.run(lo int, hi int) LANGUAGE plpgsql AS $$
DECLARE
    r record;
    st text;
    msg text;
BEGIN
    -- for the session: a commit ends settings made for the transaction
    PERFORM set_config('client_min_messages', 'error', false);
    PERFORM set_config('earmark.kinde_domain', 'http://127.0.0.1:1', false);
    PERFORM set_config('earmark.jwks_refetch_cooldown', '3600', false);
    PERFORM set_config('earmark.http_timeout', '1000', false);
    FOR r IN SELECT * FROM fuzz.call WHERE id BETWEEN lo AND hi ORDER BY id LOOP
        BEGIN
            IF r.pre IS NOT NULL THEN
                EXECUTE r.pre;
            END IF;
            EXECUTE r.sql;
            IF NOT r.refuse THEN
                RAISE EXCEPTION USING ERRCODE = 'FZ000';
            END IF;
            st := 'ok';
            msg := NULL;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
            IF st = 'FZ000' THEN
                st := 'ok';
                msg := NULL;
            END IF;
        END;
        -- a pre may have set a role for the transaction
        RESET ROLE;
        INSERT INTO fuzz.result VALUES (r.id, st, left(msg, 300))
            ON CONFLICT (id) DO UPDATE SET state = excluded.state, msg = excluded.msg;
        COMMIT;
    END LOOP;
END $$;
SQL

# --- the corpus -------------------------------------------------------------------
fz -c "SELECT n.nspname, p.proname,
              coalesce((SELECT string_agg(a.nm, ',' ORDER BY a.i)
                          FROM unnest(p.proargnames, coalesce(p.proargmodes::text[],
                                      array_fill('i'::text, ARRAY[coalesce(cardinality(p.proargnames), 0)])))
                               WITH ORDINALITY a(nm, md, i)
                         WHERE a.md IN ('i', 'b', 'v')), ''),
              coalesce((SELECT string_agg(format_type(t.oid, NULL), ',' ORDER BY t.i)
                          FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY t(oid, i)), ''),
              p.pronargdefaults, p.proretset
         FROM pg_proc p
         JOIN pg_namespace n ON n.oid = p.pronamespace
         JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
         JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'earmark'
        WHERE p.prorettype <> 'trigger'::regtype AND p.prokind = 'f'
        ORDER BY 1, 2" -F '|' >"$WORK/functions" || exit 1
NFN=$(wc -l <"$WORK/functions")
t=$(date +%s)
# the server headers' errcodes.h (the system's: a private copy of PostgreSQL,
# EM_PREFIX, has none), for the list of valid SQLSTATEs
PGINC=/usr/include/postgresql/15/server
[ -r "$PGINC/utils/errcodes.h" ] || PGINC=$("$EM_PGBIN/pg_config" --includedir-server 2>/dev/null)
[ -r "$PGINC/utils/errcodes.h" ]
ok $? "the server headers' errcodes.h is there ($PGINC/utils/errcodes.h): the valid SQLSTATEs"
python3 "$ROOT/test/integration/fuzz_sql.py" --seed "$SEED" --calls "$CALLS" --functions "$WORK/functions" \
    --docs "$ROOT/docs" --errcodes "$PGINC/utils/errcodes.h" --out "$WORK" >"$WORK/gen.log" 2>&1
ok $? "generated the corpus ($(cat "$WORK/gen.log" | tail -1), $(( $(date +%s) - t )) s)" || { sed 's/^/# /' "$WORK/gen.log"; exit 1; }

fz -c "\\copy fuzz.val FROM '$WORK/vals.copy'" -c "\\copy fuzz.call FROM '$WORK/calls.copy'" \
   -c "\\copy fuzz.allowed FROM '$WORK/allowed.copy'" -c "\\copy fuzz.cast_check FROM '$WORK/casts.copy'" >/dev/null || exit 1
fz -f "$WORK/fixture.sql" >"$WORK/fixture.log" 2>&1
ok $? "the fixture is in place" || { sed 's/^/# /' "$WORK/fixture.log" | tail -20; exit 1; }

# markers of the fixture's ids, then every argument expression on its own
unresolved=$(fz <<'SQL'
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT name, val FROM fuzz.ref LOOP
        UPDATE fuzz.call SET sql = replace(sql, '@@REF:' || r.name || '@@', r.val)
         WHERE strpos(sql, '@@REF:' || r.name || '@@') > 0;
        UPDATE fuzz.cast_check SET expr = replace(expr, '@@REF:' || r.name || '@@', r.val)
         WHERE strpos(expr, '@@REF:' || r.name || '@@') > 0;
    END LOOP;
END $$;
SELECT count(*) FROM fuzz.call WHERE sql LIKE '%@@REF:%';
SQL
)
is "$unresolved" 0 "every fixture id in the corpus is resolved"
fz >"$WORK/badcasts" <<'SQL'
CREATE FUNCTION fuzz.bad_casts() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    FOR r IN SELECT * FROM fuzz.cast_check LOOP
        BEGIN
            EXECUTE format('SELECT (%s)::%s', r.expr, r.kind);
        EXCEPTION WHEN OTHERS THEN
            RETURN NEXT left(r.expr, 200) || ': ' || SQLERRM;
        END;
    END LOOP;
END $$;
SELECT * FROM fuzz.bad_casts();
SQL
is "$(wc -l <"$WORK/badcasts")" 0 "every typed argument of the corpus is valid on its own (an error comes from the function)"
sed 's/^/#   /' "$WORK/badcasts" | head -20

# --- before ----------------------------------------------------------------------------
fz -c "SELECT rel, md5, n FROM fuzz.checksum()" >"$WORK/before"
start_time=$(q -d postgres -c "SELECT pg_postmaster_start_time()")
pm_pid=
[ -n "${EM_DATA:-}" ] && [ -r "$EM_DATA/postmaster.pid" ] && pm_pid=$(head -1 "$EM_DATA/postmaster.pid")
log=${EM_BASE:+$EM_BASE/server.log}
log_off=0
[ -n "$log" ] && [ -r "$log" ] && log_off=$(stat -c %s "$log")

# --- run ---------------------------------------------------------------------------------
wait_up() {   # until the server accepts connections (after a crash: recovery)
    local deadline
    deadline=$(wait_deadline 60)
    until "$EM_PGBIN/pg_isready" -q -d "$FZDB" >/dev/null 2>&1 && q -d "$FZDB" -c "SELECT 1" >/dev/null 2>&1; do
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        sleep 0.5
    done
}

BROKEN=()          # calls that kill their batch (a crash, a cancel) on their own
run_range() {      # run_range LO HI: a batch; on failure split it until the call is found
    local lo=$1 hi=$2 mid
    if fz -c "CALL fuzz.run($lo, $hi)" >/dev/null 2>"$WORK/batch.err"; then
        return 0
    fi
    diag "calls $lo-$hi: $(head -3 "$WORK/batch.err" | tr '\n' ' ')"
    wait_up || return 1
    if [ "$lo" -eq "$hi" ]; then
        BROKEN+=("$lo")
        return 0
    fi
    mid=$(( (lo + hi) / 2 ))
    run_range "$lo" "$mid" && run_range $((mid + 1)) "$hi"
}

total=$(fz -c "SELECT count(*) FROM fuzz.call")
t_run=$(date +%s)
lo=1
ran_all=0
while [ "$lo" -le "$total" ]; do
    hi=$((lo + BATCH - 1))
    run_range "$lo" "$hi" || { ran_all=1; diag "the server did not come back"; break; }
    lo=$((hi + 1))
done
run_s=$(( $(date +%s) - t_run ))
ok "$ran_all" "ran $total calls in $run_s s ($(( total / (run_s > 0 ? run_s : 1) )) a second)"

# --- the server ------------------------------------------------------------------------
is "${#BROKEN[@]}" 0 "no call broke its batch (a crash or a cancel)"
for id in "${BROKEN[@]}"; do
    diag "call $id: $(fz -c "SELECT fn || ': ' || coalesce(pre || '; ', '') || left(sql, 400) FROM fuzz.call WHERE id = $id")"
done
is "$(q -d postgres -c "SELECT pg_postmaster_start_time()")" "$start_time" "the postmaster was not restarted"
if [ -n "$pm_pid" ]; then
    is "$(head -1 "$EM_DATA/postmaster.pid")" "$pm_pid" "the same postmaster runs (pid $pm_pid)"
fi
if [ -n "$log" ] && [ -r "$log" ]; then
    tail -c +"$((log_off + 1))" "$log" | grep -E "terminated by signal|was terminated by|exited with exit code|PANIC|TRAP:|server process .* exited|all server processes terminated" >"$WORK/crashlog"
    is "$(wc -l <"$WORK/crashlog")" 0 "no server process was killed or exited abnormally (server log)"
    sed 's/^/#   /' "$WORK/crashlog" | head -20
fi

# --- the SQLSTATEs -----------------------------------------------------------------------
is "$(fz -c "SELECT count(*) FROM fuzz.call c LEFT JOIN fuzz.result r USING (id) WHERE r.id IS NULL")" \
   "${#BROKEN[@]}" "every call has a result"
diag "documented SQLSTATEs (from docs/api.md and docs/inbox.md):"
fz -c "SELECT '#   ' || fn || ': ' || string_agg(state, ' ' ORDER BY state) FROM fuzz.allowed GROUP BY fn ORDER BY fn"
diag "calls, accidental successes and SQLSTATEs per function:"
fz -c "SELECT '#   ' || rpad(c.fn, 34) || lpad(count(*)::text, 6) || ' calls, ' ||
              lpad(count(*) FILTER (WHERE r.state = 'ok')::text, 5) || ' ok: ' ||
              (SELECT string_agg(s.state || ' ' || s.n, ', ' ORDER BY s.n DESC, s.state)
                 FROM (SELECT r2.state, count(*) AS n FROM fuzz.call c2 JOIN fuzz.result r2 USING (id)
                        WHERE c2.fn = c.fn AND r2.state <> 'ok' GROUP BY r2.state) s)
         FROM fuzz.call c JOIN fuzz.result r USING (id) GROUP BY c.fn ORDER BY c.fn"
diag "calls per class of bad input:"
fz -c "SELECT '#   ' || string_agg(cls || ' ' || n, ', ' ORDER BY n DESC, cls) FROM (SELECT cls, count(*) n FROM fuzz.call GROUP BY cls) s"

fns_called=$(fz -c "SELECT count(DISTINCT fn) FROM fuzz.call")
is "$fns_called" "$NFN" "every function of the extension was called ($NFN)"
ok "$(( total >= 100000 || CALLS < 100000 ? 0 : 1 ))" "at least 100,000 bad calls ($total)"

is "$(fz -c "SELECT count(*) FROM fuzz.result WHERE state LIKE 'XX%'")" 0 "no internal error (XX000)"
fz -c "SELECT '#   ' || r.state || ' ' || c.fn || ': ' || r.msg || E'\n#     ' || left(c.sql, 300)
         FROM fuzz.result r JOIN fuzz.call c USING (id) WHERE r.state LIKE 'XX%' ORDER BY r.id LIMIT 10"

# one line per function: every SQLSTATE it raised is documented for it
undoc=0
while IFS='|' read -r fn n; do
    is "$n" 0 "$fn: every SQLSTATE raised is documented"
    [ "$n" != 0 ] && undoc=1
done < <(fz -F '|' -c "SELECT c.fn, count(r.id) FILTER (WHERE r.state <> 'ok' AND a.state IS NULL)
                         FROM fuzz.call c LEFT JOIN fuzz.result r USING (id)
                         LEFT JOIN fuzz.allowed a ON a.fn = c.fn AND a.state = r.state
                        GROUP BY c.fn ORDER BY c.fn")
if [ "$undoc" = 1 ]; then
    diag "undocumented SQLSTATEs (up to 3 calls each):"
    fz -c "SELECT '#   ' || fn || ' ' || state || ' x' || n || ': ' || msg || E'\n' ||
                  string_agg('#     ' || coalesce(pre || '; ', '') || left(sql, 400), E'\n')
             FROM (SELECT c.fn, r.state, r.msg, c.pre, c.sql,
                          count(*) OVER (PARTITION BY c.fn, r.state) AS n,
                          row_number() OVER (PARTITION BY c.fn, r.state ORDER BY length(c.sql), c.id) AS k
                     FROM fuzz.call c JOIN fuzz.result r USING (id)
                     LEFT JOIN fuzz.allowed a ON a.fn = c.fn AND a.state = r.state
                    WHERE r.state <> 'ok' AND a.state IS NULL) x
            WHERE k <= 3 GROUP BY fn, state, msg, n ORDER BY fn, state, msg" | head -150
fi

# input that the docs refuse: every such call failed (one that succeeded
# also left what it did, for the table check below)
refusable=$(fz -c "SELECT count(*) FROM fuzz.call WHERE refuse")
ok "$(( refusable > 0 ? 0 : 1 ))" "the corpus has calls whose arguments the docs refuse ($refusable)"
accepted=$(fz -c "SELECT count(*) FROM fuzz.call c JOIN fuzz.result r USING (id) WHERE c.refuse AND r.state = 'ok'")
is "$accepted" 0 "every call whose arguments the docs refuse (a NULL that means nothing, an empty, 256-character or 1 MB name) failed"
fz -c "SELECT '#   accepted ' || c.cls || ' ' || c.fn || ' x' || count(*) || ': ' || left(min(coalesce(c.pre || '; ', '') || c.sql), 300)
         FROM fuzz.call c JOIN fuzz.result r USING (id)
        WHERE r.state = 'ok' AND c.refuse
        GROUP BY c.cls, c.fn ORDER BY c.fn, c.cls" | head -40

# --- nothing changed ---------------------------------------------------------------------
fz -c "SELECT rel, md5, n FROM fuzz.checksum()" >"$WORK/after"
diff "$WORK/before" "$WORK/after" >"$WORK/diff"
ok $? "every table in schema earmark is unchanged ($(wc -l <"$WORK/after") tables, md5 of their rows)"
sed 's/^/#   /' "$WORK/diff"
# (but the fixture's hold whose lease passed on purpose: no worker sweeps this
# database, so after a minute earmark_check() reports it as overdue_hold)
check=$(fz -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
           -c "SELECT count(*) FROM earmark_check() c
                WHERE NOT (c.invariant = 'overdue_hold' AND c.account = 'fz_a'
                           AND c.detail LIKE 'job ' || (SELECT val FROM fuzz.ref WHERE name = 'job:expired_lease') || ' is running,%')" \
           -c "COMMIT" 2>&1)
is "$check" 0 "earmark_check() returns no row (but overdue_hold for the fixture's dead hold)"
[ "$check" = 0 ] || fz -c "SELECT invariant, account, feature, detail FROM earmark_check()" 2>&1 | sed 's/^/# /'

diag "fuzz_sql took $(( $(date +%s) - T0 )) s"
done_testing
