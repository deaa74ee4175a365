-- Named statements shared by both backends; `<backend>.sql` overrides a block
-- of the same name. Parameters are `:name`, always bound, never formatted in.
-- A claim's `/* FOR UPDATE SKIP LOCKED */` is a comment on SQLite (BEGIN IMMEDIATE
-- already excludes competitors) and the clause itself on Postgres (storage/db.py). A block
-- named in braces inside another is replaced by its text (written once, used twice).

-- ---------------------------------------------------------------- jobs

-- name: insert_job
-- Without RETURNING, as insert_relay_row: the store knows what it wrote and builds the
-- records itself (storage/store/records.py `inserted_job`, `inserted_relay_row`).
-- login_subject: the username's keyed hash, by which an operator finds the job (never the
-- username itself; docs/decisions/0032-job-search-by-username-key.md).
INSERT INTO jobs (id, kind, portal, user_id, idempotency_key, fingerprint, status,
                  key_id, sealed, created_at, updated_at, traceparent, login_subject)
VALUES (:id, :kind, :portal, :user_id, :idempotency_key, :fingerprint, 'QUEUED',
        :key_id, :sealed, :now, :now, :traceparent, :login_subject)
ON CONFLICT (user_id, idempotency_key) DO NOTHING;

-- name: insert_relay_row
-- :claimed_until set: the row is inserted claimed (attempt 1, leased) by the request that
-- publishes it right after the commit.
INSERT INTO relay_outbox (id, kind, job_id, task_id, status, next_attempt_at, dedup_id, created_at,
                          claimed_until, attempt_count, traceparent)
VALUES (:id, :kind, :job_id, :task_id, 'PENDING', :next_attempt_at, :dedup_id, :now,
        :claimed_until, :attempt_count, :traceparent);

-- name: select_job
SELECT * FROM jobs WHERE id = :id;

-- name: select_job_by_key
SELECT * FROM jobs WHERE user_id = :user_id AND idempotency_key = :idempotency_key;

-- name: select_latest_relay_for_job
SELECT * FROM relay_outbox WHERE job_id = :job_id ORDER BY created_at DESC, id DESC LIMIT 1;

-- name: select_relay_row
SELECT * FROM relay_outbox WHERE id = :id;

