-- A relay row can be SUPERSEDED: a DEAD row whose job was redriven since (a fresh row
-- carries the retry) is no longer a dead letter, but stays as the job's history. SQLite
-- cannot change a CHECK constraint in place, so the table is rebuilt (SQLite's documented
-- way: a new table, the rows copied, the old one dropped, the new one renamed, its
-- indexes made again, all in the migration's one transaction). No other table refers to
-- relay_outbox. The copy rewrites the whole table: a large one takes a while, and writes
-- wait for it.
CREATE TABLE relay_outbox_new (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('job','task')),
    job_id           TEXT REFERENCES jobs (id) ON DELETE CASCADE,
    task_id          TEXT REFERENCES task_runs (id) ON DELETE CASCADE,
    status           TEXT NOT NULL
                     CHECK (status IN ('PENDING','SENT','RETRYABLE_FAILED','DEAD','SUPERSEDED')),
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

INSERT INTO relay_outbox_new (id, kind, job_id, task_id, status, attempt_count, next_attempt_at,
                              last_error, queue_message_id, dedup_id, created_at, sent_at,
                              claimed_until, version)
SELECT id, kind, job_id, task_id, status, attempt_count, next_attempt_at, last_error,
       queue_message_id, dedup_id, created_at, sent_at, claimed_until, version
  FROM relay_outbox;

DROP TABLE relay_outbox;
ALTER TABLE relay_outbox_new RENAME TO relay_outbox;

-- The indexes as migrations 0001 and 0003 left them.
CREATE INDEX relay_outbox_eligible ON relay_outbox (next_attempt_at)
    WHERE status IN ('PENDING', 'RETRYABLE_FAILED');
CREATE INDEX relay_outbox_job ON relay_outbox (job_id);
CREATE INDEX relay_outbox_task ON relay_outbox (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX relay_outbox_created ON relay_outbox (created_at DESC, id DESC);
CREATE INDEX relay_outbox_unsent ON relay_outbox (status, created_at DESC, id DESC)
    WHERE status <> 'SENT';

-- Dead letters that a redrive of their job already answered (a newer row of the same job
-- exists, in the order `select_latest_relay_for_job` reads) are closed now.
UPDATE relay_outbox
   SET status = 'SUPERSEDED', version = version + 1
 WHERE status = 'DEAD' AND job_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM relay_outbox n
                WHERE n.job_id = relay_outbox.job_id
                  AND (n.created_at > relay_outbox.created_at
                       OR (n.created_at = relay_outbox.created_at AND n.id > relay_outbox.id)));
