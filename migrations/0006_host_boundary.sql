-- Living with the host (issue 11).
--
-- jobs.call_output: the media (and, later, text) a completed call produced, as callwarden
-- wrote it. The projection is read back from here only; the host's output_data is merged
-- into, never parsed (a host keeps its own shapes there). Existing completed calls kept
-- their output only in output_data: copied over once below.
-- usage_logs.settled_by_seq: the seq of the call event whose transaction settled the
-- reservation (NULL: settled by host code, or not yet). verify checks callwarden's own
-- settlements against the log, and a host's are told apart from them.

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS call_output jsonb;

ALTER TABLE usage_logs
    ADD COLUMN IF NOT EXISTS settled_by_seq int;

UPDATE jobs
SET call_output = jsonb_build_object('media', output_data -> 'media')
WHERE call_state = 'completed'
  AND call_output IS NULL
  AND jsonb_typeof(output_data) = 'object'
  AND jsonb_typeof(output_data -> 'media') = 'array';

-- Calls in flight across the upgrade: UpstreamSucceeded v2 moved inline-stored media keys
-- from result.raw.prestored_keys to result.stored_keys (the log is upcast on read); the
-- cached column is moved the same way, so finalizing such a call still finds its media.
UPDATE jobs
SET upstream_result = jsonb_set(upstream_result #- '{raw,prestored_keys}', '{stored_keys}',
                                upstream_result -> 'raw' -> 'prestored_keys')
WHERE jsonb_typeof(upstream_result -> 'raw' -> 'prestored_keys') = 'array'
  AND upstream_result -> 'stored_keys' IS NULL;
