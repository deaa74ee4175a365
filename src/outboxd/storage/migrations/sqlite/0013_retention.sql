-- Retention (docs/decisions/0035-retention.md). An index only: the previous release runs
-- unchanged.
-- DEAD jobs by when they died: what outbox.prune looks for (their credentials after
-- security.dead_retention_s, the jobs after retention.dead_s) without walking every finished
-- job. Few rows, written only when a job dies or is redriven.
CREATE INDEX jobs_dead ON jobs (finished_at) WHERE status = 'DEAD';
