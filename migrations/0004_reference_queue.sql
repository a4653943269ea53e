-- The reference worker's queue, on the jobs table (callwarden worker / enqueue).
--
-- At-least-once delivery, as real queues do it: a claim sets queue_owner (a process
-- incarnation) and queue_lease_until (now + the visibility timeout); a live worker extends
-- the lease while its call runs; a job whose worker died is claimable again once the lease
-- has expired (queue_deliveries counts deliveries). The ack (fenced on the owner) takes the
-- job out of the queue for good: what is left of its call belongs to the reconciler.
-- A host that drives jobs with its own queue never touches these columns.

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS queue_owner       text,
    ADD COLUMN IF NOT EXISTS queue_lease_until timestamptz,
    ADD COLUMN IF NOT EXISTS queue_deliveries  int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS queue_acked_at    timestamptz;

-- The claim's scan: only unacked, unfinished jobs are in this index.
CREATE INDEX IF NOT EXISTS jobs_queue_claim_idx
    ON jobs (created_at)
    WHERE queue_acked_at IS NULL AND status IN ('pending', 'processing');
