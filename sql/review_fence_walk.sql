-- review_fence_walk: earmark's planner hook (delegation.c) walks the FROM
-- tree of a SELECT where Citus is installed (here it is not: the hook
-- looks at the top level only, and must stay so cheap on every install).
-- The walk must not be exponential where PostgreSQL's planning is not:
-- 26 levels of CTEs nested in CTEs, each read twice, would be about 2^26
-- walks of the innermost one if each reference walked its CTE's body again
-- (minutes, doubling memory per level, and no cancel seen).  A CTE read
-- twice is never inlined, nor is a NOT MATERIALIZED one over a volatile
-- function (inline_cte): PostgreSQL plans both at once, well within the
-- statement_timeout of 30 s.  test/citus/call_shapes.sh runs the same on
-- Citus.  Without Citus no statement gets the filter.
SET client_min_messages = warning;
SET statement_timeout = '30s';
DO $$
DECLARE
    form text;
    q text;
BEGIN
    FOREACH form IN ARRAY ARRAY['WITH c AS (%s) SELECT a.x FROM c a, c b',
                                'WITH c AS NOT MATERIALIZED (%s) SELECT a.x FROM c a, c b'] LOOP
        q := 'SELECT random() AS x';
        FOR i IN 1..26 LOOP
            q := format(form, q);
        END LOOP;
        EXECUTE 'EXPLAIN (COSTS OFF) SELECT * FROM (' || q || ') s, generate_series(1, 1) g';
    END LOOP;
END $$;
RESET statement_timeout;

-- no filter without Citus: the bare call in a subquery plans as it is
EXPLAIN (COSTS OFF) SELECT * FROM (SELECT * FROM earmark_budget('acme')) s;
EXPLAIN (COSTS OFF) SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a);
