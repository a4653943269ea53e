-- 0015: the jobs a host ended on its own, with no call in callwarden's log (issue 38,
-- part 5): the reconciler records HostEnded on each once host_left_after_s has passed,
-- settling what the host left reserved by the documented policy, so that verify and audit
-- cover every job callwarden shares the database with (engine/reconciler/outside.py).
-- Partial: a row leaves the index when its HostEnded is recorded (call_state set); what
-- stays are jobs ended before the window (outside_window_s) the pass looks at.
--
-- Plain CREATE INDEX (migrations run in one transaction): on a large, busy jobs table,
-- create it CONCURRENTLY by hand first; IF NOT EXISTS then skips it here.
CREATE INDEX IF NOT EXISTS jobs_ended_outside_idx
    ON jobs (created_at)
    WHERE call_state IS NULL AND status NOT IN ('pending', 'processing');

-- The reservations still held (few: one per job in flight), for the report of what a
-- host left reserved on jobs it ended (engine/replay/audit.sql, audit_host_left).
CREATE INDEX IF NOT EXISTS usage_logs_reserved_idx
    ON usage_logs (job_id)
    WHERE status = 'reserved';
