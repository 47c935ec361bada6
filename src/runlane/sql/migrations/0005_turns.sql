-- Model turns a run has taken over all its attempts (ctx.turn()), checked
-- against budget.max_turns.
ALTER TABLE runlane.runs ADD COLUMN turns integer NOT NULL DEFAULT 0;