-- name: start_job_run
-- A job whose cancel was requested is not started again: the consumer cancels it instead. A
-- parked job (park_job) starts only from the message of the outbox row that parked it
-- (:outbox_id, the message's): an older message of it, redelivered, is refused. What it
-- waited for (wait_for) stays until the run's outcome, or its `resumed` (resume_job).
-- Nor is a QUEUED job whose outbox row a publisher holds right now: its message is on SQS
-- but its SENT mark (and `dispatched` event) has not committed yet, and the timeline must
-- read dispatched before started (docs/decisions/0031-timeline-in-causal-order.md). Once
-- the holder's lease runs out (it died), the job starts without the mark.
UPDATE jobs
   SET status = 'RUNNING', attempts = attempts + 1, lease_until = :lease_until,
       updated_at = :now, version = version + 1, error_code = NULL, error_message = NULL,
       wait_until = NULL, wait_outbox_id = NULL
 WHERE id = :id AND status IN ('QUEUED', 'RUNNING')
   AND (lease_until IS NULL OR lease_until < :now)
   AND NOT cancel_requested
   AND (wait_outbox_id IS NULL OR wait_outbox_id = CAST(:outbox_id AS TEXT))
   AND (status = 'RUNNING'
        OR NOT EXISTS (SELECT 1 FROM relay_outbox r
                        WHERE r.job_id = :id AND r.status IN ('PENDING', 'RETRYABLE_FAILED')
                          AND r.claimed_until >= :now))
RETURNING *;

-- name: park_job
-- The job's holder parks it (services/parking.py): QUEUED, no lease, waiting until
-- :wait_until for :wait_for; the outbox row inserted with it (due then) is the one whose
-- message may start it again. It made no call: the attempt its start took is given back.
UPDATE jobs
   SET status = 'QUEUED', lease_until = NULL, updated_at = :now, version = version + 1,
       attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END,
       wait_until = :wait_until, wait_for = :wait_for, wait_outbox_id = :wait_outbox_id
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: hold_job
-- A job that waits for an outside system to come back (services/breakers.py): its holder
-- lets go of it (no lease), gives back the attempt its run took (:give_back), and it waits
-- for :wait_for until the relay row inserted with it (:wait_outbox_id) is released. A job
-- with no attempt left to its name is QUEUED again; one that ran before stays RUNNING.
UPDATE jobs
   SET lease_until = NULL, attempts = attempts - :give_back,
       status = CASE WHEN attempts - :give_back <= 0 THEN 'QUEUED' ELSE 'RUNNING' END,
       updated_at = :now, version = version + 1,
       wait_until = :wait_until, wait_for = :wait_for, wait_outbox_id = :wait_outbox_id
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: resume_job
-- A waiting job's run goes ahead (its dependency answers): no longer waiting.
UPDATE jobs SET wait_for = NULL, updated_at = :now, version = version + 1
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: extend_job_lease
UPDATE jobs SET lease_until = :lease_until
 WHERE id = :id AND version = :version AND status = 'RUNNING';

-- name: update_job_progress
-- The run's latest step; the steps its worker held since its last write (workers/progress.py)
-- come as events of the same statement or transaction (`_job_change`'s `held`).
UPDATE jobs SET progress = :progress, updated_at = :now
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: finish_job
-- :progress, when not NULL: the last step the run held (workers/progress.py), written with
-- the outcome, as are the held steps' events.
UPDATE jobs
   SET status = :status, result = :result, error_code = :error_code,
       error_message = :error_message, finished_at = :now, updated_at = :now,
       locked_until = :locked_until, wait_for = NULL,
       progress = COALESCE(CAST(:progress AS TEXT), progress),
       lease_until = NULL, sealed = NULL, key_id = NULL, version = version + 1
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: job_dead
UPDATE jobs
   SET status = 'DEAD', error_code = :error_code, error_message = :error_message,
       wait_until = NULL, wait_for = NULL, wait_outbox_id = NULL,
       finished_at = :now, updated_at = :now, lease_until = NULL, version = version + 1
 WHERE id = :id AND status IN ('QUEUED', 'RUNNING')
RETURNING *;

-- name: job_retry_later
UPDATE jobs
   SET error_code = :error_code, error_message = :error_message, lease_until = NULL,
       wait_for = NULL,
       updated_at = :now, version = version + 1
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: release_job_lease
UPDATE jobs SET lease_until = NULL, updated_at = :now, version = version + 1
 WHERE id = :id AND version = :version AND status = 'RUNNING'
RETURNING *;

-- name: redrive_job
UPDATE jobs
   SET status = 'QUEUED', error_code = NULL, error_message = NULL, finished_at = NULL,
       lease_until = NULL, progress = NULL, updated_at = :now, version = version + 1,
       cancel_requested = FALSE, wait_until = NULL, wait_for = NULL, wait_outbox_id = NULL
 WHERE id = :id AND status = 'DEAD' AND sealed IS NOT NULL
RETURNING *;

-- name: job_cancel_now
-- A cancel that needs no worker's help: a QUEUED job (its unsent outbox rows are deleted in
-- the same transaction, so it is never published), or a RUNNING one nobody holds (its
-- message waits on the queue, to be deleted unrun). Its credentials go at once. :version is
-- the job as the cancel looked at it (and deleted its rows for).
UPDATE jobs
   SET status = 'CANCELLED', cancel_requested = TRUE, finished_at = :now, updated_at = :now,
       lease_until = NULL, sealed = NULL, key_id = NULL, version = version + 1
 WHERE id = :id AND version = :version
   AND (status = 'QUEUED' OR (status = 'RUNNING' AND (lease_until IS NULL OR lease_until < :now)))
RETURNING *;

-- name: job_cancel_request
-- A RUNNING job a worker holds: flagged, and the worker stops at its next portal request.
-- `version` stays, so the worker's guarded writes (heartbeat, progress, its outcome) go on.
UPDATE jobs SET cancel_requested = TRUE, updated_at = :now
 WHERE id = :id AND status = 'RUNNING' AND NOT cancel_requested
RETURNING *;

-- name: job_cancelled_by_worker
-- The worker holding a job whose cancel was requested stopped: CANCELLED, credentials erased.
UPDATE jobs
   SET status = 'CANCELLED', finished_at = :now, updated_at = :now, lease_until = NULL,
       sealed = NULL, key_id = NULL, version = version + 1
 WHERE id = :id AND version = :version AND status = 'RUNNING' AND cancel_requested
RETURNING *;

-- name: delete_unsent_relay_if_cancellable
-- Runs before job_cancel_now, so a cancel takes the outbox rows' locks before the job's, in
-- the order the relay's SENT marks take them (Postgres: no deadlock between the two). A row a
-- publish holds right now is deleted too: its SENT mark then finds no row, and the message,
-- if it went out, is deleted unrun by the consumer. Only for the job at :version, the one
-- job_cancel_now then cancels (or the cancel looks again).
DELETE FROM relay_outbox
 WHERE job_id = :id AND status IN ('PENDING', 'RETRYABLE_FAILED')
   AND EXISTS (SELECT 1 FROM jobs
                WHERE jobs.id = :id AND jobs.version = :version
                  AND (jobs.status = 'QUEUED'
                       OR (jobs.status = 'RUNNING'
                           AND (jobs.lease_until IS NULL OR jobs.lease_until < :now))));

-- ---------------------------------------------------------------- job events

-- name: insert_job_event
-- One event of a job, with the status and attempts the change it records left (the row its
-- statement returned), in that change's transaction. Postgres folds it into the change's own
-- statement instead (the `<name>_ev` blocks of postgres.sql).
INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
VALUES (:job_id, :ev_at, :ev_type, :ev_status, :ev_attempt, :ev_instance, :ev_detail);

-- name: insert_job_event_as_is
-- One event of a job as the job is now, read in the same transaction: a publish that failed
-- (the job unchanged), or a row SENT on SQLite (one execution per row of a round, after
-- jobs_running_if_queued).
INSERT INTO job_events (job_id, at, type, status, attempt, instance, detail)
SELECT id, :ev_at, :ev_type, status, attempts, :ev_instance, :ev_detail FROM jobs WHERE id = :job_id;

-- name: select_job_events
SELECT * FROM job_events WHERE job_id = :job_id AND seq > :after ORDER BY seq LIMIT :limit;

-- name: job_event_marks
-- The newest event of each job a held request waits on: one query per poll for all of them.
SELECT job_id, MAX(seq) AS seq FROM job_events
 WHERE job_id IN (SELECT value FROM json_each(:ids))
 GROUP BY job_id;

-- name: job_events_newest
-- The newest event of any job, for held listings: it moves whenever a job changes.
SELECT MAX(seq) AS seq FROM job_events;

-- ---------------------------------------------------------------- relay outbox

-- name: claim_relay_due
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id IN (SELECT id FROM relay_outbox
               WHERE status IN ('PENDING', 'RETRYABLE_FAILED') AND next_attempt_at <= :now
                 AND (claimed_until IS NULL OR claimed_until < :now)
               ORDER BY next_attempt_at
               LIMIT :limit
               /* FOR UPDATE SKIP LOCKED */)
RETURNING *;

-- name: claim_relay_one
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id = :id AND status IN ('PENDING', 'RETRYABLE_FAILED')
   AND (claimed_until IS NULL OR claimed_until < :now)
RETURNING *;

-- name: claim_relay_many
-- :ids is a JSON array of outbox ids: the requests of one coalesced dispatch batch
-- claim their rows in one statement. A row SENT already, or leased by another holder,
-- is left out of the result.
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id IN (SELECT value FROM json_each(:ids)) AND status IN ('PENDING', 'RETRYABLE_FAILED')
   AND (claimed_until IS NULL OR claimed_until < :now)
RETURNING *;

-- name: relay_sent_one
-- One row SENT, run once per row of a round with `execute_each` (SQLite's executemany:
-- no JSON array to build and parse, no rows read back; half the CPU of one statement
-- joining a JSON array, on the writer thread). The version guard refuses a row that a
-- newer holder claimed since. Postgres marks a round with `relay_sent_many`
-- (postgres.sql), one statement for all of it.
UPDATE relay_outbox
   SET status = 'SENT', queue_message_id = :m, sent_at = :now, claimed_until = NULL,
       last_error = NULL, version = version + 1
 WHERE id = :id AND version = :v;

-- name: jobs_running_if_queued
-- By primary key only: `+status` keeps the planner off any index on status (there is
-- none since migration 0003; one would visit every QUEUED job, all of a backlog, for
-- each batch, to find these few).
UPDATE jobs SET status = 'RUNNING', updated_at = :now
 WHERE id IN (SELECT value FROM json_each(:ids)) AND +status = 'QUEUED';

-- name: tasks_sent
UPDATE task_runs SET status = 'SENT'
 WHERE status = 'PENDING' AND id IN (SELECT value FROM json_each(:ids));

-- name: relay_failed
-- :refund 1 gives back the attempt the claim counted (SQS could not be reached), else 0.
UPDATE relay_outbox
   SET status = :status, next_attempt_at = :next_attempt_at, last_error = :last_error,
       attempt_count = attempt_count - :refund,
       claimed_until = NULL, version = version + 1
 WHERE id = :id AND version = :version
RETURNING *;

-- name: relay_republish_unfinished
-- The queue lost its messages (an SQS-compatible server that restarted empty): every
-- SENT row whose job or task has not finished goes out again. Delivery is at least
-- once; the consumer drops copies of finished work and the job lease stops two runs.
UPDATE relay_outbox
   SET status = 'PENDING', next_attempt_at = :now, claimed_until = NULL, version = version + 1
 WHERE status = 'SENT' AND sent_at < :now
   AND (job_id IN (SELECT id FROM jobs WHERE status IN ('QUEUED', 'RUNNING'))
        OR task_id IN (SELECT id FROM task_runs WHERE status IN ('PENDING', 'SENT')));

-- name: relay_redrive
UPDATE relay_outbox
   SET status = 'PENDING', attempt_count = 0, next_attempt_at = :now, last_error = NULL,
       claimed_until = NULL, version = version + 1
 WHERE id = :id AND status = 'DEAD'
RETURNING *;

-- name: relay_supersede_dead
-- A redrive of the whole job closes its DEAD rows: the fresh row carries the retry, and the
-- dead ones stay as history, out of the DEAD listings and counts.
UPDATE relay_outbox
   SET status = 'SUPERSEDED', claimed_until = NULL, version = version + 1
 WHERE job_id = :job_id AND status = 'DEAD';

-- name: task_dead
UPDATE task_runs SET status = 'DEAD', error = :error, finished_at = :now, version = version + 1
 WHERE id = :id AND status IN ('PENDING', 'SENT');

-- name: task_requeue
UPDATE task_runs SET status = 'PENDING', error = NULL, finished_at = NULL, version = version + 1
 WHERE id = :id AND status = 'DEAD';

-- name: job_requeue_if_dead
UPDATE jobs
   SET status = 'QUEUED', error_code = NULL, error_message = NULL, finished_at = NULL,
       lease_until = NULL, updated_at = :now, version = version + 1, cancel_requested = FALSE
 WHERE id = :id AND status = 'DEAD'
RETURNING *;

-- name: page_newest_first
-- The rest of a listing's WHERE, and its order and limit: the rows created before the
-- cursor's (created_at, id), newest first; the listings below name it in braces.
(CAST(:cursor_created AS DOUBLE PRECISION) IS NULL OR created_at < :cursor_created
        OR (created_at = :cursor_created AND id < CAST(:cursor_id AS TEXT)))
 ORDER BY created_at DESC, id DESC
 LIMIT :limit;

-- name: list_relay
SELECT * FROM relay_outbox
 WHERE (CAST(:status AS TEXT) IS NULL OR status = :status)
   AND {page_newest_first};

-- name: list_relay_unsent
-- list_relay for a status other than SENT (PENDING, RETRYABLE_FAILED, DEAD, SUPERSEDED): the
-- literal `status <> 'SENT'` is the predicate of relay_outbox_unsent, which lets both
-- planners read that small index instead of passing over every SENT row in time order.
SELECT * FROM relay_outbox
 WHERE status <> 'SENT' AND status = :status
   AND {page_newest_first};

-- name: list_relay_for_job
SELECT * FROM relay_outbox WHERE job_id = :job_id ORDER BY created_at DESC, id DESC LIMIT :limit;

-- name: job_filters
-- The admin's search filters over jobs, each applied when given (list_jobs names it in braces).
(CAST(:status AS TEXT) IS NULL OR status = :status)
   AND (CAST(:user_id AS TEXT) IS NULL OR user_id = :user_id)
   AND (CAST(:error_code AS TEXT) IS NULL OR error_code = :error_code)
   AND (CAST(:created_from AS DOUBLE PRECISION) IS NULL OR created_at >= :created_from)
   AND (CAST(:created_to AS DOUBLE PRECISION) IS NULL OR created_at < :created_to)

-- name: list_jobs
-- The admin's search: each filter applies when given; newest first along jobs_created.
SELECT * FROM jobs
 WHERE {job_filters}
   AND {page_newest_first};

-- name: list_jobs_by_subject
-- The admin's search by portal username, as its keyed hash (the login lock's subject): an
-- equality, newest first along jobs_login_subject; the other filters as in list_jobs.
SELECT * FROM jobs
 WHERE login_subject = :login_subject
   AND {job_filters}
   AND {page_newest_first};

