-- The store's queries (the write path, the clock, jobs, the migration runner's bookkeeping),
-- each under a "-- name: <name>" header. Loaded once with every package's .sql file by
-- callwarden.database.queries; parameters are psycopg named placeholders.

-- name: load_projection
-- The projection columns (callwarden's own; never the host's output_data), and how many of
-- the job's reservations were already settled when read (the write path fences on it).
SELECT id, status, call_state, call_version, provider_kind, provider_task_id,
       provider_call_started_at, call_sync, reconcile_attempts, reconcile_last_error,
       reconcile_next_at, error_message, finalize_owner, finalize_lease_until,
       upstream_result::text AS upstream_result, call_output::text AS call_output,
       provider_cost, call_finished_at, call_settlement,
       (SELECT count(*) FROM usage_logs u
         WHERE u.job_id = j.id AND u.status <> 'reserved') AS settled_reservations
FROM jobs j
WHERE id = %(job_id)s;

-- fragment: append_ctes
-- One transition in one statement (so one transaction, one round trip): update the
-- projection fenced on what the writer read, append the events (one, or a run of them an
-- actor decided at once: UpstreamSucceeded, FinalizeClaimed, Completed) at seq = the
-- version read + 1, + 2, ... only if the update won, and settle the reservation with a
-- compare-and-set on status = 'reserved' only if the events were appended. Data-modifying
-- CTEs share one snapshot and commit or roll back together. The fences (DESIGN §5, §10),
-- each statement carrying only those its events can need (see the note after append_upd):
--   * call_version = the version read (optimistic concurrency between callwarden actors);
--   * the host's status: still pending/processing (NULL counts as pending), or, for the
--     HostEnded event that records a host decision, exactly the status it observed;
--   * the number of the job's reservations not 'reserved' any more, as read (a host that
--     settled one meanwhile makes the writer re-read and re-decide); not for CallStarted;
--   * a call is started only on a row no other code has put a task on (such a row is
--     adopted by the reconciler instead): append_start only.
-- The seed's columns are written only once a call owns them (fragment seed_set).
-- A commit charges min(cost, reserved) in total over the job's reservations, split over
-- those still reserved in id order (never above any one of them, never below zero); a
-- row the host committed itself counts with what it charged (never charged again).
WITH upd AS (
{{append_upd}}
), ev AS (
    INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
    SELECT upd.id, %(expected_version)s::int + e.n::int, e.ev->>'type',
           (e.ev->>'version')::smallint, e.ev->'payload', e.ev->>'actor'
    FROM upd, {{event_rows}}
    RETURNING seq
)

-- fragment: append_upd
-- The projection's update with its fences (append_ctes above; on Citus its own
-- statement, append_upd_citus).
    UPDATE jobs SET
        call_state = %(call_state)s::text,
        call_version = %(new_version)s::int,
        status = COALESCE(%(status)s::text, status),
        {{projection_set}}
        -- TaskCreated is the call's first heartbeat (stamped with the event's own time)
        heartbeat_at = COALESCE(%(beat_at)s::timestamptz, heartbeat_at),
        heartbeat_owner = COALESCE(%(beat_owner)s::text, heartbeat_owner),
        updated_at = now()
    WHERE id = %(job_id)s::uuid
      AND call_version = %(expected_version)s::int
      AND {{host_fence}}
      {{settled_fence}}
      {{start_fence}}
    RETURNING id, user_id, is_public, workflow_execution_id, node_id

