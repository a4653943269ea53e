-- 0011: callwarden's own schema, locked down (issue 39; docs/security.md).
--
-- Until 0010 callwarden's objects sat beside the host's tables (in the first schema of the
-- migrating role's search_path, `public` on every host seen), where an API layer in front
-- of the database (Supabase's PostgREST, Hasura) serves them to anyone holding the public
-- key. Here they move, with their rows and indexes, into the schema `callwarden`, which no
-- API layer serves unless told to:
--
--   call_events, webhook_deliveries, callwarden_migrations, callwarden_tasks (Citus),
--   callwarden_is_stale, callwarden_stale_jobs
--
-- and the callback token moves off the host's row (jobs.callback_token, readable through
-- a user's own-row policy) into callwarden.callback_tokens. Names are kept: an object's
-- identity is its name in the schema, and 0010 must still find them when it runs again on
-- a database moved to Citus later (migrate.py runs it with callwarden first in the path).
--
-- Privileges: everything is revoked from PUBLIC, and every grant a moved object carried
-- (Supabase's default privileges on `public` give anon and authenticated ALL on every new
-- table and function there) is dropped: the owner (the role that migrates) keeps its own.
-- The runtime role gets exactly what it needs from `callwarden grant ROLE` (the statements
-- are engine/database/privileges.sql, `grant_runtime`).
--
-- The functions get a fixed search_path (empty: every name in them is qualified), so a
-- caller's path cannot change what they resolve.
--
-- The host's jobs row keeps the columns callwarden adds (0002..0006); a guard trigger
-- (callwarden.guard_call_columns) refuses a change to them by any role that is not
-- callwarden's runtime (that may not append to callwarden.call_events): a signed-in user
-- whose row policy lets them rename a job cannot rewrite its call. Not on Citus (it refuses
-- triggers on distributed tables): `callwarden check` says so there. The new table is
-- distributed on Citus by 0012, which migrate.py runs again on a database moved there later.

CREATE SCHEMA IF NOT EXISTS callwarden;

DO $owner$
BEGIN
    IF (SELECT nspowner FROM pg_namespace WHERE nspname = 'callwarden')
       <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'callwarden: the schema callwarden exists and belongs to %, not to %',
            (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'callwarden'),
            current_user
            USING HINT = 'migrate as the role that owns it, or drop the schema made by hand';
    END IF;
END
$owner$;

-- Each move only where the object is still outside the schema: the file is idempotent.
DO $move$
DECLARE
    t text;
    f text;
BEGIN
    FOREACH t IN ARRAY ARRAY['call_events', 'webhook_deliveries', 'callwarden_migrations',
                             'callwarden_tasks'] LOOP
        IF to_regclass(t) IS NOT NULL AND to_regclass('callwarden.' || t) IS NULL THEN
            EXECUTE format('ALTER TABLE %s SET SCHEMA callwarden', to_regclass(t));
        END IF;
    END LOOP;
    FOREACH f IN ARRAY ARRAY[
        'callwarden_is_stale(timestamptz, timestamptz, timestamptz, timestamptz, text, jsonb, float8, float8, timestamptz)',
        'callwarden_stale_jobs(jsonb, float8, float8, timestamptz)'] LOOP
        IF to_regprocedure(f) IS NOT NULL AND to_regprocedure('callwarden.' || f) IS NULL THEN
            EXECUTE format('ALTER FUNCTION %s SET SCHEMA callwarden', to_regprocedure(f));
        END IF;
    END LOOP;
END
$move$;

-- The same rule as 0007, with a fixed search_path.
CREATE OR REPLACE FUNCTION callwarden.callwarden_is_stale(
    call_started_at timestamptz,
    host_started_at timestamptz,
    created_at timestamptz,
    heartbeat_at timestamptz,
    kind text,
    thresholds jsonb,
    legacy_threshold_s float8,
    heartbeat_timeout_s float8,
    now timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = ''
AS $$
SELECT CASE
    WHEN heartbeat_at IS NOT NULL THEN
        now - heartbeat_at >= pg_catalog.make_interval(secs => heartbeat_timeout_s)
    WHEN call_started_at IS NOT NULL THEN
        now - call_started_at >= pg_catalog.make_interval(secs =>
            coalesce((thresholds ->> kind)::float8, legacy_threshold_s))
    ELSE
        coalesce(now - coalesce(host_started_at, created_at)
                 >= pg_catalog.make_interval(secs => legacy_threshold_s), false)
END
$$;

-- The same rows as 0008, with a fixed search_path: the host's jobs named with the schema
-- it is in (where this migration finds it: the host's tables need not be in public).
DO $stale_jobs$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('jobs'));
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION callwarden.callwarden_stale_jobs(
    thresholds jsonb,
    legacy_threshold_s float8,
    heartbeat_timeout_s float8,
    now timestamptz
) RETURNS SETOF %1$I.jobs
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = ''
AS $body$
SELECT j.*
FROM %1$I.jobs j
WHERE (j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
       OR (j.call_state IS NULL AND j.status IN ('pending', 'processing')
           AND j.provider_kind IS NOT NULL AND j.provider_call_started_at IS NOT NULL))
  AND callwarden.callwarden_is_stale(j.provider_call_started_at, j.started_at, j.created_at,
                                     j.heartbeat_at, j.provider_kind, thresholds,
                                     legacy_threshold_s, heartbeat_timeout_s, now)
$body$ $fn$, host);
END
$stale_jobs$;

-- The callback token (0005), off the host's row. Written once when a call is prepared
-- (engine/calls/callbacks.sql); read by the webhook receiver by the job id.
CREATE TABLE IF NOT EXISTS callwarden.callback_tokens (
    job_id     uuid        PRIMARY KEY,
    token      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

DO $token$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'jobs'::regclass AND attname = 'callback_token'
                 AND NOT attisdropped) THEN
        EXECUTE 'INSERT INTO callwarden.callback_tokens (job_id, token) '
                'SELECT id, callback_token FROM jobs WHERE callback_token IS NOT NULL '
                'ON CONFLICT (job_id) DO NOTHING';
        EXECUTE 'ALTER TABLE jobs DROP COLUMN callback_token';
    END IF;
END
$token$;

-- The guard on callwarden's columns of the host's rows: row triggers whose WHEN asks, in
-- the executor, only whether the role writing may use the schema and append to the log
-- (callwarden's runtime and owner may; a superuser may): for them the function is never
-- called. For any other role the function compares the columns named in the trigger's
-- arguments: on UPDATE none may change, on INSERT none may be set (NULL, 0 or false, their
-- defaults). AFTER, not BEFORE (a BEFORE row trigger on UPDATE locks the row again before
-- its WHEN is even evaluated); an error raised AFTER rolls the statement back all the
-- same. The columns are compared in the function, not the WHEN: a WHEN naming the 23
-- columns costs each update callwarden makes about 40 us however it short-circuits, the
-- privilege test alone a few.
CREATE OR REPLACE FUNCTION callwarden.guard_call_columns() RETURNS trigger
LANGUAGE plpgsql
SET search_path = ''
AS $$
DECLARE
    before jsonb := CASE WHEN TG_OP = 'UPDATE' THEN pg_catalog.to_jsonb(OLD) END;
    after jsonb := pg_catalog.to_jsonb(NEW);
    col text;
BEGIN
    FOREACH col IN ARRAY TG_ARGV LOOP
        IF (TG_OP = 'UPDATE' AND (before -> col) IS DISTINCT FROM (after -> col))
           OR (TG_OP = 'INSERT'
               AND coalesce(after -> col, 'null') NOT IN ('null', '0', 'false')) THEN
            RAISE EXCEPTION 'callwarden: % may not write callwarden''s columns of %.% (%: only callwarden''s runtime role may)',
                current_user, TG_TABLE_SCHEMA, TG_TABLE_NAME, col
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'update the host''s own columns only; see docs/security.md';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

DO $guard$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    DROP TRIGGER IF EXISTS callwarden_guard_update ON jobs;
    CREATE TRIGGER callwarden_guard_update
        AFTER UPDATE ON jobs
        FOR EACH ROW
        WHEN (NOT (pg_catalog.has_schema_privilege('callwarden'::regnamespace, 'USAGE')
                   AND pg_catalog.has_table_privilege('callwarden.call_events'::regclass,
                                                      'INSERT')))
        EXECUTE FUNCTION callwarden.guard_call_columns(
            'provider_kind', 'provider_task_id', 'provider_call_started_at', 'reconcile_attempts',
            'reconcile_last_error', 'call_state', 'call_version', 'call_sync',
            'reconcile_next_at', 'finalize_owner', 'finalize_lease_until', 'upstream_result',
            'call_finished_at', 'call_settlement', 'heartbeat_at', 'heartbeat_owner',
            'reconcile_owner', 'reconcile_lease_until', 'queue_owner', 'queue_lease_until',
            'queue_deliveries', 'queue_acked_at', 'call_output');
    DROP TRIGGER IF EXISTS callwarden_guard_insert ON jobs;
    CREATE TRIGGER callwarden_guard_insert
        AFTER INSERT ON jobs
        FOR EACH ROW
        WHEN (NOT (pg_catalog.has_schema_privilege('callwarden'::regnamespace, 'USAGE')
                   AND pg_catalog.has_table_privilege('callwarden.call_events'::regclass,
                                                      'INSERT')))
        EXECUTE FUNCTION callwarden.guard_call_columns(
            'provider_kind', 'provider_task_id', 'provider_call_started_at', 'reconcile_attempts',
            'reconcile_last_error', 'call_state', 'call_version', 'call_sync',
            'reconcile_next_at', 'finalize_owner', 'finalize_lease_until', 'upstream_result',
            'call_finished_at', 'call_settlement', 'heartbeat_at', 'heartbeat_owner',
            'reconcile_owner', 'reconcile_lease_until', 'queue_owner', 'queue_lease_until',
            'queue_deliveries', 'queue_acked_at', 'call_output');
    DROP TRIGGER IF EXISTS callwarden_guard_settlement ON usage_logs;
    CREATE TRIGGER callwarden_guard_settlement
        AFTER UPDATE ON usage_logs
        FOR EACH ROW
        WHEN (NOT (pg_catalog.has_schema_privilege('callwarden'::regnamespace, 'USAGE')
                   AND pg_catalog.has_table_privilege('callwarden.call_events'::regclass,
                                                      'INSERT')))
        EXECUTE FUNCTION callwarden.guard_call_columns('settled_by_seq');
    DROP TRIGGER IF EXISTS callwarden_guard_settlement_insert ON usage_logs;
    CREATE TRIGGER callwarden_guard_settlement_insert
        AFTER INSERT ON usage_logs
        FOR EACH ROW
        WHEN (NOT (pg_catalog.has_schema_privilege('callwarden'::regnamespace, 'USAGE')
                   AND pg_catalog.has_table_privilege('callwarden.call_events'::regclass,
                                                      'INSERT')))
        EXECUTE FUNCTION callwarden.guard_call_columns('settled_by_seq');
END
$guard$;

-- The runtime role's grants, in one statement the owner runs (`callwarden grant ROLE` runs
-- it; docs/security.md): what workers, the reconciler, `serve` and a host calling
-- callwarden's functions need, and nothing more. Returns each statement it ran. A later
-- migration that adds an object replaces this function with the larger set.
-- The host's tables are named with the schema this migration finds them in.
DO $grant$
DECLARE
    host text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = to_regclass('jobs'));
BEGIN
    EXECUTE format($fn$
CREATE OR REPLACE FUNCTION callwarden.grant_runtime(runtime regrole) RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = ''
AS $body$
DECLARE
    host CONSTANT text := %1$L;
    stmt text;
    seq text;
    tbl text;
BEGIN
    FOREACH stmt IN ARRAY ARRAY[
        'GRANT USAGE ON SCHEMA callwarden TO %%1$s',
        'GRANT SELECT, INSERT ON callwarden.call_events TO %%1$s',
        'GRANT SELECT, INSERT, DELETE ON callwarden.webhook_deliveries TO %%1$s',
        'GRANT SELECT, INSERT, UPDATE ON callwarden.callback_tokens TO %%1$s',
        'GRANT SELECT ON callwarden.callwarden_migrations TO %%1$s',
        'GRANT EXECUTE ON FUNCTION callwarden.callwarden_is_stale(timestamptz, timestamptz, '
            'timestamptz, timestamptz, text, jsonb, float8, float8, timestamptz), '
            'callwarden.callwarden_stale_jobs(jsonb, float8, float8, timestamptz) TO %%1$s',
        'GRANT SELECT, INSERT, UPDATE ON %%2$I.jobs, %%2$I.usage_logs, '
            '%%2$I.workflow_executions TO %%1$s',
        'GRANT SELECT, INSERT ON %%2$I.assets TO %%1$s']
    LOOP
        stmt := pg_catalog.format(stmt, runtime, host);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
    IF pg_catalog.to_regclass('callwarden.callwarden_tasks') IS NOT NULL THEN
        stmt := pg_catalog.format('GRANT SELECT, INSERT ON callwarden.callwarden_tasks TO %%s',
                                  runtime);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END IF;
    -- the host's serial keys callwarden inserts with (usage_logs.id, assets.id)
    FOR seq IN
        SELECT s FROM pg_catalog.unnest(ARRAY[
            pg_catalog.pg_get_serial_sequence(pg_catalog.format('%%I.usage_logs', host), 'id'),
            pg_catalog.pg_get_serial_sequence(pg_catalog.format('%%I.assets', host), 'id')]) AS s
        WHERE s IS NOT NULL
    LOOP
        stmt := pg_catalog.format('GRANT USAGE ON SEQUENCE %%s TO %%s', seq, runtime);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
    -- Under the host's row-level security (Supabase's tables) the runtime sees and writes
    -- every row of the tables it works on, by a policy for it alone (never BYPASSRLS, which
    -- would reach every table of the database): only on a table with RLS enabled, and not
    -- for a role that bypasses RLS already (Supabase's service_role). Enabling RLS later:
    -- run this again (`callwarden check` names the gap).
    FOREACH tbl IN ARRAY ARRAY['jobs', 'usage_logs', 'assets', 'workflow_executions'] LOOP
        stmt := pg_catalog.format('DROP POLICY IF EXISTS %%I ON %%I.%%I',
                                  'callwarden_' || runtime, host, tbl);
        EXECUTE stmt;
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                   WHERE c.oid = pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', host, tbl))
                     AND c.relrowsecurity)
           AND NOT (SELECT r.rolbypassrls FROM pg_catalog.pg_roles r WHERE r.oid = runtime) THEN
            stmt := pg_catalog.format('CREATE POLICY %%I ON %%I.%%I FOR ALL TO %%s USING (true) '
                                      'WITH CHECK (true)', 'callwarden_' || runtime, host, tbl,
                                      runtime);
            EXECUTE stmt;
            RETURN NEXT stmt;
        END IF;
    END LOOP;
END
$body$ $fn$, host);
END
$grant$;

