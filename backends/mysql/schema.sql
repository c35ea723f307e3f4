-- Generated from stepstone.stores.mysql (schema_ddl()); do not edit by hand.
-- When the table is missing, MySQLStore runs these statements one by one
-- (MySQL commits each DDL statement by itself).
CREATE TABLE IF NOT EXISTS `stepstone_checkpoints` (
    run_key BINARY(32) NOT NULL,
    run_id VARCHAR(1024) NOT NULL,
    version VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    step INTEGER NOT NULL,
    total_steps INTEGER,
    created_at DATETIME(6),
    updated_at DATETIME(6) NOT NULL,
    due_at DATETIME(6),
    owner VARCHAR(1024),
    document LONGTEXT NOT NULL,
    PRIMARY KEY (run_key),
    INDEX `ix_stepstone_checkpoints_due` (status, due_at),
    INDEX `ix_stepstone_checkpoints_status` (status, updated_at),
    INDEX `ix_stepstone_checkpoints_updated_at` (updated_at)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE IF NOT EXISTS `stepstone_checkpoints_meta` (
    `key` VARCHAR(64) NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (`key`)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

INSERT INTO `stepstone_checkpoints_meta` (`key`, value) VALUES ('schema_version', '2') ON DUPLICATE KEY UPDATE `key` = `stepstone_checkpoints_meta`.`key`;

CREATE TABLE IF NOT EXISTS `stepstone_checkpoints_pieces` (run_key BINARY(32) NOT NULL, piece_key VARCHAR(64) NOT NULL, gen BIGINT NOT NULL, data LONGBLOB NOT NULL, PRIMARY KEY (run_key, piece_key));
