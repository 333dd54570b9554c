#!/usr/bin/env bash
# test/bench/callgrind.sh: CPU instructions per call of earmark_reserve,
# earmark_charge and earmark_settle, against the PL/pgSQL reference,
# counted by valgrind --tool=callgrind on a single-user backend.
#
#   sudo bash test/bench/callgrind.sh
#
# A throwaway cluster (earmark not preloaded, so no worker;
# earmark.rate_limit = 0) gets the extension, the reference
# (reference.sql), account cg with a limit of 10^15 in both, and, for the
# charge and settle measurements, pools of open jobs (lease 1 day) whose
# ids are known.  The cluster is then stopped and each measurement is a
# single-user backend (postgres --single) under callgrind, fed on stdin
# with one PREPARE and then N lines "EXECUTE q(...)", each its own
# transaction as pgbench -M prepared sends them, once with N = 1 and once
# with N = 1 + CG_CALLS.  (Ir of the second) - (Ir of the first), divided
# by CG_CALLS, is the cost of one call with everything that happens once
# (start-up, catalog caches, the first plans) taken out.  Measured:
#   reserve   SELECT * FROM earmark_reserve('cg', 10, $1)  | SELECT ref.reserve('cg', 10, $1)
#   charge    SELECT * FROM earmark_charge('cg', $1, 5)    | SELECT ref.charge($1, 5)
#   settle    SELECT * FROM earmark_settle('cg', $1, 5)    | SELECT ref.settle($1, 5)
# with CG_ONLY="earmark_usage earmark_usage_many", recorded usage, one event
# a call against 100 a call (a new key each event):
#   usage        SELECT earmark_record_usage('cg', 1, $1)
#   usage_many   SELECT count(*) FROM earmark_record_usage_many('cg', 100 ones, 100 keys)
# with CG_ONLY="earmark_reserve earmark_settle earmark_jobs_many", a job
# reserved and settled by the single calls against 100 jobs a statement:
#   jobs_many    SELECT count(*) FROM earmark_settle_many('cg',
#                    ARRAY(reserve_many('cg', 100 tens, 100 keys)'s ids), 100 fives)
# and, with CG_ONLY="earmark_receive plain_send", a webhook delivery (a new
# key each) against test/bench/inbox's plain queue's send:
#   receive   SELECT * FROM earmark_inbox_receive('bench', $1, 'invoice.paid', <payload>)
#             | SELECT plain_send(<payload with the key>)
# and, with CG_ONLY="earmark_claim plain_read", a claim of 10 events and
# their completions against the plain queue's read and deletes, each from
# a backlog of 20,000 waiting events (and 10 more a call):
#   claim     SELECT count(earmark_inbox_complete(event_id)) FROM earmark_inbox_claim(10)
#             | SELECT count(plain_delete(msg_id)) FROM plain_read(30, 10)
# and, with CG_ONLY="earmark_receive earmark_receive_copy", a first delivery
# against a copy (the same call with a key delivered before: the copy's
# count on the event and a receipt without the key; the plain queue has no
# dedupe, so there is nothing of its to set beside it):
#   copy      SELECT * FROM earmark_inbox_receive('bench', <a delivered key>, ...)
# and, with CG_ONLY="earmark_budget earmark_refused", a report and a
# refusal (cg's cycle holds the pools' open jobs):
#   budget    SELECT * FROM earmark_budget('cg') (a key each call, unused)
#   refused   SELECT * FROM earmark_reserve('cg', 2 x 10^15, $1): past the
#             limit, after its search for dead holds (none)
# Each also reports the instructions inside the function call itself
# (inclusive): fmgr_security_definer for earmark's gate (its functions are
# SECURITY DEFINER with a pinned search_path, so this wraps the C function
# and includes the search_path switch), em_call_pinned for the receive
# (it pins its search path in C), plpgsql_call_handler for the reference
# and the plain queue.  Instructions are user-space instructions (Ir): the kernel's
# share (the WAL fsync at commit) is not counted.
# CG_PRELOAD=1 preloads earmark in the measured backend (below).
# CG_ESCROW=N gives account cg N escrow slots (earmark_set_escrow) before
# its pools are made: reserve and settle then go through the slots, as on
# a hot account.
#
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${CG_PORT:-55460}
CALLS=${CG_CALLS:-2000}
LIMIT=1000000000000000

