-- Following and steering one job: the same as the Postgres migration 0007
-- (docs/decisions/0022-job-timeline-and-waits.md), without NOTIFY (a daemon on the file
-- polls job_events for the jobs its held requests wait on).
--
-- jobs gains CANCELLED in its CHECK, which SQLite can change only by rebuilding the table:
-- a new table, the rows copied, the old one dropped and the new one renamed (the runner
-- turns foreign keys off around a migration, so dropping the old table takes no relay
-- row with it, and checks them before the commit).
CREATE TABLE job_events (
    seq      INTEGER PRIMARY KEY,
    job_id   TEXT NOT NULL,
    at       REAL NOT NULL,
    type     TEXT NOT NULL,
    status   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    instance TEXT NOT NULL,
    detail   TEXT
);
-- A job's events in order: the index holds the rowid (seq) after job_id.
CREATE INDEX job_events_job ON job_events (job_id);

CREATE TABLE jobs_new (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL,
    portal           TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    status           TEXT NOT NULL
                     CHECK (status IN ('QUEUED','RUNNING','SUCCEEDED','FAILED','DEAD','CANCELLED')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    key_id           TEXT,
    sealed           BLOB,
    lease_until      REAL,
    progress         TEXT,
    error_code       TEXT,
    error_message    TEXT,
    result           TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL,
    version          INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    traceparent      TEXT,
    UNIQUE (user_id, idempotency_key)
);
INSERT INTO jobs_new (id, kind, portal, user_id, idempotency_key, fingerprint, status, attempts,
                      key_id, sealed, lease_until, progress, error_code, error_message, result,
                      created_at, updated_at, finished_at, version)
SELECT id, kind, portal, user_id, idempotency_key, fingerprint, status, attempts,
       key_id, sealed, lease_until, progress, error_code, error_message, result,
       created_at, updated_at, finished_at, version
  FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_created ON jobs (created_at DESC, id DESC);

ALTER TABLE relay_outbox ADD COLUMN traceparent TEXT;
