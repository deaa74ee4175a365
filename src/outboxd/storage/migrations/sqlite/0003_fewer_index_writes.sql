-- Fewer index writes per job: the same indexes as the Postgres migration 0003
-- (docs/architecture.md, "Fewer index writes per job"). SQLite rewrites only the
-- indexes whose columns an UPDATE changes, so with no index naming jobs.status a job's
-- way to RUNNING touches no index, and a row SENT leaves the small index of unsent rows
-- instead of moving inside a status index. (SQLite has no fillfactor.)
DROP INDEX jobs_status_finished;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

DROP INDEX relay_outbox_status_created;
CREATE INDEX relay_outbox_unsent ON relay_outbox (status, created_at DESC, id DESC)
    WHERE status <> 'SENT';

DROP INDEX relay_outbox_task;
CREATE INDEX relay_outbox_task ON relay_outbox (task_id) WHERE task_id IS NOT NULL;
