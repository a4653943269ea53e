-- The store port's own statements (engine/database/postgres.py); every other operation of the
-- port runs the statements it ran before the port existed.

-- name: heartbeat_at
-- heartbeat, stamped with the caller's clock (a simulated one: the deterministic
-- simulation's Postgres replay) instead of the database's now().
UPDATE jobs
SET heartbeat_at = %(now)s::timestamptz, heartbeat_owner = %(owner)s,
    progress = GREATEST(progress, COALESCE(%(progress)s::int, progress))
WHERE id = %(job_id)s AND call_state IN ('created', 'polling') AND {{open_fence}}
RETURNING id;

-- name: host_add_reservation
-- The host reserves credits for a job once more (a second usage_logs row).
INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)
SELECT id, user_id, 'reserved', %(credits)s::numeric FROM jobs WHERE id = %(job_id)s::uuid
RETURNING id;