-- ---------------------------------------------------------------- tasks

-- name: insert_task_run
INSERT INTO task_runs (id, type, payload, dedup_id, status, enqueued_at)
VALUES (:id, :type, :payload, :dedup_id, 'PENDING', :now)
ON CONFLICT (dedup_id) DO NOTHING
RETURNING id;

-- name: select_task_by_dedup
SELECT * FROM task_runs WHERE dedup_id = :dedup_id;

-- name: select_task
SELECT * FROM task_runs WHERE id = :id;

-- name: finish_task
UPDATE task_runs SET status = :status, error = :error, finished_at = :now, version = version + 1
 WHERE id = :id AND status IN ('PENDING', 'SENT')
RETURNING *;

-- name: list_tasks
SELECT * FROM task_runs
 WHERE (CAST(:type AS TEXT) IS NULL OR type = :type)
   AND (CAST(:cursor_created AS DOUBLE PRECISION) IS NULL OR enqueued_at < :cursor_created
        OR (enqueued_at = :cursor_created AND id < CAST(:cursor_id AS TEXT)))
 ORDER BY enqueued_at DESC, id DESC
 LIMIT :limit;

-- ---------------------------------------------------------------- per-user caps (read only when on)
-- Read inside the intake's or the registration's own transaction, after the user's
-- `cap_lock` where writes run side by side (postgres.sql): the count and the write it
-- allows are one step.

