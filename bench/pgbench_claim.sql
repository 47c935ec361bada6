-- The bare-SQL limit of a SKIP LOCKED queue: claim :batch rows (one
-- statement, its own transaction), then ack them (a second statement).
-- Table and index: bench/throughput.py CLAIM_TABLE. Run as
--   pgbench -n -f bench/pgbench_claim.sql -D batch=10 -T 10 -c 2 DB
WITH c AS (
    SELECT id FROM bench_claims WHERE status = 'pending'
    ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE bench_claims AS b SET status = 'running' FROM c WHERE b.id = c.id RETURNING b.id
)
SELECT quote_literal(coalesce(array_agg(id), '{}')::text) AS ids FROM u
\gset
UPDATE bench_claims SET status = 'done' WHERE id = ANY(:ids::bigint[]);
