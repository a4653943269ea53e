-- Queries of `callwarden demo`: the invariants are checked with SQL over jobs, usage_logs,
-- call_events and the settlement audit, never from the demo's own counters.

-- name: demo_audit_trigger
-- Demo databases only: every UPDATE of a usage_logs row is audited, so a second
-- settlement (or a settlement that did not start from 'reserved') is visible.
{{demo_audit_table}}
{{demo_audit_trigger_on_usage_logs}}

-- name: demo_audit_trigger_citus
-- The same on Citus, in one transaction statement by statement (write.execute_script,
-- over one connection per node as Citus needs for a function's DDL): the audit table is
-- distributed with usage_logs (job_id), so the trigger, which Citus creates on every
-- shard of usage_logs only when told it is safe, writes the shard beside its row.
SET LOCAL citus.enable_unsafe_triggers = on;
SET LOCAL citus.multi_shard_modify_mode = 'sequential';
{{demo_audit_table}}
SELECT create_distributed_table('demo_usage_audit', 'job_id', colocate_with => 'usage_logs')
WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition
                  WHERE logicalrelid = 'demo_usage_audit'::regclass);
{{demo_audit_trigger_on_usage_logs}}

-- fragment: demo_audit_table
CREATE TABLE IF NOT EXISTS demo_usage_audit (
    job_id uuid NOT NULL, old_status text NOT NULL, new_status text NOT NULL,
    at timestamptz NOT NULL DEFAULT now());

-- fragment: demo_audit_trigger_on_usage_logs
CREATE OR REPLACE FUNCTION demo_usage_audit_fn() RETURNS trigger AS $fn$
BEGIN
    INSERT INTO demo_usage_audit (job_id, old_status, new_status)
    VALUES (NEW.job_id, OLD.status, NEW.status);
    RETURN NEW;
END $fn$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS demo_usage_audit_trg ON usage_logs;
CREATE TRIGGER demo_usage_audit_trg AFTER UPDATE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION demo_usage_audit_fn();

-- name: demo_states
SELECT coalesce(call_state, 'none') AS state, count(*) AS n FROM jobs GROUP BY 1;

-- name: demo_stuck
-- Jobs not terminal (at most 10): what a failed demo names, to find in the workers' logs.
SELECT id::text AS id, coalesce(call_state, 'none') AS state FROM jobs
WHERE call_state IS NULL
   OR call_state NOT IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled')
ORDER BY id LIMIT 10;

-- name: demo_unstarted
-- Jobs with no call yet: still in the queue, or their message lost (engine/demo/lost.py).
SELECT id::text AS id FROM jobs WHERE call_state IS NULL;

-- name: demo_recovered
-- Calls whose terminal event was recorded by a reconciler.
SELECT count(*) AS n
FROM jobs j JOIN callwarden.call_events e ON e.job_id = j.id AND e.seq = j.call_version
WHERE j.call_state IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled')
  AND e.actor LIKE 'reconciler:%%';

-- name: demo_by_webhook
-- Calls whose terminal event was recorded by the webhook receiver's side.
SELECT count(*) AS n
FROM jobs j JOIN callwarden.call_events e ON e.job_id = j.id AND e.seq = j.call_version
WHERE j.call_state IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled')
  AND e.actor LIKE 'webhook%%';

-- name: demo_settlements
-- Per reservation: how many times it moved, and whether each move started at 'reserved'.
SELECT u.job_id, j.call_state, u.status, u.credits_reserved, u.credits_charged,
       (SELECT count(*) FROM demo_usage_audit a WHERE a.job_id = u.job_id) AS moves,
       (SELECT count(*) FROM demo_usage_audit a
         WHERE a.job_id = u.job_id AND a.old_status <> 'reserved') AS bad_moves
FROM usage_logs u JOIN jobs j ON j.id = u.job_id;

-- name: demo_latency
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY s) AS p95
FROM (SELECT extract(epoch FROM call_finished_at - created_at)::float8 AS s
      FROM jobs WHERE call_finished_at IS NOT NULL) t;

-- name: demo_latencies
SELECT extract(epoch FROM call_finished_at - created_at)::float8 AS s,
       (SELECT e.actor LIKE 'reconciler:%%' FROM callwarden.call_events e
         WHERE e.job_id = j.id AND e.seq = j.call_version) AS by_reconciler
FROM jobs j WHERE call_finished_at IS NOT NULL;

-- name: demo_workflow
INSERT INTO workflow_executions (id, status) VALUES (%(id)s, 'running');

-- name: demo_cut_connections
-- `callwarden demo --chaos`: cut every other connection to the demo database (workers,
-- reconciler, service, this process's pool), as a failover or a pooler restart would.
SELECT count(pg_terminate_backend(pid)) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid();

-- name: demo_job_ids
-- The demo's jobs, if its setup already enqueued them.
SELECT id FROM jobs ORDER BY created_at, id;

-- name: demo_job_specs
-- `callwarden demo --queue`: what to publish for each job (its input_data, as text).
SELECT id, input_data::text AS input_data FROM jobs ORDER BY created_at, id;
