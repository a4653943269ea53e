-- The webhook receiver's look-ups and delivery dedupe, and the service's ping: run by
-- the database port (engine/database/postgres.py) and the service's housekeeping.

-- name: service_ping
SELECT 1 AS ok;

-- name: webhook_find_job
-- Served by the unique partial index jobs_provider_task_idx (provider_kind, provider_task_id).
SELECT id, provider_kind, provider_task_id, call_state
FROM jobs
WHERE provider_kind = ANY(%(kinds)s::text[])
  AND provider_task_id = %(task_id)s::text;

-- name: webhook_task_holder_citus
-- On Citus the task's one job is kept in callwarden_tasks (distributed by the task id):
-- one shard answers, where webhook_find_job would ask every shard of jobs.
SELECT job_id FROM callwarden.callwarden_tasks
WHERE provider_kind = ANY(%(kinds)s::text[])
  AND provider_task_id = %(task_id)s::text;

-- name: webhook_held_job_citus
SELECT id, provider_kind, provider_task_id, call_state
FROM jobs
WHERE id = %(job_id)s::uuid
  AND provider_kind = ANY(%(kinds)s::text[])
  AND provider_task_id = %(task_id)s::text;

-- name: webhook_job_by_id
SELECT j.id, j.provider_kind, j.provider_task_id, j.provider_call_started_at, j.call_state,
       t.token AS callback_token
FROM jobs j
LEFT JOIN callwarden.callback_tokens t ON t.job_id = j.id
WHERE j.id = %(job_id)s::uuid;

-- name: webhook_record_delivery
-- Replay protection: a second delivery with the same id inserts nothing.
INSERT INTO callwarden.webhook_deliveries (provider, delivery_id, job_id)
VALUES (%(provider)s::text, %(delivery_id)s::text, %(job_id)s::uuid)
ON CONFLICT (provider, delivery_id) DO NOTHING
RETURNING delivery_id;

-- name: webhook_forget_delivery
-- The delivery could not be processed (database error): let the provider's retry through.
DELETE FROM callwarden.webhook_deliveries
WHERE provider = %(provider)s::text AND delivery_id = %(delivery_id)s::text;

-- name: webhook_prune_deliveries
DELETE FROM callwarden.webhook_deliveries
WHERE received_at < %(before)s::timestamptz;