-- name: job_quota
-- The user's active jobs through the (user_id, idempotency_key) index: cheap while a token
-- is one end user's, which is when the cap is meant to be on.
SELECT (SELECT COUNT(*) FROM jobs
         WHERE user_id = :user_id AND idempotency_key = :idempotency_key) AS taken,
       (SELECT COUNT(*) FROM (SELECT 1 FROM jobs
                               WHERE user_id = :user_id AND status IN ('QUEUED', 'RUNNING')
                               LIMIT :limit) active_jobs) AS active;

-- name: website_quota
SELECT (SELECT COUNT(*) FROM websites WHERE domain = :domain) AS taken,
       (SELECT COUNT(*) FROM website_registrations
         WHERE user_id = :user_id AND registered_at > :since) AS recent,
       (SELECT MIN(registered_at) FROM website_registrations
         WHERE user_id = :user_id AND registered_at > :since) AS oldest;

-- name: website_registration_insert
INSERT INTO website_registrations (user_id, registered_at, website_id)
VALUES (:user_id, :now, :website_id)
ON CONFLICT (user_id, registered_at, website_id) DO NOTHING;

-- name: website_registrations_trim
DELETE FROM website_registrations WHERE user_id = :user_id AND registered_at < :before;

-- ---------------------------------------------------------------- the portal login lock

