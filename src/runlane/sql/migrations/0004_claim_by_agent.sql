-- Workers claim only the agents they serve: an index per agent lets one
-- agent's claim skip another agent's backlog.
CREATE INDEX runs_claim_by_agent_idx ON runlane.runs (agent, priority DESC, available_at, seq)
    WHERE status = 'pending';
