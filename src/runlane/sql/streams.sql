-- Named queries of the API's event streams; runlane.event_hub owns them.

-- name: run_stream_page
-- One read of a run's stream: the run's state and a page of its events after
-- a seq, from one snapshot. Events are written before a terminal status, so
-- when the run is seen ended here, every event it wrote is in this result.
-- No row: the run does not exist (any more). A row with a NULL seq: no event.
SELECT r.status, r.outcome, r.output, r.error, r.interrupt,
       e.seq, e.kind, e.data, e.attempt, e.created_at
FROM runlane.runs AS r
LEFT JOIN LATERAL (
    SELECT seq, kind, data, attempt, created_at FROM runlane.run_events
    WHERE run_id = r.id AND seq > %(after_seq)s
    ORDER BY seq
    LIMIT %(limit)s
) AS e ON true
WHERE r.id = %(run_id)s
ORDER BY e.seq;
