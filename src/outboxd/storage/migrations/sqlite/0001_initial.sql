-- Times are Unix epoch seconds (REAL) on both backends, so the same code and
-- the same comparisons serve SQLite and Postgres.
CREATE TABLE jobs (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    portal          TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('QUEUED','RUNNING','SUCCEEDED','FAILED','DEAD')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    key_id          TEXT,
    sealed          BLOB,
    lease_until     REAL,
    progress        TEXT,
    error_code      TEXT,
    error_message   TEXT,
    result          TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    finished_at     REAL,
    version         INTEGER NOT NULL DEFAULT 0,
    UNIQUE (user_id, idempotency_key)
);
CREATE INDEX jobs_status_finished ON jobs (status, finished_at);

CREATE TABLE task_runs (
    id          TEXT PRIMARY KEY,
    type        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    dedup_id    TEXT NOT NULL UNIQUE,
    status      TEXT NOT NULL CHECK (status IN ('PENDING','SENT','SUCCEEDED','FAILED','DEAD')),
    error       TEXT,
    enqueued_at REAL NOT NULL,
    finished_at REAL,
    version     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX task_runs_type_enqueued ON task_runs (type, enqueued_at DESC, id DESC);
CREATE INDEX task_runs_enqueued ON task_runs (enqueued_at DESC, id DESC);

CREATE TABLE relay_outbox (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('job','task')),
    job_id           TEXT REFERENCES jobs (id) ON DELETE CASCADE,
    task_id          TEXT REFERENCES task_runs (id) ON DELETE CASCADE,
    status           TEXT NOT NULL CHECK (status IN ('PENDING','SENT','RETRYABLE_FAILED','DEAD')),
    attempt_count    INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL NOT NULL,
    last_error       TEXT,
    queue_message_id TEXT,
    dedup_id         TEXT NOT NULL,
    created_at       REAL NOT NULL,
    sent_at          REAL,
    -- A relay holds a row it is publishing until this time (a lease, not a backoff).
    claimed_until    REAL,
    version          INTEGER NOT NULL DEFAULT 0,
    CHECK ((kind = 'job') = (job_id IS NOT NULL) AND (kind = 'task') = (task_id IS NOT NULL)),
    CHECK (status <> 'SENT' OR queue_message_id IS NOT NULL)
);
-- The relay's scan: eligible rows by due time, and nothing else in the index.
CREATE INDEX relay_outbox_eligible ON relay_outbox (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRYABLE_FAILED');
CREATE INDEX relay_outbox_job ON relay_outbox (job_id);
CREATE INDEX relay_outbox_task ON relay_outbox (task_id);
CREATE INDEX relay_outbox_created ON relay_outbox (created_at DESC, id DESC);
CREATE INDEX relay_outbox_status_created ON relay_outbox (status, created_at DESC, id DESC);

CREATE TABLE websites (
    id          TEXT PRIMARY KEY,
    domain      TEXT NOT NULL UNIQUE,
    favicon_url TEXT,
    category    TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    version     INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE work_outbox (
    id            TEXT PRIMARY KEY,
    website_id    TEXT NOT NULL UNIQUE REFERENCES websites (id) ON DELETE CASCADE,
    status        TEXT NOT NULL CHECK (status IN ('PENDING','PROCESSING','COMPLETED','FAILED')),
    attempt_count INTEGER NOT NULL DEFAULT 0,
    attempted_at  REAL,
    last_error    TEXT,
    created_at    REAL NOT NULL,
    version       INTEGER NOT NULL DEFAULT 0
);
-- The claimer's three scans (never tried, retries, stale PROCESSING) each read
-- one small partial index in order, whatever the size of the COMPLETED history.
CREATE INDEX work_outbox_fresh ON work_outbox (created_at) WHERE status = 'PENDING' AND attempted_at IS NULL;
CREATE INDEX work_outbox_retry ON work_outbox (attempted_at) WHERE status = 'PENDING' AND attempted_at IS NOT NULL;
CREATE INDEX work_outbox_processing ON work_outbox (attempted_at) WHERE status = 'PROCESSING';
