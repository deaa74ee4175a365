-- A relay row can be SUPERSEDED: a DEAD row whose job was redriven since (a fresh row
-- carries the retry) is no longer a dead letter, but stays as the job's history.
-- The status check is replaced by a wider one. Every row already satisfies the old, stricter
-- check; the validation is a scan under the lock the ALTER already holds.
ALTER TABLE relay_outbox DROP CONSTRAINT relay_outbox_status_check;
ALTER TABLE relay_outbox ADD CONSTRAINT relay_outbox_status_check
    CHECK (status IN ('PENDING', 'SENT', 'RETRYABLE_FAILED', 'DEAD', 'SUPERSEDED')) NOT VALID;
ALTER TABLE relay_outbox VALIDATE CONSTRAINT relay_outbox_status_check;

-- Dead letters that a redrive of their job already answered (a newer row of the same job
-- exists, in the order `select_latest_relay_for_job` reads) are closed now.
UPDATE relay_outbox
   SET status = 'SUPERSEDED', version = version + 1
 WHERE status = 'DEAD' AND job_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM relay_outbox n
                WHERE n.job_id = relay_outbox.job_id
                  AND (n.created_at > relay_outbox.created_at
                       OR (n.created_at = relay_outbox.created_at AND n.id > relay_outbox.id)));
