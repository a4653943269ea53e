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
-- SECURITY INVOKER (the caller's own privileges: callwarden grant ROLE), and
-- #variable_conflict error with every parameter and local qualified: a column the host
-- adds to its tables can never stand in for one. The host's tables are named with the
-- schema this migration finds jobs in, user_id cast to the host's own column types. Every
-- name here is qualified; the search_path is fixed to the host's schema (then pg_temp,
-- last) only for the host's own triggers these writes fire, which resolve their names
-- as they do under the Python write path's statements. The functions that touch no table
-- (the rendered declaration below) have an empty one.

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
    WHEN state = 'completed' AND event = 'LeftoverSettled' THEN 'completed'
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
    WHEN event = 'LeftoverSettled' THEN 1
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

CREATE OR REPLACE FUNCTION callwarden.safe_error(message text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $body$
#variable_conflict error
DECLARE
    v_out text := message;
    v_hex text;
BEGIN
    IF v_out IS NULL THEN
        RETURN NULL;
    END IF;
    v_out := replace(v_out,  E'\\/', '/');
    v_out := replace(v_out,  E'\\u0020', ' ');
    v_out := replace(v_out,  E'\\"', '"');
    LOOP  -- percent-escapes, as urllib's unquote (a NUL becomes U+FFFD)
        v_hex := substring(v_out FROM '%([0-9A-Fa-f]{2})');
        EXIT WHEN v_hex IS NULL;
        v_out := replace(v_out, '%' || v_hex, CASE WHEN v_hex = '00' THEN chr(65533)
                         ELSE chr(get_byte(decode(v_hex, 'hex'), 0)) END);
    END LOOP;
    v_out := regexp_replace(v_out,  E'\\y([a-z][a-z0-9+.-]*://)[^/\\s@''\\"<>]+@',  E'\\1[redacted]@', 'gi');
    v_out := regexp_replace(v_out,  E'\\y([a-z][a-z0-9+.-]*://[^\\s?#''\\"<>]*)[?#][^\\s''\\"<>]*',  E'\\1?[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y([\\w-]+(?:\\.[\\w-]+)+(?::\\d+)?/[^\\s?#''\\"<>]*)\\?[^\\s''\\"<>]*',  E'\\1?[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'([\\"'']?\\y(?:(?:proxy-)?authorization|set-cookie|cookie|x-api-key|xi-api-key|x-goog-api-key|api-key|x-amz-security-token|[\\w-]*signature|x-kie-[\\w-]+|webhook-id)\\y[\\"'']?\\s*[:=]\\s*)(\\"[^\\"]*\\"|''[^'']*''|[^\\r\\n]+)',  E'\\1[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'(b?[\\"''](?:(?:proxy-)?authorization|set-cookie|cookie|x-api-key|xi-api-key|x-goog-api-key|api-key|x-amz-security-token|[\\w-]*signature|x-kie-[\\w-]+|webhook-id|(?![\\w-]*(?:error|exception|warning)\\y)[\\w-]*(?:api[ _-]?key|apikey|key|token|secret|signature|sig|password|passwd|pwd|pass|private|credential|session|sid|auth)[\\w-]*)[\\"'']\\s*,\\s*b?)(?!''\\[redacted\\]'')(\\"[^\\"]*\\"|''[^'']*'')',  E'\\1''[redacted]''', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(bearer|basic)\\s+(?!\\[redacted\\])[A-Za-z0-9._~+/=-]+',  E'\\1 [redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(token)\\s+(?=[\\w.-]*\\d)[\\w.-]{16,}',  E'\\1 [redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'([\\"'']?\\y(?![\\w-]*(?:error|exception|warning)\\y)[\\w-]*(?:api[ _-]?key|apikey|key|token|secret|signature|sig|password|passwd|pwd|pass|private|credential|session|sid|auth)[\\w-]*[\\"'']?\\s*[:=]\\s*)(?!\\[redacted\\])(?!(?:bearer|basic|token)\\s)(\\"[^\\"]*\\"|''[^'']*''|[^\\s,;&''\\"}]+)',  E'\\1[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(?:sk-[A-Za-z0-9_-]{16,}|sk_[A-Za-z0-9]{16,}|r8_[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|AIza[\\w-]{30,})', '[redacted]', 'g');
    v_out := regexp_replace(v_out,  E'\\y(key|token|secret)\\s+(?=[\\w.-]*\\d)(?=[\\w.-]*[a-z])[\\w.-]{12,}',  E'\\1 [redacted]', 'gi');
    IF length(v_out) > 1000 THEN
        v_out := left(v_out, 1000) || '... (' || (length(v_out) - 1000) || ' characters cut)';
    END IF;
    RETURN v_out;
END
$body$;

-- END GENERATED

-- The functions that name the host's tables, made with its schema and its user_id types.
DO $host_api$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('jobs'));
    jobs_user text := (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                       WHERE a.attrelid = to_regclass('jobs') AND a.attname = 'user_id');
    usage_user text := (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                        WHERE a.attrelid = to_regclass('usage_logs') AND a.attname = 'user_id');
    assets_user text := (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                         WHERE a.attrelid = to_regclass('assets') AND a.attname = 'user_id');
    body text := $fns$
CREATE OR REPLACE FUNCTION callwarden.host_api_version() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = @host@, pg_temp AS $body$ SELECT 1 $body$;

-- The job's row, locked for this transaction; no_data_found (P0002) if there is none.
CREATE OR REPLACE FUNCTION callwarden.locked_job(job_id uuid) RETURNS @host@.jobs
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
BEGIN
    SELECT * INTO v_job FROM @host@.jobs j WHERE j.id = locked_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job %', locked_job.job_id USING ERRCODE = 'P0002';
    END IF;
    RETURN v_job;
END
$body$;

-- Append events (a jsonb array of payloads, each with its type, at and actor) to a call
-- read in state from_state at version from_version, each checked against the declaration;
-- the state after.
CREATE OR REPLACE FUNCTION callwarden.append_events(job_id uuid, from_state text,
                                                    from_version int, events jsonb)
RETURNS text
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_state text := append_events.from_state;
    v_event jsonb;
    v_n int := 0;
BEGIN
    FOR v_event IN SELECT e.value FROM jsonb_array_elements(append_events.events) e LOOP
        v_state := callwarden.next_state(v_state, v_event->>'type');
        IF v_state IS NULL THEN
            RAISE EXCEPTION '% may not follow state %', v_event->>'type',
                COALESCE(append_events.from_state, 'none') USING ERRCODE = 'CW003';
        END IF;
        v_n := v_n + 1;
        INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
        VALUES (append_events.job_id, append_events.from_version + v_n, v_event->>'type',
                callwarden.event_version(v_event->>'type'), v_event, v_event->>'actor');
    END LOOP;
    RETURN v_state;
END
$body$;

-- Settle the job's reservations still 'reserved' to committed (charging min(cost, what
-- was reserved) in total, split over them in id order; NULL cost: the reservations) or
-- refunded, by the event at seq: settle_ctes of engine/database/queries.sql. The word
-- the Python write path answers: settled, no_reservation or already_settled.
CREATE OR REPLACE FUNCTION callwarden.settle(job_id uuid, settle_to text, seq int,
                                             cost numeric)
RETURNS text
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_moved int;
BEGIN
    WITH host_charged AS (
        SELECT COALESCE(sum(COALESCE(u.credits_charged, u.credits_reserved)), 0) AS charged
        FROM @host@.usage_logs u
        WHERE u.job_id = settle.job_id AND u.status = 'committed'
    ), open_rows AS (
        SELECT u.id, u.credits_reserved,
               (SELECT h.charged FROM host_charged h) + COALESCE(sum(u.credits_reserved) OVER (
                   ORDER BY u.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                   AS before
        FROM @host@.usage_logs u
        WHERE u.job_id = settle.job_id AND u.status = 'reserved'
    ), moved_rows AS (
        UPDATE @host@.usage_logs u SET
            status = settle.settle_to,
            settled_at = now(),
            settled_by_seq = settle.seq,
            credits_charged = CASE WHEN settle.settle_to = 'committed'
                THEN LEAST(o.credits_reserved, GREATEST(0, COALESCE(
                         settle.cost, o.credits_reserved + o.before) - o.before))
                ELSE 0 END
        FROM open_rows o
        WHERE u.job_id = settle.job_id AND u.id = o.id AND u.status = 'reserved'
        RETURNING u.id
    )
    SELECT count(*) INTO v_moved FROM moved_rows;
    IF v_moved > 0 THEN
        RETURN 'settled';
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u
                             WHERE u.job_id = settle.job_id)
                THEN 'already_settled' ELSE 'no_reservation' END;
END
$body$;

-- The call ends in state `dest` by the last of its `n_events` events (appended): the
-- projection's terminal columns (as the fold's _enter: the host status, the finish time,
-- no next attempt; the finalization lease is the events' own business), and the
-- settlement the state declares ('host': none moved).
CREATE OR REPLACE FUNCTION callwarden.end_call(j @host@.jobs, dest text, n_events int,
                                               at timestamptz, error_text text,
                                               settle_to text, cost numeric)
RETURNS text
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    UPDATE @host@.jobs t SET
        call_state = end_call.dest,
        call_version = (end_call.j).call_version + end_call.n_events,
        status = COALESCE(callwarden.state_status(end_call.dest), t.status),
        error_message = COALESCE(end_call.error_text, t.error_message),
        reconcile_next_at = NULL,
        call_finished_at = end_call.at,
        call_settlement = end_call.settle_to,
        updated_at = now()
    WHERE t.id = (end_call.j).id;
    IF end_call.settle_to IN ('committed', 'refunded') THEN
        RETURN callwarden.settle((end_call.j).id, end_call.settle_to,
                                 (end_call.j).call_version + end_call.n_events, end_call.cost);
    END IF;
    RETURN NULL;
END
$body$;

-- The host wrote a terminal status on an open call first: HostEnded, as the Python write
-- path records it (a job it completed is the host's to commit; what it left reserved on
-- one it failed or cancelled is refunded). No row when the job is not such a call.
CREATE OR REPLACE FUNCTION callwarden.host_ended(j @host@.jobs, actor text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_at timestamptz := now();
    v_dest text;
    v_word text;
BEGIN
    IF (host_ended.j).call_state IS NULL
       OR callwarden.state_settlement((host_ended.j).call_state) IS NOT NULL
       OR COALESCE((host_ended.j).status, 'pending') IN ('pending', 'processing') THEN
        RETURN;
    END IF;
    PERFORM callwarden.append_events((host_ended.j).id, (host_ended.j).call_state,
                                     (host_ended.j).call_version, jsonb_build_array(
        jsonb_build_object('type', 'HostEnded', 'at', v_at, 'actor', host_ended.actor,
                           'status', (host_ended.j).status)));
    v_dest := CASE (host_ended.j).status WHEN 'completed' THEN 'completed'
                                         WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END;
    v_word := callwarden.end_call(host_ended.j, v_dest, 1, v_at, NULL,
                                  CASE WHEN v_dest = 'completed' THEN 'host' ELSE 'refunded' END,
                                  NULL);
    UPDATE @host@.jobs t SET status = (host_ended.j).status  -- the host's word stays
    WHERE t.id = (host_ended.j).id;
    RETURN QUERY SELECT false, v_dest, v_word;
END
$body$;

-- A job row and its credit reservation (none when credits is NULL), in one transaction;
-- user_id is cast to the host's own column types (text or uuid). (Every function that
-- reads or writes a table is PL/pgSQL: Citus plans no SQL function with parameters.)
CREATE OR REPLACE FUNCTION callwarden.create_job(user_id text, credits numeric,
                                                 input jsonb DEFAULT '{}',
                                                 job_type text DEFAULT 'image',
                                                 job_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_id uuid := COALESCE(create_job.job_id, gen_random_uuid());
BEGIN
    INSERT INTO @host@.jobs (id, user_id, job_type, status, input_data)
    VALUES (v_id, create_job.user_id::@jobs_user_type@, create_job.job_type, 'pending',
            COALESCE(create_job.input, '{}'));
    IF create_job.credits IS NOT NULL THEN
        INSERT INTO @host@.usage_logs (job_id, user_id, status, credits_reserved)
        VALUES (v_id, create_job.user_id::@usage_user_type@, 'reserved', create_job.credits);
    END IF;
    RETURN v_id;
END
$body$;

-- The claim before the create (OwnCalls.start; markProviderCallStart for a sync call):
-- records CallStarted on a job with no call and answers `create`; on a job whose call
-- started before, what its holder must do (docs/node.md: resume with the task id,
-- ambiguous, finalize, done, not_started; a sync call answers `already_started`).
CREATE OR REPLACE FUNCTION callwarden.start_call(job_id uuid, kind text, actor text,
                                                 sync boolean DEFAULT false,
                                                 recreate boolean DEFAULT false)
RETURNS TABLE (action text, task_id text, state text, version int)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
    v_at timestamptz := now();
    v_ended record;
BEGIN
    IF start_call.kind IS NULL OR start_call.kind = ''
       OR start_call.actor IS NULL OR start_call.actor = '' THEN
        RAISE EXCEPTION 'start_call: kind and actor are required' USING ERRCODE = '22023';
    END IF;
    v_job := callwarden.locked_job(start_call.job_id);
    IF v_job.call_state IS NULL THEN
        IF v_job.provider_task_id IS NOT NULL
           OR COALESCE(v_job.status, 'pending') NOT IN ('pending', 'processing') THEN
            RETURN QUERY SELECT 'not_started'::text, v_job.provider_task_id, NULL::text,
                                v_job.call_version;
            RETURN;
        END IF;
        PERFORM callwarden.append_events(v_job.id, NULL, v_job.call_version,
                                         jsonb_build_array(jsonb_build_object(
            'type', 'CallStarted', 'at', v_at, 'actor', start_call.actor,
            'kind', start_call.kind, 'sync', start_call.sync)));
        UPDATE @host@.jobs t SET
            call_state = 'created', call_version = v_job.call_version + 1,
            provider_kind = start_call.kind, provider_task_id = NULL,
            provider_call_started_at = v_at, call_sync = start_call.sync,
            reconcile_attempts = 0, reconcile_last_error = NULL, reconcile_next_at = NULL,
            finalize_owner = NULL, finalize_lease_until = NULL, upstream_result = NULL,
            call_output = NULL, call_finished_at = NULL, call_settlement = NULL,
            updated_at = now()
        WHERE t.id = v_job.id;
        RETURN QUERY SELECT 'create'::text, NULL::text, 'created'::text, v_job.call_version + 1;
        RETURN;
    END IF;
    IF v_job.provider_kind IS DISTINCT FROM start_call.kind THEN
        RAISE EXCEPTION 'job % has a % call, not %', v_job.id, v_job.provider_kind,
            start_call.kind USING ERRCODE = 'CW002';
    END IF;
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, start_call.actor);
    IF FOUND THEN  -- the host ended the job: its decision is recorded, nothing to do
        RETURN QUERY SELECT 'done'::text, v_job.provider_task_id, v_ended.state,
                            v_job.call_version + 1;
        RETURN;
    END IF;
    RETURN QUERY SELECT
        CASE WHEN callwarden.state_settlement(v_job.call_state) IS NOT NULL THEN 'done'
             WHEN start_call.sync THEN 'already_started'
             WHEN v_job.call_state = 'created' THEN
                 CASE WHEN start_call.recreate THEN 'create' ELSE 'ambiguous' END
             WHEN v_job.call_state = 'polling' THEN 'resume'
             ELSE 'finalize' END,
        v_job.provider_task_id, v_job.call_state, v_job.call_version;
END
$body$;

-- The upstream task id, persisted (TaskCreated: created -> polling; the call's first
-- heartbeat). Another id than the job holds: CW001; one another job holds: 23505 (on
-- Citus, where no unique index spans the shards, callwarden_tasks holds the claim as the
-- Python write path's does).
CREATE OR REPLACE FUNCTION callwarden.task_created(job_id uuid, task_id text, actor text)
RETURNS TABLE (ok boolean, state text, version int)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
    v_at timestamptz := now();
    v_ended record;
    v_holder uuid;
BEGIN
    IF task_created.task_id IS NULL OR task_created.task_id = '' THEN
        RAISE EXCEPTION 'task_created: a task id is required' USING ERRCODE = '22023';
    END IF;
    v_job := callwarden.locked_job(task_created.job_id);
    IF v_job.provider_task_id IS NOT NULL AND v_job.provider_task_id <> task_created.task_id
    THEN
        RAISE EXCEPTION 'job % holds task %, not %', v_job.id, v_job.provider_task_id,
            task_created.task_id USING ERRCODE = 'CW001';
    END IF;
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, task_created.actor);
    IF FOUND THEN
        RETURN QUERY SELECT false, v_ended.state, v_job.call_version + 1;
        RETURN;
    END IF;
    IF v_job.call_state IS DISTINCT FROM 'created' THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_version;
        RETURN;
    END IF;
    IF to_regclass('callwarden.callwarden_tasks') IS NOT NULL THEN  -- Citus
        INSERT INTO callwarden.callwarden_tasks (provider_kind, provider_task_id, job_id)
        VALUES (v_job.provider_kind, task_created.task_id, v_job.id)
        ON CONFLICT (provider_task_id, provider_kind) DO NOTHING;
        SELECT c.job_id INTO v_holder FROM callwarden.callwarden_tasks c
        WHERE c.provider_task_id = task_created.task_id
          AND c.provider_kind = v_job.provider_kind;
        IF v_holder IS DISTINCT FROM v_job.id THEN
            RAISE EXCEPTION 'upstream task already claimed by another job: % %',
                v_job.provider_kind, task_created.task_id USING ERRCODE = '23505';
        END IF;
    END IF;
    PERFORM callwarden.append_events(v_job.id, v_job.call_state, v_job.call_version,
                                     jsonb_build_array(jsonb_build_object(
        'type', 'TaskCreated', 'at', v_at, 'actor', task_created.actor,
        'task_id', task_created.task_id)));
    UPDATE @host@.jobs t SET
        call_state = 'polling', call_version = v_job.call_version + 1, status = 'processing',
        provider_task_id = task_created.task_id, heartbeat_at = v_at,
        heartbeat_owner = task_created.actor, updated_at = now()
    WHERE t.id = v_job.id;
    RETURN QUERY SELECT true, 'polling'::text, v_job.call_version + 1;
END
$body$;

-- Projection-only (never an event): the call's holder is alive. False when the call is
-- no longer one to poll (it ended, or its result is recorded), or there is no such job:
-- stop polling.
CREATE OR REPLACE FUNCTION callwarden.heartbeat(job_id uuid, owner text,
                                                progress int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    UPDATE @host@.jobs t
    SET heartbeat_at = now(), heartbeat_owner = heartbeat.owner,
        progress = GREATEST(t.progress, COALESCE(heartbeat.progress, t.progress))
    WHERE t.id = heartbeat.job_id AND t.call_state IN ('created', 'polling');
    RETURN FOUND;
END
$body$;

-- An upstream failure or a vanished task (-> failed or swept, refunded): `event` is the
-- payload, `error_text` what goes on the row.
CREATE OR REPLACE FUNCTION callwarden.fail_call(job_id uuid, actor text, event jsonb,
                                                error_text text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs := callwarden.locked_job(fail_call.job_id);
    v_ended record;
    v_dest text;
BEGIN
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, fail_call.actor);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    IF callwarden.next_state(v_job.call_state, fail_call.event->>'type') IS NULL
       OR (fail_call.event->>'type' = 'UpstreamFailed'
           AND v_job.call_state NOT IN ('created', 'polling')) THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    v_dest := callwarden.append_events(v_job.id, v_job.call_state, v_job.call_version,
                                       jsonb_build_array(fail_call.event));
    RETURN QUERY SELECT true, v_dest,
        callwarden.end_call(v_job, v_dest, 1, (fail_call.event->>'at')::timestamptz,
                            fail_call.error_text, callwarden.state_settlement(v_dest), NULL);
END
$body$;

-- The error text is recorded as callwarden.safe_error makes it (no credentials, no query
-- strings, bounded), as every error the Python write path records.
CREATE OR REPLACE FUNCTION callwarden.failed(job_id uuid, actor text, error text,
                                             code text DEFAULT NULL)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
-- (no #variable_conflict line: its word "error" is this function's parameter; error is
-- PL/pgSQL's default, and every name here is qualified)
DECLARE
    v_error text := callwarden.safe_error(COALESCE(NULLIF(failed.error, ''), 'failed'));
BEGIN
    RETURN QUERY SELECT f.ok, f.state, f.settlement
    FROM callwarden.fail_call(failed.job_id, failed.actor, jsonb_build_object(
        'type', 'UpstreamFailed', 'at', now(), 'actor', failed.actor,
        'error', v_error, 'code', failed.code), v_error) f;
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.not_found(job_id uuid, actor text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    RETURN QUERY SELECT f.ok, f.state, f.settlement
    FROM callwarden.fail_call(not_found.job_id, not_found.actor, jsonb_build_object(
        'type', 'Swept', 'at', now(), 'actor', not_found.actor,
        'reason', 'upstream_task_not_found'), 'upstream_task_not_found') f;
END
$body$;

-- A cancel (any open call, or a job whose call never started; refunded).
CREATE OR REPLACE FUNCTION callwarden.cancel(job_id uuid, by text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs := callwarden.locked_job(cancel.job_id);
    v_at timestamptz := now();
    v_ended record;
BEGIN
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, cancel.by);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    IF callwarden.state_settlement(v_job.call_state) IS NOT NULL
       OR (v_job.call_state IS NULL
           AND COALESCE(v_job.status, 'pending') NOT IN ('pending', 'processing')) THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    PERFORM callwarden.append_events(v_job.id, v_job.call_state, v_job.call_version,
                                     jsonb_build_array(jsonb_build_object(
        'type', 'Cancelled', 'at', v_at, 'actor', cancel.by, 'by', cancel.by)));
    RETURN QUERY SELECT true, 'cancelled'::text,
        callwarden.end_call(v_job, 'cancelled', 1, v_at, NULL, 'refunded', NULL);
END
$body$;

-- The asset rows of a completion (append_completion's assets_in): a function of its own,
-- with no parameter named like the conflict target's columns.
CREATE OR REPLACE FUNCTION callwarden.insert_assets(j @host@.jobs, media jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    INSERT INTO @host@.assets (job_id, user_id, storage_key, url, content_type, size_bytes,
                               is_public)
    SELECT (insert_assets.j).id, (insert_assets.j).user_id::text::@assets_user_type@, a.key,
           a.url, a.content_type, a.size, COALESCE((insert_assets.j).is_public, true)
    FROM jsonb_to_recordset(insert_assets.media)
         AS a(key text, url text, content_type text, size bigint)
    ON CONFLICT (job_id, storage_key) DO NOTHING;
END
$body$;

-- Whether a number a payload carries decodes as a float in Python (finite, in range).
CREATE OR REPLACE FUNCTION callwarden.float_ok(value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = @host@, pg_temp AS $body$
    SELECT jsonb_typeof(float_ok.value) <> 'number'
           OR abs((float_ok.value #>> '{}')::numeric) < 1e300
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
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
    v_at timestamptz := now();
    v_ended record;
    v_media jsonb := COALESCE(succeeded.media, '[]');
    v_result jsonb := COALESCE(succeeded.result, '{}');
    v_upstream jsonb;
    v_output jsonb;
    v_word text;
BEGIN
    IF jsonb_typeof(v_media) <> 'array' OR EXISTS (
        SELECT 1 FROM jsonb_array_elements(v_media) a
        WHERE jsonb_typeof(a.value) <> 'object'
           OR jsonb_typeof(a.value->'key') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a.value->'url') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a.value->'content_type') IS DISTINCT FROM 'string'
           OR jsonb_typeof(a.value->'size') IS DISTINCT FROM 'number'
           OR (a.value->>'size')::numeric <> trunc((a.value->>'size')::numeric)
           OR (a.value->>'size')::numeric NOT BETWEEN 0 AND 9223372036854775807) THEN
        RAISE EXCEPTION 'succeeded: media must be an array of {key, url, content_type, size}'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(v_result) <> 'object' OR succeeded.cost < 0
       OR succeeded.cost >= 1e300 OR succeeded.cost = 'NaN'::numeric THEN
        RAISE EXCEPTION 'succeeded: result must be an object and cost finite, >= 0'
            USING ERRCODE = '22023';
    END IF;
    v_upstream := jsonb_build_object(
        'media_urls', CASE WHEN jsonb_typeof(v_result->'media_urls') = 'array'
                           THEN v_result->'media_urls' ELSE '[]' END,
        'text', CASE WHEN jsonb_typeof(v_result->'text') = 'string' THEN v_result->'text' END,
        'cost', CASE WHEN jsonb_typeof(v_result->'cost') = 'number' THEN v_result->'cost' END,
        'raw', CASE WHEN jsonb_typeof(v_result->'raw') = 'object'
                    THEN v_result->'raw' ELSE '{}' END,
        'stored_keys', '[]'::jsonb,
        'usage', CASE WHEN jsonb_typeof(v_result->'usage') = 'object'
                      THEN v_result->'usage' ELSE '{}' END,
        'stop_reason', CASE WHEN jsonb_typeof(v_result->'stop_reason') = 'string'
                            THEN v_result->'stop_reason' END);
    IF NOT callwarden.float_ok(v_upstream->'cost')
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_upstream->'media_urls') u
                  WHERE jsonb_typeof(u.value) <> 'string')
       OR EXISTS (SELECT 1 FROM jsonb_each(v_upstream->'usage') u
                  WHERE jsonb_typeof(u.value) NOT IN ('number', 'string')
                     OR NOT callwarden.float_ok(u.value)) THEN
        RAISE EXCEPTION 'succeeded: result.media_urls must be strings, result.cost and '
            'result.usage values finite numbers (usage: or strings)' USING ERRCODE = '22023';
    END IF;
    v_job := callwarden.locked_job(succeeded.job_id);
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, succeeded.actor);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    IF v_job.call_state IS NULL OR v_job.call_state NOT IN ('created', 'polling') THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    v_output := jsonb_build_object('media', v_media)
        || CASE WHEN succeeded.text IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('text', succeeded.text) END
        || CASE WHEN v_upstream->'stop_reason' = 'null'::jsonb THEN '{}'::jsonb
                ELSE jsonb_build_object('stop_reason', v_upstream->'stop_reason') END;
    PERFORM callwarden.append_events(v_job.id, v_job.call_state, v_job.call_version,
                                     jsonb_build_array(
        jsonb_build_object('type', 'UpstreamSucceeded', 'at', v_at, 'actor', succeeded.actor,
                           'result', v_upstream),
        jsonb_build_object('type', 'FinalizeClaimed', 'at', v_at, 'actor', succeeded.actor,
                           'owner', succeeded.actor,
                           'lease_until', v_at + interval '60 seconds'),
        jsonb_build_object('type', 'Completed', 'at', v_at, 'actor', succeeded.actor,
                           'media', v_media, 'cost', succeeded.cost, 'text', succeeded.text,
                           'stop_reason', v_upstream->'stop_reason')));
    UPDATE @host@.jobs t SET
        upstream_result = v_upstream,
        call_output = v_output,
        output_data = CASE WHEN jsonb_typeof(t.output_data) = 'object'
                           THEN t.output_data || v_output ELSE v_output END,
        provider_cost = COALESCE(succeeded.cost, t.provider_cost),
        finalize_owner = NULL,
        finalize_lease_until = NULL,
        completed_at = v_at,
        progress = 100
    WHERE t.id = v_job.id;
    v_word := callwarden.end_call(v_job, 'completed', 3, v_at, NULL, 'committed',
                                  succeeded.cost);
    PERFORM callwarden.insert_assets(v_job, v_media);
    IF v_job.workflow_execution_id IS NOT NULL THEN  -- a reference table on Citus
        UPDATE @host@.workflow_executions w
        SET status = 'completed', failed_nodes = '{}', error_message = NULL,
            updated_at = now()
        WHERE w.id = v_job.workflow_execution_id AND w.status = 'failed'
          AND w.failed_nodes = ARRAY[v_job.node_id]::text[];
    END IF;
    RETURN QUERY SELECT true, 'completed'::text, v_word;
END
$body$;
$fns$;
BEGIN
    EXECUTE replace(replace(replace(replace(body, '@host@', quote_ident(host)),
                                    '@jobs_user_type@', jobs_user),
                            '@usage_user_type@', usage_user),
                    '@assets_user_type@', assets_user);
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
                            'safe_error', 'float_ok', 'insert_assets',
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
