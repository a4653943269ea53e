-- 0009: the indexes the operator dashboard's queries run on (engine/service/service.sql,
-- dashboard_*), so its overview and call list cost what their window or page holds, never
-- the size of jobs or call_events (tests/integration/test_dashboard_plans.py proves it with
-- EXPLAIN at 1,000,000 rows).
--
-- Plain CREATE INDEX (migrations run in one transaction): on a large, busy jobs table,
-- create them CONCURRENTLY by hand first; IF NOT EXISTS then skips them here.

-- Terminal events by time, with what the charts group by (type, who ended the call): the
-- overview's charts and "recent outcomes" read it index-only, bounded by their window.
-- Partial: one row per ended call, not one per event.
CREATE INDEX IF NOT EXISTS call_events_terminal_idx
    ON call_events (recorded_at) INCLUDE (type, actor, job_id)
    WHERE type IN ('Completed', 'UpstreamFailed', 'Swept', 'Exhausted', 'Cancelled',
                   'HostEnded');

-- Time to terminal per kind over a window: calls by the time they finished.
CREATE INDEX IF NOT EXISTS jobs_call_finished_idx
    ON jobs (call_finished_at) INCLUDE (provider_kind, provider_call_started_at)
    WHERE call_finished_at IS NOT NULL;

-- The call list, newest first, paged by the key (provider_call_started_at, id); one for
-- every call and one for a kind's calls.
CREATE INDEX IF NOT EXISTS jobs_call_started_idx
    ON jobs (provider_call_started_at, id)
    WHERE provider_call_started_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_kind_started_idx
    ON jobs (provider_kind, provider_call_started_at, id)
    WHERE provider_call_started_at IS NOT NULL;

-- The call list searched by error text: only calls that carry an error, newest first (a
-- substring match cannot use a btree; this bounds it to the calls it can match).
CREATE INDEX IF NOT EXISTS jobs_errored_started_idx
    ON jobs (provider_call_started_at, id)
    WHERE provider_call_started_at IS NOT NULL
      AND (error_message IS NOT NULL OR reconcile_last_error IS NOT NULL);

-- Credits committed / released / refunded over a window, by settlement time.
CREATE INDEX IF NOT EXISTS usage_logs_settled_at_idx
    ON usage_logs (settled_at) INCLUDE (status, credits_reserved, credits_charged)
    WHERE settled_at IS NOT NULL;
