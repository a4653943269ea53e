-- Bulk rows for the dashboard's scale checks (bench/dashboard.py and
-- tests/integration/test_dashboard_plans.py load them with callwarden.database.queries.load_queries).
-- Set-based: %(rows)s jobs spread over the 30 days before now(), oldest first (as a live
-- system writes them: the time indexes fill in order), in four kinds; the %(open)s newest
-- are still polling, the rest ended (mostly completed; some failed, cancelled by an admin,
-- exhausted). Every other job has its two call_events rows (about %(rows)s events in all);
-- every job one usage_logs row (settled when the call ended). Job ids follow the row
-- number, so the primary keys fill in order.

-- name: load_jobs
INSERT INTO jobs (id, user_id, status, provider_kind, provider_task_id,
                  provider_call_started_at, call_state, call_version, call_finished_at,
                  call_settlement, error_message, created_at, started_at, completed_at)
SELECT id, 'user-' || (i %% 1000), CASE WHEN open THEN 'processing'
                                       WHEN state = 'completed' THEN 'completed'
                                       ELSE 'failed' END,
       kind, 'task-' || i, started, state, 2,
       CASE WHEN open THEN NULL ELSE started + make_interval(secs => 5 + i %% 120) END,
       CASE WHEN open THEN NULL WHEN state = 'completed' THEN 'committed' ELSE 'refunded' END,
       CASE WHEN state = 'failed' THEN 'upstream said: error ' || (i %% 37)
                                       || CASE WHEN i %% 5000 = 2 THEN ' content_policy 100%%'
                                               ELSE '' END END,
       started, started, NULL
FROM (
    SELECT i, ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid AS id,
           (ARRAY['kie-standard', 'kie-veo', 'replicate-prediction', 'kie-suno'])[1 + i %% 4]
               AS kind,
           now() - make_interval(secs => (%(rows)s::int - i)::float8 / %(rows)s::int * 30 * 86400)
               AS started,
           i > %(rows)s::int - %(open)s::int AS open,
           CASE WHEN i > %(rows)s::int - %(open)s::int THEN 'polling'
                WHEN i %% 50 = 2 THEN 'failed'
                WHEN i %% 97 = 2 THEN 'cancelled'
                WHEN i %% 211 = 3 THEN 'exhausted'
                ELSE 'completed' END AS state
    FROM generate_series(1, %(rows)s::int) AS i
) s;

-- name: load_call_events
-- Every other job gets its log (CallStarted, then its terminal event unless it is open):
-- %(rows)s events in all, and, as in a live log, more events than ended calls. Read from
-- jobs in the order it was written: the events come out (nearly) in time order too.
INSERT INTO callwarden.call_events (job_id, seq, type, payload, actor, recorded_at)
SELECT j.id, e.seq, e.type,
       jsonb_build_object('type', e.type, 'actor', e.actor,
                          'at', to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
       || CASE e.type WHEN 'CallStarted' THEN jsonb_build_object('kind', j.provider_kind,
                                                                 'sync', false)
                      WHEN 'UpstreamFailed' THEN jsonb_build_object('error', j.error_message,
                                                                    'code', NULL)
                      WHEN 'Cancelled' THEN jsonb_build_object('by', 'admin')
                      ELSE '{}'::jsonb END,
       e.actor, e.at
FROM jobs j
CROSS JOIN LATERAL (VALUES
    (1, 'CallStarted', 'worker:w' || abs(hashtext(j.id::text) %% 8), j.provider_call_started_at),
    (2, CASE j.call_state WHEN 'completed' THEN 'Completed' WHEN 'failed' THEN 'UpstreamFailed'
                          WHEN 'cancelled' THEN 'Cancelled' ELSE 'Exhausted' END,
        CASE WHEN j.call_state = 'cancelled' THEN 'admin'
             WHEN j.call_state = 'exhausted' THEN 'reconciler:r1'
             WHEN hashtext(j.id::text) %% 5 = 0 THEN 'webhook'
             WHEN hashtext(j.id::text) %% 7 = 0 THEN 'reconciler:r1'
             ELSE 'worker:w' || abs(hashtext(j.id::text) %% 8) END,
        j.call_finished_at)
) AS e(seq, type, actor, at)
WHERE j.provider_task_id LIKE 'task-%%'
  AND substr(j.provider_task_id, 6)::int %% 2 = 0
  AND (e.seq = 1 OR j.call_state <> 'polling');

-- name: load_usage_logs
INSERT INTO usage_logs (job_id, user_id, status, credits_reserved, credits_charged,
                        created_at, settled_at, settled_by_seq)
SELECT id, user_id,
       CASE WHEN call_settlement IS NULL THEN 'reserved' ELSE call_settlement END,
       10, CASE call_settlement WHEN 'committed' THEN 8 WHEN 'refunded' THEN 0 END,
       provider_call_started_at, call_finished_at,
       CASE WHEN call_settlement IS NULL THEN NULL ELSE 1 END
FROM jobs
WHERE provider_task_id LIKE 'task-%%';

-- name: load_assets
-- One stored file per completed job (the job page's files, its assets query).
INSERT INTO assets (job_id, user_id, storage_key, url, content_type, size_bytes)
SELECT id, user_id, id::text || '/0.png', '/media/' || id::text || '/0.png', 'image/png', 1024
FROM jobs
WHERE call_state = 'completed';

-- name: vacuum_analyze
VACUUM ANALYZE jobs, callwarden.call_events, usage_logs;

-- name: page_cursor
-- The key of the %(offset)s-th newest call (0-based): a cursor deep in the call list.
SELECT id, provider_call_started_at AS at
FROM jobs
WHERE provider_call_started_at IS NOT NULL
ORDER BY provider_call_started_at DESC, id DESC
OFFSET %(offset)s LIMIT 1;

-- name: failed_job
-- The newest failed call with a log (bench/dashboard.py times its page).
SELECT id
FROM jobs
WHERE call_state = 'failed' AND substr(provider_task_id, 6)::int %% 2 = 0
ORDER BY provider_call_started_at DESC
LIMIT 1;
