-- bench/admission.py's own statements (loaded with callwarden.database.queries.load_queries):
-- the jobs it starts, inserted by plain SQL as a host does, the limit row each writer runs
-- under, and the open calls it cancels between rounds (untimed).

-- name: new_jobs
-- (a) %(n)s pending jobs over 10 users, each with a fresh id.
INSERT INTO jobs (id, user_id, status)
SELECT gen_random_uuid(), 'u-' || (g %% 10), 'pending'
FROM generate_series(1, %(n)s) g
RETURNING id;

-- name: new_reservations
-- (a) Each of those jobs' reservation, 5 credits.
INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)
SELECT id, user_id, 'reserved', 5 FROM jobs WHERE id = ANY(%(jobs)s);

-- name: clear_limits
-- No limit row: every kind admitted without a count.
DELETE FROM callwarden.limits;

-- name: set_limit
-- The account's one limit row: every cap a parameter, NULL if unset (wait_s: 2, its default).
INSERT INTO callwarden.limits (account, kinds, in_flight, tenant_in_flight, creates, per_s,
                               wait_s)
VALUES (%(account)s, ARRAY[%(kind)s], %(in_flight)s, %(tenant_in_flight)s, %(creates)s,
        %(per_s)s, COALESCE(%(wait_s)s::float8, 2));

-- name: open_calls
-- (a) Every call of %(kind)s not yet ended: cancelled between rounds.
SELECT id FROM jobs
WHERE provider_kind = %(kind)s AND call_state IS NOT NULL
  AND call_state NOT IN ('completed', 'failed', 'swept', 'exhausted', 'cancelled');

-- name: burst_job
-- (b) One pending job of %(user_id)s.
INSERT INTO jobs (id, user_id, status) VALUES (gen_random_uuid(), %(user_id)s, 'pending')
RETURNING id;

-- name: burst_reservation
-- (b) That job's reservation, 5 credits.
INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)
VALUES (%(job_id)s, %(user_id)s, 'reserved', 5);