-- name: login_failure_insert
INSERT INTO portal_login_failures (subject, failed_at, user_id) VALUES (:subject, :now, :user_id)
ON CONFLICT (subject, failed_at) DO NOTHING;

-- name: login_failures_trim
DELETE FROM portal_login_failures WHERE subject = :subject AND failed_at < :before;

-- name: login_subject_lock
-- One login decision per username at a time. SQLite: the write transaction (BEGIN IMMEDIATE)
-- is serialised already; Postgres takes a transaction-scoped advisory lock (postgres.sql).
SELECT 1 AS locked;

-- name: login_attempt_insert
-- A login try under way, counted as a failure until its outcome (attempt_of: its job).
INSERT INTO portal_login_failures (subject, failed_at, user_id, attempt_of)
VALUES (:subject, :now, :user_id, :holder)
ON CONFLICT (subject, failed_at) DO NOTHING;

-- name: login_attempt_delete
DELETE FROM portal_login_failures WHERE subject = :subject AND attempt_of = :holder;

-- name: login_failures_of
SELECT subject, user_id, failed_at, attempt_of FROM portal_login_failures
 WHERE subject = :subject AND failed_at > :since
 ORDER BY failed_at DESC
 LIMIT :limit;

-- name: login_failures_all
SELECT subject, user_id, failed_at, attempt_of FROM portal_login_failures
 WHERE failed_at > :since
 ORDER BY failed_at DESC
 LIMIT :limit;

-- name: login_failures_clear
DELETE FROM portal_login_failures WHERE subject = :subject;

-- name: login_throttle_ensure
-- A row whose next try was due over :stale_before (a window ago) and not taken is left from
-- an earlier episode (no job came since, so no failure is that recent): it starts afresh.
INSERT INTO portal_login_throttle (subject, next_try_at, delay_s)
VALUES (:subject, :first_try_at, :first_delay_s)
ON CONFLICT (subject) DO UPDATE
   SET next_try_at = excluded.next_try_at, delay_s = excluded.delay_s, holder = NULL,
       held_until = NULL
 WHERE portal_login_throttle.next_try_at < :stale_before;

-- name: login_throttle_select
SELECT * FROM portal_login_throttle WHERE subject = :subject;

-- name: login_try_take
-- The one try of a throttled username: only when its time has come and no live holder has
-- it (the row lock, or SQLite's write lock, lets one of two takers through). The spacing
-- doubles, up to :max_delay_s, and the next try moves that far ahead of this one.
UPDATE portal_login_throttle
   SET holder = :holder, held_until = CAST(:now AS DOUBLE PRECISION) + :hold_s,
       delay_s = CASE WHEN delay_s * 2 < :max_delay_s THEN delay_s * 2 ELSE :max_delay_s END,
       next_try_at = :now
                     + CASE WHEN delay_s * 2 < :max_delay_s THEN delay_s * 2 ELSE :max_delay_s END
 WHERE subject = :subject AND next_try_at <= :now
   AND (holder IS NULL OR held_until < :now)
RETURNING *;

-- name: login_try_release
UPDATE portal_login_throttle SET holder = NULL, held_until = NULL
 WHERE subject = :subject AND holder = :holder;

-- name: login_throttle_clear
DELETE FROM portal_login_throttle WHERE subject = :subject;

-- name: login_throttles_of
SELECT * FROM portal_login_throttle WHERE subject IN (SELECT value FROM json_each(:subjects));

-- ---------------------------------------------------------------- websites

-- name: insert_website
INSERT INTO websites (id, domain, favicon_url, created_at, updated_at)
VALUES (:id, :domain, :favicon_url, :now, :now)
ON CONFLICT (domain) DO NOTHING
RETURNING id;

-- name: insert_work_row
INSERT INTO work_outbox (id, website_id, status, created_at)
VALUES (:id, :website_id, 'PENDING', :now);

-- name: select_website_by_domain
-- A website without its work row was classified: outbox.prune deletes COMPLETED rows only
-- (their attempts and last error go with them).
SELECT w.*, COALESCE(o.status, 'COMPLETED') AS work_status, o.attempt_count AS work_attempts,
       o.last_error AS work_last_error
  FROM websites w LEFT JOIN work_outbox o ON o.website_id = w.id
 WHERE w.domain = :domain;

-- name: work_claimed
-- A claimed work row PROCESSING, its attempt counted: the `claim_work_*` blocks name it in
-- braces and say which row.
UPDATE work_outbox
   SET status = 'PROCESSING', attempt_count = attempt_count + 1, attempted_at = :now,
       version = version + 1;

-- name: claim_work_fresh
{work_claimed}
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PENDING' AND attempted_at IS NULL
              ORDER BY created_at LIMIT 1
              /* FOR UPDATE SKIP LOCKED */)