command -v valgrind >/dev/null || em_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
em_setup
em_start_cluster "$PORT" "earmark.rate_limit = 0"
CG_TMP=$(mktemp -d /tmp/earmark-callgrind.XXXXXX)
chmod 777 "$CG_TMP"
trap '[ -n "${CG_KEEP:-}" ] && em_log "kept $CG_TMP" || rm -rf "$CG_TMP"; em_stop_cluster' EXIT

# the claims' backlog (none unless they are measured)
case " ${CG_ONLY:-} " in
    *" earmark_claim "* | *" plain_read "*) BACKLOG=$((20000 + 10 * (CALLS + 3))) ;;
    *) BACKLOG=0 ;;
esac

em_psql -d postgres >/dev/null <<SQL
CREATE EXTENSION earmark;
\i $EM_ROOT/test/bench/reference.sql
\i $EM_ROOT/test/bench/inbox/plain_queue.sql
SELECT earmark_set_limit('cg', $LIMIT);
${CG_ESCROW:+SELECT earmark_set_escrow('cg', $CG_ESCROW);}
SELECT ref.set_limit('cg', $LIMIT);
-- the keys each call of earmark_receive_copy delivers again (arg below)
SELECT count(*) FROM (
    SELECT earmark_inbox_receive('bench', k, 'invoice.paid', '{}')
      FROM (SELECT 'earmark_receive_copy-1-1' AS k
            UNION ALL
            SELECT 'earmark_receive_copy-$((CALLS + 1))-' || g FROM generate_series(1, $((CALLS + 1))) g) keys
     WHERE ' ${CG_ONLY:-} ' LIKE '% earmark_receive_copy %') s;
-- the claims' backlog: the rows test/bench/inbox.sh fills its queues with
\set first 1
\set last $BACKLOG
\i $EM_ROOT/test/bench/inbox/fill_earmark.sql
\i $EM_ROOT/test/bench/inbox/fill_plain.sql
-- their rows' hint bits set now, not by whichever call reads them first
VACUUM ANALYZE plain_q;
VACUUM ANALYZE earmark.inbox_event, earmark.inbox_receipt;
-- the cycle's budget row exists before any measurement
SELECT * FROM earmark_settle('cg', (SELECT job_id FROM earmark_reserve('cg', 1, 'warm-up')), 0);
-- pools of open jobs for charge and settle: 1 + 1 + CALLS + 1 a pool, ids
-- in order; 100 a transaction (many holds of one account in one
-- transaction are slow, see docs/benchmarks.md)
DO \$\$
BEGIN
    FOR i IN 1 .. $((2 * CALLS + 4)) LOOP
        PERFORM earmark_reserve('cg', 10, 'pool-' || i, lease => interval '1 day');
        PERFORM ref.reserve('cg', 10, 'pool-' || i, interval '1 day');
        IF i % 100 = 0 THEN COMMIT; END IF;
    END LOOP;
