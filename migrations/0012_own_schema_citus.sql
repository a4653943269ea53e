-- 0012: on a Citus coordinator, callwarden.callback_tokens (0011) beside its jobs:
-- distributed by job_id, co-located with jobs, so the webhook's look-up of a job and its
-- token is answered by one shard. On plain Postgres one DO block that returns at once.
-- Like 0010, it runs again when a database migrated on plain Postgres is moved to Citus
-- (migrate.py, _distribute_late), and leaves a table already distributed as it is.

DO $citus$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition
                   WHERE logicalrelid = 'callwarden.callback_tokens'::regclass) THEN
        PERFORM create_distributed_table('callwarden.callback_tokens', 'job_id',
                                         colocate_with => 'jobs');
        PERFORM truncate_local_data_after_distributing_table('callwarden.callback_tokens');
    END IF;
END
$citus$;
