-- 0017: one definition of the projection and the settlement (issue 38, item 2).
--
-- What each event writes on the jobs row was written twice: by the fold in Python
-- (projections/fold.py) and by hand in the host API's PL/pgSQL (0014, 0016). It is now
-- declared once, as data (projections/writes.py), and both are made from it: the fold's
-- handlers, and callwarden.apply_event here, rendered by engine/database/declared.py
-- between the GENERATED HOST markers (tests/unit/test_declared_sql.py fails when this
-- block and the declaration differ; tests/integration/test_apply_event.py holds the fold
-- and the function equal on every (state, event)). callwarden.settle is rendered from the
-- Python write path's own settlement (settle_ctes, engine/database/queries.sql).
--
-- The host functions write their events through callwarden.write_events (apply_event,
-- the log row, then the row written by the Python write path's own SET list: append_upd
-- of engine/database/queries.sql, rendered) and settle through callwarden.transition;
-- each is made again here with the signature it had (a call in flight under 0016 finishes
-- under these; host_api_version() stays 1). fail_call's error_text is now the event's own
-- (failed and not_found put the same text in both).

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
-- BEGIN GENERATED HOST (python -m callwarden.database.declared)

CREATE OR REPLACE FUNCTION callwarden.apply_event(j @host@.jobs, e jsonb)
RETURNS @host@.jobs
LANGUAGE plpgsql STABLE PARALLEL SAFE SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v @host@.jobs := apply_event.j;
    v_type text := apply_event.e->>'type';
    v_before text := (apply_event.j).call_state;
    v_dest text := callwarden.next_state((apply_event.j).call_state, apply_event.e->>'type');
