-- Named queries of API keys; runlane.keys owns them.

-- name: insert_key
INSERT INTO runlane.api_keys (prefix, key_hash, tenant, user_id, admin, name)
VALUES (%(prefix)s, %(key_hash)s, %(tenant)s, %(user_id)s, %(admin)s, %(name)s)
RETURNING *;

-- name: find_active_key
-- Looks a presented key up by its hash and notes its use (at most once a
-- minute, to keep writes off the request path).
WITH found AS (
    SELECT * FROM runlane.api_keys
    WHERE key_hash = %(key_hash)s AND revoked_at IS NULL
), touched AS (
    UPDATE runlane.api_keys AS k SET last_used_at = now()
    FROM found
    WHERE k.id = found.id
      AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute')
)
SELECT * FROM found;

-- name: list_keys
SELECT * FROM runlane.api_keys
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY created_at;

-- name: revoke_key
UPDATE runlane.api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE prefix = %(prefix)s
RETURNING *;
