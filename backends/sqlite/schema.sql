-- Generated from stepstone.stores.sqlite (schema_ddl()); do not edit by hand.
-- SQLiteStore runs these statements in one BEGIN IMMEDIATE transaction on open.
CREATE TABLE IF NOT EXISTS stepstone_checkpoints (
    run_id TEXT NOT NULL,
    version TEXT NOT NULL,
    status TEXT NOT NULL,
    step INTEGER NOT NULL,
    total_steps INTEGER,
    created_at TEXT,
    updated_at TEXT NOT NULL,
    due_at TEXT,
    owner TEXT,
    document TEXT NOT NULL,
    PRIMARY KEY (run_id)
);

CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_at_rest ON stepstone_checkpoints (status, updated_at) WHERE status != 'running';

CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_queued ON stepstone_checkpoints (due_at) WHERE status = 'queued';

CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_running ON stepstone_checkpoints (owner) WHERE status = 'running';

CREATE INDEX IF NOT EXISTS ix_stepstone_checkpoints_waiting ON stepstone_checkpoints (due_at) WHERE status = 'waiting';

CREATE TABLE IF NOT EXISTS stepstone_meta (
    "key" TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY ("key")
);

INSERT INTO stepstone_meta ("key", value) VALUES ('schema_version', '2') ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS stepstone_pieces (run_id TEXT NOT NULL, piece_key TEXT NOT NULL, gen INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_id, piece_key));
