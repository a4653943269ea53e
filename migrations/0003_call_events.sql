-- callwarden's own schema: the projection columns on jobs and the event log.
--
-- call_state / call_version are the fold of call_events for the job: call_version equals
-- the number of events, and every write is fenced on it (optimistic concurrency).
-- Heartbeat and progress are projection-only columns, never events.

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS call_state            text,
    ADD COLUMN IF NOT EXISTS call_version          int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS call_sync             boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS reconcile_next_at     timestamptz,
    ADD COLUMN IF NOT EXISTS finalize_owner        text,
    ADD COLUMN IF NOT EXISTS finalize_lease_until  timestamptz,
    ADD COLUMN IF NOT EXISTS upstream_result       jsonb,
    ADD COLUMN IF NOT EXISTS call_finished_at      timestamptz,
    ADD COLUMN IF NOT EXISTS call_settlement       text,
    ADD COLUMN IF NOT EXISTS heartbeat_at          timestamptz,
    ADD COLUMN IF NOT EXISTS heartbeat_owner       text,
    ADD COLUMN IF NOT EXISTS reconcile_owner       text,
    ADD COLUMN IF NOT EXISTS reconcile_lease_until timestamptz;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'jobs_call_state_check') THEN
        ALTER TABLE jobs ADD CONSTRAINT jobs_call_state_check CHECK (call_state IN (
            'created', 'polling', 'upstream_succeeded', 'finalizing',
            'completed', 'failed', 'swept', 'exhausted', 'cancelled'));
    END IF;
END
$$;

CREATE TABLE IF NOT EXISTS call_events (
    job_id      uuid        NOT NULL REFERENCES jobs (id),
    seq         int         NOT NULL CHECK (seq >= 1),
    type        text        NOT NULL,
    version     smallint    NOT NULL DEFAULT 1,
    payload     jsonb       NOT NULL,
    actor       text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

CREATE INDEX IF NOT EXISTS call_events_recorded_at_idx ON call_events (recorded_at);

-- Webhook look-ups, and no two jobs may claim one upstream task.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_provider_task_idx
    ON jobs (provider_kind, provider_task_id)
    WHERE provider_task_id IS NOT NULL;

-- The reconciler's scan: only non-terminal calls are in this index, so its cost grows
-- with the number of in-flight calls, never with the size of jobs.
CREATE INDEX IF NOT EXISTS jobs_open_calls_idx
    ON jobs (provider_call_started_at)
    WHERE call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing');
