-- On one node every form of an earmark call runs as it always has: the
-- planner hook that refuses, on a distributed install, the calls Citus
-- would crash on (an earmark function with a subquery, a VALUES list or a
-- CTE in its statement) never fires here.
SET client_min_messages = warning;
SELECT earmark_set_limit('shape_a', 1000);
SELECT earmark_set_limit('shape_b', 50);
SELECT v.a, (earmark_budget(v.a)).remaining FROM (VALUES ('shape_a'), ('shape_b')) v (a) ORDER BY v.a;
SELECT earmark_budget(v.a) IS NOT NULL AS read FROM (VALUES ('shape_a')) v (a);
SELECT (earmark_reserve(s.a, 10, 'shape-1')).admitted FROM (SELECT 'shape_a'::text AS a) s;
SELECT r.admitted, r.remaining FROM earmark_reserve('shape_a', 20, 'shape-2') r, (SELECT 1) x;
WITH c AS (SELECT 'shape_b'::text AS a) SELECT (earmark_reserve(c.a, 60, 'shape-3')).reason FROM c;
DO $$ BEGIN PERFORM earmark_reserve(v.a, 5, 'shape-4') FROM (VALUES ('shape_b')) v (a); END $$;
SELECT account, idempotency_key, amount, status FROM earmark.job WHERE account LIKE 'shape_%' ORDER BY idempotency_key;