END \$\$;
SQL
EM_FIRST=$(em_psql -d postgres -At -c "SELECT min(job_id) FROM earmark.job WHERE idempotency_key LIKE 'pool-%'")
REF_FIRST=$(em_psql -d postgres -At -c "SELECT min(id) FROM ref.job WHERE key LIKE 'pool-%'")
pools_ok=$(em_psql -d postgres -At -c "
    SELECT (SELECT max(job_id) - min(job_id) + 1 = count(*) AND count(*) = $((2 * CALLS + 4))
              FROM earmark.job WHERE idempotency_key LIKE 'pool-%')
       AND (SELECT max(id) - min(id) + 1 = count(*) AND count(*) = $((2 * CALLS + 4))
              FROM ref.job WHERE key LIKE 'pool-%')")
[ "$pools_ok" = t ] || { em_log "the job pools' ids are not contiguous"; exit 1; }
em_as_pg "$EM_PGBIN/pg_ctl" -D "$EM_DATA" -m fast -w stop >/dev/null

declare -A PREP=(
    [earmark_reserve]="PREPARE q(text) AS SELECT * FROM earmark_reserve('cg', 10, \$1);"
    [reference_reserve]="PREPARE q(text) AS SELECT ref.reserve('cg', 10, \$1);"
    [earmark_charge]="PREPARE q(bigint) AS SELECT * FROM earmark_charge('cg', \$1, 5);"
    [reference_charge]="PREPARE q(bigint) AS SELECT ref.charge(\$1, 5);"
    [earmark_settle]="PREPARE q(bigint) AS SELECT * FROM earmark_settle('cg', \$1, 5);"
    [reference_settle]="PREPARE q(bigint) AS SELECT ref.settle(\$1, 5);"
    # (one line each: a single-user backend reads a statement a line)
    [earmark_receive]="PREPARE q(text) AS SELECT * FROM earmark_inbox_receive('bench', \$1, 'invoice.paid', jsonb_build_object('type', 'invoice.paid', 'data', jsonb_build_object('customer_id', 'customer_1', 'plan', jsonb_build_object('key', 'pro'))));"
    [earmark_usage]="PREPARE q(text) AS SELECT earmark_record_usage('cg', 1, \$1);"
    [earmark_usage_many]="PREPARE q(text) AS SELECT count(*) FROM earmark_record_usage_many('cg', array_fill(1::bigint, ARRAY[100]), ARRAY(SELECT \$1 || '-' || g FROM generate_series(1, 100) g));"
    [earmark_jobs_many]="PREPARE q(text) AS SELECT count(*) FROM earmark_settle_many('cg', ARRAY(SELECT job_id FROM earmark_reserve_many('cg', array_fill(10::bigint, ARRAY[100]), ARRAY(SELECT \$1 || '-' || g FROM generate_series(1, 100) g)) ORDER BY ord), array_fill(5::bigint, ARRAY[100]));"
    [earmark_claim]="PREPARE q(text) AS SELECT count(earmark_inbox_complete(event_id)) FROM earmark_inbox_claim(10) WHERE \$1 <> '';"
    [plain_read]="PREPARE q(text) AS SELECT count(plain_delete(msg_id)) FROM plain_read(30, 10) WHERE \$1 <> '';"
    [earmark_budget]="PREPARE q(text) AS SELECT * FROM earmark_budget('cg') WHERE \$1 <> '';"
    [earmark_refused]="PREPARE q(text) AS SELECT * FROM earmark_reserve('cg', 2000000000000000, \$1);"
    [plain_send]="PREPARE q(text) AS SELECT plain_send(jsonb_build_object('type', 'invoice.paid', 'key', \$1, 'data', jsonb_build_object('customer_id', 'customer_1', 'plan', jsonb_build_object('key', 'pro'))));"
)
# a copy is the same call; only its keys (arg below) were delivered before
PREP[earmark_receive_copy]=${PREP[earmark_receive]}

# the argument of call I (1-based) of the run with N calls: a new key for
# reserve; for charge and settle a job of the pool nobody used yet (run
# with 1 call: job 0 of the pool; run with N: jobs 1 .. N; charge's pool
# first, settle's after it)
arg() {
    local name=$1 n=$2 i=$3 first off
    case $name in
        *_reserve | *_receive | *_receive_copy | *_send | *_usage | *_usage_many | *_jobs_many | *_claim | *_read | *_budget | *_refused)
            echo "'$name-$n-$i'"; return ;;
        earmark_*) first=$EM_FIRST ;;
        *) first=$REF_FIRST ;;
    esac
    off=$(( n == 1 ? 0 : i ))
    case $name in *_settle) off=$(( off + CALLS + 2 )) ;; esac
    echo $(( first + off ))
}

