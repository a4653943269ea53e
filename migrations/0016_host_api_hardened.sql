-- 0016: the host API, hardened after a review (issue 38). Migrations are immutable, so
-- each function 0014 made and this changes is made again here (CREATE OR REPLACE, the same
-- signatures: a call in flight under 0014 finishes under these, host_api_version() stays 1):
--
-- * callwarden.safe_error, rendered again from the one list of substitutions
--   (engine/database/declared.py): percent-escapes are read once and a run of them as
--   UTF-8, as Python's unquote reads them, and `\s` matches every space Python's does
--   (U+00A0, U+2003...): 'Bearer%E2%80%83<key>' and 'password\u00a0= <key>' kept the key;
-- * callwarden.succeeded refuses a result whose `raw` holds a number no float holds
--   (Python could not read the event back);
-- * a repeat of an actor's own outcome (succeeded, failed, not_found, cancel, with the
--   same arguments) whose first reply was lost answers ok = true, with the first call's
--   settlement word, instead of ok = false ("another actor ended it": a host would undo
--   its own completed job);
-- * callwarden.heartbeat answers false once the host has ended the job (its own status
--   written over an open call): the holder stops polling, as docs/node.md says.
--
-- The rest of the generated block (next_state, event_version, state_status,
-- state_settlement) is carried again unchanged: the newest migration carrying the block
-- is the one tests/unit/test_declared_sql.py compares with the declaration.

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
    v_rest text;
    v_run text;
    v_bytes bytea;
    v_plain text;
    v_at int;
