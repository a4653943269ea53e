-- Living with the host (issue 11): callwarden's own copy of a completed call's output.
--
-- call_output: the media (and, later, text) a completed call produced, as callwarden wrote
-- it. The projection is read back from here only; the host's output_data is merged into,
-- never parsed (a host keeps its own shapes there).
-- Existing completed calls kept their output only in output_data: copy it over once.

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS call_output jsonb;

UPDATE jobs
SET call_output = jsonb_build_object('media', output_data -> 'media')
WHERE call_state = 'completed'
  AND call_output IS NULL
  AND jsonb_typeof(output_data) = 'object'
  AND jsonb_typeof(output_data -> 'media') = 'array';
