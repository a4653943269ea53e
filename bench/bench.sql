-- The benchmarks' own statements (loaded by bench/_common.py as SQL): the raw-SQL floors
-- the engine is compared with, the load generators, and the stats readers.

-- name: floor_insert_event
-- bench/append.py, the three-statement floor: the event row...
INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
VALUES (%(job_id)s, %(new_version)s, %(type)s, %(event_version)s, %(payload)s::jsonb,
        %(actor)s);

-- name: floor_update_projection
-- ...the same projection columns the engine's statement writes, with the same fences...
UPDATE jobs SET call_state = %(call_state)s, call_version = %(new_version)s,
    status = COALESCE(%(status)s, status), provider_kind = %(provider_kind)s,
    provider_task_id = %(provider_task_id)s,
    provider_call_started_at = %(provider_call_started_at)s, call_sync = %(call_sync)s,
    reconcile_attempts = %(reconcile_attempts)s,
    reconcile_last_error = %(reconcile_last_error)s,
    reconcile_next_at = %(reconcile_next_at)s,
    error_message = COALESCE(%(error_message)s, error_message),
    finalize_owner = %(finalize_owner)s, finalize_lease_until = %(finalize_lease_until)s,
    upstream_result = %(upstream_result)s::jsonb,
    call_output = %(call_output)s::jsonb,
    output_data = CASE WHEN %(call_output)s::jsonb IS NULL THEN output_data
                       WHEN jsonb_typeof(output_data) = 'object'
                       THEN output_data || %(call_output)s::jsonb
                       ELSE %(call_output)s::jsonb END,
    provider_cost = %(provider_cost)s, call_finished_at = %(call_finished_at)s,
    call_settlement = %(call_settlement)s, updated_at = now()
WHERE id = %(job_id)s AND call_version = %(expected_version)s AND status <> 'cancelled';

-- name: floor_settle
-- ...and the settlement.
UPDATE usage_logs SET status = %(settle_to)s, settled_at = now(),
    credits_charged = LEAST(%(cost)s, credits_reserved)
WHERE job_id = %(job_id)s AND status = 'reserved';

-- name: stats_force_flush
-- A backend with no pending table stats skips even a forced flush and keeps its
-- transaction counts; reading a catalog row gives it some, so every call flushes.
SELECT pg_stat_force_next_flush() FROM pg_class LIMIT 1;

-- name: stats_clear_snapshot
SELECT pg_stat_clear_snapshot();

-- name: stats_transactions
SELECT xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = %(name)s;

-- name: peer_complete
-- What the host's own code would write when a call completes (the DBOS peer has no engine).
WITH j AS (
    UPDATE jobs SET status = 'completed', progress = 100, updated_at = now()
    WHERE id = %(job_id)s RETURNING id
)
UPDATE usage_logs SET status = 'committed', settled_at = now(),
       credits_charged = LEAST(COALESCE(%(cost)s, credits_reserved), credits_reserved)
WHERE job_id = (SELECT id FROM j) AND status = 'reserved';

-- name: load_completed_jobs
-- bench/reconcile.py: finished jobs, the bulk the reconciler's claim must not scan.
INSERT INTO jobs (id, user_id, status, call_state, call_version, provider_kind,
                  provider_task_id, provider_call_started_at, call_finished_at,
                  call_settlement)
SELECT gen_random_uuid(), 'u' || (i %% 1000), 'completed', 'completed', 5, 'kie-standard',
       'done-' || i, now() - (i || ' seconds')::interval, now(), 'committed'
FROM generate_series(%(lo)s::int, %(hi)s::int) AS i;

-- name: load_stale_jobs
-- In-flight jobs with a reservation and no call yet.
WITH j AS (
    INSERT INTO jobs (id, user_id, status)
    SELECT gen_random_uuid(), 'u', 'processing' FROM generate_series(1, %(n)s::int)
    RETURNING id, user_id
)
INSERT INTO usage_logs (job_id, user_id, credits_reserved)
SELECT id, user_id, 10 FROM j RETURNING job_id;

