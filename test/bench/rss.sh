#!/usr/bin/env bash
# test/bench/rss.sh: does a backend's memory stay flat over a million
# reserve + settle calls?  On a private throwaway cluster.
#
#   sudo bash test/bench/rss.sh
#
# One session (one backend) calls a procedure that runs, RSS_BATCH times
# (100,000), earmark_reserve then earmark_settle, each pair in its own
# transaction (COMMIT in the loop), on one account with a finite limit
# (10^15) and earmark.rate_limit = 0.  After every batch the backend reads
# its own /proc/self/status (pg_read_file) and prints VmRSS (all resident
# memory), RssAnon (its private heap: where a leak would show) and RssShmem
# (the shared memory it has touched: shared buffers, growing towards
# shared_buffers as the tables grow, not a leak).  RSS_BATCHES batches (10):
# a million calls of each.
#
# The same loop then runs over the PL/pgSQL reference (ref.reserve,
# ref.settle) in a second session, as a control: growth both sides share
# belongs to the loop or to PostgreSQL, not to earmark.  RSS_REFERENCE=0
# skips it.
#
# synchronous_commit is off in these sessions: this measures memory, not
# durability, and a million fsyncs would take a long while.
#
# Environment: RSS_PORT (55459), RSS_BATCH (100000), RSS_BATCHES (10),
# RSS_REFERENCE (1).  A few minutes per million on 2 cores.

source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

PORT=${RSS_PORT:-55459}
BATCH=${RSS_BATCH:-100000}
BATCHES=${RSS_BATCHES:-10}
REFERENCE=${RSS_REFERENCE:-1}
LIMIT=1000000000000000

em_setup
em_start_cluster "$PORT" "shared_preload_libraries = 'earmark'" \
    "earmark.database = 'postgres'" "earmark.rate_limit = 0" \
    "max_wal_size = '4GB'" "checkpoint_timeout = '30min'"

em_psql -d postgres >/dev/null <<SQL
CREATE EXTENSION earmark;
\i $EM_ROOT/test/bench/reference.sql
SELECT earmark_set_limit('rss', $LIMIT);
SELECT ref.set_limit('rss', $LIMIT);

CREATE PROCEDURE rss_loop(side text, batch int, n int)
LANGUAGE plpgsql AS \$\$
DECLARE
    j bigint;
BEGIN
    FOR i IN 1 .. n LOOP
        IF side = 'earmark' THEN
            SELECT r.job_id INTO j FROM earmark_reserve('rss', 10, batch || '-' || i) r;
            PERFORM earmark_settle('rss', j, 5);
        ELSE
            j := ref.reserve('rss', 10, batch || '-' || i);
            PERFORM ref.settle(j, 5);
        END IF;
        COMMIT;
    END LOOP;
END
\$\$;
SQL

# run_side SIDE: prints "batch|calls|VmRSS kB|RssAnon kB|RssShmem kB|seconds" per batch
run_side() {
    local side=$1 b
    {
        echo "SET synchronous_commit = off;"
        echo "SELECT 'pid', pg_backend_pid();"
        for b in $(seq 1 "$BATCHES"); do
            echo "SELECT clock_timestamp() AS t0 \\gset"
            echo "CALL rss_loop('$side', $b, $BATCH);"
            echo "SELECT $b, $b * $BATCH,
                   substring(pg_read_file('/proc/self/status') FROM 'VmRSS:\\s*(\\d+)'),
                   substring(pg_read_file('/proc/self/status') FROM 'RssAnon:\\s*(\\d+)'),
                   substring(pg_read_file('/proc/self/status') FROM 'RssShmem:\\s*(\\d+)'),
                   round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 1);"
        done
    } | em_psql -d postgres -At
}

report() {   # report SIDE FILE
    local side=$1 file=$2
    echo
    echo "$side: one backend (pid $(sed -n 's/^pid|//p' "$file")), reserve + settle, a transaction each"
    echo
    echo "| calls | VmRSS (kB) | RssAnon (kB) | RssShmem (kB) | seconds for the batch |"
    echo "| ---: | ---: | ---: | ---: | ---: |"
    grep -v '^pid|' "$file" | awk -F'|' '{ printf "| %\047d | %d | %d | %d | %s |\n", $2, $3, $4, $5, $6 }'
    grep -v '^pid|' "$file" | awk -F'|' -v side="$side" '
        NR == 1 { r0 = $3; a0 = $4; c0 = $2; lo = $4; hi = $4 }
        { r1 = $3; a1 = $4; c1 = $2; if ($4 < lo) lo = $4; if ($4 > hi) hi = $4 }
        END { printf "\n%s: from %\047d to %\047d calls, VmRSS %+d kB, RssAnon %+d kB (%.3f bytes of RssAnon a call); RssAnon between %d and %d kB over the samples\n",
                     side, c0, c1, r1 - r0, a1 - a0, (a1 - a0) * 1024 / (c1 - c0), lo, hi }'
}

RSS_TMP=$(mktemp -d /tmp/earmark-rss.XXXXXX)
trap 'rm -rf "$RSS_TMP"; em_stop_cluster' EXIT

em_log "earmark: $BATCHES x $BATCH reserve + settle in one session"
run_side earmark >"$RSS_TMP/earmark"
if [ "$REFERENCE" = 1 ]; then
    em_log "reference: the same loop over ref.reserve / ref.settle"
    run_side reference >"$RSS_TMP/reference"
fi

echo
echo "Backend memory over $((BATCH * BATCHES)) reserve + settle calls, $(date -u '+%Y-%m-%d %H:%M UTC'),"
echo "PostgreSQL $(em_psql -d postgres -At -c 'SHOW server_version'), $(nproc) CPUs, shared_buffers $(em_psql -d postgres -At -c 'SHOW shared_buffers')."
report earmark "$RSS_TMP/earmark"
[ "$REFERENCE" = 1 ] && report "reference (PL/pgSQL)" "$RSS_TMP/reference"
echo
echo "VmRSS = RssAnon + RssFile + RssShmem.  RssShmem is the shared memory the backend has"
echo "touched (shared buffers; it grows until it reaches shared_buffers); RssAnon is the"
echo "backend's private memory, where a leak shows."
