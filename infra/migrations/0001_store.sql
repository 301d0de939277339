-- The store of one service, in that service's own schema (search_path is set by the caller).
-- offsets: the last stream sequence a consumer applied, written in the same transaction as
--          the state change, so a redelivered message is recognised and skipped.
-- records: the current state, one JSON document per (kind, key).
-- journal: append-only history per (kind, key) (a workload's events, the budget audit log...).
CREATE TABLE IF NOT EXISTS offsets (
    consumer   text PRIMARY KEY,
    stream_seq bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    kind text  NOT NULL,
    key  text  NOT NULL,
    doc  jsonb NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS journal (
    n    bigserial PRIMARY KEY,
    kind text  NOT NULL,
    key  text  NOT NULL,
    doc  jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_kind_key ON journal (kind, key, n);