-- Each append statement has a shape of its own (callwarden.database.queries derives them
-- from these fragments): a start keeps start_fence and drops settled_fence; every other
-- append drops start_fence; a completion (a Completed, never a host's decision) fences on
-- open_fence alone and writes seed_set_owned (append_completion_host_seed keeps seed_set:
-- a legacy row's call, whose seed stays the host's).

-- fragment: host_fence
-- The host's status: still pending/processing (NULL counts as pending), or, for the
-- HostEnded event that records a host decision, exactly the status it observed.
CASE WHEN %(host_status)s::text IS NULL
     THEN {{open_fence}}
     ELSE status IS NOT DISTINCT FROM %(host_status)s::text END

-- fragment: open_fence
-- host_fence for an event that is not a host's decision.
COALESCE(status, 'pending') IN ('pending', 'processing')

-- fragment: start_fence
-- A call is started only on a row no other code has put a task on (such a row is adopted
-- by the reconciler instead): append_start's alone.
AND provider_task_id IS NULL

-- fragment: event_rows
-- The run's events as rows, numbered from 1: one jsonb array of {type, version, payload,
-- actor} objects, one parameter sent as it is (the elements of a text[] parameter are
-- escaped character by character in Python, and a payload is mostly quotes).
jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(ev, n)
-- fragment: settle_ctes
-- The settlement of a terminal transition, after append_ctes (a transition that settles
-- nothing runs append_move, without these: see there).
, host_charged AS (
    -- what the job's rows the host committed itself already charged: part of the total
    SELECT COALESCE(sum(COALESCE(u.credits_charged, u.credits_reserved)), 0) AS charged
    FROM usage_logs u
    WHERE u.job_id = %(job_id)s::uuid AND u.status = 'committed'
), open_rows AS (
    SELECT u.id, u.credits_reserved,
           (SELECT charged FROM host_charged) + COALESCE(sum(u.credits_reserved) OVER (
               ORDER BY u.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM usage_logs u
    WHERE u.job_id = %(job_id)s::uuid AND u.status = 'reserved'
), settle AS (
    UPDATE usage_logs u SET
        status = %(settle_to)s::text,
        settled_at = now(),
        settled_by_seq = %(new_version)s::int,
        credits_charged = CASE WHEN %(settle_to)s::text = 'committed'
            -- (cost: clamped to >= 0 by the caller; NULL: charge the reservation)
            THEN LEAST(o.credits_reserved, GREATEST(0, COALESCE(
                     %(cost)s::numeric, o.credits_reserved + o.before) - o.before))
            ELSE 0 END
    FROM open_rows o
    -- the job id too: on Citus (usage_logs distributed by job_id) the update then goes to
    -- the job's one shard, not to every shard (issue 27)
    WHERE u.job_id = %(job_id)s::uuid AND u.id = o.id
      AND u.status = 'reserved'
      AND %(settle_to)s::text IS NOT NULL
      AND EXISTS (SELECT 1 FROM ev)
    RETURNING u.id
)

-- fragment: admit_cte
-- A start's admission (migrations/0018_admission.sql, callwarden.admit), before its
-- update: append_start's alone (callwarden.database.queries puts it there).
WITH adm AS MATERIALIZED (
    SELECT * FROM callwarden.admit(%(job_id)s::uuid, %(provider_kind)s::text)
), upd AS (

-- fragment: admit_fence
-- The start's update runs only when admit let it (append_start's start_fence).
AND (SELECT reason FROM adm) IS NULL

-- fragment: admit_cols
-- Why a refused start waits, and for how long (append_start's answer).
, (SELECT reason FROM adm) AS wait_reason, (SELECT retry_after_s FROM adm) AS retry_after_s

-- name: admit_citus
-- A start's admission on Citus (write.py runs it first in the start's transaction).
SELECT reason AS wait_reason, retry_after_s
FROM callwarden.admit(%(job_id)s::uuid, %(provider_kind)s::text);

-- fragment: settled_fence
-- The settled-reservations fence of every append but a start's (append_start: the same
-- statement without it, so each statement has one shape and Postgres keeps one generic
-- plan for it; with a NULL-or-count fence it re-planned every start).
AND (SELECT count(*) FROM usage_logs u
     WHERE u.job_id = %(job_id)s::uuid AND u.status <> 'reserved') = %(expected_settled)s::int

-- name: append_event
-- One transition that settles the reservation (see the fragments append_ctes and
-- settle_ctes above).
{{append_ctes}}
{{settle_ctes}}
SELECT (SELECT count(*) FROM ev) AS appended,
       (SELECT count(*) FROM settle) AS settled,
       (SELECT count(*) FROM usage_logs WHERE job_id = %(job_id)s::uuid) AS reservations;

-- name: append_move
-- One transition that settles nothing (TaskCreated, a heartbeat's kin, a reconcile
-- attempt...): append_ctes alone. Its own statement so that its generic plan costs no
-- settlement: with the settlement in it, Postgres costed the generic plan above the
-- custom ones (which drop the settlement when settle_to is NULL), and once the tables had
-- statistics it planned the append at every execution (bench/plan_cache.py: ~25% fewer
-- transitions per second).
{{append_ctes}}
SELECT (SELECT count(*) FROM ev) AS appended, 0::bigint AS settled,
       0::bigint AS reservations;

-- name: append_completion
-- A completing transition in ONE statement (one round trip, its own commit): the append
-- (fragment append_ctes), then, only if it was appended (rows of upd), the asset rows and
-- the sole-cause reopen of the parent workflow (Seed §5.7: only if this node was its sole
-- failure, with a compare-and-set on 'failed' so a user's cancel is never overwritten).
-- Both take the job's columns from upd's RETURNING (none of them is one it changes).
{{append_ctes}}
{{settle_ctes}},
assets_in AS (
    INSERT INTO assets (job_id, user_id, storage_key, url, content_type, size_bytes, is_public)
    SELECT j.id, j.user_id, a.key, a.url, a.content_type, a.size, COALESCE(j.is_public, true)
    FROM upd j, jsonb_to_recordset(%(assets)s::jsonb)
                AS a(key text, url text, content_type text, size bigint)
    ON CONFLICT (job_id, storage_key) DO NOTHING
), reopen AS (
    UPDATE workflow_executions w
    SET status = 'completed', failed_nodes = '{}', error_message = NULL, updated_at = now()
    FROM upd j
    WHERE w.id = j.workflow_execution_id AND w.status = 'failed'
      AND w.failed_nodes = ARRAY[j.node_id]::text[]
)
SELECT (SELECT count(*) FROM ev) AS appended,
       (SELECT count(*) FROM settle) AS settled,
       (SELECT count(*) FROM usage_logs WHERE job_id = %(job_id)s::uuid) AS reservations;

-- name: append_upd_citus
-- On Citus (issue 27) a transition is these statements in one transaction, each with the
-- job id, so each goes to the job's one shard group and the transaction commits on one
-- worker without two-phase commit (the one statement of append_ctes is planned there as
-- sub-plans whose results are sent to every worker). engine/database/write.py runs them:
-- the update (its fences), then only if it won the events, the settlement, the assets
-- and, for a workflow's node, the reopen of the workflow (a reference table: every node).
{{append_upd}};

-- name: append_event_citus
-- One event of the run (write.py sends the run's events at once, in a pipeline): an
-- INSERT ... VALUES goes to the job's shard as it is; an INSERT ... SELECT is planned on
-- the coordinator, whose results then commit in two phases.
INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
VALUES (%(job_id)s::uuid, %(seq)s::int, %(type)s::text, %(version)s::smallint,
        %(payload)s::jsonb, %(actor)s::text);

-- name: append_settle_citus
-- settle_ctes after the events were appended (append_events_citus, in this transaction).
WITH ev AS (SELECT 1 AS seq)
{{settle_ctes}}
SELECT (SELECT count(*) FROM settle) AS settled,
       (SELECT count(*) FROM usage_logs WHERE job_id = %(job_id)s::uuid) AS reservations;

-- name: append_asset_citus
-- One asset row (a VALUES, as append_event_citus).
INSERT INTO assets (job_id, user_id, storage_key, url, content_type, size_bytes, is_public)
VALUES (%(job_id)s::uuid, %(user_id)s::text, %(key)s::text, %(url)s::text,
        %(content_type)s::text, %(size)s::bigint, COALESCE(%(is_public)s::boolean, true))
ON CONFLICT (job_id, storage_key) DO NOTHING;

-- name: append_reopen_due_citus
-- Whether the job's completion reopens its workflow (append_reopen_citus): read first, as
-- a write to a reference table goes to every node and commits in two phases. (Only this
-- node's own earlier failure makes it the sole failure: no race with this completion.)
SELECT EXISTS (SELECT 1 FROM workflow_executions w
               WHERE w.id = %(workflow_execution_id)s::uuid AND w.status = 'failed'
                 AND w.failed_nodes = ARRAY[%(node_id)s::text]::text[]) AS due;

-- name: append_reopen_citus
-- append_completion's reopen, for a job that names a workflow (see there).
UPDATE workflow_executions w
SET status = 'completed', failed_nodes = '{}', error_message = NULL, updated_at = now()
WHERE w.id = %(workflow_execution_id)s::uuid AND w.status = 'failed'
  AND w.failed_nodes = ARRAY[%(node_id)s::text]::text[];

-- name: load_events
SELECT seq, type, version, payload::text AS payload, actor, recorded_at
FROM callwarden.call_events
WHERE job_id = %(job_id)s
ORDER BY seq;

-- name: create_job
-- A job row and its credit reservation, in one statement.
WITH j AS (
    INSERT INTO jobs (id, user_id, job_type, status, input_data, workflow_execution_id, node_id)
    VALUES (%(job_id)s, %(user_id)s, %(job_type)s, %(status)s, %(input_data)s::jsonb,
            %(workflow_execution_id)s, %(node_id)s)
    RETURNING id, user_id
)
INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)
SELECT id, user_id, 'reserved', %(credits)s FROM j WHERE %(credits)s::numeric IS NOT NULL
RETURNING id;

-- name: slow_down
-- The provider answered a create with 429: pause the kind's account and halve its caps
-- (migrations/0018_admission.sql, callwarden.slow_down). No row: no limit names the kind.
SELECT account, paused_s, rate_factor
FROM callwarden.slow_down(%(kind)s::text, %(retry_after_s)s::float8);

-- name: heartbeat
-- Projection-only: proves the owner is alive and reports progress. Never an event.
UPDATE jobs
SET heartbeat_at = now(), heartbeat_owner = %(owner)s,
    progress = GREATEST(progress, COALESCE(%(progress)s::int, progress))
-- No row: the call is no longer polled (ended, its result recorded, or the host ended
-- the job; callwarden.heartbeat, migration 0016, answers the same).
WHERE id = %(job_id)s AND call_state IN ('created', 'polling') AND {{open_fence}}
RETURNING id

-- name: job_meta
SELECT id, user_id, job_type, status, is_public, workflow_execution_id, node_id,
       input_data::text AS input_data
FROM jobs
WHERE id = %(job_id)s;

-- name: clock_now
-- The database's clock: the one every actor compares leases and heartbeats on.
SELECT now() AS now;

-- The migration runner's own bookkeeping (engine/database/migrate.py).

-- name: migrations_create_table
-- Unqualified, as every bookkeeping query here: migrate runs with callwarden's schema last
-- in its search_path, so these find the table where an earlier release made it (before
-- 0011 moves it) or in callwarden (after); a fresh database makes it where 0001..0010
-- make theirs, and 0011 moves it with them (migrate.py).
CREATE TABLE callwarden_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_place
-- Where the bookkeeping is: 'own' (callwarden.callwarden_migrations, since 0011),
-- 'legacy' (an earlier release's, in the search_path) or NULL (never migrated).
SELECT CASE WHEN to_regclass('callwarden.callwarden_migrations') IS NOT NULL THEN 'own'
            WHEN to_regclass('callwarden_migrations') IS NOT NULL THEN 'legacy'
       END AS place;

-- name: migrations_applied
SELECT version FROM callwarden.callwarden_migrations;

-- name: migrations_applied_legacy
SELECT version FROM callwarden_migrations;

-- name: migrations_record
INSERT INTO callwarden_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migrations_search_path
SELECT current_setting('search_path') AS path;

-- name: migrations_set_search_path
-- Session-wide (migrate runs on a direct connection, never through a pooler in
-- transaction mode) and put back when migrate ends.
SELECT set_config('search_path', %(path)s::text, false);

-- name: migrations_regrant
-- After migrating: every role granted callwarden's runtime before (it holds INSERT on the
-- log by a grant of its own) is granted again, so what a migration added, or a table a
-- late move to Citus made (callwarden_tasks), is theirs too (migration 0011's function).
SELECT callwarden.grant_runtime(a.grantee::regrole) AS stmt
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = to_regclass('callwarden.call_events') AND a.privilege_type = 'INSERT'
  AND a.grantee <> 0 AND a.grantee <> c.relowner;

-- name: migrations_drop_guards
-- Before 0010 distributes jobs on a database moved to Citus later: Citus refuses a table
-- with triggers (0011's guard is not installed on Citus; `check` says so).
DROP TRIGGER IF EXISTS callwarden_guard_update ON jobs;

-- name: migrations_drop_guards_insert
DROP TRIGGER IF EXISTS callwarden_guard_insert ON jobs;

-- name: migrations_drop_guards_settlement
DROP TRIGGER IF EXISTS callwarden_guard_settlement ON usage_logs;

-- name: migrations_drop_guards_settlement_insert
DROP TRIGGER IF EXISTS callwarden_guard_settlement_insert ON usage_logs;

-- name: task_claim_citus
-- On Citus, where no unique index spans shards: the upstream task's one job, kept in
-- callwarden_tasks (distributed by the task id, migration 0010) in the transaction that
-- appends the TaskCreated or Adopted naming it (write.py); a task another job holds is
-- left as it is (task_holder_citus then names that job: TaskAlreadyClaimed).
INSERT INTO callwarden.callwarden_tasks (provider_kind, provider_task_id, job_id)
VALUES (%(kind)s, %(task_id)s, %(job_id)s::uuid)
ON CONFLICT (provider_task_id, provider_kind) DO NOTHING
RETURNING job_id;

-- name: task_holder_citus
SELECT job_id FROM callwarden.callwarden_tasks
WHERE provider_task_id = %(task_id)s AND provider_kind = %(kind)s;

-- name: migrations_on_citus
-- A Citus database: migrations are sent one statement at a time (migrate.py).
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') AS ok;

-- name: citus_workers
-- The coordinator's active primary workers (engine/database/databases.py).
SELECT nodename, nodeport FROM pg_dist_node
WHERE groupid <> 0 AND isactive AND noderole = 'primary'
ORDER BY nodename, nodeport;

-- name: citus_extension
CREATE EXTENSION IF NOT EXISTS citus;

-- name: citus_set_coordinator
SELECT citus_set_coordinator_host(%(host)s::text, %(port)s::int);

-- name: citus_add_worker
SELECT citus_add_node(%(host)s::text, %(port)s::int)
WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node
                  WHERE nodename = %(host)s::text AND nodeport = %(port)s::int);

-- name: migrations_citus_done
-- On Citus: whether 0010 (jobs distributed, the task table made) and 0012 (the callback
-- tokens distributed) ran there; a database moved to Citus after it was migrated has
-- neither: migrate.py runs them again.
SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass)
       AND to_regclass('callwarden_tasks') IS NOT NULL
       AND (to_regclass('callwarden.callback_tokens') IS NULL
            OR EXISTS (SELECT 1 FROM pg_dist_partition
                       WHERE logicalrelid = to_regclass('callwarden.callback_tokens')))
       AS ok;

-- name: migrations_lock
-- Two migrators on one database serialise here.
SELECT pg_advisory_lock(%(key)s);

-- name: migrations_unlock
SELECT pg_advisory_unlock(%(key)s);

-- name: read_snapshot
-- First statement of a snapshot read (verify, rebuild, the reconciler's candidate): one
-- consistent snapshot of rows + events; read only, so it takes no lock a writer waits for.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- fragment: projection_set
-- The projection columns an event's fold writes, but status (the append and the rebuild
-- fence it differently): written once, spliced into append_event and
-- audit_rebuild_projection by callwarden.database.queries.
    {{seed_set}}
    call_sync = %(call_sync)s::boolean,
    reconcile_next_at = %(reconcile_next_at)s::timestamptz,
    error_message = COALESCE(%(error_message)s::text, error_message),
    finalize_owner = %(finalize_owner)s::text,
    finalize_lease_until = %(finalize_lease_until)s::timestamptz,
    upstream_result = %(upstream_result)s::jsonb,
    call_output = %(call_output)s::jsonb,
    output_data = CASE
        WHEN %(call_output)s::jsonb IS NULL THEN output_data
        WHEN jsonb_typeof(output_data) = 'object' THEN output_data || %(call_output)s::jsonb
        ELSE %(call_output)s::jsonb END,
    -- the host's own until a Completed says (its markJobCompleted writes it)
    provider_cost = COALESCE(%(provider_cost)s::numeric, provider_cost),
    call_finished_at = %(call_finished_at)s::timestamptz,
    call_settlement = %(call_settlement)s::text,
    completed_at = CASE WHEN %(is_completion)s::boolean
                        THEN %(call_finished_at)s::timestamptz ELSE completed_at END,
    progress = CASE WHEN %(is_completion)s::boolean THEN 100 ELSE progress END,

-- fragment: seed_set
-- The seed's columns, written only once a call owns them (owns_seed: CallStarted or
-- Adopted set provider_kind): a cancel of a job whose call never started leaves the
-- host's provider_kind, task id, start time and attempt counters as they are.
provider_kind = CASE WHEN %(owns_seed)s::boolean THEN %(provider_kind)s::text
                     ELSE provider_kind END,
provider_task_id = CASE WHEN %(owns_seed)s::boolean THEN %(provider_task_id)s::text
                        ELSE provider_task_id END,
provider_call_started_at = CASE WHEN %(owns_seed)s::boolean
                                THEN %(provider_call_started_at)s::timestamptz
                                ELSE provider_call_started_at END,
reconcile_attempts = CASE WHEN %(owns_seed)s::boolean
                          THEN %(reconcile_attempts)s::int
                          ELSE reconcile_attempts END,
reconcile_last_error = CASE WHEN %(owns_seed)s::boolean
                            THEN %(reconcile_last_error)s::text
                            ELSE reconcile_last_error END,

-- fragment: seed_set_owned
-- seed_set when the call owns the seed (append_completion; write.py picks the shape).
provider_kind = %(provider_kind)s::text,
provider_task_id = %(provider_task_id)s::text,
provider_call_started_at = %(provider_call_started_at)s::timestamptz,
reconcile_attempts = %(reconcile_attempts)s::int,
reconcile_last_error = %(reconcile_last_error)s::text,
