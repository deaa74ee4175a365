-- Postgres overrides, where the dialects differ: JSON arrays as jsonb.
-- (The claims' `/* FOR UPDATE SKIP LOCKED */` in common.sql is uncommented for
-- Postgres when the blocks load: any number of relays and claimers share one
-- table without waiting on each other. SQLite's BEGIN IMMEDIATE needs no lock.)

-- name: claim_relay_due
-- The due rows' ids as an array, then each row by primary key: with `id IN (subquery)`
-- the planner hash-joined the subquery against a sequential scan of the whole table,
-- SENT rows included (a millisecond per 5,000 rows, on every round).
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id = ANY(ARRAY(SELECT id FROM relay_outbox
                       WHERE status IN ('PENDING', 'RETRYABLE_FAILED') AND next_attempt_at <= :now
                         AND (claimed_until IS NULL OR claimed_until < :now)
                       ORDER BY next_attempt_at
                       LIMIT :limit
                       FOR UPDATE SKIP LOCKED))
RETURNING *;

-- name: relay_mark_sent
-- A round's rows SENT, written once: the `sent` part of `relay_sent_many` and of
-- `relay_sent_and_claim_due`, which name it in braces (the loader puts this text there).
-- The version guard refuses a row a newer holder (or a redrive) owns since. :ids, :versions
-- and :message_ids are parallel arrays; a row finds its own by array_position, and
-- `id = ANY(:ids)` is planned as a lookup of a few rows by primary key.
UPDATE relay_outbox
   SET status = 'SENT', sent_at = :now, claimed_until = NULL, last_error = NULL,
       queue_message_id = (CAST(:message_ids AS text[]))[
           array_position(CAST(:ids AS text[]), id)],
       version = version + 1
 WHERE id = ANY(CAST(:ids AS text[]))
   AND version = (CAST(:versions AS integer[]))[array_position(CAST(:ids AS text[]), id)]
RETURNING *;

-- name: relay_sent_and_claim_due
-- The relay loop's transaction per round in one statement: the round that was sent is
-- marked SENT (`relay_mark_sent`), its jobs RUNNING and its tasks SENT, and the next round
-- is claimed. One round trip instead of five (BEGIN, three statements, COMMIT), and one
-- executor start. The parts share one snapshot, so the claim is told which rows are being
-- recorded and leaves them alone even should their lease have run out (Postgres does not
-- say which of two updates of one row in one statement takes effect). The rows come back
-- as one set: `sent` says which part a row is from. A round with failures takes the
-- general path (storage/store/relay.py).
WITH sent AS (
{relay_mark_sent}
), running AS (
    UPDATE jobs SET status = 'RUNNING', updated_at = :now
     WHERE status = 'QUEUED' AND id = ANY(ARRAY(SELECT job_id FROM sent))
    RETURNING id, status, attempts
), {dispatched_events}, tasks AS (
    UPDATE task_runs SET status = 'SENT'
     WHERE status = 'PENDING' AND id = ANY(ARRAY(SELECT task_id FROM sent))
), claimed AS (
    UPDATE relay_outbox
       SET attempt_count = attempt_count + 1, claimed_until = :claimed_until,
           version = version + 1
     WHERE id = ANY(ARRAY(SELECT id FROM relay_outbox
                           WHERE status IN ('PENDING', 'RETRYABLE_FAILED')
                             AND next_attempt_at <= :now
                             AND (claimed_until IS NULL OR claimed_until < :now)
                             AND id <> ALL(CAST(:ids AS text[]))
                           ORDER BY next_attempt_at
                           LIMIT :limit
                           FOR UPDATE SKIP LOCKED))
    RETURNING *
)
SELECT true AS sent, * FROM sent
UNION ALL
SELECT false AS sent, * FROM claimed;

-- name: claim_relay_many
-- Rows are locked in id order, so two batches that share a row (concurrent replays of
-- one request) cannot deadlock; the one that waits then finds the row leased.
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id IN (SELECT id FROM relay_outbox
               WHERE id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))
               ORDER BY id
               FOR UPDATE)
   AND status IN ('PENDING', 'RETRYABLE_FAILED')
   AND (claimed_until IS NULL OR claimed_until < :now)
