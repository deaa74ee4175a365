-- Postgres overrides: claims skip rows another instance holds, so any number
-- of relays and claimers share one table without waiting on each other.

-- name: claim_relay_due
UPDATE relay_outbox
   SET attempt_count = attempt_count + 1, claimed_until = :claimed_until, version = version + 1
 WHERE id IN (SELECT id FROM relay_outbox
               WHERE status IN ('PENDING', 'RETRYABLE_FAILED') AND next_attempt_at <= :now
                 AND (claimed_until IS NULL OR claimed_until < :now)
               ORDER BY next_attempt_at
               LIMIT :limit
               FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: claim_work_fresh
UPDATE work_outbox
   SET status = 'PROCESSING', attempt_count = attempt_count + 1, attempted_at = :now,
       version = version + 1
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PENDING' AND attempted_at IS NULL
              ORDER BY created_at LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: claim_work_retry
UPDATE work_outbox
   SET status = 'PROCESSING', attempt_count = attempt_count + 1, attempted_at = :now,
       version = version + 1
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PENDING' AND attempted_at IS NOT NULL
                AND attempted_at <= :retry_before
              ORDER BY attempted_at LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: claim_work_stale
UPDATE work_outbox
   SET status = 'PROCESSING', attempt_count = attempt_count + 1, attempted_at = :now,
       version = version + 1
 WHERE id = (SELECT id FROM work_outbox
              WHERE status = 'PROCESSING' AND attempted_at <= :stale_before
              ORDER BY attempted_at LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: relay_sent_many
UPDATE relay_outbox
   SET status = 'SENT', queue_message_id = j.m, sent_at = :now, claimed_until = NULL,
       last_error = NULL, version = relay_outbox.version + 1
  FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS j(id text, v integer, m text)
 WHERE relay_outbox.id = j.id AND relay_outbox.version = j.v
RETURNING relay_outbox.*;

-- name: jobs_running_if_queued
UPDATE jobs SET status = 'RUNNING', updated_at = :now
 WHERE status = 'QUEUED' AND id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)));

-- name: tasks_sent
UPDATE task_runs SET status = 'SENT'
 WHERE status = 'PENDING' AND id IN (SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)));
