-- What goes with deleted runs, in one trigger: their attempts (0027, which
-- have no foreign key to runs) and their listing rows (0030).
--
-- 0030 added a second AFTER DELETE statement trigger on runs beside
-- 0027's, each a plpgsql call of its own on every statement that deletes
-- runs (the pruner's batches, an operator's, a lane's cascade). Both
-- deletes read the same transition table of the deleted runs and reach
-- their rows through their table's primary key whatever the statistics
-- say, so one function does both, with the plans pinned as before.
CREATE FUNCTION runlane.delete_dependents_of_deleted_runs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    DELETE FROM runlane.run_attempts AS a USING deleted_runs AS d WHERE a.run_id = d.id;
    DELETE FROM runlane.run_listing AS l USING deleted_runs AS d WHERE l.run_id = d.id;
    RETURN NULL;
END;
$$;

DROP TRIGGER runs_delete_attempts ON runlane.runs;
DROP TRIGGER runs_unlist_deleted ON runlane.runs;
DROP FUNCTION runlane.delete_attempts_of_deleted_runs();
DROP FUNCTION runlane.unlist_deleted_runs();

CREATE TRIGGER runs_delete_dependents
    AFTER DELETE ON runlane.runs
    REFERENCING OLD TABLE AS deleted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runlane.delete_dependents_of_deleted_runs();
