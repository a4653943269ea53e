-- 0018: admission control (issue 42): provider and tenant limits held across the fleet.
--
-- A limit is a row of callwarden.limits: a provider account (a kind, or kinds sharing one
-- key) and its caps: the most calls in flight upstream (a call holds its slot from its
-- start until it is terminal), the most of them one user (the job's user_id) may hold, and
-- the most creates per window. `callwarden limits apply` writes the rows from the settings'
-- [limits.<account>] sections (engine/calls/limits.py); a host may write them by SQL.
--
-- A slot is not a counter: it is the open call itself. callwarden.admit, called by every
-- start (the Python write path's append_start, in the same statement; start_call, the
-- host API's claim), locks the job's row, then the account (a transaction-scoped advisory
-- lock: starts of one account take turns for the rest of their transaction), counts the
-- account's open calls, the user's, and the starts of the window, and answers NULL (start)
-- or why to wait and for how long. Nothing is taken that must be given back: the terminal
-- transition that ends a call (by its worker, the reconciler's recovery or sweep after a
-- SIGKILL, a host's own status) is what frees its slot, and no drift is possible.
-- Each statement in admit takes a fresh snapshot (READ COMMITTED, a volatile function), so
-- a start counts every start committed before it took the lock.
--
-- A refused start writes nothing to the job or the log: its job keeps waiting, in
-- callwarden.waiting (the reason, since when, when to try again), shown by `callwarden
-- jobs`, the dashboard and the metrics, and deleted by the start that admits it.
--
-- On Citus (0019): limits is a reference table, waiting is distributed by job_id beside
-- jobs, and the Python write path calls admit as its own statement in the start's
-- transaction; the counts run on the coordinator across the shards (docs/admission.md).

-- On Citus, this transaction's DDL one statement after the other: an index built on the
-- distributed jobs and then a function (propagated to every node) are refused in parallel
-- mode ("there was a parallel operation on a distributed table").
DO $sequential$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$sequential$;

CREATE TABLE IF NOT EXISTS callwarden.limits (
    account          text PRIMARY KEY CHECK (account <> ''),
    kinds            text[] NOT NULL CHECK (cardinality(kinds) > 0),
    in_flight        int CHECK (in_flight > 0),
    tenant_in_flight int CHECK (tenant_in_flight > 0),
    creates          int CHECK (creates > 0),
    per_s            double precision CHECK (per_s > 0),
    wait_s           double precision NOT NULL DEFAULT 2 CHECK (wait_s > 0),
    -- the provider's own 429s (callwarden.slow_down): no start before paused_until, and
    -- the caps scaled by rate_factor as of the pause (halved), one call's worth back per
    -- wait_s since the pause ended (callwarden.limit_factor)
    paused_until     timestamptz,
    rate_factor      double precision NOT NULL DEFAULT 1
                     CHECK (rate_factor > 0 AND rate_factor <= 1),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((creates IS NULL) = (per_s IS NULL))
);

CREATE TABLE IF NOT EXISTS callwarden.waiting (
    job_id   uuid PRIMARY KEY,
    account  text NOT NULL,
    reason   text NOT NULL,
    since    timestamptz NOT NULL DEFAULT now(),
    retry_at timestamptz NOT NULL,
    refusals int NOT NULL DEFAULT 1
);

-- The counts admit makes: the account's open calls and a user's, index-only (their cost
-- grows with the calls in flight, never with jobs), and the starts in a window (0009's
-- jobs_kind_started_idx). Plain CREATE INDEX (see 0009 for a large, busy table).
CREATE INDEX IF NOT EXISTS waiting_account_idx ON callwarden.waiting (account, retry_at);

CREATE INDEX IF NOT EXISTS jobs_open_kind_user_idx
    ON jobs (provider_kind, user_id)
    WHERE call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing');

DO $host_api$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('jobs'));
    body text := $fns$
-- The share of an account's caps it admits at `at`: 1, or after the provider's 429s the
-- factor slow_down left (halved) plus one call's worth per wait_s since the pause ended
-- (additive increase, computed: nothing is written on a start).
CREATE OR REPLACE FUNCTION callwarden.limit_factor(
    rate_factor double precision, paused_until timestamptz, wait_s double precision,
    calls int, at timestamptz) RETURNS double precision
-- (its columns, not the row: on Citus a query of the reference table runs on a shard,
-- whose row type is the shard's)
LANGUAGE sql IMMUTABLE SET search_path = @host@, pg_temp AS $body$
    SELECT CASE WHEN rate_factor >= 1 OR paused_until IS NULL THEN rate_factor
                ELSE LEAST(1, rate_factor + GREATEST(0, floor(
                         EXTRACT(epoch FROM at - paused_until) / wait_s))
                     / GREATEST(1, calls)) END
$body$;

-- A start's admission: NULL when the job may start now (no limit names its kind; the job's
-- call has started already, or the row holds a task: the start's own fences answer it),
-- else the reason and the seconds to wait; a refusal is recorded in callwarden.waiting,
-- an admission deletes the job's row there. See the head of this file.
CREATE OR REPLACE FUNCTION callwarden.admit(job_id uuid, kind text,
                                            OUT reason text, OUT retry_after_s double precision)
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_job @host@.jobs;
    v_limit callwarden.limits;
    v_now timestamptz;
    v_n bigint;
    v_edge timestamptz;
    v_cap bigint;
    v_prior int;
    v_factor double precision;
BEGIN
    SELECT * INTO v_limit FROM callwarden.limits l WHERE l.kinds @> ARRAY[admit.kind]
    ORDER BY l.account LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The counts read fresh snapshots only at READ COMMITTED: under REPEATABLE READ a start
    -- would not see the starts committed since its transaction began (SERIALIZABLE aborts
    -- one of two such starts: safe).
    IF pg_catalog.current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'callwarden.admit: a start must run at READ COMMITTED (or SERIALIZABLE), '
                        'not REPEATABLE READ: its counts would miss starts committed meanwhile'
            USING ERRCODE = '0A000';
    END IF;
    -- The row first, as start_call locks it: the Python and the SQL starts take their locks
    -- in one order. The account's lock is held until the start's transaction ends: a start
    -- belongs in a transaction of its own, or as its last write (docs/admission.md).
    SELECT * INTO v_job FROM @host@.jobs j WHERE j.id = admit.job_id FOR UPDATE;
    IF NOT FOUND OR v_job.call_state IS NOT NULL OR v_job.provider_task_id IS NOT NULL
       OR COALESCE(v_job.status, 'pending') NOT IN ('pending', 'processing') THEN
        RETURN;  -- no start to admit: the start's own fences answer (not_started, resume...)
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(
        pg_catalog.hashtextextended('callwarden.admit:' || v_limit.account, 0));
    -- read again under the lock: a pause or a rate another start wrote meanwhile
    SELECT * INTO v_limit FROM callwarden.limits l WHERE l.account = v_limit.account;
    v_now := pg_catalog.clock_timestamp();
    v_factor := callwarden.limit_factor(v_limit.rate_factor, v_limit.paused_until,
                                        v_limit.wait_s,
                                        COALESCE(v_limit.in_flight, v_limit.creates), v_now);
    IF v_limit.paused_until > v_now THEN
        admit.reason := pg_catalog.format('%s: the provider refused a create (429): paused',
                                          v_limit.account);
        admit.retry_after_s := EXTRACT(epoch FROM v_limit.paused_until - v_now);
    END IF;
    IF admit.reason IS NULL AND v_limit.in_flight IS NOT NULL THEN
        v_cap := GREATEST(1, floor(v_limit.in_flight * v_factor));
        SELECT count(*) INTO v_n FROM @host@.jobs j
        WHERE j.provider_kind = ANY (v_limit.kinds)
          AND j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing');
        IF v_n >= v_cap THEN
            admit.reason := pg_catalog.format('%s: %s of %s calls in flight', v_limit.account,
                                              v_n, v_cap);
            admit.retry_after_s := v_limit.wait_s;
        END IF;
    END IF;
    IF admit.reason IS NULL AND v_limit.tenant_in_flight IS NOT NULL THEN
        SELECT count(*) INTO v_n FROM @host@.jobs j
        WHERE j.provider_kind = ANY (v_limit.kinds) AND j.user_id = v_job.user_id
          AND j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing');
        IF v_n >= v_limit.tenant_in_flight THEN
            admit.reason := pg_catalog.format('%s: this user holds %s of %s calls in flight',
                                              v_limit.account, v_n, v_limit.tenant_in_flight);
            -- twice as long per refusal of this job, up to 16 wait_s: a user's backlog
            -- comes back to the queue ever more rarely, so other users' jobs are reached
            SELECT w.refusals INTO v_prior FROM callwarden.waiting w
            WHERE w.job_id = admit.job_id;
            admit.retry_after_s := v_limit.wait_s * LEAST(16, 2 ^ COALESCE(v_prior, 0));
        END IF;
    END IF;
    IF admit.reason IS NULL AND v_limit.creates IS NOT NULL THEN
        v_cap := GREATEST(1, floor(v_limit.creates * v_factor));
        -- the window's cap-th newest start: while it is in the window, the window is full.
        -- A quarter second more than the window: a start is stamped before it waits for
        -- this lock (its CallStarted's time), so it looks older than its commit by that wait
        SELECT j.provider_call_started_at INTO v_edge FROM @host@.jobs j
        WHERE j.provider_kind = ANY (v_limit.kinds)
          AND j.provider_call_started_at
              > v_now - pg_catalog.make_interval(secs => v_limit.per_s + 0.25)
        ORDER BY j.provider_call_started_at DESC
        OFFSET v_cap - 1 LIMIT 1;
        IF FOUND THEN
            admit.reason := pg_catalog.format('%s: %s creates in %s s', v_limit.account,
                                              v_cap, v_limit.per_s);
            admit.retry_after_s := GREATEST(0.05, EXTRACT(epoch FROM
                v_edge + pg_catalog.make_interval(secs => v_limit.per_s + 0.25) - v_now));
        END IF;
    END IF;
    IF admit.reason IS NULL THEN
        DELETE FROM callwarden.waiting w WHERE w.job_id = admit.job_id;
        RETURN;
    END IF;
    -- rows of jobs that stopped asking (ended, or given up by their queue) long ago: the
    -- account's waiting list holds only jobs still waiting (a row comes back with its next
    -- refusal). A range of waiting_account_idx: it costs the stale rows, not the list
    DELETE FROM callwarden.waiting w
    WHERE w.account = v_limit.account
      AND w.retry_at < v_now - pg_catalog.make_interval(secs => GREATEST(600, 60 * v_limit.wait_s));
    INSERT INTO callwarden.waiting AS w (job_id, account, reason, since, retry_at)
    VALUES (admit.job_id, v_limit.account, admit.reason, v_now,
            v_now + pg_catalog.make_interval(secs => admit.retry_after_s))
    ON CONFLICT ON CONSTRAINT waiting_pkey DO UPDATE
        SET reason = EXCLUDED.reason, retry_at = EXCLUDED.retry_at,
            account = EXCLUDED.account, refusals = w.refusals + 1;
END
$body$;

-- The provider answered a create with 429 (after the transport's own retries): the
-- account of `kind` stops admitting starts for retry_after_s (its wait_s when the provider
-- said none), and, unless it was paused already (one decrease per pause, however many
-- workers saw the 429), its caps are halved (multiplicative decrease; limit_factor adds
-- one call's worth back per wait_s after the pause). No row when no limit names the kind.
CREATE OR REPLACE FUNCTION callwarden.slow_down(kind text, retry_after_s double precision,
                                                OUT account text, OUT paused_s double precision,
                                                OUT rate_factor double precision)
RETURNS SETOF record
LANGUAGE plpgsql SET search_path = @host@, pg_temp AS $body$
#variable_conflict error
DECLARE
    v_now timestamptz := pg_catalog.clock_timestamp();
BEGIN
    RETURN QUERY
    UPDATE callwarden.limits l
    SET rate_factor = CASE WHEN COALESCE(l.paused_until, v_now) <= v_now
                           THEN GREATEST(callwarden.limit_factor(
                                    l.rate_factor, l.paused_until, l.wait_s,
                                    COALESCE(l.in_flight, l.creates), v_now) / 2, 1.0 / 64)
                           ELSE l.rate_factor END,
        paused_until = GREATEST(l.paused_until, v_now + pg_catalog.make_interval(
            secs => COALESCE(slow_down.retry_after_s, l.wait_s)))
    WHERE l.account = (SELECT m.account FROM callwarden.limits m
                       WHERE m.kinds @> ARRAY[slow_down.kind] ORDER BY m.account LIMIT 1)
    RETURNING l.account, EXTRACT(epoch FROM l.paused_until - v_now)::float8, l.rate_factor;
END
$body$;

CREATE OR REPLACE FUNCTION callwarden.host_api_version() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = @host@, pg_temp AS $body$ SELECT 2 $body$;

-- Why a job waits (start_call answered `wait`): the reason and the seconds to wait, or no
-- row when it does not.
CREATE OR REPLACE FUNCTION callwarden.waiting_for(job_id uuid,
                                                  OUT reason text, OUT retry_after_s double precision)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = @host@, pg_temp AS $body$
    SELECT w.reason, GREATEST(0, EXTRACT(epoch FROM w.retry_at - pg_catalog.clock_timestamp()))::float8
    FROM callwarden.waiting w WHERE w.job_id = waiting_for.job_id
$body$;

-- start_call (0017's) with admission: a job with no call is started only when admit lets
-- it (version 2 of the host API: the action `wait`, the reason from waiting_for).
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
        IF (callwarden.admit(v_job.id, start_call.kind)).reason IS NOT NULL THEN
            RETURN QUERY SELECT 'wait'::text, NULL::text, NULL::text, v_job.call_version;
            RETURN;
        END IF;
        v_at := pg_catalog.clock_timestamp();  -- admitted now (not when the transaction began)
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
$fns$;
BEGIN
    EXECUTE replace(body, '@host@', quote_ident(host));
END
$host_api$;

-- The new functions: nothing for PUBLIC; EXECUTE, and the new tables, for every role that
-- holds the host API already (a runtime `callwarden grant` made before this migration).
DO $grant$
DECLARE
    r regrole;
BEGIN
    REVOKE ALL ON FUNCTION callwarden.admit(uuid, text) FROM PUBLIC;
    REVOKE ALL ON FUNCTION callwarden.waiting_for(uuid) FROM PUBLIC;
    REVOKE ALL ON FUNCTION callwarden.slow_down(text, double precision) FROM PUBLIC;
    REVOKE ALL ON FUNCTION callwarden.limit_factor(double precision, timestamptz,
                                                   double precision, int, timestamptz)
        FROM PUBLIC;
    REVOKE ALL ON callwarden.limits, callwarden.waiting FROM PUBLIC;
    FOR r IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.oid = 'callwarden.succeeded(uuid, text, jsonb, text, numeric, jsonb)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION callwarden.admit(uuid, text) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION callwarden.waiting_for(uuid) TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION callwarden.slow_down(text, double precision) '
                       'TO %s', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION callwarden.limit_factor(double precision, '
                       'timestamptz, double precision, int, timestamptz) TO %s', r);
        EXECUTE format(CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
                            THEN 'GRANT SELECT, UPDATE ON callwarden.limits TO %s'
                            ELSE 'GRANT SELECT, UPDATE (paused_until, rate_factor) ON '
                                 'callwarden.limits TO %s' END, r);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON callwarden.waiting TO %s', r);
    END LOOP;
END
$grant$;

-- grant_runtime (0017's) and the new tables: a runtime role reads the limits (and writes
-- only their pause and rate), and keeps the waiting rows (the functions are granted by the loop over every callwarden function).
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
    FOREACH stmt IN ARRAY ARRAY[
        -- (the caps are the operator's: a runtime only pauses and scales them; Citus
        -- grants no column list, so there the runtime may update the row)
        pg_catalog.format(CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_extension
                                            WHERE extname = 'citus')
                               THEN 'GRANT SELECT, UPDATE ON callwarden.limits TO %s'
                               ELSE 'GRANT SELECT, UPDATE (paused_until, rate_factor) ON '
                                    'callwarden.limits TO %s' END, runtime),
        pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON callwarden.waiting TO %s',
                          runtime)] LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
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
