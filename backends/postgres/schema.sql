-- Generated from stepstone.stores.postgres (schema_ddl()); do not edit by hand.
-- When the table is missing, PostgresStore runs these statements in one transaction,
-- holding an advisory lock on the table name.
CREATE TABLE IF NOT EXISTS "stepstone_checkpoints" (
    run_key BYTEA NOT NULL,
    run_id TEXT NOT NULL,
    version VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    step INTEGER NOT NULL,
    total_steps INTEGER,
    created_at TIMESTAMP WITH TIME ZONE,
    updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    due_at TIMESTAMP WITH TIME ZONE,
    owner TEXT,
    document TEXT NOT NULL,
    PRIMARY KEY (run_key)
);

CREATE INDEX IF NOT EXISTS "ix_stepstone_checkpoints_due" ON "stepstone_checkpoints" (status, due_at);

CREATE INDEX IF NOT EXISTS "ix_stepstone_checkpoints_status" ON "stepstone_checkpoints" (status, updated_at);

CREATE INDEX IF NOT EXISTS "ix_stepstone_checkpoints_updated_at" ON "stepstone_checkpoints" (updated_at);

CREATE TABLE IF NOT EXISTS "stepstone_checkpoints_meta" (
    key VARCHAR(64) NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (key)
);

INSERT INTO "stepstone_checkpoints_meta" (key, value) VALUES ('schema_version', '2') ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS "stepstone_checkpoints_pieces" (run_key BYTEA NOT NULL, piece_key TEXT NOT NULL, gen BIGINT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (run_key, piece_key));
