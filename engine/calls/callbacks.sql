-- name: callback_token_ensure
-- The job's callback token, set once (a redelivered job keeps the token its upstream task
-- was created with): kept in callwarden's schema (migration 0011), never on the host's row
-- where a user's own-row policy would show it. The DO UPDATE writes nothing new: it makes
-- the statement return the token a concurrent or earlier prepare stored. No row: no job.
INSERT INTO callwarden.callback_tokens AS t (job_id, token)
SELECT j.id, %(token)s::text FROM jobs j WHERE j.id = %(job_id)s::uuid
ON CONFLICT (job_id) DO UPDATE SET token = t.token
RETURNING t.token AS callback_token;
