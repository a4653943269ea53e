-- 0019: on a Citus coordinator, 0018's tables: callwarden.limits a reference table (every
-- node reads the caps), callwarden.waiting distributed by job_id, co-located with jobs. On
-- plain Postgres one DO block that returns at once. Like 0010 and 0012 (its name ends in
-- citus), it runs again when a database migrated on plain Postgres is moved to Citus
-- (migrate.py, _distribute_late), and leaves a table already distributed as it is.

DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    -- one table after the other on every node (a reference table after a distributed
    -- one in one transaction is refused in parallel mode: see 0017's grant_runtime)
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    IF to_regclass('callwarden.limits') IS NOT NULL  -- (0018 applied: see _distribute_late)
       AND NOT EXISTS (SELECT 1 FROM pg_dist_partition
                       WHERE logicalrelid = to_regclass('callwarden.limits')) THEN
        PERFORM create_reference_table('callwarden.limits');
    END IF;
    IF to_regclass('callwarden.waiting') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_dist_partition
                       WHERE logicalrelid = to_regclass('callwarden.waiting')) THEN
        PERFORM create_distributed_table('callwarden.waiting', 'job_id',
                                         colocate_with => 'jobs');
    END IF;
END
$citus$;