RETURNING *;

-- name: claim_work_retry
{work_claimed}
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PENDING' AND attempted_at IS NOT NULL
                AND attempted_at <= :retry_before
              ORDER BY attempted_at LIMIT 1
              /* FOR UPDATE SKIP LOCKED */)
RETURNING *;

-- name: claim_work_stale
{work_claimed}
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PROCESSING' AND attempted_at <= :stale_before
              ORDER BY attempted_at LIMIT 1
              /* FOR UPDATE SKIP LOCKED */)
RETURNING *;

-- name: select_website
SELECT * FROM websites WHERE id = :id;

-- name: set_website_category
UPDATE websites SET category = :category, updated_at = :now, version = version + 1
 WHERE id = :id AND category IS NULL;

-- name: work_completed
UPDATE work_outbox SET status = 'COMPLETED', last_error = NULL, version = version + 1
 WHERE id = :id AND version = :version AND status = 'PROCESSING';

-- name: work_failed
UPDATE work_outbox
   SET status = :status, attempted_at = :now, last_error = :last_error, version = version + 1
 WHERE id = :id AND version = :version AND status = 'PROCESSING';

-- name: work_give_back
UPDATE work_outbox
   SET status = 'PENDING', attempt_count = attempt_count - 1,
       attempted_at = CASE WHEN attempt_count - 1 = 0 THEN NULL ELSE attempted_at END,
       version = version + 1
 WHERE id = :id AND version = :version AND status = 'PROCESSING';

-- ---------------------------------------------------------------- cluster pacing
-- One row per paced resource ("ai", "suwon"). SQLite serves the processes of
-- one host, so "now" is that host's clock; Postgres overrides every statement
-- that reads the time with the database's clock_timestamp().

-- name: pace_ensure
INSERT INTO pace (name) VALUES (:name) ON CONFLICT (name) DO NOTHING;

-- name: pace_take
UPDATE pace
   SET last_at = max(next_at, paused_until, :now),
       next_at = max(next_at, paused_until, :now) + :delay,
       updated_at = :now
 WHERE name = :name
RETURNING last_at AS slot, paused_until, CAST(:now AS REAL) AS now;

-- name: pace_pause
UPDATE pace
   SET paused_until = max(paused_until, :now + :pause_s), updated_at = :now
 WHERE name = :name
RETURNING paused_until, CAST(:now AS REAL) AS now;

-- name: pace_read
SELECT name, last_at, next_at, paused_until, CAST(:now AS REAL) AS now
  FROM pace WHERE name = :name;

-- name: pace_all
SELECT p.name, p.last_at, p.next_at, p.paused_until, CAST(:now AS REAL) AS now,
       (SELECT COUNT(*) FROM pace_leases l
         WHERE l.name = p.name AND l.holder IS NOT NULL AND l.expires_at > :now) AS sessions
  FROM pace p ORDER BY p.name;

-- name: lease_ensure
INSERT INTO pace_leases (name, slot) VALUES (:name, :slot) ON CONFLICT (name, slot) DO NOTHING;

-- name: lease_take
UPDATE pace_leases SET holder = :holder, expires_at = :now + :lease_s
 WHERE name = :name
   AND slot = (SELECT slot FROM pace_leases
                WHERE name = :name AND slot < :limit
                  AND (holder IS NULL OR expires_at <= :now)
                ORDER BY slot LIMIT 1)
RETURNING slot, expires_at, CAST(:now AS REAL) AS now;

-- name: lease_renew
UPDATE pace_leases SET expires_at = :now + :lease_s
 WHERE name = :name AND slot = :slot AND holder = :holder;

-- name: lease_release
UPDATE pace_leases SET holder = NULL, expires_at = 0
 WHERE name = :name AND slot = :slot AND holder = :holder;
-- name: list_websites
-- As select_website_by_domain: a pruned work row was COMPLETED.
SELECT w.*, COALESCE(o.status, 'COMPLETED') AS work_status, o.attempt_count AS work_attempts,
       o.last_error AS work_last_error
  FROM websites w LEFT JOIN work_outbox o ON o.website_id = w.id
 WHERE (CAST(:status AS TEXT) IS NULL OR COALESCE(o.status, 'COMPLETED') = :status)
   AND (CAST(:cursor_created AS DOUBLE PRECISION) IS NULL OR w.created_at < :cursor_created
        OR (w.created_at = :cursor_created AND w.id < CAST(:cursor_id AS TEXT)))
 ORDER BY w.created_at DESC, w.id DESC
 LIMIT :limit;

