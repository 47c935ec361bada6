-- Queries of the maintenance lock (owned by runlane/maintenance_lock.py).

-- name: try_lock
-- Session-level, so a job can work in several short transactions while one
-- process holds it. Only the holder bounds its idle time: a holder frozen
-- mid-pass (SIGSTOP, a VM pause, a black-holed connection) is disconnected
-- by the server after idle_ms, which releases the lock for the others.
SELECT locked,
       CASE WHEN locked THEN
           set_config('idle_session_timeout', %(idle_ms)s, false)
           || set_config('idle_in_transaction_session_timeout', %(idle_ms)s, false)
       END AS bounded
FROM (SELECT pg_try_advisory_lock(%(lock_key)s) AS locked) AS attempt;

-- name: unlock
-- Gives the connection back to the pool as it was: the session's own
-- idle timeouts again (RESET cannot share a statement with the unlock).
SELECT pg_advisory_unlock(%(lock_key)s) AS unlocked,
       set_config('idle_session_timeout',
                  (SELECT reset_val FROM pg_settings WHERE name = 'idle_session_timeout'),
                  false)
       || set_config('idle_in_transaction_session_timeout',
                     (SELECT reset_val FROM pg_settings
                      WHERE name = 'idle_in_transaction_session_timeout'),
                     false) AS restored;
