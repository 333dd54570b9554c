#!/usr/bin/env bash
# test/citus/review_distribute_worker_path.sh: the statements
# earmark_distribute() sends to the worker nodes (run_command_on_workers)
# run there under the connection's own search_path ("$user", public), not
# under the function's pinned one.  The check of a worker's own copy of
# earmark.inbox_handler compares a regprocedure with "IS DISTINCT FROM",
# and pg_catalog has no "=" of (regprocedure, regprocedure) (it is oid's,
# through a binary coercion): a role that may create in public on a worker
# node plants one, and its function runs there as the superuser who runs
# earmark_distribute() on the coordinator (TAP).
#   EM_PREFIX=/work/pfx/NAME CT_PORT=55990 bash test/citus/review_distribute_worker_path.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
ct_begin_cluster
ct_sql 0 -q -c "CREATE EXTENSION earmark" >/dev/null
ok $? "CREATE EXTENSION earmark"
ct_sql 0 -q -c "CREATE ROLE review_planter LOGIN" >/dev/null 2>&1
# the role may create in public on node 1 only (a database that kept
# PostgreSQL 14's grants, or one the role owns)
ct_sql 1 -q -c "SET citus.enable_ddl_propagation = off" \
            -c "GRANT CREATE ON SCHEMA public TO review_planter" >/dev/null
ok $? "review_planter may create in public on node 1"
"$EM_PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(ct_dir 1)/sock" -p "$(ct_port 1)" \
    -U review_planter -d "$CT_DB" >/dev/null 2>&1 <<'SQL'
SET citus.enable_ddl_propagation = off;
CREATE FUNCTION public.planted_eq(regprocedure, regprocedure) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'PLANTED-EQ ran as % (superuser %)', current_user,
        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
    RETURN $1::oid OPERATOR(pg_catalog.=) $2::oid;
END $$;
CREATE OPERATOR public.= (LEFTARG = regprocedure, RIGHTARG = regprocedure,
                          FUNCTION = public.planted_eq);
SQL
ok $? "review_planter planted = (regprocedure, regprocedure) in public on node 1"

got=$(ct_sql 0 -q -A -t -c "SELECT count(*) > 0 FROM earmark_distribute()" 2>&1)
is "$got" t "earmark_distribute() on the coordinator, as a superuser"
is "$(ct_logged 'PLANTED-EQ ran' 1)" 0 \
   "no statement earmark_distribute() sent to node 1 ran the planted operator"
done_testing
