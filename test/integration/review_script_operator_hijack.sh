#!/usr/bin/env bash
# The install and upgrade scripts run as a superuser (earmark.control:
# superuser = true) with the search path PostgreSQL gives an extension
# script: pg_catalog, then the extension's schema (public by default).  A
# name the scripts leave unqualified resolves through that path, and an
# operator of the exact argument types beats pg_catalog's polymorphic one.
# The shared_preload_libraries DO block at the top of src/earmark.sql and
# of src/earmark--0.2.0--0.3.0.sql compares two text[] with a bare "&&"
# (pg_catalog has only &&(anyarray, anyarray)): a role that may create in
# public (the database's owner in PostgreSQL 15; every role in a database
# that kept PostgreSQL 14's grants on public) plants &&(text[], text[]),
# and its function runs as the superuser that runs CREATE EXTENSION earmark
# or ALTER EXTENSION earmark UPDATE.  Checked here: the planted operator's
# function never runs, in either script, and the database's owner stays an
# ordinary role.
source "$(dirname "$0")/tap.sh"

OWNER=review_hijack_owner
plant() {   # plant DB: as the database's owner, an operator && (text[], text[]) in public
    q -U "$OWNER" -d "$1" <<'SQL'
CREATE TABLE public.hijack_log (who text, superuser boolean);
CREATE FUNCTION public.hijack_overlap(text[], text[]) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.hijack_log
    SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
    RETURN true;
END $$;
CREATE OPERATOR public.&& (LEFTARG = text[], RIGHTARG = text[], FUNCTION = public.hijack_overlap);
SQL
}

q -d postgres -c "DROP DATABASE IF EXISTS review_hijack_install" \
              -c "DROP DATABASE IF EXISTS review_hijack_update" \
              -c "DROP ROLE IF EXISTS $OWNER" \
              -c "CREATE ROLE $OWNER LOGIN" \
              -c "CREATE DATABASE review_hijack_install OWNER $OWNER" \
              -c "CREATE DATABASE review_hijack_update OWNER $OWNER" >/dev/null 2>&1
ok $? "two databases owned by an ordinary role"

# --- CREATE EXTENSION earmark -----------------------------------------------
plant review_hijack_install >/dev/null
ok $? "the owner planted && (text[], text[]) in public"
q -d review_hijack_install -c "CREATE EXTENSION earmark" >/dev/null 2>&1
ok $? "CREATE EXTENSION earmark, as a superuser"
is "$(q -d review_hijack_install -c "SELECT coalesce(string_agg(who || ':' || superuser, ','), 'none') FROM public.hijack_log")" \
   none "the install script ran no operator of the owner's"

# --- ALTER EXTENSION earmark UPDATE from 0.2.0 -------------------------------
q -d review_hijack_update -c "CREATE EXTENSION earmark VERSION '0.2.0'" >/dev/null 2>&1
ok $? "CREATE EXTENSION earmark VERSION '0.2.0', before anything is planted"
plant review_hijack_update >/dev/null
ok $? "the owner planted && (text[], text[]) in public"
q -d review_hijack_update -c "ALTER EXTENSION earmark UPDATE" >/dev/null 2>&1
ok $? "ALTER EXTENSION earmark UPDATE, as a superuser"
is "$(q -d review_hijack_update -c "SELECT coalesce(string_agg(who || ':' || superuser, ','), 'none') FROM public.hijack_log")" \
   none "the upgrade script ran no operator of the owner's"

# --- the built-in plan change's calls into the extension's schema -------------
# earmark.apply_plan_change (run by the worker as its owner, a superuser)
# calls @extschema@.earmark_inbox_ignore(e.event_id, '...'): the owner of
# public adds an overload with a defaulted third argument, and the call
# becomes ambiguous (42725): an event the handler should ignore fails
# instead, six times, then is dead.
q -U "$OWNER" -d review_hijack_install -c "CREATE FUNCTION public.earmark_inbox_ignore(event_id bigint, reason text, x int DEFAULT 0) RETURNS text LANGUAGE sql AS \$\$ SELECT 'owner''s'::text \$\$" >/dev/null
ok $? "the owner added earmark_inbox_ignore(bigint, text, int DEFAULT 0) to public"
got=$(q -d review_hijack_install 2>&1 <<'SQL'
SELECT event_id FROM public.earmark_inbox_receive('billing', 'late-1', 'customer.plan_changed',
    '{"data": {"plan": {"key": "pro"}}}', pg_catalog.now() - interval '1 minute', 'no-such-account') \gset
BEGIN;
SELECT earmark.apply_plan_change(e) FROM earmark.inbox_event e WHERE e.event_id = :event_id;
ROLLBACK;
SQL
)
is "$got" "ignored" "the plan change for an unknown account is ignored, whatever public holds"

is "$(q -d postgres -c "SELECT rolsuper FROM pg_roles WHERE rolname = '$OWNER'")" f \
   "the database's owner is still not a superuser"

q -d postgres -c "DROP DATABASE review_hijack_install" -c "DROP DATABASE review_hijack_update" \
              -c "DROP ROLE $OWNER" >/dev/null
done_testing
