-- The uncapped claim keeps its plans for the session, and those plans are
-- pinned to the claim indexes whatever the statistics say.
--
-- 0009 planned the claim's statements again on every call
-- (force_custom_plan), because a plan kept from a moment the queue was
-- empty read every pending run once a backlog came: measured here, a
-- one-run claim took 83 ms with 20,000 runs pending under a plan made on
-- an empty table. Planning every call cost about half of a one-run claim's
-- backend time (BENCHMARKS.md, fourth and fifth sessions).
--
-- What made the kept plan slow was a sequential or bitmap scan followed by
-- a sort: the cheapest way to read a table that the statistics say is
-- empty. Inside this function those plan shapes are turned off, so the
-- plan made once is the ordered index scan of a claim index with its
-- LIMIT, which reads as many rows as it claims at any queue length. (The
-- update's lookup of the picked runs by id could still go through another
-- index holding id: 0013 makes it a lookup by row address.) A sort remains
-- only where nothing else can order the rows (the candidates' effective
-- priority, at most twice the limit). jit is off because the disabled plan
-- shapes raise the estimated costs above jit's thresholds, and compiling
-- the plan would cost far more than running it.
ALTER FUNCTION runlane.claim_uncapped_runs(text, text[], integer, double precision, double precision)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION runlane.claim_uncapped_runs(text, text[], integer, double precision, double precision)
    SET enable_seqscan = off;
ALTER FUNCTION runlane.claim_uncapped_runs(text, text[], integer, double precision, double precision)
    SET enable_bitmapscan = off;
ALTER FUNCTION runlane.claim_uncapped_runs(text, text[], integer, double precision, double precision)
    SET enable_sort = off;
ALTER FUNCTION runlane.claim_uncapped_runs(text, text[], integer, double precision, double precision)
    SET jit = off;
