-- An operator finds a portal job by its portal username (a student number) without the
-- username being stored: each job keeps the username's keyed hash, the login lock's subject
-- (security.py `login_subject`), written by the intake in the statement that inserts the job
-- (docs/decisions/0032-job-search-by-username-key.md).
-- Additive only: the previous release runs on this schema (it leaves the column NULL).
-- Jobs accepted before this migration have no key and are never found by a username.
ALTER TABLE jobs ADD COLUMN login_subject TEXT;

-- jobs_login_subject: the search by username (list_jobs_by_subject), an equality on the key,
-- newest first without a sort. Partial: the jobs without a key cost it nothing.
CREATE INDEX jobs_login_subject ON jobs (login_subject, created_at DESC, id DESC)
    WHERE login_subject IS NOT NULL;
