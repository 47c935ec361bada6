-- The capped claim never reads runs whole: sequential scans are off in it,
-- as in the uncapped claim (0034) and the run writes (0019).
--
-- Each capped claim counts the running runs of every capped tenant whose
-- cap it holds (0017), planned on every call (force_custom_plan) from the
-- statistics at hand. Taken during a burst, when most runs were running,
-- they made that count a sequential scan of runs: once the burst had
-- finished, every capped claim read the whole table once per capped tenant
-- until the next ANALYZE (tests/integration/test_query_plans.py: three
-- claims after a burst of 3,000 runs, three sequential scans and 9,081
-- rows read; 24 rows with this). With sequential scans off the count
-- reads runs_leased_idx, which holds the running runs alone. The other
-- statements of the function read tenant_limits (a few rows, by its
-- primary key now) and the claim indexes, as before.
ALTER FUNCTION runlane.claim_capped_runs(text, text[], integer, double precision,
                                         double precision)
    SET enable_seqscan = off;
