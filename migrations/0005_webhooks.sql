-- The service face (issue 8): per-job callback tokens and webhook replay protection.
--
-- callback_token: the secret in a KIE callback URL (/webhooks/kie/{job_id}/{token}), set
-- once when the call starts; without a KIE HMAC key it is what authenticates a callback.
-- webhook_deliveries: one row per signed delivery processed (Replicate webhook-id,
-- ElevenLabs signature, KIE signature + body digest), so a replay within the signature
-- tolerance is refused; rows older than the tolerance are pruned (a replay that old is
-- refused as stale anyway).

ALTER TABLE jobs
    ADD COLUMN IF NOT EXISTS callback_token text;

CREATE TABLE IF NOT EXISTS webhook_deliveries (
    provider    text        NOT NULL,
    delivery_id text        NOT NULL,
    job_id      uuid,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, delivery_id)
);

CREATE INDEX IF NOT EXISTS webhook_deliveries_received_at_idx
    ON webhook_deliveries (received_at);