-- name: count_completed
SELECT count(*) AS n FROM jobs WHERE id = ANY(%(ids)s) AND call_state = 'completed';

-- name: job_heartbeated
SELECT 1 AS ok FROM jobs WHERE id = %(job_id)s AND heartbeat_at IS NOT NULL;

-- name: job_completed
SELECT 1 AS ok FROM jobs WHERE id = %(job_id)s AND call_state = 'completed';

-- name: vacuum_jobs
VACUUM ANALYZE jobs;

-- name: capacity_counters
-- bench/capacity.py, read on the server's "postgres" database (so reading adds nothing to
-- the bench database's counts): the bench database's transactions, the WAL position and
-- the cluster's WAL records and full-page images (pg_stat_wal is cluster-wide).
SELECT d.xact_commit AS commits, d.xact_rollback AS rollbacks,
       pg_current_wal_lsn()::text AS lsn, w.wal_records AS wal_records, w.wal_fpi AS wal_fpi
FROM pg_stat_database d, pg_stat_wal w
WHERE d.datname = %(name)s;

-- name: capacity_wal_bytes
SELECT pg_wal_lsn_diff(%(after)s::pg_lsn, %(before)s::pg_lsn) AS bytes;

-- name: capacity_tables
-- Per table of a call: on-disk bytes with indexes (and FSM/VM forks), rows inserted, rows
-- updated and how many of those updates were HOT (from the flushed table stats).
SELECT s.relname AS name, pg_total_relation_size(s.relid) AS bytes,
       s.n_tup_ins AS inserted, s.n_tup_upd AS updated, s.n_tup_hot_upd AS hot_updated
FROM pg_stat_user_tables s
WHERE s.schemaname IN ('public', 'callwarden') AND s.relname = ANY(%(names)s::text[]);

-- name: capacity_vacuum
-- After bulk-loading histories (--prefill): vacuumed and analysed now, so autovacuum does
-- not visit the loaded rows inside a measured window.
VACUUM (ANALYZE) jobs, callwarden.call_events, usage_logs, assets;

-- name: capacity_checkpoint
-- Before each window when --prefill is given: every page the window touches first pays a
-- full-page image in the WAL, as on a table much larger than a checkpoint interval writes.
CHECKPOINT;

-- name: capacity_settings
SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%(names)s::text[]) ORDER BY name;

-- name: peer_insert_assets
-- bench/lifecycle.py, the DBOS peer's asset rows (as callwarden's completion writes them).
INSERT INTO assets (job_id, user_id, storage_key, url, content_type, size_bytes, is_public)
SELECT j.id, j.user_id, a.key, a.url, a.content_type, a.size, COALESCE(j.is_public, true)
FROM jobs j,
     unnest(%(keys)s::text[], %(urls)s::text[], %(types)s::text[], %(sizes)s::bigint[])
         AS a(key, url, content_type, size)
WHERE j.id = %(job_id)s
ON CONFLICT (job_id, storage_key) DO NOTHING;

-- name: plan_counts
-- bench/plan_cache.py: the generic and custom plans of this session's prepared appends.
SELECT CASE WHEN statement LIKE '%%host_charged%%' THEN 'settling (append_event/completion)'
            WHEN statement LIKE '%%<> ''reserved''%%' THEN 'append_move'
            ELSE 'append_start' END AS shape,
       generic_plans, custom_plans
FROM pg_prepared_statements
WHERE statement LIKE '%%INSERT INTO callwarden.call_events%%'
ORDER BY prepare_time;

-- name: stats_own_transactions
-- bench/citus.py: the transactions a worker ran in this database.
SELECT xact_commit + xact_rollback AS n FROM pg_stat_database
WHERE datname = current_database();

