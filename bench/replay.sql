-- Bulk loading for bench/replay.py (loaded with callwarden.database.queries.load_queries).

-- name: copy_jobs
COPY jobs (id, user_id, job_type, status, call_state, call_version, provider_kind,
           provider_task_id, provider_call_started_at, call_sync, reconcile_attempts,
           reconcile_last_error, reconcile_next_at, error_message, finalize_owner,
           finalize_lease_until, upstream_result, call_output, output_data, provider_cost,
           call_finished_at, call_settlement, completed_at, progress)
FROM STDIN;

-- name: copy_usage_logs
COPY usage_logs (job_id, user_id, status, credits_reserved, credits_charged, settled_at)
FROM STDIN;

-- name: copy_call_events
COPY callwarden.call_events (job_id, seq, type, version, payload, actor, recorded_at)
FROM STDIN;

-- name: analyze
ANALYZE;
