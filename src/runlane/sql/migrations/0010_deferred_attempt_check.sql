-- The claim's foreign-key check on run_attempts, planned once per session
-- instead of once per claimed run.
--
-- Both claim functions SET plan_cache_mode = force_custom_plan (0009), and
-- a function's settings hold for everything that runs inside it: also for
-- the foreign-key trigger that the claim's attempts insert fires, one check
-- query per inserted row. Under that setting PostgreSQL planned the check
-- query again for every row, and planning any query on runs weighs its
-- indexes: 40% of the backend CPU of a 50-run claim went there (perf on
-- the backend; BENCHMARKS.md, fourth-session hot-path changes).
--
-- Checked at commit instead, the check runs outside the claim function,
-- under the session's plan_cache_mode, and reuses its plan. The check
-- itself is unchanged. A claim inserts attempt rows only for the runs its
-- own UPDATE has just written, so it never fails there; deleting a run
-- still deletes its attempt rows at once (ON DELETE CASCADE is never
-- deferred).
ALTER TABLE runlane.run_attempts
    ALTER CONSTRAINT run_attempts_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