# CG_PRELOAD=1: the single-user backend loads earmark as a preloaded
# library (shared memory: the rate limit, off here; the contention
# detector; the budgets' lease floors, which a refusal trusts)
PRELOAD=()
if [ "${CG_PRELOAD:-0}" = 1 ]; then
    PRELOAD=(-c shared_preload_libraries=earmark -c earmark.rate_limit=0 -c earmark.database=postgres)
fi

# measure NAME N: prints "total_Ir function_inclusive_Ir"
measure() {
    local name=$1 n=$2 out=$CG_TMP/$1.$2.out i
    {
        echo "${PREP[$name]}"
        for i in $(seq 1 "$n"); do echo "EXECUTE q($(arg "$name" "$n" "$i"));"; done
    } >"$CG_TMP/$name.$n.sql"
    em_as_pg valgrind --tool=callgrind --trace-children=no --callgrind-out-file="$out" \
        "$EM_PGBIN/postgres" --single -D "$EM_DATA" "${PRELOAD[@]}" postgres \
        <"$CG_TMP/$name.$n.sql" >"$CG_TMP/$name.$n.log" 2>&1 \
        || { tail -20 "$CG_TMP/$name.$n.log" >&2; em_log "valgrind failed: $name $n"; exit 1; }
    if grep -q 'ERROR' "$CG_TMP/$name.$n.log"; then
        grep -m3 'ERROR' "$CG_TMP/$name.$n.log" >&2; em_log "SQL error in $name $n"; exit 1
    fi
    local total fn
    total=$(sed -n 's/^\(totals\|summary\): *\([0-9]*\).*/\2/p' "$out" | head -1)
    local f=fmgr_security_definer
    case $name in
        reference_* | plain_*) f=plpgsql_call_handler ;;
        earmark_receive* | earmark_claim) f=em_call_pinned ;;
    esac
    fn=$(callgrind_annotate --inclusive=yes --threshold=100 "$out" 2>/dev/null \
        | awk -v f="$f" '!done && ($0 ~ (":" f " ") || $0 ~ (":" f "$")) { gsub(",", "", $1); print $1; done = 1 }')
    echo "$total ${fn:-0}"
}

declare -A PER FNPER
NAMES=${CG_ONLY:-earmark_reserve reference_reserve earmark_charge reference_charge earmark_settle reference_settle}
for name in $NAMES; do
    em_log "callgrind: $name, 1 call"
    read -r t1 f1 < <(measure "$name" 1)
    em_log "callgrind: $name, $((CALLS + 1)) calls"
    read -r t2 f2 < <(measure "$name" $((CALLS + 1)))
    PER[$name]=$(( (t2 - t1) / CALLS ))
    FNPER[$name]=$(( (f2 - f1) / CALLS ))
    em_log "$name: ${PER[$name]} Ir a statement, ${FNPER[$name]} inside the function"
done

