-- 0010: on a Citus coordinator, distribute callwarden's tables (issue 27, item 1). On a
-- database without the citus extension this whole file is one DO block that returns at
-- once: nothing changes on plain Postgres.
--
-- On Citus:
-- * jobs is distributed by id; call_events, usage_logs and assets by job_id, co-located
--   with jobs, so every row of one call lives on one shard (and on one node).
-- * workflow_executions and callwarden_migrations become reference tables (a copy on every
--   node): jobs references workflow_executions by a foreign key, which Citus accepts from
--   a distributed table only to a reference (or co-located) table, and the reconciler's
--   claim reads callwarden_migrations inside its query on jobs. Both are small and rarely
--   written (a reference write goes to every node).
-- * webhook_deliveries stays a plain table on the coordinator: it is written once per
--   delivery, in its own statement, and never joined with the distributed tables; as a
--   reference table every delivery would be a write on every node.
-- * Citus refuses a primary key or unique index of a distributed table that does not
--   contain the distribution column: the keys of usage_logs and assets become
--   (job_id, id), and the unique index jobs_provider_task_idx (one upstream task, one job)
--   is replaced by callwarden_tasks, keyed on the task and distributed by the task id
--   (filled from jobs here; the engine does not write it yet: issue 27, item 2). jobs keeps
--   a non-unique index on (provider_kind, provider_task_id) for the webhook look-up.
-- * Distributing jobs with its foreign key to workflow_executions in place would first
--   turn jobs and every table that references it into "Citus local" tables, and turning
--   those into distributed tables recreates them, which silently drops the function
--   callwarden_stale_jobs (it returns SETOF jobs). So the foreign keys from jobs to
--   workflow_executions are dropped first and added back once both sides are converted,
--   and the two functions of 0007 and 0008 are made distributed objects (created on every
--   node, where the shards' queries call them).
-- Tables already distributed (a host that did it by hand) are left as they are.

DO $citus$
DECLARE
    fk record;
    fks text[] := '{}';
    def text;
    pk record;
    t text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- One connection per node for the whole transaction: the tables below are created,
    -- altered and filled in it, which Citus cannot run over parallel connections.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);

    -- The task look-up (item 2), filled from jobs while jobs is still a local table.
    CREATE TABLE IF NOT EXISTS callwarden_tasks (
        provider_kind    text        NOT NULL,
        provider_task_id text        NOT NULL,
        job_id           uuid        NOT NULL,
        claimed_at       timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (provider_task_id, provider_kind)
    );
    IF to_regclass('jobs_provider_task_idx') IS NOT NULL THEN
        INSERT INTO callwarden_tasks (provider_kind, provider_task_id, job_id)
        SELECT provider_kind, provider_task_id, id
        FROM jobs
        WHERE provider_task_id IS NOT NULL AND provider_kind IS NOT NULL
        ON CONFLICT DO NOTHING;
        DROP INDEX jobs_provider_task_idx;
    END IF;
    CREATE INDEX IF NOT EXISTS jobs_provider_task_lookup_idx
        ON jobs (provider_kind, provider_task_id)
        WHERE provider_task_id IS NOT NULL;

    -- Primary keys that must contain job_id.
    FOREACH t IN ARRAY ARRAY['usage_logs', 'assets'] LOOP
        SELECT c.conname, pg_get_constraintdef(c.oid) AS cols INTO pk
        FROM pg_constraint c
        WHERE c.conrelid = t::regclass AND c.contype = 'p'
          AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                          WHERE a.attrelid = c.conrelid AND a.attname = 'job_id'
                            AND a.attnum = ANY (c.conkey));
        IF FOUND THEN
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I, ADD CONSTRAINT %I %s',
                           t, pk.conname, pk.conname,
                           regexp_replace(pk.cols, '^PRIMARY KEY \(', 'PRIMARY KEY (job_id, '));
        END IF;
    END LOOP;

    -- The foreign keys from jobs to workflow_executions, dropped until both are converted.
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass) THEN
        FOR fk IN
            SELECT conname, pg_get_constraintdef(oid) AS def
            FROM pg_constraint
            WHERE conrelid = 'jobs'::regclass AND contype = 'f'
              AND confrelid = 'workflow_executions'::regclass
        LOOP
            fks := fks || format('ALTER TABLE jobs ADD CONSTRAINT %I %s', fk.conname, fk.def);
            EXECUTE format('ALTER TABLE jobs DROP CONSTRAINT %I', fk.conname);
        END LOOP;
    END IF;

    FOREACH t IN ARRAY ARRAY['workflow_executions', 'callwarden_migrations'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t::regclass) THEN
            PERFORM create_reference_table(t);
            PERFORM truncate_local_data_after_distributing_table(t);
        END IF;
    END LOOP;

    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'jobs'::regclass) THEN
        PERFORM create_distributed_table('jobs', 'id');
    END IF;
    FOREACH t IN ARRAY ARRAY['call_events', 'usage_logs', 'assets'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t::regclass) THEN
            PERFORM create_distributed_table(t, 'job_id', colocate_with => 'jobs');
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                   WHERE logicalrelid = 'callwarden_tasks'::regclass) THEN
        PERFORM create_distributed_table('callwarden_tasks', 'provider_task_id',
                                         colocate_with => 'none');
    END IF;
    FOREACH def IN ARRAY fks LOOP
        EXECUTE def;
    END LOOP;
    -- create_distributed_table copies a table's rows into its shards and leaves the local
    -- copy behind, unread: empty it.
    FOREACH t IN ARRAY ARRAY['jobs', 'call_events', 'usage_logs', 'assets', 'callwarden_tasks']
    LOOP
        PERFORM truncate_local_data_after_distributing_table(t);
    END LOOP;

    -- The staleness rule (0007) and the stale rows (0008) on every node.
    PERFORM create_distributed_function(
        'callwarden_is_stale(timestamptz, timestamptz, timestamptz, timestamptz, text, jsonb, float8, float8, timestamptz)');
    PERFORM create_distributed_function(
        'callwarden_stale_jobs(jsonb, float8, float8, timestamptz)');
END
$citus$;
