-- The seed's migration 135: external-call reconciliation columns on jobs.
--   D1: one set of columns on jobs, not a side table (every job has <= 1 external call).
--   D8: provider_call_started_at is distinct from started_at (set once per call).
-- The partial index covers BOTH pending and processing, so a crash before the
-- pending -> processing flip still leaves a visible row.

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS provider_kind            text,
    ADD COLUMN IF NOT EXISTS provider_task_id         text,
    ADD COLUMN IF NOT EXISTS provider_call_started_at timestamptz,
    ADD COLUMN IF NOT EXISTS reconcile_attempts       int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS reconcile_last_error     text;

CREATE INDEX IF NOT EXISTS jobs_inflight_idx
    ON jobs (provider_call_started_at)
    WHERE status IN ('pending', 'processing');
