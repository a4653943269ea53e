-- The host API (issue 38): every step a host takes on a call, as SQL functions any
-- language calls (the TypeScript client in clients/node/, supabase-js rpc, psql), with
-- the fences, events and settlement of callwarden's own write path: a call started here
-- can be finished by callwarden's worker or reconciler, and the other way round.
--
-- Each function locks the job's row (FOR UPDATE), decides on it, appends its events at
-- seq = call_version + 1, + 2, ... and updates the projection columns, and, when the call
-- ends, settles the job's reservations with a compare-and-set on status = 'reserved', all
-- in the caller's one transaction. A Python writer racing it waits for the lock, then its
-- fence on call_version fails and it decides again on what this wrote (and the other way
-- round: its event's seq taken, a function's insert fails and nothing of it stands).
--
-- Which event may follow which state, each event's payload version and the status a state
-- projects to are rendered from callwarden's one declaration (engine/database/declared.py;
-- the block below; tests/unit/test_declared_sql.py fails when they differ), and every step
-- asks callwarden.next_state before it writes. tests/integration/test_host_api.py drives
-- these functions and callwarden's Python actors on the same calls and checks that the
-- columns equal the fold of the log (verify) after every step.
--
-- Versioning: callwarden.host_api_version() answers the contract's version (1). A later
-- release keeps every signature below and changes bodies with CREATE OR REPLACE, so a call
-- in flight under this release finishes under the next (its state is the row and the log,
-- which every release reads); a change a client must know of raises the version.
--
-- SECURITY INVOKER (the caller's own privileges: callwarden grant ROLE), search_path ''.
-- The host's tables are named with the schema this migration finds jobs in (@host@).

-- BEGIN GENERATED (python -m callwarden.database.declared)

CREATE OR REPLACE FUNCTION callwarden.next_state(state text, event text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
SELECT CASE
    WHEN state IS NULL AND event = 'Adopted' THEN 'created'
    WHEN state IS NULL AND event = 'CallStarted' THEN 'created'
    WHEN state IS NULL AND event = 'Cancelled' THEN 'cancelled'
    WHEN state = 'created' AND event = 'Cancelled' THEN 'cancelled'
    WHEN state = 'finalizing' AND event = 'Cancelled' THEN 'cancelled'
    WHEN state = 'polling' AND event = 'Cancelled' THEN 'cancelled'
    WHEN state = 'upstream_succeeded' AND event = 'Cancelled' THEN 'cancelled'
    WHEN state = 'finalizing' AND event = 'Completed' THEN 'completed'
    WHEN state = 'created' AND event = 'Exhausted' THEN 'exhausted'
    WHEN state = 'finalizing' AND event = 'Exhausted' THEN 'exhausted'
    WHEN state = 'polling' AND event = 'Exhausted' THEN 'exhausted'
    WHEN state = 'upstream_succeeded' AND event = 'Exhausted' THEN 'exhausted'
    WHEN state = 'finalizing' AND event = 'FinalizeClaimed' THEN 'finalizing'
    WHEN state = 'upstream_succeeded' AND event = 'FinalizeClaimed' THEN 'finalizing'
    WHEN state = 'finalizing' AND event = 'FinalizeFailed' THEN 'upstream_succeeded'
    WHEN state IS NULL AND event = 'HostEnded' THEN 'failed'
    WHEN state = 'created' AND event = 'HostEnded' THEN 'failed'
    WHEN state = 'finalizing' AND event = 'HostEnded' THEN 'failed'
    WHEN state = 'polling' AND event = 'HostEnded' THEN 'failed'
    WHEN state = 'upstream_succeeded' AND event = 'HostEnded' THEN 'failed'
    WHEN state = 'created' AND event = 'ReconcileAttempted' THEN 'created'
    WHEN state = 'finalizing' AND event = 'ReconcileAttempted' THEN 'finalizing'
    WHEN state = 'polling' AND event = 'ReconcileAttempted' THEN 'polling'
    WHEN state = 'upstream_succeeded' AND event = 'ReconcileAttempted' THEN 'upstream_succeeded'
    WHEN state = 'created' AND event = 'Swept' THEN 'swept'
    WHEN state = 'polling' AND event = 'Swept' THEN 'swept'
    WHEN state = 'created' AND event = 'TaskCreated' THEN 'polling'
    WHEN state = 'created' AND event = 'UpstreamFailed' THEN 'failed'
    WHEN state = 'finalizing' AND event = 'UpstreamFailed' THEN 'failed'
    WHEN state = 'polling' AND event = 'UpstreamFailed' THEN 'failed'
    WHEN state = 'upstream_succeeded' AND event = 'UpstreamFailed' THEN 'failed'
    WHEN state = 'created' AND event = 'UpstreamSucceeded' THEN 'upstream_succeeded'
    WHEN state = 'polling' AND event = 'UpstreamSucceeded' THEN 'upstream_succeeded'
    ELSE NULL END
$body$;

CREATE OR REPLACE FUNCTION callwarden.event_version(event text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
SELECT CASE
    WHEN event = 'Adopted' THEN 1
    WHEN event = 'CallStarted' THEN 1
    WHEN event = 'Cancelled' THEN 1
    WHEN event = 'Completed' THEN 1
    WHEN event = 'Exhausted' THEN 1
    WHEN event = 'FinalizeClaimed' THEN 1
    WHEN event = 'FinalizeFailed' THEN 1
    WHEN event = 'HostEnded' THEN 1
    WHEN event = 'ReconcileAttempted' THEN 1
    WHEN event = 'Swept' THEN 1
    WHEN event = 'TaskCreated' THEN 1
    WHEN event = 'UpstreamFailed' THEN 1
    WHEN event = 'UpstreamSucceeded' THEN 2
    ELSE NULL END
$body$;

CREATE OR REPLACE FUNCTION callwarden.state_status(state text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
SELECT CASE
    WHEN state = 'created' THEN NULL
    WHEN state = 'polling' THEN 'processing'
    WHEN state = 'upstream_succeeded' THEN 'processing'
    WHEN state = 'finalizing' THEN 'processing'
    WHEN state = 'completed' THEN 'completed'
    WHEN state = 'failed' THEN 'failed'
    WHEN state = 'swept' THEN 'failed'
    WHEN state = 'exhausted' THEN 'failed'
    WHEN state = 'cancelled' THEN 'cancelled'
    ELSE NULL END
$body$;

CREATE OR REPLACE FUNCTION callwarden.state_settlement(state text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
SELECT CASE
    WHEN state = 'created' THEN NULL
    WHEN state = 'polling' THEN NULL
    WHEN state = 'upstream_succeeded' THEN NULL
    WHEN state = 'finalizing' THEN NULL
    WHEN state = 'completed' THEN 'committed'
    WHEN state = 'failed' THEN 'refunded'
    WHEN state = 'swept' THEN 'refunded'
    WHEN state = 'exhausted' THEN 'refunded'
    WHEN state = 'cancelled' THEN 'refunded'
    ELSE NULL END
$body$;

-- END GENERATED

-- The functions that name the host's tables, made with its schema (@host@ below).
DO $host_api$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('jobs'));
    body text := $fns$
CREATE OR REPLACE FUNCTION callwarden.host_api_version() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = '' AS $body$ SELECT 1 $body$;

-- The job's row, locked for this transaction; no_data_found (P0002) if there is none.
CREATE OR REPLACE FUNCTION callwarden.locked_job(job_id uuid) RETURNS @host@.jobs
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs;
BEGIN
    SELECT * INTO j FROM @host@.jobs WHERE id = locked_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job %', job_id USING ERRCODE = 'P0002';
    END IF;
    RETURN j;
END
$body$;

-- Append events (a jsonb array of payloads, each with its type, at and actor) to a call
-- read at version from_version, each checked against the declaration; the state after.
CREATE OR REPLACE FUNCTION callwarden.append_events(job_id uuid, from_state text,
                                                    from_version int, events jsonb)
RETURNS text
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    st text := from_state;
    e jsonb;
    n int := 0;
BEGIN
    FOR e IN SELECT * FROM jsonb_array_elements(events) LOOP
        st := callwarden.next_state(st, e->>'type');
        IF st IS NULL THEN
            RAISE EXCEPTION '% may not follow state %', e->>'type',
                COALESCE(from_state, 'none') USING ERRCODE = 'CW003';
        END IF;
        n := n + 1;
        INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
        VALUES (append_events.job_id, from_version + n, e->>'type',
                callwarden.event_version(e->>'type'), e, e->>'actor');
    END LOOP;
    RETURN st;
END
$body$;

-- Settle the job's reservations still 'reserved' to committed (charging min(cost, what
-- was reserved) in total, split over them in id order; NULL cost: the reservations) or
-- refunded, by the event at seq; the settlement word the Python write path answers.
CREATE OR REPLACE FUNCTION callwarden.settle(job_id uuid, settle_to text, seq int,
                                             cost numeric)
RETURNS text
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    moved int;
BEGIN
    WITH host_charged AS (
        SELECT COALESCE(sum(COALESCE(u.credits_charged, u.credits_reserved)), 0) AS charged
        FROM @host@.usage_logs u
        WHERE u.job_id = settle.job_id AND u.status = 'committed'
    ), open_rows AS (
        SELECT u.id, u.credits_reserved,
               (SELECT charged FROM host_charged) + COALESCE(sum(u.credits_reserved) OVER (
                   ORDER BY u.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                   AS before
        FROM @host@.usage_logs u
        WHERE u.job_id = settle.job_id AND u.status = 'reserved'
    ), moved_rows AS (
        UPDATE @host@.usage_logs u SET
            status = settle_to,
            settled_at = now(),
            settled_by_seq = settle.seq,
            credits_charged = CASE WHEN settle_to = 'committed'
                THEN LEAST(o.credits_reserved, GREATEST(0, COALESCE(
                         settle.cost, o.credits_reserved + o.before) - o.before))
                ELSE 0 END
        FROM open_rows o
        WHERE u.job_id = settle.job_id AND u.id = o.id AND u.status = 'reserved'
        RETURNING u.id
    )
    SELECT count(*) INTO moved FROM moved_rows;
    IF moved > 0 THEN
        RETURN 'settled';
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u WHERE u.job_id = settle.job_id)
                THEN 'already_settled' ELSE 'no_reservation' END;
END
$body$;

-- The call ends in state `dest` by the last of `events` (already appended): the
-- projection's terminal columns, and the settlement the state declares ('host': none).
CREATE OR REPLACE FUNCTION callwarden.end_call(j @host@.jobs, dest text, n_events int,
                                               at timestamptz, error text,
                                               settle_to text, cost numeric)
RETURNS text
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
BEGIN
    UPDATE @host@.jobs SET
        call_state = dest,
        call_version = j.call_version + n_events,
        status = COALESCE(callwarden.state_status(dest), status),
        error_message = COALESCE(error, error_message),
        reconcile_next_at = NULL,
        finalize_owner = NULL,
        finalize_lease_until = NULL,
        call_finished_at = at,
        call_settlement = settle_to,
        updated_at = now()
    WHERE id = j.id;
    IF settle_to IN ('committed', 'refunded') THEN
        RETURN callwarden.settle(j.id, settle_to, j.call_version + n_events, cost);
    END IF;
    RETURN NULL;
END
$body$;

-- The host wrote a terminal status on an open call first: HostEnded, as the Python write
-- path records it (a job it completed is the host's to commit; else what it left
-- reserved is refunded). NULL when the row is not such a call.
CREATE OR REPLACE FUNCTION callwarden.host_ended(j @host@.jobs, actor text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    at timestamptz := now();
    dest text;
    word text;
BEGIN
    IF j.call_state IS NULL OR callwarden.state_settlement(j.call_state) IS NOT NULL
       OR COALESCE(j.status, 'pending') IN ('pending', 'processing') THEN
        RETURN;
    END IF;
    PERFORM callwarden.append_events(j.id, j.call_state, j.call_version, jsonb_build_array(
        jsonb_build_object('type', 'HostEnded', 'at', at, 'actor', actor,
                           'status', j.status)));
    dest := CASE j.status WHEN 'completed' THEN 'completed' WHEN 'cancelled' THEN 'cancelled'
                          ELSE 'failed' END;
    word := callwarden.end_call(j, dest, 1, at, NULL,
                                CASE WHEN dest = 'completed' THEN 'host' ELSE 'refunded' END,
                                NULL);
    UPDATE @host@.jobs SET status = j.status WHERE id = j.id;  -- the host's word stays
    RETURN QUERY SELECT false, dest, word;
END
$body$;

-- A job row and its credit reservation (none when credits is NULL), in one statement.
CREATE OR REPLACE FUNCTION callwarden.create_job(user_id text, credits numeric,
                                                 input jsonb DEFAULT '{}',
                                                 job_type text DEFAULT 'image',
                                                 job_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE sql SET search_path = '' AS $body$
    WITH j AS (
        INSERT INTO @host@.jobs (id, user_id, job_type, status, input_data)
        VALUES (COALESCE(create_job.job_id, gen_random_uuid()), create_job.user_id,
                create_job.job_type, 'pending', COALESCE(create_job.input, '{}'))
        RETURNING id, user_id
    ), r AS (
        INSERT INTO @host@.usage_logs (job_id, user_id, status, credits_reserved)
        SELECT j.id, j.user_id, 'reserved', create_job.credits FROM j
        WHERE create_job.credits IS NOT NULL
    )
    SELECT id FROM j
$body$;

-- The claim before the create (OwnCalls.start, markProviderCallStart for a sync call):
-- records CallStarted on a job with no call, then answers `create`; on a job whose call
-- started before, what its holder must do (see the client's docs: resume with the task
-- id, ambiguous, finalize, done, not_started; a sync call answers `already_started`).
CREATE OR REPLACE FUNCTION callwarden.start_call(job_id uuid, kind text, actor text,
                                                 sync boolean DEFAULT false,
                                                 recreate boolean DEFAULT false)
RETURNS TABLE (action text, task_id text, state text, version int)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs := callwarden.locked_job(start_call.job_id);
    at timestamptz := now();
    ended record;
BEGIN
    IF kind IS NULL OR kind = '' OR actor IS NULL OR actor = '' THEN
        RAISE EXCEPTION 'start_call: kind and actor are required' USING ERRCODE = '22023';
    END IF;
    IF j.call_state IS NULL THEN
        IF j.provider_task_id IS NOT NULL
           OR COALESCE(j.status, 'pending') NOT IN ('pending', 'processing') THEN
            RETURN QUERY SELECT 'not_started', j.provider_task_id, NULL::text, j.call_version;
            RETURN;
        END IF;
        PERFORM callwarden.append_events(j.id, NULL, j.call_version, jsonb_build_array(
            jsonb_build_object('type', 'CallStarted', 'at', at, 'actor', actor,
                               'kind', kind, 'sync', sync)));
        UPDATE @host@.jobs SET
            call_state = 'created', call_version = j.call_version + 1,
            provider_kind = kind, provider_task_id = NULL, provider_call_started_at = at,
            call_sync = sync, reconcile_attempts = 0, reconcile_last_error = NULL,
            reconcile_next_at = NULL, finalize_owner = NULL, finalize_lease_until = NULL,
            upstream_result = NULL, call_output = NULL, provider_cost = NULL,
            call_finished_at = NULL, call_settlement = NULL, updated_at = now()
        WHERE id = j.id;
        RETURN QUERY SELECT 'create', NULL::text, 'created', j.call_version + 1;
        RETURN;
    END IF;
    IF j.provider_kind IS DISTINCT FROM kind THEN
        RAISE EXCEPTION 'job % has a % call, not %', j.id, j.provider_kind, kind
            USING ERRCODE = 'CW002';
    END IF;
    SELECT * INTO ended FROM callwarden.host_ended(j, actor);
    IF FOUND THEN  -- the host ended the job: its decision is recorded, nothing to do
        RETURN QUERY SELECT 'done'::text, j.provider_task_id, ended.state,
                            j.call_version + 1;
        RETURN;
    END IF;
    RETURN QUERY SELECT
        CASE WHEN callwarden.state_settlement(j.call_state) IS NOT NULL THEN 'done'
             WHEN sync THEN 'already_started'
             WHEN j.call_state = 'created' THEN
                 CASE WHEN recreate THEN 'create' ELSE 'ambiguous' END
             WHEN j.call_state = 'polling' THEN 'resume'
             ELSE 'finalize' END,
        j.provider_task_id, j.call_state, j.call_version;
END
$body$;

-- The upstream task id, persisted (TaskCreated: created -> polling; the call's first
-- heartbeat). Another id than the job holds: CW001; one another job holds: 23505.
CREATE OR REPLACE FUNCTION callwarden.task_created(job_id uuid, task_id text, actor text)
RETURNS TABLE (ok boolean, state text, version int)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs := callwarden.locked_job(task_created.job_id);
    at timestamptz := now();
    ended record;
BEGIN
    IF task_id IS NULL OR task_id = '' THEN
        RAISE EXCEPTION 'task_created: a task id is required' USING ERRCODE = '22023';
    END IF;
    IF j.provider_task_id IS NOT NULL AND j.provider_task_id <> task_id THEN
        RAISE EXCEPTION 'job % holds task %, not %', j.id, j.provider_task_id, task_id
            USING ERRCODE = 'CW001';
    END IF;
    SELECT * INTO ended FROM callwarden.host_ended(j, actor);
    IF FOUND THEN
        RETURN QUERY SELECT false, ended.state, j.call_version + 1;
        RETURN;
    END IF;
    IF j.call_state IS DISTINCT FROM 'created' THEN
        RETURN QUERY SELECT false, j.call_state, j.call_version;
        RETURN;
    END IF;
    PERFORM callwarden.append_events(j.id, j.call_state, j.call_version, jsonb_build_array(
        jsonb_build_object('type', 'TaskCreated', 'at', at, 'actor', actor,
                           'task_id', task_id)));
    UPDATE @host@.jobs SET
        call_state = 'polling', call_version = j.call_version + 1, status = 'processing',
        provider_task_id = task_created.task_id, heartbeat_at = at, heartbeat_owner = actor,
        updated_at = now()
    WHERE id = j.id;
    RETURN QUERY SELECT true, 'polling'::text, j.call_version + 1;
END
$body$;

-- Projection-only (never an event): the call's holder is alive. False when the call is
-- no longer one to poll (it ended, or its result is recorded): stop polling.
CREATE OR REPLACE FUNCTION callwarden.heartbeat(job_id uuid, owner text,
                                                progress int DEFAULT NULL)
RETURNS boolean
LANGUAGE sql SET search_path = '' AS $body$
    WITH beat AS (
        UPDATE @host@.jobs
        SET heartbeat_at = now(), heartbeat_owner = heartbeat.owner,
            progress = GREATEST(progress, COALESCE(heartbeat.progress, progress))
        WHERE id = heartbeat.job_id AND call_state IN ('created', 'polling')
        RETURNING id
    )
    SELECT EXISTS (SELECT 1 FROM beat)
$body$;

-- An upstream failure or a vanished task (created|polling -> failed or swept, refunded).
CREATE OR REPLACE FUNCTION callwarden.fail_call(job_id uuid, actor text, event jsonb,
                                                error text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs := callwarden.locked_job(fail_call.job_id);
    ended record;
    dest text;
BEGIN
    SELECT * INTO ended FROM callwarden.host_ended(j, actor);
    IF FOUND THEN
        RETURN QUERY SELECT ended.ok, ended.state, ended.settlement;
        RETURN;
    END IF;
    IF callwarden.next_state(j.call_state, event->>'type') IS NULL
       OR (event->>'type' = 'UpstreamFailed' AND j.call_state NOT IN ('created', 'polling'))
    THEN
        RETURN QUERY SELECT false, j.call_state, j.call_settlement;
        RETURN;
    END IF;
    dest := callwarden.append_events(j.id, j.call_state, j.call_version,
                                     jsonb_build_array(event));
    RETURN QUERY SELECT true, dest,
        callwarden.end_call(j, dest, 1, (event->>'at')::timestamptz, error,
                            callwarden.state_settlement(dest), NULL);
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.failed(job_id uuid, actor text, error text,
                                             code text DEFAULT NULL)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE sql SET search_path = '' AS $body$
    SELECT * FROM callwarden.fail_call(failed.job_id, failed.actor, jsonb_build_object(
        'type', 'UpstreamFailed', 'at', now(), 'actor', failed.actor,
        'error', left(COALESCE(failed.error, 'failed'), 2000), 'code', failed.code),
        left(COALESCE(failed.error, 'failed'), 2000))
$body$;

CREATE OR REPLACE FUNCTION callwarden.not_found(job_id uuid, actor text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE sql SET search_path = '' AS $body$
    SELECT * FROM callwarden.fail_call(not_found.job_id, not_found.actor, jsonb_build_object(
        'type', 'Swept', 'at', now(), 'actor', not_found.actor,
        'reason', 'upstream_task_not_found'), 'upstream_task_not_found')
$body$;

-- A cancel (any open call, or a job whose call never started; refunded).
CREATE OR REPLACE FUNCTION callwarden.cancel(job_id uuid, by text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs := callwarden.locked_job(cancel.job_id);
    at timestamptz := now();
    ended record;
BEGIN
    SELECT * INTO ended FROM callwarden.host_ended(j, by);
    IF FOUND THEN
        RETURN QUERY SELECT ended.ok, ended.state, ended.settlement;
        RETURN;
    END IF;
    IF callwarden.state_settlement(j.call_state) IS NOT NULL
       OR (j.call_state IS NULL AND COALESCE(j.status, 'pending') NOT IN ('pending', 'processing'))
    THEN
        RETURN QUERY SELECT false, j.call_state, j.call_settlement;
        RETURN;
    END IF;
    PERFORM callwarden.append_events(j.id, j.call_state, j.call_version, jsonb_build_array(
        jsonb_build_object('type', 'Cancelled', 'at', at, 'actor', by, 'by', by)));
    RETURN QUERY SELECT true, 'cancelled'::text,
        callwarden.end_call(j, 'cancelled', 1, at, NULL, 'refunded', NULL);
END
$body$;

-- The outcome: upstream succeeded with what the host stored (media: [{key, url,
-- content_type, size}]) and its text; UpstreamSucceeded, FinalizeClaimed and Completed,
-- the asset rows, the sole-cause reopen of the parent workflow and the commit at `cost`
-- (NULL: the reservations; never above them) in this one transaction. `result`: what the
-- provider reported ({media_urls, text, cost, usage, stop_reason, raw}), kept in the log.
CREATE OR REPLACE FUNCTION callwarden.succeeded(job_id uuid, actor text,
                                                media jsonb DEFAULT '[]',
                                                text text DEFAULT NULL,
                                                cost numeric DEFAULT NULL,
                                                result jsonb DEFAULT NULL)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = '' AS $body$
#variable_conflict use_column
DECLARE
    j @host@.jobs := callwarden.locked_job(succeeded.job_id);
    at timestamptz := now();
    ended record;
    m jsonb := COALESCE(media, '[]');
    r jsonb := COALESCE(result, '{}');
    upstream jsonb;
    output jsonb;
    word text;
BEGIN
    IF jsonb_typeof(m) <> 'array' OR EXISTS (
        SELECT 1 FROM jsonb_array_elements(m) a
        WHERE jsonb_typeof(a) <> 'object' OR jsonb_typeof(a->'key') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a->'url') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a->'content_type') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a->'size') IS DISTINCT FROM 'number'
           OR (a->>'size')::numeric <> trunc((a->>'size')::numeric) OR (a->>'size')::numeric < 0)
    THEN
        RAISE EXCEPTION 'succeeded: media must be an array of {key, url, content_type, size}'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(r) <> 'object' OR cost < 0 OR cost = 'NaN'::numeric THEN
        RAISE EXCEPTION 'succeeded: result must be an object and cost >= 0'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO ended FROM callwarden.host_ended(j, actor);
    IF FOUND THEN
        RETURN QUERY SELECT ended.ok, ended.state, ended.settlement;
        RETURN;
    END IF;
    IF j.call_state IS NULL OR j.call_state NOT IN ('created', 'polling') THEN
        RETURN QUERY SELECT false, j.call_state, j.call_settlement;
        RETURN;
    END IF;
    upstream := jsonb_build_object(
        'media_urls', CASE WHEN jsonb_typeof(r->'media_urls') = 'array'
                           THEN r->'media_urls' ELSE '[]' END,
        'text', CASE WHEN jsonb_typeof(r->'text') = 'string' THEN r->'text' END,
        'cost', CASE WHEN jsonb_typeof(r->'cost') = 'number' THEN r->'cost' END,
        'raw', CASE WHEN jsonb_typeof(r->'raw') = 'object' THEN r->'raw' ELSE '{}' END,
        'stored_keys', '[]'::jsonb,
        'usage', CASE WHEN jsonb_typeof(r->'usage') = 'object' THEN r->'usage' ELSE '{}' END,
        'stop_reason', CASE WHEN jsonb_typeof(r->'stop_reason') = 'string'
                            THEN r->'stop_reason' END);
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(upstream->'media_urls') u
               WHERE jsonb_typeof(u) <> 'string')
       OR EXISTS (SELECT 1 FROM jsonb_each(upstream->'usage') u
                  WHERE jsonb_typeof(u.value) NOT IN ('number', 'string')) THEN
        RAISE EXCEPTION 'succeeded: result.media_urls must be strings, result.usage values '
            'numbers or strings' USING ERRCODE = '22023';
    END IF;
    output := jsonb_build_object('media', m)
        || CASE WHEN text IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('text', text) END
        || CASE WHEN upstream->'stop_reason' = 'null'::jsonb THEN '{}'::jsonb
                ELSE jsonb_build_object('stop_reason', upstream->'stop_reason') END;
    PERFORM callwarden.append_events(j.id, j.call_state, j.call_version, jsonb_build_array(
        jsonb_build_object('type', 'UpstreamSucceeded', 'at', at, 'actor', actor,
                           'result', upstream),
        jsonb_build_object('type', 'FinalizeClaimed', 'at', at, 'actor', actor,
                           'owner', actor, 'lease_until', at + interval '60 seconds'),
        jsonb_build_object('type', 'Completed', 'at', at, 'actor', actor, 'media', m,
                           'cost', cost, 'text', text,
                           'stop_reason', upstream->'stop_reason')));
    UPDATE @host@.jobs SET
        upstream_result = upstream,
        call_output = output,
        output_data = CASE WHEN jsonb_typeof(output_data) = 'object' THEN output_data || output
                           ELSE output END,
        provider_cost = succeeded.cost,
        completed_at = at,
        progress = 100
    WHERE id = j.id;
    word := callwarden.end_call(j, 'completed', 3, at, NULL, 'committed', cost);
    INSERT INTO @host@.assets (job_id, user_id, storage_key, url, content_type, size_bytes,
                               is_public)
    SELECT j.id, j.user_id, a.key, a.url, a.content_type, a.size, COALESCE(j.is_public, true)
    FROM jsonb_to_recordset(m) AS a(key text, url text, content_type text, size bigint)
    ON CONFLICT (job_id, storage_key) DO NOTHING;
    UPDATE @host@.workflow_executions w
    SET status = 'completed', failed_nodes = '{}', error_message = NULL, updated_at = now()
    WHERE w.id = j.workflow_execution_id AND w.status = 'failed'
      AND w.failed_nodes = ARRAY[j.node_id]::text[];
    RETURN QUERY SELECT true, 'completed'::text, word;
END
$body$;
$fns$;
BEGIN
    EXECUTE replace(body, '@host@', quote_ident(host));
END
$host_api$;

-- Nothing for PUBLIC (as 0011): a role calls these once `callwarden grant ROLE` made it a
-- runtime, and then with its own privileges (SECURITY INVOKER).
DO $revoke$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'callwarden'::regnamespace
          AND p.proname IN ('next_state', 'event_version', 'state_status', 'state_settlement',
                            'host_api_version', 'locked_job', 'append_events', 'settle',
                            'end_call', 'host_ended', 'create_job', 'start_call',
                            'task_created', 'heartbeat', 'fail_call', 'failed', 'not_found',
                            'cancel', 'succeeded')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$revoke$;

-- The runtime grant (0011's, kept as grant_runtime_tables) also gives EXECUTE on the host
-- API: a host's worker role is a runtime.
DO $grant$
BEGIN
    IF to_regprocedure('callwarden.grant_runtime_tables(regrole)') IS NULL THEN
        ALTER FUNCTION callwarden.grant_runtime(regrole) RENAME TO grant_runtime_tables;
    END IF;
END
$grant$;

CREATE OR REPLACE FUNCTION callwarden.grant_runtime(runtime regrole) RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = ''
AS $body$
DECLARE
    stmt text;
    f regprocedure;
BEGIN
    RETURN QUERY SELECT * FROM callwarden.grant_runtime_tables(runtime);
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'callwarden'::regnamespace
          AND p.proname NOT IN ('grant_runtime', 'grant_runtime_tables', 'guard_call_columns',
                                'callwarden_is_stale', 'callwarden_stale_jobs')
        ORDER BY p.proname
    LOOP
        stmt := pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f, runtime);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$body$;
REVOKE ALL ON FUNCTION callwarden.grant_runtime(regrole) FROM PUBLIC;