fmt() { echo "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo
echo "Instructions (callgrind Ir) per call, single-user backend, $(date -u '+%Y-%m-%d %H:%M UTC');"
echo "(Ir with $((CALLS + 1)) calls - Ir with 1 call) / $CALLS; each call an EXECUTE of a prepared"
echo "statement in its own transaction."
echo
# the header only when some call was measured on both sides (CG_ONLY may
# name earmark's alone, for the batch's table below)
both() { [ -n "${PER[earmark_$1]:-}" ] && [ -n "${PER[reference_$1]:-}" ]; }
{ both reserve || both charge || both settle; } && {
    echo "| call | earmark: statement | earmark: inside the function | reference: statement | reference: inside the function | earmark / reference (statement) |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
}
te=0; tr=0; fe=0; fr=0
for op in reserve charge settle; do
    e=${PER[earmark_$op]:-}; r=${PER[reference_$op]:-}
    [ -n "$e" ] && [ -n "$r" ] || continue
    echo "| $op | $(fmt "$e") | $(fmt "${FNPER[earmark_$op]}") | $(fmt "$r") | $(fmt "${FNPER[reference_$op]}") | $(ratio "$e" "$r") |"
    te=$((te + e)); tr=$((tr + r)); fe=$((fe + ${FNPER[earmark_$op]})); fr=$((fr + ${FNPER[reference_$op]}))
done
[ "$te" -gt 0 ] && echo "| **a job** (the three) | $(fmt $te) | $(fmt $fe) | $(fmt $tr) | $(fmt $fr) | $(ratio $te $tr) |"
e=${PER[earmark_usage]:-}; r=${PER[earmark_usage_many]:-}
if [ -n "$e" ] && [ -n "$r" ]; then
    echo
    echo "| call | statement | inside the function | an event |"
    echo "| --- | ---: | ---: | ---: |"
    echo "| earmark_record_usage, one event | $(fmt "$e") | $(fmt "${FNPER[earmark_usage]}") | $(fmt "$e") |"
    echo "| earmark_record_usage_many, 100 events | $(fmt "$r") | $(fmt "${FNPER[earmark_usage_many]}") | $(fmt $((r / 100))) |"
    echo "| single / batch, an event | | | $(ratio "$e" $((r / 100))) |"
fi
e=${PER[earmark_reserve]:-}; s=${PER[earmark_settle]:-}; r=${PER[earmark_jobs_many]:-}
if [ -n "$e" ] && [ -n "$s" ] && [ -n "$r" ]; then
    echo
    echo "| a job | statements | inside the functions | a job |"
    echo "| --- | ---: | ---: | ---: |"
    echo "| earmark_reserve, then earmark_settle | $(fmt $((e + s))) | $(fmt $((${FNPER[earmark_reserve]} + ${FNPER[earmark_settle]}))) | $(fmt $((e + s))) |"
    echo "| earmark_reserve_many + earmark_settle_many, 100 jobs | $(fmt "$r") | $(fmt "${FNPER[earmark_jobs_many]}") | $(fmt $((r / 100))) |"
    echo "| single / batch, a job | | | $(ratio $((e + s)) $((r / 100))) |"
fi
# vs_plain EARMARK PLAIN WHAT: earmark's call against the plain queue's, when both were measured
vs_plain() {
    local e=${PER[$1]:-} r=${PER[$2]:-}
    [ -n "$e" ] && [ -n "$r" ] || return 0
    echo
    echo "| call | earmark: statement | earmark: inside the function(s) | plain queue: statement | plain queue: inside the function(s) | earmark / plain (statement) |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    echo "| $3 | $(fmt "$e") | $(fmt "${FNPER[$1]}") | $(fmt "$r") | $(fmt "${FNPER[$2]}") | $(ratio "$e" "$r") |"
}
vs_plain earmark_claim plain_read "10 events claimed and completed (claim + 10 completes / read + 10 deletes)"
vs_plain earmark_receive plain_send "a delivery (receive / send)"
e=${PER[earmark_receive]:-}
c=${PER[earmark_receive_copy]:-}
if [ -n "$e" ] && [ -n "$c" ]; then
    echo
    echo "| call | statement | inside the function | / a first delivery (statement) |"
    echo "| --- | ---: | ---: | ---: |"
    echo "| a first delivery | $(fmt "$e") | $(fmt "${FNPER[earmark_receive]}") | 1.00 |"
    echo "| a copy (its key delivered before) | $(fmt "$c") | $(fmt "${FNPER[earmark_receive_copy]}") | $(ratio "$c" "$e") |"
fi
if [ -n "${PER[earmark_budget]:-}${PER[earmark_refused]:-}" ]; then
    echo
    echo "| call | statement | inside the function |"
    echo "| --- | ---: | ---: |"
    for n in earmark_budget earmark_refused; do
        [ -n "${PER[$n]:-}" ] && echo "| ${n#earmark_} | $(fmt "${PER[$n]}") | $(fmt "${FNPER[$n]}") |"
    done
fi
