-- review28c_walk: the planner hook's FROM walk must not be exponential
-- where PostgreSQL's planning is not.  A NOT MATERIALIZED CTE whose body
-- calls a volatile function is never inlined (inline_cte), so PostgreSQL
-- plans 26 levels of them, each read twice, at once (a CTE scan each); a
-- walk that enters each reference's body again takes 2^26 steps and
-- allocates a chain list at each (about 2 GB at 21 levels, doubling per
-- level, until the backend is killed for memory).  Planned well within
-- a statement_timeout of 30 s.  (On this node without Citus the hook does
-- not walk at all; test/citus/call_shapes.sh runs the same where it does.)
SET client_min_messages = warning;
SET statement_timeout = '30s';
DO $$
DECLARE
    q text := 'SELECT random() AS x';
BEGIN
    FOR i IN 1..26 LOOP
        q := format('WITH c AS NOT MATERIALIZED (%s) SELECT a.x FROM c a, c b', q);
    END LOOP;
    EXECUTE 'EXPLAIN (COSTS OFF) SELECT * FROM (' || q || ') s, generate_series(1, 1) g';
END $$;
RESET statement_timeout;
SELECT 'planned' AS result;