BEGIN
    IF v_dest IS NULL THEN
        RAISE EXCEPTION '% may not follow state %', v_type, COALESCE(v_before, 'none')
            USING ERRCODE = 'CW003';
    END IF;
    IF v_before IS NULL AND v.call_version = 0 THEN  -- the empty call
        v.provider_kind := NULL::text;
        v.provider_task_id := NULL::text;
        v.provider_call_started_at := NULL::timestamptz;
        v.call_sync := false;
        v.reconcile_attempts := 0;
        v.reconcile_last_error := NULL::text;
        v.reconcile_next_at := NULL::timestamptz;
        v.error_message := NULL::text;
        v.finalize_owner := NULL::text;
        v.finalize_lease_until := NULL::timestamptz;
        v.upstream_result := NULL::jsonb;
        v.provider_cost := NULL::numeric;
        v.call_finished_at := NULL::timestamptz;
        v.call_settlement := NULL::text;
        v.call_output := NULL;
    END IF;
    v.call_state := v_dest;  -- a rule may refine it (Adopted with a task id: polling)
    CASE v_type
        WHEN 'Adopted' THEN
            v.call_sync := COALESCE((apply_event.e->>'sync')::boolean, false);
            IF (apply_event.e->>'kind') IS DISTINCT FROM 'legacy' THEN
                v.provider_kind := (apply_event.e->>'kind');
                v.provider_call_started_at := COALESCE((apply_event.e->>'call_started_at')::timestamptz, (apply_event.e->>'at')::timestamptz);
                v.reconcile_attempts := COALESCE((apply_event.e->>'reconcile_attempts')::int, 0::int);
                v.reconcile_last_error := (apply_event.e->>'reconcile_last_error');
            END IF;
            IF COALESCE((apply_event.e->>'task_id'), '') <> '' THEN
                v.provider_task_id := (apply_event.e->>'task_id');
                v.call_state := 'polling';
            END IF;
        WHEN 'CallStarted' THEN
            v.provider_kind := (apply_event.e->>'kind');
            v.call_sync := COALESCE((apply_event.e->>'sync')::boolean, false);
            v.provider_call_started_at := (apply_event.e->>'at')::timestamptz;
        WHEN 'Cancelled' THEN
            NULL;
        WHEN 'Completed' THEN
            v.call_output := CASE WHEN COALESCE(NULLIF(apply_event.e->'media', 'null'), '[]'::jsonb) IS NULL THEN v.call_output - 'media'
                ELSE COALESCE(v.call_output, '{}') || jsonb_build_object('media', COALESCE(NULLIF(apply_event.e->'media', 'null'), '[]'::jsonb)) END;
            v.call_output := CASE WHEN NULLIF(apply_event.e->'text', 'null') IS NULL THEN v.call_output - 'text'
                ELSE COALESCE(v.call_output, '{}') || jsonb_build_object('text', NULLIF(apply_event.e->'text', 'null')) END;
            v.call_output := CASE WHEN NULLIF(apply_event.e->'stop_reason', 'null') IS NULL THEN v.call_output - 'stop_reason'
                ELSE COALESCE(v.call_output, '{}') || jsonb_build_object('stop_reason', NULLIF(apply_event.e->'stop_reason', 'null')) END;
            v.provider_cost := (apply_event.e->>'cost')::numeric;
            v.finalize_owner := NULL::text;
            v.finalize_lease_until := NULL::timestamptz;
            IF v.call_output->'media' IS NULL THEN v.call_output := NULL; END IF;
        WHEN 'Exhausted' THEN
            v.error_message := 'reconcile_exhausted'::text;
            v.reconcile_attempts := GREATEST(v.reconcile_attempts, (apply_event.e->>'attempts')::int);
            v.reconcile_last_error := COALESCE((apply_event.e->>'last_error'), v.reconcile_last_error);
        WHEN 'FinalizeClaimed' THEN
            IF v_before = 'finalizing' AND v.finalize_lease_until IS NOT NULL
               AND (apply_event.e->>'at')::timestamptz < v.finalize_lease_until THEN
                RAISE EXCEPTION 'FinalizeClaimed may not follow state %: lease held by % until %', v_before,
                    v.finalize_owner, v.finalize_lease_until USING ERRCODE = 'CW003';
            END IF;
            v.finalize_owner := (apply_event.e->>'owner');
            v.finalize_lease_until := (apply_event.e->>'lease_until')::timestamptz;
        WHEN 'FinalizeFailed' THEN
            v.finalize_owner := NULL::text;
            v.finalize_lease_until := NULL::timestamptz;
            v.reconcile_last_error := (apply_event.e->>'error');
        WHEN 'HostEnded' THEN
            IF (apply_event.e->>'status') = 'completed' THEN
                v.call_state := 'completed';
            END IF;
            IF (apply_event.e->>'status') = 'cancelled' THEN
                v.call_state := 'cancelled';
            END IF;
        WHEN 'LeftoverSettled' THEN
            IF v.call_settlement IS DISTINCT FROM 'host' THEN
                RAISE EXCEPTION 'LeftoverSettled may not follow state %: only a reservation left to the host (settlement %)', v_before,
                    v.call_settlement USING ERRCODE = 'CW003';
            END IF;
            v.call_settlement := COALESCE((apply_event.e->>'settlement'), 'committed'::text);
        WHEN 'ReconcileAttempted' THEN
            v.reconcile_attempts := v.reconcile_attempts + 1;
            v.reconcile_next_at := (apply_event.e->>'next_attempt_at')::timestamptz;
            v.reconcile_last_error := COALESCE((apply_event.e->>'error'), v.reconcile_last_error);
        WHEN 'Swept' THEN
            v.error_message := COALESCE((apply_event.e->>'reason'), 'reconcile_no_recovery'::text);
        WHEN 'TaskCreated' THEN
            v.provider_task_id := (apply_event.e->>'task_id');
        WHEN 'UpstreamFailed' THEN
            v.error_message := (apply_event.e->>'error');
        WHEN 'UpstreamSucceeded' THEN
            v.upstream_result := NULLIF(apply_event.e->'result', 'null');
    END CASE;
    v.call_version := v.call_version + 1;
    IF v.call_state IS DISTINCT FROM v_before THEN  -- entered: its status and settlement
        v.status := COALESCE(callwarden.state_status(v.call_state), v.status);
        IF callwarden.state_settlement(v.call_state) IS NOT NULL THEN
            v.call_settlement := callwarden.state_settlement(v.call_state);
            v.call_finished_at := (apply_event.e->>'at')::timestamptz;
            v.reconcile_next_at := NULL;
        END IF;
    END IF;
    IF v_type = 'HostEnded' THEN
        v.status := (apply_event.e->>'status');
        IF (apply_event.e->>'status') = 'completed' THEN
            v.call_settlement := 'host'::text;
        END IF;
    END IF;
    RETURN v;
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.write_events(j @host@.jobs, events jsonb)
RETURNS @host@.jobs
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v @host@.jobs := write_events.j;
    v_event jsonb;
    v_completion boolean := false;
    v_beat_at timestamptz;
    v_beat_owner text;
