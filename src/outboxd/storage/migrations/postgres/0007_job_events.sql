-- Following and steering one job (docs/decisions/0022-job-timeline-and-waits.md):
--
-- * job_events: a job's timeline, one row per change of the job, written in the same
--   statement or transaction as the change. `seq` orders a job's events (it is global,
--   so gaps are normal); the primary key (job_id, seq) is the one index, serving both a
--   job's timeline and the deletion of a pruned job's events. No foreign key: the row
--   it would check was written by the same statement, and prune deletes events with
--   their job.
-- * NOTIFY outboxd_jobs with the job id, from a statement-level trigger on job_events:
--   every daemon LISTENing on the database wakes the requests held on that job.
-- * jobs: CANCELLED; cancel_requested (set by a cancel; a consumer running the job
--   stops at its next portal request); traceparent (W3C trace context, kept with the job
--   and carried to the worker as an SQS message attribute), also on the outbox row that
--   publishes it.
-- * jobs_created: the admin listing, newest first and by time range, without a sort of
--   the whole table (immutable columns: job updates stay HOT).
CREATE TABLE job_events (
    job_id   TEXT NOT NULL,
    seq      BIGINT GENERATED ALWAYS AS IDENTITY,
    at       DOUBLE PRECISION NOT NULL,
    type     TEXT NOT NULL,
    status   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    instance TEXT NOT NULL,
    detail   TEXT,
    PRIMARY KEY (job_id, seq)
);

CREATE FUNCTION outboxd_job_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outboxd_jobs', job_id) FROM (SELECT DISTINCT job_id FROM new_events) AS e;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_events_notify AFTER INSERT ON job_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION outboxd_job_events_notify();

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('QUEUED','RUNNING','SUCCEEDED','FAILED','DEAD','CANCELLED'));
ALTER TABLE jobs ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE jobs ADD COLUMN traceparent TEXT;
ALTER TABLE relay_outbox ADD COLUMN traceparent TEXT;
CREATE INDEX jobs_created ON jobs (created_at DESC, id DESC);
