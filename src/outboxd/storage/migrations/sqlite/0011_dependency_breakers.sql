-- One breaker per outside system (portal, ai, sqs) for the whole cluster: its state lives
-- here so every instance sees it, and an operator's pause outlives restarts
-- (docs/decisions/0033-dependency-breakers.md). Additive only: the previous release runs
-- on this schema and ignores the table and the column.
--
-- dependencies: failures_in_a_row counts runs in a row, from any instance, that ended in an
-- outage failure, down_since set = the breaker is open. probe_job / probe_until: the one
-- piece of waiting work chosen as the cluster's probe, and until when no other is chosen.
-- paused_*: an operator's pause (reason required, paused_until NULL = until resumed).
CREATE TABLE dependencies (
    name              TEXT PRIMARY KEY,
    failures_in_a_row INTEGER NOT NULL DEFAULT 0,
    down_since        REAL,
    last_error        TEXT,
    last_failure_at   REAL,
    last_probe_at     REAL,
    probe_job         TEXT,
    probe_until       REAL,
    paused_at         REAL,
    paused_until      REAL,
    pause_reason      TEXT,
    paused_by         TEXT,
    updated_at        REAL NOT NULL DEFAULT 0,
    version           INTEGER NOT NULL DEFAULT 0
);
INSERT INTO dependencies (name) VALUES ('portal'), ('ai'), ('sqs');

-- A job's relay row that waits for a dependency to come back (not published until then):
-- the dependency's name. The breaker makes them due when it closes, and picks its probe
-- among them, oldest first.
ALTER TABLE relay_outbox ADD COLUMN waits_for TEXT;
CREATE INDEX relay_outbox_waiting ON relay_outbox (waits_for, created_at)
    WHERE waits_for IS NOT NULL;