RETURNING *;

-- name: relay_sent_many
-- One statement, one round trip: the rows SENT (`relay_mark_sent`), and with them their
-- jobs RUNNING (when QUEUED) and their task runs SENT (when PENDING), what
-- `jobs_running_if_queued` and `tasks_sent` do in separate statements on SQLite, which has
-- no UPDATE in a WITH (`SqlStore._relay_sent` skips them where the driver's features say
-- the SENT marks are one statement). The rows are found by `id = ANY(:ids)`, parallel
-- arrays: a join with `jsonb_to_recordset`, which the planner takes for a hundred rows,
-- was planned as a hash join over a sequential scan of the outbox up to tens of thousands
-- of rows, and asyncpg's prepared statement kept it.
-- The jobs are found by primary key from the rows just updated: their status test is
-- written so that no index could serve it (there is no index on jobs.status since
-- migration 0003; with stale statistics the planner once read every QUEUED job through
-- one, for each batch).
-- Its commit does not wait for the WAL flush (`set_config(..., true)`: this transaction
-- only; the pooled connection stays `synchronous_commit = on`). The daemon dying costs
-- nothing: Postgres has the commit. Postgres or its machine failing within a fraction of a
-- second could undo the marks; the rows are then published again once their lease runs
-- out, as after a crash between SQS's answer and this statement: a duplicate message,
-- which the consumer's idempotency absorbs. Any later commit that waits for the flush (an
-- intake, the consumer's) makes this one durable too: the WAL is flushed in order.
-- Measured in docs/decisions/0008-async-sent-commit-postgres.md.
WITH sent AS (
{relay_mark_sent}
), running AS (
UPDATE jobs SET status = 'RUNNING', updated_at = :now
  FROM sent
 WHERE jobs.id = sent.job_id AND (jobs.status = 'QUEUED') IS TRUE
RETURNING jobs.id, jobs.status, jobs.attempts
), {dispatched_events}, tasks AS (
UPDATE task_runs SET status = 'SENT'
  FROM sent
 WHERE task_runs.id = sent.task_id AND task_runs.status = 'PENDING'
)
SELECT sent.*
  FROM sent, (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit;

-- (`jobs_running_if_queued` and `tasks_sent` have no Postgres version: `relay_sent_many`
-- does their work there.)

-- name: dispatched_events
-- The `dispatched` event of each job row just SENT, part of `relay_sent_many` and
-- `relay_sent_and_claim_due` (named in braces there), so the timeline commits with the SENT
-- mark. Its status is the job's after the statement: RUNNING when `running` moved it; else
-- (a row published again, a job the consumer moved meanwhile) the job's latest committed
-- status, read with a lock so it is not an older snapshot's.
dispatched AS (
    INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
    SELECT sent.job_id, :now, 'dispatched', COALESCE(running.status, other.status),
           COALESCE(running.attempts, other.attempts), :ev_instance,
           json_build_object('messageId', sent.queue_message_id, 'outboxId', sent.id)::text
      FROM sent
      LEFT JOIN running ON running.id = sent.job_id
      LEFT JOIN LATERAL (SELECT j.status, j.attempts FROM jobs j
                          WHERE j.id = sent.job_id AND running.id IS NULL
                          FOR SHARE) AS other ON TRUE
     WHERE sent.job_id IS NOT NULL
)

-- name: event_of_changed
-- The event of a job change in the change's own statement: `WITH changed AS (<the UPDATE
-- ... RETURNING *>), {event_of_changed} SELECT * FROM changed` (the `<name>_ev` blocks).
ev AS (
    INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
    SELECT id, :ev_at, :ev_type, status, attempts, :ev_instance, :ev_detail FROM changed
)

-- name: events_of_changed
-- Several events of one job change in the change's own statement (the `<name>_evs`
-- blocks): the progress steps a worker held (workers/progress.py), each at its own time,
-- then the change's own event. :ev_ats, :ev_types, :ev_statuses and :ev_details are
-- parallel arrays in the order the events happened; a NULL status is the changed row's.
-- Inserted in that order (ORDER BY the position), so their seqs follow it.
evs AS (
    INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
    SELECT changed.id, e.at, e.type, COALESCE(e.status, changed.status), changed.attempts,
           :ev_instance, e.detail
      FROM changed,
           unnest(CAST(:ev_ats AS double precision[]), CAST(:ev_types AS text[]),
                  CAST(:ev_statuses AS text[]), CAST(:ev_details AS text[]))
               WITH ORDINALITY AS e(at, type, status, detail, n)
     ORDER BY e.n
)

-- name: update_job_progress_evs
WITH changed AS ({update_job_progress}), {events_of_changed} SELECT * FROM changed;

-- name: finish_job_evs
WITH changed AS ({finish_job}), {events_of_changed} SELECT * FROM changed;

-- name: start_job_run_ev
WITH changed AS ({start_job_run}), {event_of_changed} SELECT * FROM changed;

-- name: park_job_ev
WITH changed AS ({park_job}), {event_of_changed} SELECT * FROM changed;

-- name: hold_job_ev
WITH changed AS ({hold_job}), {event_of_changed} SELECT * FROM changed;

-- name: resume_job_ev
WITH changed AS ({resume_job}), {event_of_changed} SELECT * FROM changed;

-- name: update_job_progress_ev
WITH changed AS ({update_job_progress}), {event_of_changed} SELECT * FROM changed;

-- name: finish_job_ev
WITH changed AS ({finish_job}), {event_of_changed} SELECT * FROM changed;

-- name: job_retry_later_ev
WITH changed AS ({job_retry_later}), {event_of_changed} SELECT * FROM changed;

-- name: release_job_lease_ev
WITH changed AS ({release_job_lease}), {event_of_changed} SELECT * FROM changed;

-- name: job_dead_ev
WITH changed AS ({job_dead}), {event_of_changed} SELECT * FROM changed;

-- name: redrive_job_ev
WITH changed AS ({redrive_job}), {event_of_changed} SELECT * FROM changed;

-- name: job_requeue_if_dead_ev
WITH changed AS ({job_requeue_if_dead}), {event_of_changed} SELECT * FROM changed;

-- name: job_cancel_now_ev
WITH changed AS ({job_cancel_now}), {event_of_changed} SELECT * FROM changed;

-- name: job_cancel_request_ev
WITH changed AS ({job_cancel_request}), {event_of_changed} SELECT * FROM changed;

-- name: job_cancelled_by_worker_ev
WITH changed AS ({job_cancelled_by_worker}), {event_of_changed} SELECT * FROM changed;

-- name: job_event_marks
SELECT job_id, MAX(seq) AS seq FROM job_events
 WHERE job_id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))
 GROUP BY job_id;

-- name: delete_job_events_of
DELETE FROM job_events WHERE job_id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)));

-- name: login_subject_lock
-- One login decision per username at a time (released at the transaction's end); the first
-- key names this use (decision 0028), the second the username's keyed hash.
SELECT pg_advisory_xact_lock(28, hashtext(:subject));

-- name: login_throttles_of
SELECT * FROM portal_login_throttle
 WHERE subject IN (SELECT jsonb_array_elements_text(CAST(:subjects AS jsonb)));

-- name: delete_jobs_of
DELETE FROM jobs WHERE id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)));

-- Cluster pacing takes the time from the database, so instances on VMs whose
-- clocks disagree still keep one pace. The row lock of the UPDATE queues
-- concurrent takers; each one re-reads next_at after the one before it.

-- name: pace_take
WITH c AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now)
UPDATE pace
   SET last_at = GREATEST(pace.next_at, pace.paused_until, c.now),
       next_at = GREATEST(pace.next_at, pace.paused_until, c.now) + :delay,
       updated_at = c.now
  FROM c
 WHERE pace.name = :name
RETURNING pace.last_at AS slot, pace.paused_until, c.now AS now;

-- name: pace_pause
WITH c AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now)
UPDATE pace
   SET paused_until = GREATEST(pace.paused_until, c.now + :pause_s), updated_at = c.now
  FROM c
 WHERE pace.name = :name
RETURNING pace.paused_until, c.now AS now;

-- name: pace_read
SELECT name, last_at, next_at, paused_until,
       CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now
  FROM pace WHERE name = :name;

-- name: pace_all
WITH c AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now)
SELECT p.name, p.last_at, p.next_at, p.paused_until, c.now,
       (SELECT COUNT(*) FROM pace_leases l
         WHERE l.name = p.name AND l.holder IS NOT NULL AND l.expires_at > c.now) AS sessions
  FROM pace p, c ORDER BY p.name;

-- name: lease_take
WITH c AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now)
UPDATE pace_leases SET holder = :holder, expires_at = c.now + :lease_s
  FROM c
 WHERE pace_leases.name = :name
   AND pace_leases.slot = (SELECT l.slot FROM pace_leases l
                            WHERE l.name = :name AND l.slot < :limit
                              AND (l.holder IS NULL
                                   OR l.expires_at
                                      <= CAST(extract(epoch FROM clock_timestamp())
                                              AS double precision))
                            ORDER BY l.slot LIMIT 1
                            FOR UPDATE SKIP LOCKED)
RETURNING pace_leases.slot, pace_leases.expires_at, c.now AS now;

-- name: lease_renew
UPDATE pace_leases
   SET expires_at = CAST(extract(epoch FROM clock_timestamp()) AS double precision) + :lease_s
 WHERE name = :name AND slot = :slot AND holder = :holder;

-- name: insert_jobs_many
-- Group commit: a group's jobs and their outbox rows in one statement (one round trip).
-- A key already taken, before or by an earlier member of the group, inserts nothing and
-- returns no row; that member then runs alone and finds the job. It returns only the ids it
-- inserted: the store builds the rows from what it wrote (storage/store/records.py
-- `inserted_job`), cheaper than sending them back. Past :not_after (the
-- caller's own deadline for the statement) nothing is written and every member runs alone.
WITH j AS (
    SELECT *
      FROM unnest(CAST(:ids AS text[]), CAST(:outbox_ids AS text[]), CAST(:portals AS text[]),
                  CAST(:user_ids AS text[]), CAST(:keys AS text[]),
                  CAST(:fingerprints AS text[]), CAST(:key_ids AS text[]),
                  CAST(:sealed AS bytea[]), CAST(:nows AS double precision[]),
                  CAST(:claimed_untils AS double precision[]), CAST(:traceparents AS text[]),
                  CAST(:login_subjects AS text[]))
           AS t(id, outbox_id, portal, user_id, idempotency_key, fingerprint, key_id, sealed, ts,
                claimed_until, traceparent, login_subject)
     -- Run outside an explicit transaction, the statement commits itself: should it reach
     -- the server only after the client gave up on it (a network that held it past the
     -- command timeout, the caller answered 503), it writes nothing.
     WHERE extract(epoch FROM clock_timestamp()) < :not_after
), job AS (
    INSERT INTO jobs (id, kind, portal, user_id, idempotency_key, fingerprint, status,
                      key_id, sealed, created_at, updated_at, traceparent, login_subject)
    SELECT id, 'portal_link', portal, user_id, idempotency_key, fingerprint, 'QUEUED',
           key_id, sealed, ts, ts, traceparent, login_subject
      FROM j
    ON CONFLICT (user_id, idempotency_key) DO NOTHING
    RETURNING id, created_at, status, attempts
), relay AS (
    INSERT INTO relay_outbox (id, kind, job_id, task_id, status, next_attempt_at, dedup_id,
                              created_at, claimed_until, attempt_count, traceparent)
    SELECT j.outbox_id, 'job', job.id, NULL, 'PENDING', j.ts, job.id, j.ts,
           j.claimed_until, CASE WHEN j.claimed_until IS NULL THEN 0 ELSE 1 END, j.traceparent
      FROM job JOIN j ON j.id = job.id
    RETURNING job_id
), accepted AS (
    -- Each new job's first event, in the statement that makes the job.
    INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
    SELECT id, created_at, 'accepted', status, attempts, :ev_instance, NULL FROM job
)
SELECT job.id
  FROM job JOIN relay ON relay.job_id = job.id;

-- name: notify_job_changes
-- Jobs this process committed changes to, told to every process LISTENing on the channel of
-- storage/store/__init__.py `JOB_CHANNEL`, a notification per payload of storage/notifier.py
-- `payloads` (its token and up to 200 job ids): a statement of its own after the commits,
-- never inside a write transaction (docs/decisions/0023-notify-after-commit.md).
SELECT pg_notify('outboxd_jobs', p) FROM unnest(CAST(:payloads AS text[])) AS p;

-- name: cap_lock
-- A per-user cap's lock (storage/store/base.py `_cap_lock`), held until the transaction ends:
-- the user's concurrent intakes (or registrations) take turns from here to their commit, so
-- the count that follows sees every row the others wrote. An advisory lock needs no row, no
-- table and nothing to clean up; two users whose ids hash alike merely take turns. `hashtext`
-- need only agree among the sessions of one server, which it does.
SELECT pg_advisory_xact_lock(CAST(:cap AS integer), hashtext(:user_id));

-- name: audit_prune_open
-- The append-only trigger lets this transaction's DELETEs through, and no other's.
SELECT set_config('outboxd.audit_prune', 'on', true);

-- name: audit_prune_close
SELECT set_config('outboxd.audit_prune', 'off', true);

-- name: growth_file
-- No one file: each table's size is read with the table (growth_tables), always split.
SELECT NULL AS bytes, NULL AS free_bytes, true AS split;

-- name: growth_tables
-- outboxd's tables in its schema (storage/growth_ports.py `OUTBOXD_TABLES`: the schema may
-- hold other applications' tables), each with its indexes and TOAST, and the statistics
-- collector's live and dead row estimates (flushed by each backend at most once a second or
-- so: they lag the writes a little). Reading a size takes the table's weakest lock for the
-- statement, which only an ACCESS EXCLUSIVE lock (ALTER TABLE, VACUUM FULL) waits for.
SELECT s.relname AS name,
       coalesce(pg_total_relation_size(s.relid), 0) AS bytes,
       s.n_live_tup AS live,
       s.n_dead_tup AS dead
  FROM pg_stat_user_tables AS s
 WHERE s.schemaname = current_schema() AND s.relname = ANY(CAST(:tables AS text[]));

-- name: growth_oldest_transaction
-- How long the oldest transaction open in this database has run: any session's with a
-- transaction under way, idle in it or not, and any prepared transaction; this read's own
-- session and autovacuum's workers aside (a vacuum's own snapshot holds back no other vacuum).
-- That transaction holds back vacuum: no row deleted or updated since it began can be removed
-- until it ends. Other roles' sessions show their times only to a role with
-- pg_read_all_stats (pg_monitor); without it they are not seen (docs/operations.md).
SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp() - min(t.started)) AS double precision) AS age_s
  FROM (SELECT xact_start AS started FROM pg_stat_activity
         WHERE datname = current_database() AND xact_start IS NOT NULL
           AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
        UNION ALL
        SELECT prepared FROM pg_prepared_xacts WHERE database = current_database()) AS t;