BEGIN
    IF v_out IS NULL THEN
        RETURN NULL;
    END IF;
    v_out := replace(v_out,  E'\\/', '/');
    v_out := replace(v_out,  E'\\u0020', ' ');
    v_out := replace(v_out,  E'\\"', '"');
    v_rest := v_out;  -- percent-escapes, once, each run of them as UTF-8 (as unquote)
    v_out := '';
    LOOP
        v_run := substring(v_rest FROM '(?:%[0-9A-Fa-f]{2})+');
        EXIT WHEN v_run IS NULL;
        v_at := position(v_run IN v_rest);
        v_bytes := decode(replace(v_run, '%', ''), 'hex');
        BEGIN
            v_plain := convert_from(v_bytes, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character
                       OR invalid_parameter_value THEN
            v_plain := NULL;
        END;
        IF v_plain IS NULL THEN  -- not UTF-8, or a NUL: byte by byte, ASCII kept
            SELECT string_agg(CASE WHEN b BETWEEN 1 AND 127 THEN chr(b) ELSE chr(65533) END,
                              '' ORDER BY n)
            INTO v_plain
            FROM generate_series(0, length(v_bytes) - 1) n, get_byte(v_bytes, n) b;
        END IF;
        v_out := v_out || left(v_rest, v_at - 1) || v_plain;
        v_rest := substr(v_rest, v_at + length(v_run));
    END LOOP;
    v_out := v_out || v_rest;
    v_out := regexp_replace(v_out,  E'\\y([a-z][a-z0-9+.-]*://)[^/\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000@''\\"<>]+@',  E'\\1[redacted]@', 'gi');
    v_out := regexp_replace(v_out,  E'\\y([a-z][a-z0-9+.-]*://[^\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000?#''\\"<>]*)[?#][^\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000''\\"<>]*',  E'\\1?[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y([\\w-]+(?:\\.[\\w-]+)+(?::\\d+)?/[^\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000?#''\\"<>]*)\\?[^\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000''\\"<>]*',  E'\\1?[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'([\\"'']?\\y(?:(?:proxy-)?authorization|set-cookie|cookie|x-api-key|xi-api-key|x-goog-api-key|api-key|x-amz-security-token|[\\w-]*signature|x-kie-[\\w-]+|webhook-id)\\y[\\"'']?[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*[:=][\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*)(\\"[^\\"]*\\"|''[^'']*''|[^\\r\\n]+)',  E'\\1[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'(b?[\\"''](?:(?:proxy-)?authorization|set-cookie|cookie|x-api-key|xi-api-key|x-goog-api-key|api-key|x-amz-security-token|[\\w-]*signature|x-kie-[\\w-]+|webhook-id|(?![\\w-]*(?:error|exception|warning)\\y)[\\w-]*(?:api[ _-]?key|apikey|key|token|secret|signature|sig|password|passwd|pwd|pass|private|credential|session|sid|auth)[\\w-]*)[\\"''][\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*,[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*b?)(?!''\\[redacted\\]'')(\\"[^\\"]*\\"|''[^'']*'')',  E'\\1''[redacted]''', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(bearer|basic)[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+(?!\\[redacted\\])[A-Za-z0-9._~+/=-]+',  E'\\1 [redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(token)[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+(?=[\\w.-]*\\d)[\\w.-]{16,}',  E'\\1 [redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'([\\"'']?\\y(?![\\w-]*(?:error|exception|warning)\\y)[\\w-]*(?:api[ _-]?key|apikey|key|token|secret|signature|sig|password|passwd|pwd|pass|private|credential|session|sid|auth)[\\w-]*[\\"'']?[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*[:=][\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]*)(?!\\[redacted\\])(?!(?:bearer|basic|token)[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000])(\\"[^\\"]*\\"|''[^'']*''|[^\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000,;&''\\"}]+)',  E'\\1[redacted]', 'gi');
    v_out := regexp_replace(v_out,  E'\\y(?:sk-[A-Za-z0-9_-]{16,}|sk_[A-Za-z0-9]{16,}|r8_[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|AIza[\\w-]{30,})', '[redacted]', 'g');
    v_out := regexp_replace(v_out,  E'\\y(key|token|secret)[\\s\\u001c-\\u001f\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+(?=[\\w.-]*\\d)(?=[\\w.-]*[a-z])[\\w.-]{12,}',  E'\\1 [redacted]', 'gi');
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
-- The word a repeat of this actor's own outcome answers, as the first call answered it
-- (settled: its event moved the reservation; already_settled; no_reservation), or NULL
-- when the call's last event (at seq `version`) is not `type` by `actor` with `same` in
-- its payload: a client whose reply was lost asks again, with the same arguments, and
-- learns it recorded the outcome (ok), not that another actor did.
CREATE OR REPLACE FUNCTION callwarden.repeated(job_id uuid, version int, type text,
                                               actor text, same jsonb)
RETURNS text
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    IF NOT EXISTS (SELECT 1 FROM callwarden.call_events e
                   WHERE e.job_id = repeated.job_id AND e.seq = repeated.version
                     AND e.type = repeated.type AND e.actor = repeated.actor
                     AND e.payload @> repeated.same) THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u
                             WHERE u.job_id = repeated.job_id
                               AND u.settled_by_seq = repeated.version) THEN 'settled'
                WHEN EXISTS (SELECT 1 FROM @host@.usage_logs u
                             WHERE u.job_id = repeated.job_id) THEN 'already_settled'
                ELSE 'no_reservation' END;
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.fail_call(job_id uuid, actor text, event jsonb,
                                                error_text text)
RETURNS TABLE (ok boolean, state text, settlement text)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs := callwarden.locked_job(fail_call.job_id);
    v_ended record;
    v_dest text;
    v_word text;
BEGIN
    SELECT * INTO v_ended FROM callwarden.host_ended(v_job, fail_call.actor);
    IF FOUND THEN
        RETURN QUERY SELECT v_ended.ok, v_ended.state, v_ended.settlement;
        RETURN;
    END IF;
    v_word := callwarden.repeated(v_job.id, v_job.call_version, fail_call.event->>'type',
                                  fail_call.actor, fail_call.event - 'at');
    IF v_word IS NOT NULL THEN  -- this actor's own outcome, asked again (a lost reply)
        RETURN QUERY SELECT true, v_job.call_state, v_word;
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
    PERFORM callwarden.append_events(v_job.id, v_job.call_state, v_job.call_version,
                                     jsonb_build_array(jsonb_build_object(
        'type', 'Cancelled', 'at', v_at, 'actor', cancel.by, 'by', cancel.by)));
    RETURN QUERY SELECT true, 'cancelled'::text,
        callwarden.end_call(v_job, 'cancelled', 1, v_at, NULL, 'refunded', NULL);
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.heartbeat(job_id uuid, owner text,
                                                progress int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
BEGIN
    UPDATE @host@.jobs t
    SET heartbeat_at = now(), heartbeat_owner = heartbeat.owner,
        progress = GREATEST(t.progress, COALESCE(heartbeat.progress, t.progress))
    WHERE t.id = heartbeat.job_id AND t.call_state IN ('created', 'polling')
      AND COALESCE(t.status, 'pending') IN ('pending', 'processing');
    RETURN FOUND;
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

-- repeated: nothing for PUBLIC (as 0014's); EXECUTE for every role that holds the host API
-- already (a runtime `callwarden grant` made before this migration), and for the roles
-- `callwarden grant` makes after it (grant_runtime grants every function of the schema).
REVOKE ALL ON FUNCTION callwarden.repeated(uuid, int, text, text, jsonb) FROM PUBLIC;

DO $grant$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.oid = 'callwarden.succeeded(uuid, text, jsonb, text, numeric, jsonb)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       'callwarden.repeated(uuid, int, text, text, jsonb) TO %s', r);
    END LOOP;
END
$grant$;
