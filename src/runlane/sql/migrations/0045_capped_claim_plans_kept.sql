-- The capped claim keeps its plans for the session, pinned to the claim
-- indexes as the uncapped claim's are (0012).
--
-- While any tenant has a cap, every claim is runlane.claim_capped_runs,
-- which planned its seven statements again on every call
-- (force_custom_plan, since 0009). Measured in the thirty-fifth session
-- (PostgreSQL 15; BENCHMARKS.md, *Where the time goes*): a claim of 10
-- runs and its outcome cost the backend 1,738 us of CPU that way against
-- 1,075 with its plans kept, a claim of one run 1,409 against 759; timed
-- on one connection with 40,000 runs pending, a claim of 10 took 1.41 ms
-- against 1.00. The claim of a worker that has a few free slots is small.
--
-- A kept plan must not be one that only suits the table as it was when it
-- was made: on a queue analyzed empty, a sequential or bitmap scan and a
-- sort look cheapest, and would then read the whole backlog at every
-- claim (0012's finding). Sequential scans are already off in this
-- function (0038) and its candidates are read with sorts off (0017);
-- bitmap scans go off too, so that each candidate query is an ordered
-- scan of a claim index under its LIMIT, each capped tenant's count reads
-- runs_leased_idx, and the picked runs are looked up by primary key.
-- The ranking of the candidates still sorts (at most twice the limit):
-- nothing else can order them by effective priority within a tenant.
-- jit is off: runlane's own sessions already turn it off, but a claim
-- called from any other session must not be compiled either.
-- tests/integration/test_query_plans.py plans the capped claim on an empty
-- queue and on a queue of one run, then claims behind a backlog.
ALTER FUNCTION runlane.claim_capped_runs(text, text[], integer, double precision,
                                         double precision)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION runlane.claim_capped_runs(text, text[], integer, double precision,
                                         double precision)
    SET enable_bitmapscan = off;
ALTER FUNCTION runlane.claim_capped_runs(text, text[], integer, double precision,
                                         double precision)
    SET jit = off;
