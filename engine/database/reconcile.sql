-- The reconciler's claim statements, run by the database port (engine/database/postgres.py:
-- claim, renew, release, park). Projection columns are never written here: every state change
-- goes through append_event (fenced on call_version). These statements only move the
-- reconciler's own claim columns (reconcile_owner, reconcile_lease_until).

-- name: reconcile_claim
-- Claim up to batch_size stale in-flight calls in ONE statement (so one transaction).
-- Two branches, each served by a partial index and each locking with SKIP LOCKED:
--   open_calls: calls with events, through jobs_open_calls_idx (call_state open): stale
--               ones, ones the host ended meanwhile (its status is no longer
--               pending/processing: record it at once), and ones past their horizon
--               (threshold + cap x re-poll) whatever holds them;
--   seed_rows: rows with no events (the host's own workers wrote the seed columns, or a
--              legacy row with none), through jobs_inflight_idx (status pending/processing);
--              a row with no call at all is legacy only when created before the legacy
--              cutoff (%(legacy_cutoff)s, or when migration 0002 installed the call columns;
--              with neither known, no row is legacy: fail closed). A newer call-less row
--              that still holds a reserved reservation is treated as legacy once it was
--              created before %(reserved_before)s (reserved_without_call_s ago; NULL:
--              never): a job whose call never started (a lost queue message) is swept and
--              refunded, never reserved forever. The row's legacy_cutoff is returned as
--              the effective one, so the decision (is_legacy) agrees.
-- Every mutable predicate (state, heartbeat, next attempt, claim lease, finalization lease)
-- sits on the locked relation itself, so a row changed by a concurrent commit is re-checked
-- on its newest version before it is locked (no stale-snapshot claim, River #1302).
-- Staleness is the stale_rule fragment (the one rule, as callwarden.callwarden_is_stale;
-- its %(stale_*)s arguments come from StaleRule.sql_params). %(cutoff)s = now - min(smallest kind
-- threshold, heartbeat timeout): the index range every stale open call falls in;
-- %(horizon_extra_s)s = attempt cap x re-poll interval.
WITH cut AS ({{claim_cut}}), open_calls AS (
    SELECT j.id
    FROM jobs j
    WHERE {{claim_open_calls}}
    LIMIT %(batch_size)s
    FOR UPDATE OF j SKIP LOCKED
), seed_rows AS (
    SELECT j.id
    FROM jobs j, cut
    WHERE {{claim_seed_rows}}
    LIMIT (SELECT greatest(%(batch_size)s - count(*), 0) FROM open_calls)
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs j
SET reconcile_owner = %(owner)s::text,
    reconcile_lease_until = %(lease_until)s::timestamptz
FROM cut
WHERE j.id = ANY(ARRAY(SELECT id FROM open_calls UNION ALL SELECT id FROM seed_rows))
{{claim_returning}}

-- name: reconcile_candidates_citus
-- reconcile_claim on Citus (issue 27), which runs no FOR UPDATE across shards and no
-- subquery in a LIMIT, step 1: the candidates of both branches, read without a lock (each
-- shard through its own partial indexes), open calls first; %(candidates)s of them (a few
-- times the batch: another reconciler may take some first).
WITH cut AS ({{claim_cut}}
), open_calls AS (
    SELECT j.id, 0 AS branch
    FROM jobs j
    WHERE {{claim_open_calls}}
    LIMIT %(candidates)s
), seed_rows AS (
    SELECT j.id, 1 AS branch
    FROM jobs j, cut
    WHERE {{claim_seed_rows}}
    LIMIT %(candidates)s
)
SELECT id FROM (SELECT * FROM open_calls UNION ALL SELECT * FROM seed_rows) c
ORDER BY branch
LIMIT %(candidates)s;

-- name: reconcile_claim_one_citus
-- Step 2, per candidate until the batch is full: a single-shard UPDATE (no two-phase
-- commit) that re-checks both branches' predicates on the row it locks (READ COMMITTED
-- re-evaluates its WHERE on the newest version after a concurrent commit): a call another
-- reconciler leased, a worker heartbeated or the host ended meanwhile answers no row, so
-- two reconcilers never hold one call. The same rows as reconcile_claim.
WITH cut AS ({{claim_cut}}
)
UPDATE jobs j
SET reconcile_owner = %(owner)s::text,
    reconcile_lease_until = %(lease_until)s::timestamptz
FROM cut
WHERE j.id = %(job_id)s::uuid
  AND (({{claim_open_calls}})
       OR ({{claim_seed_rows}}))
{{claim_returning}};

-- fragment: claim_cut
    SELECT COALESCE(%(legacy_cutoff)s::timestamptz,
                    (SELECT applied_at FROM callwarden.callwarden_migrations WHERE version = 2))
           AS legacy_cutoff

-- fragment: claim_open_calls
-- (the open_calls branch's predicate: see reconcile_claim)
j.call_state IN ('created', 'polling', 'upstream_succeeded', 'finalizing')
      AND (j.reconcile_lease_until IS NULL OR j.reconcile_lease_until <= %(now)s::timestamptz)
      AND (
          COALESCE(j.status, 'pending') NOT IN ('pending', 'processing')
          OR j.provider_call_started_at <= %(now)s::timestamptz - make_interval(secs =>
                 COALESCE((%(stale_thresholds)s::jsonb ->> j.provider_kind)::float8,
                          %(stale_legacy_s)s::float8) + %(horizon_extra_s)s::float8)
          OR (j.provider_call_started_at < %(cutoff)s::timestamptz
              AND (j.reconcile_next_at IS NULL
                   OR j.reconcile_next_at <= %(now)s::timestamptz)
              AND NOT (j.call_state = 'finalizing'
                       AND j.finalize_lease_until > %(now)s::timestamptz)
              AND {{stale_rule}}))

-- fragment: claim_seed_rows
-- (the seed_rows branch's predicate: see reconcile_claim)
j.status IN ('pending', 'processing')
      AND j.call_state IS NULL
      AND (j.provider_call_started_at < %(cutoff)s::timestamptz
           OR (j.provider_call_started_at IS NULL
               AND (j.created_at < cut.legacy_cutoff
                    OR (j.created_at < %(reserved_before)s::timestamptz
                        -- LIMIT 1: a look-up per row through usage_logs_job_id_idx, never
                        -- a hashed scan of every reserved row
                        AND (SELECT true FROM usage_logs u WHERE u.job_id = j.id
                               AND u.status = 'reserved' LIMIT 1)))))
      AND (j.reconcile_lease_until IS NULL OR j.reconcile_lease_until <= %(now)s::timestamptz)
      AND {{stale_rule}}

-- fragment: claim_returning
RETURNING j.id, j.status, j.call_state, j.call_version, j.provider_kind, j.provider_task_id,
          j.provider_call_started_at, j.call_sync, j.reconcile_attempts,
          j.reconcile_last_error, j.reconcile_next_at, j.error_message, j.finalize_owner,
          j.finalize_lease_until, j.upstream_result::text AS upstream_result,
          j.call_output::text AS call_output, j.provider_cost, j.call_finished_at,
          j.call_settlement, j.heartbeat_at, j.started_at, j.created_at,
          CASE WHEN j.call_state IS NULL AND j.provider_call_started_at IS NULL
                    AND j.created_at < %(reserved_before)s::timestamptz
                    AND (SELECT true FROM usage_logs u WHERE u.job_id = j.id
                           AND u.status = 'reserved' LIMIT 1)
               THEN greatest(cut.legacy_cutoff, %(reserved_before)s::timestamptz)
               ELSE cut.legacy_cutoff END AS legacy_cutoff,
          (SELECT count(*) FROM usage_logs u
            WHERE u.job_id = j.id AND u.status <> 'reserved') AS settled_reservations

-- name: reconcile_renew
-- Before acting on a claimed call: extend the claim from the time of renewal, only if it
-- is still ours (a claim that expired and was taken by another reconciler is never acted
-- on).
UPDATE jobs
SET reconcile_lease_until = %(lease_until)s::timestamptz
WHERE id = %(job_id)s::uuid AND reconcile_owner = %(owner)s::text
RETURNING id;

-- name: reconcile_release
-- Done with the call (whatever happened): drop the claim, only if it is still ours.
UPDATE jobs
SET reconcile_owner = NULL, reconcile_lease_until = NULL
WHERE id = %(job_id)s::uuid AND reconcile_owner = %(owner)s::text;

-- name: reconcile_park
-- A call the reconciler cannot read (its log does not decode or replay, or the row's
-- call_version is not its length): keep it out of the claims until %(until)s (only the
-- claim columns are written; nothing about the call changes), so one bad row never costs
-- every pass.
UPDATE jobs
SET reconcile_owner = NULL, reconcile_lease_until = %(until)s::timestamptz
WHERE id = %(job_id)s::uuid AND reconcile_owner = %(owner)s::text;

-- fragment: stale_rule
-- The staleness rule over the row j: the same rule as the function
-- callwarden.callwarden_is_stale (migration 0011) and StaleRule in engine/rules/stale.py
-- (tests/integration/test_stale_rule.py holds the three equal). Written out, not called:
-- the planner never inlines a function with a fixed search_path, and called per candidate
-- row it costs 6.6 us a row against 0.4 us inlined (200,000 rows, Postgres 15). A call that
-- heartbeated is stale once its heartbeat is heartbeat_timeout_s old; one that never did,
-- once it is its kind's threshold old; a row with no call start is aged from the host's
-- started_at (else created_at) against the legacy threshold.
(CASE
    WHEN j.heartbeat_at IS NOT NULL THEN
        %(now)s::timestamptz - j.heartbeat_at
            >= make_interval(secs => %(stale_heartbeat_s)s::float8)
    WHEN j.provider_call_started_at IS NOT NULL THEN
        %(now)s::timestamptz - j.provider_call_started_at >= make_interval(secs =>
            coalesce((%(stale_thresholds)s::jsonb ->> j.provider_kind)::float8,
                     %(stale_legacy_s)s::float8))
    ELSE
        coalesce(%(now)s::timestamptz - coalesce(j.started_at, j.created_at)
                 >= make_interval(secs => %(stale_legacy_s)s::float8), false)
END)

-- name: reconcile_outside
-- Jobs the host ended (status not pending/processing) on which callwarden never recorded a
-- call, created since %(since)s (outside_window_s ago): each gets its HostEnded
-- (engine/reconciler/outside.py), the append fenced on call_version 0, the status read and
-- the reservations settled as read, so two reconcilers record it once and a host that
-- reopens the job meanwhile wins. jobs_ended_outside_idx (0015) serves the window.
SELECT j.id, j.status,
       (SELECT count(*) FROM usage_logs u
         WHERE u.job_id = j.id AND u.status <> 'reserved') AS settled_reservations
FROM jobs j
WHERE j.call_state IS NULL AND j.status NOT IN ('pending', 'processing')
  AND j.created_at >= %(since)s::timestamptz
ORDER BY j.created_at
LIMIT %(batch_size)s;

-- name: reconcile_leftovers
-- Calls the host completed (HostEnded: settlement 'host') whose reservation is still
-- 'reserved' host_left_after_s after callwarden recorded that (call_finished_at, its own
-- clock's time, before %(before)s): the host's commit never came. Each gets
-- LeftoverSettled by the policy (engine/reconciler/outside.py). usage_logs_reserved_idx
-- (0015) holds only the reserved rows.
SELECT DISTINCT j.id
FROM usage_logs u
JOIN jobs j ON j.id = u.job_id
WHERE u.status = 'reserved'
  AND j.call_settlement = 'host'
  AND j.call_finished_at < %(before)s::timestamptz
LIMIT %(batch_size)s;