-- name: work_retry_failed
-- An operator sends a FAILED classification back: attempts start again from zero.
UPDATE work_outbox
   SET status = 'PENDING', attempt_count = 0, attempted_at = NULL, last_error = NULL,
       version = version + 1
 WHERE website_id = :website_id AND status = 'FAILED';

-- ---------------------------------------------------------------- stats and pruning

-- name: count_jobs
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM jobs GROUP BY status;

-- name: count_relay
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM relay_outbox GROUP BY status;

-- name: count_work
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM work_outbox GROUP BY status;

-- name: count_tasks
SELECT status, COUNT(*) AS n, MIN(enqueued_at) AS oldest FROM task_runs GROUP BY status;

-- name: prune_relay_sent
-- A DEAD job's SENT row goes with its credentials (:dead_before is
-- security.dead_retention_s's cut-off): it can no longer be redriven. Every other row goes
-- with its job or task (the foreign key's cascade), and a RUNNING job's SENT row, which
-- republish_unfinished needs after a queue loses its messages, stays.
DELETE FROM relay_outbox WHERE id IN (
    SELECT r.id FROM jobs j JOIN relay_outbox r ON r.job_id = j.id
     WHERE j.status = 'DEAD' AND j.finished_at < :dead_before AND r.status = 'SENT'
     LIMIT :limit);

-- name: prune_work_completed
DELETE FROM work_outbox WHERE id IN (
    SELECT id FROM work_outbox WHERE status = 'COMPLETED' AND attempted_at < :before LIMIT :limit);

-- name: prune_finished_tasks
DELETE FROM task_runs WHERE id IN (
    SELECT id FROM task_runs
     WHERE (status IN ('SUCCEEDED', 'FAILED') AND finished_at < :before)
        OR (status = 'DEAD' AND finished_at < :dead_before)
     LIMIT :limit);

-- name: prune_dead_credentials
UPDATE jobs SET sealed = NULL, key_id = NULL, version = version + 1
 WHERE id IN (SELECT id FROM jobs WHERE status = 'DEAD' AND sealed IS NOT NULL
                 AND finished_at < :before LIMIT :limit);

-- name: prune_login_failures
DELETE FROM portal_login_failures WHERE (subject, failed_at) IN (
    SELECT subject, failed_at FROM portal_login_failures WHERE failed_at < :before LIMIT :limit);

-- name: prune_login_throttle
-- A throttle whose next try is long past: no job came for the username since.
DELETE FROM portal_login_throttle WHERE subject IN (
    SELECT subject FROM portal_login_throttle WHERE next_try_at < :before LIMIT :limit);

-- name: prune_website_registrations
DELETE FROM website_registrations WHERE (user_id, registered_at, website_id) IN (
    SELECT user_id, registered_at, website_id FROM website_registrations
     WHERE registered_at < :before LIMIT :limit);

-- name: prunable_jobs
-- Jobs past their retention, with how many rows go with each (timeline events, outbox rows):
-- the prune takes as many as fit in one transaction of retention.batch_rows rows.
SELECT j.id,
       (SELECT COUNT(*) FROM job_events e WHERE e.job_id = j.id)
       + (SELECT COUNT(*) FROM relay_outbox r WHERE r.job_id = j.id) AS attached
  FROM jobs j
 WHERE (j.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND j.finished_at < :before)
    OR (j.status = 'DEAD' AND j.finished_at < :dead_before)
 LIMIT :candidates;

-- name: delete_job_events_of
-- :ids is a JSON array of job ids: their timelines go with them (prune).
DELETE FROM job_events WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: delete_jobs_of
DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(:ids));

-- ---------------------------------------------------------------- dependency breakers
-- One row per outside system (services/breakers.py, docs/decisions/0033-dependency-breakers.md).

-- name: dependency_rows
SELECT * FROM dependencies ORDER BY name;

-- name: select_dependency
SELECT * FROM dependencies WHERE name = :name;

-- name: dependency_outage
-- A run ended in an outage failure: counted, and the breaker opens at :open_after in a row.
-- A failed probe frees the probe's place (the next is chosen a probe interval on).
UPDATE dependencies
   SET failures_in_a_row = failures_in_a_row + 1, last_error = :error, last_failure_at = :now,
       down_since = CASE WHEN down_since IS NULL AND failures_in_a_row + 1 >= :open_after
                         THEN :now ELSE down_since END,
       probe_until = CASE WHEN probe_job = :job THEN NULL ELSE probe_until END,
       probe_job = CASE WHEN probe_job = :job THEN NULL ELSE probe_job END,
       updated_at = :now, version = version + 1
 WHERE name = :name
RETURNING *;

-- name: dependency_through
-- A run got an answer: the count starts again, and an open breaker closes.
UPDATE dependencies
   SET failures_in_a_row = 0, down_since = NULL, probe_job = NULL, probe_until = NULL,
       updated_at = :now, version = version + 1
 WHERE name = :name AND (failures_in_a_row > 0 OR down_since IS NOT NULL)