-- Least privilege: nothing for PUBLIC, and no grant a moved object brought with it.
DO $privileges$
DECLARE
    obj record;
    grantee text;
BEGIN
    EXECUTE 'REVOKE ALL ON SCHEMA callwarden FROM PUBLIC';
    FOR obj IN
        SELECT format('TABLE %s', c.oid::regclass) AS what, c.relacl AS acl, c.relowner AS owner
        FROM unnest(ARRAY['call_events', 'webhook_deliveries', 'callwarden_migrations',
                          'callwarden_tasks', 'callback_tokens']) AS t (name)
        JOIN pg_class c ON c.oid = to_regclass('callwarden.' || t.name)
        UNION ALL
        SELECT format('FUNCTION %s', p.oid::regprocedure), p.proacl, p.proowner
        FROM pg_proc p
        WHERE p.pronamespace = 'callwarden'::regnamespace
          AND p.proname IN ('callwarden_is_stale', 'callwarden_stale_jobs',
                            'guard_call_columns', 'grant_runtime')
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM PUBLIC', obj.what);
        FOR grantee IN
            SELECT DISTINCT a.grantee::regrole::text
            FROM aclexplode(obj.acl) a
            WHERE a.grantee <> 0 AND a.grantee <> obj.owner
        LOOP
            EXECUTE format('REVOKE ALL ON %s FROM %s', obj.what, grantee);
        END LOOP;
    END LOOP;
END
$privileges$;
