-- Fewer index writes per job (docs/architecture.md, "Fewer index writes per job").
--
-- A job's row is updated on its way to RUNNING (and on every heartbeat), its outbox
-- row when it is claimed and when it is SENT. An update that changes no indexed
-- column and finds room on its page is a HOT update: no index is touched. So:
--
-- * no index on jobs names `status` any more: QUEUED -> RUNNING, the start of a run and
--   the heartbeats change no indexed column. Pruning finds finished jobs by
--   `finished_at`, which only terminal states set;
-- * the outbox's listing by status keeps an index only for the rows not SENT (a few,
--   where a scan of the listing index in time order would have to pass over every
--   SENT row to find them); SENT rows leave it instead of being written into it;
-- * a job's outbox row has no entry in the task index;
-- * both tables leave a fifth of each page free, so that those updates find room
--   beside the row they replace.
ALTER TABLE jobs SET (fillfactor = 80);
ALTER TABLE relay_outbox SET (fillfactor = 80);

DROP INDEX jobs_status_finished;
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;

DROP INDEX relay_outbox_status_created;
CREATE INDEX relay_outbox_unsent ON relay_outbox (status, created_at DESC, id DESC)
    WHERE status <> 'SENT';

DROP INDEX relay_outbox_task;
CREATE INDEX relay_outbox_task ON relay_outbox (task_id) WHERE task_id IS NOT NULL;