-- name: citus_prepared
-- bench/citus.py: prepared transactions the coordinator recorded (one per worker of a
-- two-phase commit; this cluster's maintenance daemon does not clean them up).
SELECT count(*) AS n FROM pg_dist_transaction;

-- name: floor3_start
-- bench/lifecycle.py, the raw-SQL floor of a three-commit engine: the same three durable
-- transactions as callwarden's happy call, each one bare statement. First CallStarted: the
-- event and the projection, fenced on version 0.
WITH upd AS (
    UPDATE jobs SET call_state = 'created', call_version = 1, status = 'processing',
           provider_kind = %(kind)s, provider_call_started_at = now(), updated_at = now()
    WHERE id = %(job_id)s AND call_version = 0
    RETURNING id
)
INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
SELECT id, 1, 'CallStarted', 1, %(payload)s::jsonb, %(actor)s FROM upd;

-- name: floor3_task
-- ...then TaskCreated: the task id on the row, fenced on version 1...
WITH upd AS (
    UPDATE jobs SET call_state = 'polling', call_version = 2,
           provider_task_id = %(task_id)s, updated_at = now()
    WHERE id = %(job_id)s AND call_version = 1
    RETURNING id
)
INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
SELECT id, 2, 'TaskCreated', 1, %(payload)s::jsonb, %(actor)s FROM upd;

-- name: floor3_complete
-- ...then the success, its claim and Completed (three events), the row completed, the
-- reservation committed and the asset rows, fenced on version 2; it answers what it
-- wrote, which bench/lifecycle.py checks.
WITH upd AS (
    UPDATE jobs SET call_state = 'completed', call_version = 5, status = 'completed',
           progress = 100, call_finished_at = now(), call_settlement = 'committed',
           updated_at = now()
    WHERE id = %(job_id)s AND call_version = 2
    RETURNING id, user_id, is_public
), ev AS (
    INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
    SELECT upd.id, 2 + x.n, x.item ->> 'type', 1, x.item, %(actor)s
    FROM upd, jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS x(item, n)
    RETURNING 1
), settle AS (
    UPDATE usage_logs SET status = 'committed', settled_at = now(),
           credits_charged = LEAST(%(cost)s, credits_reserved)
    WHERE job_id = (SELECT id FROM upd) AND status = 'reserved'
    RETURNING 1
), assets_in AS (
    INSERT INTO assets (job_id, user_id, storage_key, url, content_type, size_bytes,
                        is_public)
    SELECT j.id, j.user_id, a.key, a.url, a.content_type, a.size,
           COALESCE(j.is_public, true)
    FROM upd j, jsonb_to_recordset(%(assets)s::jsonb)
                AS a(key text, url text, content_type text, size bigint)
    ON CONFLICT (job_id, storage_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM ev) AS events, (SELECT count(*) FROM settle) AS settled,
       (SELECT count(*) FROM assets_in) AS assets;

-- name: host_api_start
-- bench/lifecycle.py, the host API (migration 0014): the three calls a Node host makes
-- through clients/node, sent from Python over the same wire. First the claim...
SELECT action FROM callwarden.start_call(%(job_id)s::uuid, %(kind)s::text, %(actor)s::text);

-- name: host_api_task
-- ...then the task id...
SELECT ok FROM callwarden.task_created(%(job_id)s::uuid, %(task_id)s::text, %(actor)s::text);

-- name: host_api_succeeded
-- ...then the outcome with what the host stored: events, row, assets and settlement.
SELECT ok, settlement
FROM callwarden.succeeded(%(job_id)s::uuid, %(actor)s::text, %(media)s::jsonb);

-- name: host_create_job
-- bench/host_api.py: a happy async call through the host API, as a Node worker makes it.
SELECT callwarden.create_job('bench-user', 10) AS id;

-- name: host_start_call
SELECT * FROM callwarden.start_call(%(job)s, 'kie-standard', 'bench');

-- name: host_task_created
SELECT * FROM callwarden.task_created(%(job)s, %(task)s, 'bench');

-- name: host_heartbeat
SELECT callwarden.heartbeat(%(job)s, 'bench', 50);

-- name: host_succeeded
SELECT * FROM callwarden.succeeded(%(job)s, 'bench', %(media)s::jsonb, NULL, 2.5,
                                   %(result)s::jsonb);