RETURNING *;

-- name: dependency_probe_take
-- The cluster's one probe while the breaker is open: taken by one caller at a time, a probe
-- interval after the last (the first, a probe interval after it opened), and held until
-- :until (or the probe's outcome).
UPDATE dependencies
   SET probe_job = :job, probe_until = :until, last_probe_at = :now, updated_at = :now,
       version = version + 1
 WHERE name = :name AND down_since IS NOT NULL
   AND (probe_until IS NULL OR probe_until < :now)
   AND COALESCE(last_probe_at, down_since) <= :probe_before
RETURNING *;

-- name: dependency_pause
UPDATE dependencies
   SET paused_at = :now, paused_until = :until, pause_reason = :reason, paused_by = :actor,
       updated_at = :now, version = version + 1
 WHERE name = :name
RETURNING *;

-- name: dependency_resume
-- An operator's resume, or a pause whose end came (:ended_before: only a pause ended by then).
UPDATE dependencies
   SET paused_at = NULL, paused_until = NULL, pause_reason = NULL, paused_by = NULL,
       updated_at = :now, version = version + 1
 WHERE name = :name AND pause_reason IS NOT NULL
   AND (CAST(:ended_before AS DOUBLE PRECISION) IS NULL OR paused_until <= :ended_before)
RETURNING *;

-- name: insert_waiting_relay_row
-- A held job's row: not published until the dependency it waits for is back (or :due).
INSERT INTO relay_outbox (id, kind, job_id, status, next_attempt_at, dedup_id, created_at,
                          attempt_count, traceparent, waits_for)
VALUES (:id, 'job', :job_id, 'PENDING', :due, :id, :now, 0, :traceparent, :waits_for);

-- name: dependency_oldest_waiting
-- The probe: the waiting job whose row has waited longest (a failed probe waits again
-- with a fresh row, at the back).
SELECT id, job_id FROM relay_outbox
 WHERE waits_for = :name AND status = 'PENDING'
 ORDER BY created_at, id LIMIT 1;

-- name: dependency_release_one
UPDATE relay_outbox SET next_attempt_at = :now, waits_for = NULL, version = version + 1
 WHERE id = :id AND waits_for IS NOT NULL AND status = 'PENDING';

-- name: dependency_release_waiting
-- The dependency is back: everything that waited for it goes out now (the consumer's pace
-- spreads the runs).
UPDATE relay_outbox SET next_attempt_at = :now, waits_for = NULL, version = version + 1
 WHERE waits_for = :name AND status = 'PENDING';

-- name: dependency_waiting_jobs
-- What waits for a dependency: for the portal its held jobs; for the AI the work-outbox rows
-- not yet done, and for SQS the rows not yet published (they wait only while it is away).
SELECT CASE CAST(:name AS TEXT)
       WHEN 'ai' THEN (SELECT COUNT(*) FROM work_outbox WHERE status = 'PENDING')
       WHEN 'sqs' THEN (SELECT COUNT(*) FROM relay_outbox
                         WHERE status IN ('PENDING', 'RETRYABLE_FAILED') AND waits_for IS NULL)
       ELSE (SELECT COUNT(*) FROM relay_outbox WHERE waits_for = :name AND status = 'PENDING')
       END AS n;

-- ---------------------------------------------------------------- the audit log
-- Append-only (migration 0012): rows are inserted here and deleted only by prune_audit, with
-- the gate opened for its own transaction (docs/decisions/0034-roles-and-the-audit-log.md).

-- name: insert_audit
INSERT INTO audit_log (id, at, actor, role, action, target, reason, outcome, request_id, instance)
VALUES (:id, :at, :actor, :role, :action, :target, :reason, :outcome, :request_id, :instance);

-- name: list_audit
SELECT * FROM audit_log
 WHERE (CAST(:actor AS TEXT) IS NULL OR actor = :actor)
   AND (CAST(:action AS TEXT) IS NULL OR action = :action)
   AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR at >= :since)
   AND (CAST(:cursor_created AS DOUBLE PRECISION) IS NULL OR at < :cursor_created
        OR (at = :cursor_created AND id < CAST(:cursor_id AS TEXT)))
 ORDER BY at DESC, id DESC
 LIMIT :limit;

-- name: audit_prune_open
UPDATE audit_prune SET open = 1;

-- name: audit_prune_close
UPDATE audit_prune SET open = 0;

-- name: prune_audit
DELETE FROM audit_log WHERE id IN (
    SELECT id FROM audit_log WHERE at < :before ORDER BY at LIMIT :limit);

-- ---------------------------------------------------------------- growth in sight
-- The growth gauges (storage/store/growth.py): what the tables take on disk, their dead rows,
-- the oldest open transaction. Each backend has its own way to tell (sqlite.sql,
-- postgres.sql); the defaults here are what a backend that cannot tell answers.

-- name: growth_oldest_transaction
-- A database that shows no other session's transactions (SQLite: each process sees only its
-- own connections) answers none.
SELECT NULL AS age_s;
