-- Host baseline: the tables the seed design assumes already exist on the host.
-- Every statement is IF NOT EXISTS, so on a real host (which has these tables) this
-- migration is a no-op; on an empty database it creates a minimal compatible schema.

CREATE TABLE IF NOT EXISTS workflow_executions (
    id            uuid PRIMARY KEY,
    status        text NOT NULL DEFAULT 'running',
    failed_nodes  text[] NOT NULL DEFAULT '{}',
    error_message text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS jobs (
    id                    uuid PRIMARY KEY,
    user_id               text NOT NULL,
    job_type              text NOT NULL DEFAULT 'image',
    status                text NOT NULL DEFAULT 'pending',
    input_data            jsonb NOT NULL DEFAULT '{}'::jsonb,
    output_data           jsonb,
    error_message         text,
    provider              text,
    provider_cost         numeric,
    display_cost          numeric,
    should_watermark      boolean,
    is_public             boolean,
    workflow_execution_id uuid REFERENCES workflow_executions (id),
    node_id               text,
    progress              integer NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    started_at            timestamptz,
    completed_at          timestamptz,
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS usage_logs (
    id                bigserial PRIMARY KEY,
    job_id            uuid NOT NULL REFERENCES jobs (id),
    user_id           text NOT NULL,
    status            text NOT NULL DEFAULT 'reserved'
                      CHECK (status IN ('reserved', 'committed', 'refunded')),
    credits_reserved  numeric NOT NULL CHECK (credits_reserved >= 0),
    credits_charged   numeric,
    created_at        timestamptz NOT NULL DEFAULT now(),
    settled_at        timestamptz
);

CREATE INDEX IF NOT EXISTS usage_logs_job_id_idx ON usage_logs (job_id);

CREATE TABLE IF NOT EXISTS assets (
    id           bigserial PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES jobs (id),
    user_id      text NOT NULL,
    storage_key  text NOT NULL,
    url          text NOT NULL,
    content_type text NOT NULL,
    size_bytes   bigint NOT NULL,
    is_public    boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX IF NOT EXISTS assets_job_key_idx ON assets (job_id, storage_key);
