-- name: callback_token_ensure
-- The job's callback token, set once (a redelivered job keeps the token its upstream task
-- was created with).
UPDATE jobs
SET callback_token = COALESCE(callback_token, %(token)s::text)
WHERE id = %(job_id)s::uuid
RETURNING callback_token;