BEGIN
    FOR v_event IN SELECT x.value FROM jsonb_array_elements(write_events.events) x LOOP
        v := callwarden.apply_event(v, v_event);
        INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor)
        VALUES (v.id, v.call_version, v_event->>'type',
                callwarden.event_version(v_event->>'type'), v_event, v_event->>'actor');
        v_completion := v_completion OR v_event->>'type' = 'Completed';
        IF v_event->>'type' = 'TaskCreated' THEN
            v_beat_at := (v_event->>'at')::timestamptz;
            v_beat_owner := v_event->>'actor';
        END IF;
    END LOOP;
    UPDATE @host@.jobs SET
        call_state = v.call_state,
        call_version = v.call_version,
        status = COALESCE(v.status, status),
        provider_kind = CASE WHEN (v.provider_kind IS NOT NULL) THEN v.provider_kind
        ELSE provider_kind END,
        provider_task_id = CASE WHEN (v.provider_kind IS NOT NULL) THEN v.provider_task_id
        ELSE provider_task_id END,
        provider_call_started_at = CASE WHEN (v.provider_kind IS NOT NULL)
        THEN v.provider_call_started_at
        ELSE provider_call_started_at END,
        reconcile_attempts = CASE WHEN (v.provider_kind IS NOT NULL)
        THEN v.reconcile_attempts
        ELSE reconcile_attempts END,
        reconcile_last_error = CASE WHEN (v.provider_kind IS NOT NULL)
        THEN v.reconcile_last_error
        ELSE reconcile_last_error END,
        call_sync = v.call_sync,
        reconcile_next_at = v.reconcile_next_at,
        error_message = COALESCE(v.error_message, error_message),
        finalize_owner = v.finalize_owner,
        finalize_lease_until = v.finalize_lease_until,
        upstream_result = v.upstream_result,
        call_output = v.call_output,
        output_data = CASE
        WHEN v.call_output IS NULL THEN output_data
        WHEN jsonb_typeof(output_data) = 'object' THEN output_data || v.call_output
        ELSE v.call_output END,
        provider_cost = COALESCE(v.provider_cost, provider_cost),
        call_finished_at = v.call_finished_at,
        call_settlement = v.call_settlement,
        completed_at = CASE WHEN v_completion
        THEN v.call_finished_at ELSE completed_at END,
        progress = CASE WHEN v_completion THEN 100 ELSE progress END,
        heartbeat_at = COALESCE(v_beat_at, heartbeat_at),
        heartbeat_owner = COALESCE(v_beat_owner, heartbeat_owner),
        updated_at = now()
    WHERE id = v.id;
    RETURN v;
END
$body$;

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
(SELECT charged FROM host_charged) + COALESCE(sum(u.credits_reserved) OVER (
ORDER BY u.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
FROM @host@.usage_logs u
WHERE u.job_id = settle.job_id AND u.status = 'reserved'
), settle AS (
UPDATE @host@.usage_logs u SET
status = settle.settle_to,
settled_at = now(),
settled_by_seq = settle.seq,
credits_charged = CASE WHEN settle.settle_to = 'committed'
THEN LEAST(o.credits_reserved, GREATEST(0, COALESCE(
settle.cost, o.credits_reserved + o.before) - o.before))
ELSE 0 END
FROM open_rows o
WHERE u.job_id = settle.job_id AND u.id = o.id
AND u.status = 'reserved'
AND settle.settle_to IS NOT NULL
RETURNING u.id
)
    SELECT count(*) INTO v_moved FROM settle;
    IF v_moved > 0 THEN
        RETURN 'settled';
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u
                             WHERE u.job_id = settle.job_id)
                THEN 'already_settled' ELSE 'no_reservation' END;
END
$body$;

-- END GENERATED HOST

