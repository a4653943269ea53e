-- The reference worker's queue on the jobs table (migration 0004). Every write after the
-- claim is fenced on the owner that claimed, so a worker whose lease expired and whose job
-- was redelivered can neither ack nor extend it any more.

-- name: queue_claim
-- One statement: pick a batch of unacked jobs whose lease is free or expired (the
-- visibility timeout), skipping rows another claimer holds, and lease them to the owner.
WITH picked AS (
    SELECT id
    FROM jobs
    WHERE queue_acked_at IS NULL
      AND status IN ('pending', 'processing')
      AND (queue_lease_until IS NULL OR queue_lease_until < now())
    ORDER BY created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    queue_owner = %(owner)s,
    queue_lease_until = now() + make_interval(secs => %(visibility_s)s::float8),
    queue_deliveries = j.queue_deliveries + 1,
    started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.input_data::text AS input_data, j.queue_deliveries AS deliveries;

-- name: queue_claim_citus
-- queue_claim on Citus (issue 27), which runs no FOR UPDATE across shards: the candidates
-- are read without a lock, and the UPDATE re-checks each one's lease on the row it locks
-- (READ COMMITTED re-evaluates its WHERE on the newest version after a concurrent
-- commit), so two claimers never lease one job: the second skips what the first took.
UPDATE jobs j SET
    queue_owner = %(owner)s,
    queue_lease_until = now() + make_interval(secs => %(visibility_s)s::float8),
    queue_deliveries = j.queue_deliveries + 1,
    started_at = now()
WHERE j.id IN (SELECT id
               FROM jobs
               WHERE queue_acked_at IS NULL
                 AND status IN ('pending', 'processing')
                 AND (queue_lease_until IS NULL OR queue_lease_until < now())
               ORDER BY created_at
               LIMIT %(batch)s)
  AND j.queue_acked_at IS NULL
  AND j.status IN ('pending', 'processing')
  AND (j.queue_lease_until IS NULL OR j.queue_lease_until < now())
RETURNING j.id, j.input_data::text AS input_data, j.queue_deliveries AS deliveries;

-- name: queue_extend
UPDATE jobs
SET queue_lease_until = now() + make_interval(secs => %(visibility_s)s::float8)
WHERE id = %(job_id)s
  AND queue_owner = %(owner)s
  AND queue_acked_at IS NULL
RETURNING id;

-- name: queue_ack
UPDATE jobs
SET queue_acked_at = now(), queue_lease_until = NULL
WHERE id = %(job_id)s
  AND queue_owner = %(owner)s
  AND queue_acked_at IS NULL
RETURNING id;

-- name: queue_defer
-- A job whose start the account's limits refused (issue 42): back in the queue, claimable
-- again once retry_after_s has passed (the lease doubles as its "not before"), and this
-- delivery not counted, so a job waiting for a slot is never given up for it.
UPDATE jobs
SET queue_lease_until = now() + make_interval(secs => %(retry_after_s)s::float8),
    queue_deliveries = GREATEST(queue_deliveries - 1, 0)
WHERE id = %(job_id)s
  AND queue_owner = %(owner)s
  AND queue_acked_at IS NULL
RETURNING id;
