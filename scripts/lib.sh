# scripts/lib.sh: set-up shared by scripts/demo.sh and scripts/test.sh.
#
# Installs what a fresh Debian 12 machine lacks, builds and installs
# earmark, and runs a private throwaway PostgreSQL 15 cluster as an
# unprivileged user on its own socket directory and port.
#
# Source it, then call em_setup and em_start_cluster; em_stop_cluster runs
# on exit.

set -euo pipefail

EM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# EM_PREFIX: a private copy of PostgreSQL 15 (bin, lib, share) to build and
# run against instead of the system's, so that several checkouts can each
# install their own earmark.so side by side (PostgreSQL finds its lib and
# share directories relative to its binaries).  Made on first use.
EM_PREFIX=${EM_PREFIX:-}
if [ -n "$EM_PREFIX" ]; then
    EM_PGBIN=$EM_PREFIX/usr/lib/postgresql/15/bin
else
    EM_PGBIN=${EM_PGBIN:-/usr/lib/postgresql/15/bin}
fi
export EM_PGBIN
EM_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-client-15 postgresql-15-pgtap
             postgresql-15-cron libcurl4-openssl-dev libssl-dev libpq-dev
             libtap-parser-sourcehandler-pgtap-perl make gcc python3 openssl
             clang libclang-rt-14-dev valgrind python3-psycopg2)
# the unprivileged user the server runs as (PostgreSQL refuses root)
EM_PGUSER=${EM_PGUSER:-postgres}

em_log() { printf '[earmark] %s\n' "$*" >&2; }

em_sudo() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

em_install_packages() {
    local missing=()
    local p
    for p in "${EM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        em_log "installing: ${missing[*]}"
        em_sudo apt-get update -qq
        em_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    # Debian's package starts a cluster of its own on 5432; ours is private
    # and does not need it.
    id "$EM_PGUSER" >/dev/null 2>&1 || em_sudo useradd --system --create-home "$EM_PGUSER"
    em_make_prefix
}

# em_make_prefix: copy the system's PostgreSQL 15 into EM_PREFIX (once)
em_make_prefix() {
    [ -z "$EM_PREFIX" ] && return 0
    [ -x "$EM_PGBIN/postgres" ] && return 0
    em_log "copying PostgreSQL 15 into $EM_PREFIX"
    mkdir -p "$EM_PREFIX/usr/lib/postgresql" "$EM_PREFIX/usr/share/postgresql"
    cp -a /usr/lib/postgresql/15 "$EM_PREFIX/usr/lib/postgresql/"
    cp -a /usr/share/postgresql/15 "$EM_PREFIX/usr/share/postgresql/"
    chmod -R a+rX "$EM_PREFIX"
}

em_build() {
    em_log "building earmark"
    em_make_prefix
    # built against the system's headers and PGXS; installed into EM_PREFIX
    # when one is set
    make -C "$EM_ROOT" -s with_llvm=no PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null
    if [ -n "$EM_PREFIX" ]; then
        make -C "$EM_ROOT" -s with_llvm=no PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config \
            DESTDIR="$EM_PREFIX" install >/dev/null
    else
        em_sudo make -C "$EM_ROOT" -s with_llvm=no PG_CONFIG="$EM_PGBIN/pg_config" install >/dev/null
    fi
}

em_setup() {
    em_install_packages
    em_build
}

# em_start_cluster PORT [extra postgresql.conf lines...]
# Sets EM_DATA, EM_SOCK, EM_PORT, PGHOST, PGPORT, PGUSER.
em_start_cluster() {
    EM_PORT=$1
    shift
    EM_BASE=$(mktemp -d /tmp/earmark-cluster.XXXXXX)
    chmod 755 "$EM_BASE"
    EM_DATA=$EM_BASE/data
    EM_SOCK=$EM_BASE/sock
    mkdir -p "$EM_SOCK"
    em_sudo chown -R "$EM_PGUSER" "$EM_BASE"
    em_as_pg "$EM_PGBIN/initdb" -D "$EM_DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$EM_BASE/initdb.log" 2>&1 \
        || { cat "$EM_BASE/initdb.log"; return 1; }
    {
        echo "port = $EM_PORT"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$EM_SOCK'"
        echo "max_connections = 300"
        echo "shared_buffers = 256MB"
        echo "fsync = on"
        echo "log_min_messages = warning"
        echo "log_line_prefix = '%m [%p] %b '"
        for line in "$@"; do echo "$line"; done
    } | em_as_pg tee -a "$EM_DATA/postgresql.conf" >/dev/null
    # EM_PG_WRAPPER: a program pg_ctl starts instead of postgres (valgrind)
    em_as_pg "$EM_PGBIN/pg_ctl" -D "$EM_DATA" -l "$EM_BASE/server.log" -w -t 120 \
        ${EM_PG_WRAPPER:+-p "$EM_PG_WRAPPER"} start >/dev/null
    export PGHOST=$EM_SOCK PGPORT=$EM_PORT PGUSER=postgres
    trap em_stop_cluster EXIT
    em_log "cluster up: socket $EM_SOCK, port $EM_PORT"
}

em_as_pg() {
    if [ "$(id -un)" = "$EM_PGUSER" ]; then "$@"
    elif [ "$(id -u)" -eq 0 ]; then runuser -u "$EM_PGUSER" -- "$@"
    else sudo -u "$EM_PGUSER" "$@"; fi
}

em_stop_cluster() {
    if [ -n "${EM_DATA:-}" ] && [ -d "$EM_DATA" ]; then
        em_as_pg "$EM_PGBIN/pg_ctl" -D "$EM_DATA" -m fast -w stop >/dev/null 2>&1 || true
        if [ -z "${EM_KEEP:-}" ]; then rm -rf "$EM_BASE"; else em_log "kept $EM_BASE"; fi
    fi
}

em_psql() { "$EM_PGBIN/psql" -X -v ON_ERROR_STOP=1 -q "$@"; }
