#!/usr/bin/env bash
# review_receipt_upgrade_dependents.sh: ALTER EXTENSION earmark UPDATE from
# 0.2.0 in a database where the operator built on the receipts' id, as
# 0.2.0 documented the table (receipt_id, a primary key): each case in a
# database of its own, 0.2.0 with an event and its receipts.
#
#   view      a view of the deliveries, SELECT r.*, e.event_type ...
#   fk        a table of notes on deliveries, its key referencing receipt_id
#   trigger   an AFTER INSERT trigger on the receipts that copies
#             NEW.receipt_id into an audit table
#   index     an index of the operator's on (received_at, receipt_id), to
#             page through the receipts
#
# What the update may do with each: keep it working (the update succeeds,
# the object works after it, and deliveries work), or stop before
# changing anything with an error that names the object and says what to
# do (not PostgreSQL's "Use DROP ... CASCADE", which an ALTER EXTENSION
# UPDATE cannot take).  What it must not do: stop with advice the operator
# cannot follow, drop the operator's object without a word, or succeed and
# leave every later delivery failing.
#
# A build with receipt_id dropped (tried, not merged): the view and the foreign key stop the
# update with "Use DROP ... CASCADE"; the index is dropped silently; the
# trigger makes every delivery fail after the update.
source "$(dirname "$0")/tap.sh"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
CASES="view fk trigger index"
db() { echo "earmark_rcpt_dep_$1"; }
drop_dbs() {
    local c
    for c in $CASES; do q -d postgres -c "DROP DATABASE IF EXISTS $(db "$c") WITH (FORCE)" >/dev/null 2>&1; done
}
trap drop_dbs EXIT
drop_dbs

for c in $CASES; do
    q -d postgres -c "CREATE DATABASE $(db "$c")" >/dev/null
    q -d "$(db "$c")" >/dev/null <<'SQL'
CREATE EXTENSION earmark VERSION '0.2.0';
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, seen_count)
VALUES ('app', 'dep-1', 'invoice.paid', '{}', now() - interval '1 hour', 'received', 2);
SQL
done
ok $? "four databases at 0.2.0"

# the operator's objects, then the 0.2.0 receipts (the trigger sees them)
q -d "$(db view)" -c "CREATE VIEW public.deliveries AS
                        SELECT r.*, e.event_type FROM earmark.inbox_receipt r JOIN earmark.inbox_event e USING (event_id)" >/dev/null
q -d "$(db fk)" -c "CREATE TABLE public.delivery_note (receipt_id bigint PRIMARY KEY REFERENCES earmark.inbox_receipt, note text)" >/dev/null
q -d "$(db trigger)" >/dev/null <<'SQL'
CREATE TABLE public.delivery_audit (receipt_id bigint, event_id bigint);
CREATE FUNCTION public.delivery_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.delivery_audit VALUES (NEW.receipt_id, NEW.event_id);
    RETURN NULL;
END $$;
CREATE TRIGGER delivery_audit AFTER INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION public.delivery_audit();
SQL
q -d "$(db index)" -c "CREATE INDEX receipt_page ON earmark.inbox_receipt (received_at, receipt_id)" >/dev/null
for c in $CASES; do
    q -d "$(db "$c")" -c "INSERT INTO earmark.inbox_receipt (event_id, inserted)
                          SELECT event_id, x FROM earmark.inbox_event, (VALUES (true), (false)) v (x)" >/dev/null
done
q -d "$(db fk)" -c "INSERT INTO public.delivery_note SELECT min(receipt_id), 'checked' FROM earmark.inbox_receipt" >/dev/null
ok $? "the operator's objects on receipt_id: a view, a foreign key, a trigger, an index"

# update CASE: "ok", or the update's error (message and hint, one line)
update() {
    local out
    if out=$(q -d "$(db "$1")" -c "ALTER EXTENSION earmark UPDATE TO '0.3.0'" 2>&1 >/dev/null); then
        echo ok
    else
        echo "$out" | tr '\n' ' '
    fi
}
version() { q -d "$(db "$1")" -c "SELECT extversion FROM pg_extension WHERE extname = 'earmark'"; }
# refused CASE OBJECT ERR: the update stopped at 0.2.0 with an error that
# names OBJECT and does not tell to add CASCADE to the update
refused() {
    [ "$(version "$1")" = 0.2.0 ] && [[ "$3" == *"$2"* ]] && [[ "$3" != *"Use DROP ... CASCADE"* ]]
}
# delivers CASE: a first delivery and a copy after the update
delivers() {
    [ "$(q -d "$(db "$1")" -c "SELECT string_agg(inserted::text, ',') FROM (
                                 SELECT inserted FROM earmark_inbox_receive('app', 'after-$1', 'invoice.paid', '{}') UNION ALL
                                 SELECT inserted FROM earmark_inbox_receive('app', 'after-$1', 'invoice.paid', '{}')) d" 2>&1)" = "true,false" ]
}

# view: the deliveries' view works after the update, or the update names it
err=$(update view)
echo "# view: $err"
if [ "$err" = ok ]; then
    [ "$(q -d "$(db view)" -c "SELECT count(*) FROM public.deliveries")" = 2 ] && delivers view
    ok $? "view: the update keeps the operator's view of the receipts working, and deliveries work"
else
    refused view deliveries "$err"
    ok $? "view: the update stops at 0.2.0 with an error that names the view and says what to do (not 'Use DROP ... CASCADE')"
fi

# fk: the notes keep their receipts, or the update names the constraint
err=$(update fk)
echo "# fk: $err"
if [ "$err" = ok ]; then
    [ "$(q -d "$(db fk)" -c "SELECT count(*) FROM public.delivery_note n JOIN earmark.inbox_receipt r USING (receipt_id)")" = 1 ] &&
        delivers fk
    ok $? "fk: the update keeps the notes' foreign key to the receipts, and deliveries work"
else
    refused fk delivery_note "$err"
    ok $? "fk: the update stops at 0.2.0 with an error that names the notes' foreign key and says what to do"
fi

# trigger: deliveries still work (the trigger still writes its audit row),
# or the update names it
err=$(update trigger)
echo "# trigger: $err"
if [ "$err" = ok ]; then
    delivers trigger
    ok $? "trigger: after the update a delivery works under the operator's trigger that reads NEW.receipt_id"
    q -d "$(db trigger)" -c "SELECT earmark_inbox_receive('app', 'after-trigger-2', 'invoice.paid', '{}')" 2>&1 | sed 's/^/#   /' | head -3
else
    refused trigger delivery_audit "$err"
    ok $? "trigger: the update stops at 0.2.0 with an error that names the trigger and says what to do"
fi

# index: the operator's index is still there, or the update names it
err=$(update index)
echo "# index: $err"
if [ "$err" = ok ]; then
    is "$(q -d "$(db index)" -c "SELECT count(*) FROM pg_indexes WHERE schemaname = 'earmark' AND indexname = 'receipt_page'")" 1 \
       "index: the update keeps the operator's index on the receipts (it is not dropped without a word)"
else
    refused index receipt_page "$err"
    ok $? "index: the update stops at 0.2.0 with an error that names the index and says what to do"
fi

done_testing