-- The call's events written (write_events) and, when they settle it, its reservations
-- settled as its new state declares (settle, at the version of the event that ended it),
-- at the cost the events record, as the Python write path charges it (append_params:
-- a Completed's cost, never below 0; NULL, the reservations, for anything else): the state
-- after, and the settlement word (NULL: nothing was to move).
CREATE OR REPLACE FUNCTION callwarden.transition(j @host@.jobs, events jsonb,
                                                 OUT state text, OUT settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v @host@.jobs := callwarden.write_events(transition.j, transition.events);
BEGIN
    transition.state := v.call_state;
    IF v.call_settlement IN ('committed', 'refunded')
       AND v.call_settlement IS DISTINCT FROM (transition.j).call_settlement THEN
        transition.settlement := callwarden.settle(v.id, v.call_settlement, v.call_version,
            CASE WHEN transition.events @> '[{"type": "Completed"}]'
                      AND v.provider_cost IS NOT NULL  -- (GREATEST skips a NULL)
                 THEN GREATEST(v.provider_cost, 0) END);
    END IF;
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
        PERFORM callwarden.write_events(v_job, jsonb_build_array(jsonb_build_object(
            'type', 'CallStarted', 'at', v_at, 'actor', start_call.actor,
            'kind', start_call.kind, 'sync', start_call.sync)));
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
    PERFORM callwarden.write_events(v_job, jsonb_build_array(jsonb_build_object(
        'type', 'TaskCreated', 'at', v_at, 'actor', task_created.actor,
        'task_id', task_created.task_id)));
    RETURN QUERY SELECT true, 'polling'::text, v_job.call_version + 1;
END
$body$;

-- The host wrote a terminal status on an open call first: HostEnded, as the Python write
-- path records it (a job it completed is the host's to commit; what it left reserved on
-- one it failed or cancelled is refunded). No row when the job is not such a call.
CREATE OR REPLACE FUNCTION callwarden.host_ended(j @host@.jobs, actor text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    IF (host_ended.j).call_state IS NULL
       OR callwarden.state_settlement((host_ended.j).call_state) IS NOT NULL
       OR COALESCE((host_ended.j).status, 'pending') IN ('pending', 'processing') THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT false, t.state, t.settlement
    FROM callwarden.transition(host_ended.j, jsonb_build_array(jsonb_build_object(
        'type', 'HostEnded', 'at', now(), 'actor', host_ended.actor,
        'status', (host_ended.j).status))) t;
END
$body$;

-- An upstream failure or a vanished task (failed, not_found: -> failed or swept,
-- refunded). The event is made here from `event`'s type and text fields, as those two
-- pass them (failed makes the error text safe first): a caller's other fields, its own
-- `at`, or a field Python could not read back (a number for a text) never reach the log.
-- (error_text, as 0014 had it, is not read: the event's own text goes on the row.)
CREATE OR REPLACE FUNCTION callwarden.fail_call(job_id uuid, actor text, event jsonb,
                                                error_text text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
    v_type text := fail_call.event->>'type';
    v_event jsonb;
    v_ended record;
    v_word text;
BEGIN
    IF v_type = 'UpstreamFailed'
       AND COALESCE(jsonb_typeof(fail_call.event->'error'), 'null') IN ('string', 'null')
       AND COALESCE(jsonb_typeof(fail_call.event->'code'), 'null') IN ('string', 'null') THEN
        v_event := jsonb_build_object('type', v_type, 'at', now(), 'actor', fail_call.actor,
            'error', COALESCE(NULLIF(fail_call.event->>'error', ''), 'failed'),
            'code', NULLIF(fail_call.event->'code', 'null'));
    ELSIF v_type = 'Swept'
          AND jsonb_typeof(fail_call.event->'reason') = 'string' THEN
        v_event := jsonb_build_object('type', v_type, 'at', now(), 'actor', fail_call.actor,
                                      'reason', fail_call.event->'reason');
    ELSE
        RAISE EXCEPTION 'fail_call: an UpstreamFailed with a text error and code, or a '
            'Swept with a text reason' USING ERRCODE = '22023';
    END IF;
    v_job := callwarden.locked_job(fail_call.job_id);
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, fail_call.actor);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    v_word := callwarden.repeated(v_job.id, v_job.call_version, v_type, fail_call.actor,
                                  v_event - 'at');
    IF v_word IS NOT NULL THEN  -- this actor's own outcome, asked again (a lost reply)
        RETURN QUERY SELECT true, v_job.call_state, v_word;
        RETURN;
    END IF;
    IF callwarden.next_state(v_job.call_state, v_type) IS NULL
       OR (v_type = 'UpstreamFailed' AND v_job.call_state NOT IN ('created', 'polling')) THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, t.state, t.settlement
    FROM callwarden.transition(v_job, jsonb_build_array(v_event)) t;
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.cancel(job_id uuid, by text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs := callwarden.locked_job(cancel.job_id);
    v_at timestamptz := now();
    v_ended record;
    v_word text;
BEGIN
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, cancel.by);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    v_word := callwarden.repeated(v_job.id, v_job.call_version, 'Cancelled',
                                  cancel.by, '{}');
    IF v_word IS NOT NULL THEN  -- this actor's own outcome, asked again (a lost reply)
        RETURN QUERY SELECT true, v_job.call_state, v_word;
        RETURN;
    END IF;
    IF callwarden.state_settlement(v_job.call_state) IS NOT NULL
       OR (v_job.call_state IS NULL
           AND COALESCE(v_job.status, 'pending') NOT IN ('pending', 'processing')) THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, t.state, t.settlement
    FROM callwarden.transition(v_job, jsonb_build_array(jsonb_build_object(
        'type', 'Cancelled', 'at', v_at, 'actor', cancel.by, 'by', cancel.by))) t;
END
$body$;

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
       OR jsonb_path_exists(v_upstream->'raw',  -- a number no float holds, as msgspec reads it
                            'strict $.** ? (@.type() == "number" && @.abs() >= 1e300 '
                            '&& @.floor() != @)')
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_upstream->'media_urls') u
                  WHERE jsonb_typeof(u.value) <> 'string')
       OR EXISTS (SELECT 1 FROM jsonb_each(v_upstream->'usage') u
                  WHERE jsonb_typeof(u.value) NOT IN ('number', 'string')
                     OR NOT callwarden.float_ok(u.value)) THEN
        RAISE EXCEPTION 'succeeded: result.media_urls must be strings, result.cost and '
            'result.usage values finite numbers (usage: or strings), result.raw''s numbers '
            'within a float''s range' USING ERRCODE = '22023';
    END IF;
    v_job := callwarden.locked_job(succeeded.job_id);
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, succeeded.actor);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    v_word := callwarden.repeated(v_job.id, v_job.call_version, 'Completed',
                                  succeeded.actor, jsonb_build_object(
        'media', v_media, 'cost', succeeded.cost, 'text', succeeded.text));
    IF v_word IS NOT NULL THEN  -- this actor's own outcome, asked again (a lost reply)
        RETURN QUERY SELECT true, v_job.call_state, v_word;
        RETURN;
    END IF;
    IF v_job.call_state IS NULL OR v_job.call_state NOT IN ('created', 'polling') THEN
        RETURN QUERY SELECT false, v_job.call_state, v_job.call_settlement;
        RETURN;
    END IF;
    SELECT t.settlement INTO v_word FROM callwarden.transition(v_job, jsonb_build_array(
        jsonb_build_object('type', 'UpstreamSucceeded', 'at', v_at, 'actor', succeeded.actor,
                           'result', v_upstream),
        jsonb_build_object('type', 'FinalizeClaimed', 'at', v_at, 'actor', succeeded.actor,
                           'owner', succeeded.actor,
                           'lease_until', v_at + interval '60 seconds'),
        jsonb_build_object('type', 'Completed', 'at', v_at, 'actor', succeeded.actor,
                           'media', v_media, 'cost', succeeded.cost, 'text', succeeded.text,
                           'stop_reason', v_upstream->'stop_reason'))) t;
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

-- 0014's append_events and end_call: the column writes they made by hand are
-- write_events' now (rendered from the declaration), and nothing calls them.
DROP FUNCTION IF EXISTS callwarden.append_events(uuid, text, int, jsonb);
DROP FUNCTION IF EXISTS callwarden.end_call(@host@.jobs, text, int, timestamptz, text, text,
                                            numeric);
$fns$;
BEGIN
    EXECUTE replace(replace(replace(replace(body, '@host@', quote_ident(host)),
                                    '@jobs_user_type@', jobs_user),
                            '@usage_user_type@', usage_user),
                    '@assets_user_type@', assets_user);
END
$host_api$;

-- The new functions: nothing for PUBLIC; EXECUTE for every role that holds the host API
-- already (a runtime `callwarden grant` made before this migration), as 0016 did.
DO $grant$
DECLARE
    f regprocedure;
    r regrole;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'callwarden'::regnamespace
          AND p.proname IN ('apply_event', 'write_events', 'transition')
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        FOR r IN
            SELECT DISTINCT a.grantee::regrole
            FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.oid = 'callwarden.succeeded(uuid, text, jsonb, text, numeric, jsonb)'::regprocedure
              AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r);
        END LOOP;
    END LOOP;
END
$grant$;

-- grant_runtime (0014's, the same): on Citus its GRANTs on the distributed tables and then
-- on a reference table were refused in one transaction ("parallel DDL access"): `callwarden
-- grant` and the re-grant after every migrate failed on a cluster with a runtime role. The
-- transaction's multi-shard DDL runs sequentially there now.
CREATE OR REPLACE FUNCTION callwarden.grant_runtime(runtime regrole) RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = ''
AS $body$
DECLARE
    stmt text;
    f regprocedure;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
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
