-- 0013: the contract columns of jobs a host's own table may lack (issue 40, item 10).
-- 0001 makes jobs with them only when the host has no jobs table; a host that had one
-- before callwarden may lack these three, and `callwarden check` then named each as a
-- problem that no migration fixed. Each is nullable with no default (no table rewrite):
-- a job without a workflow run, without a node, and public unless the host says otherwise
-- (docs/embedding.md, "The host contract").

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS workflow_execution_id uuid,
    ADD COLUMN IF NOT EXISTS node_id               text,
    ADD COLUMN IF NOT EXISTS is_public             boolean;
