-- The portal login lock counts per username and per submitting user, and a username past
-- the total threshold is throttled rather than locked (docs/decisions/0028-login-lock-per-user.md).
-- Additive only: the previous release runs on this schema (it writes failures without a
-- user, which count toward the total only, and ignores the columns and table below).
--
-- portal_login_failures.user_id: who submitted the job whose login failed. attempt_of: set on a
-- login try still under way (its job id): it counts as a failure until its outcome, so jobs
-- running at once cannot all pass the count.
ALTER TABLE portal_login_failures ADD COLUMN user_id TEXT;
ALTER TABLE portal_login_failures ADD COLUMN attempt_of TEXT;

-- portal_login_throttle: one row per username (keyed hash) past
-- scrapers.suwon.max_auth_failures_total: when its next login may be tried (next_try_at,
-- spaced by delay_s, doubled at each try up to auth_failure_window_s), and which job holds
-- the one try allowed at a time (holder, until held_until). Deleted by a successful login
-- or an unlock.
CREATE TABLE portal_login_throttle (
    subject     TEXT PRIMARY KEY,
    next_try_at DOUBLE PRECISION NOT NULL,
    delay_s     DOUBLE PRECISION NOT NULL,
    holder      TEXT,
    held_until  DOUBLE PRECISION
);

-- A job parked until a dependency lets it run (services/parking.py): until when, what it
-- waits for (JSON: dependency, state), and the outbox row that delivers it then (the only
-- message that may start it). locked_until: how long the PORTAL_LOGIN_LOCKED it ended with
-- holds.
ALTER TABLE jobs ADD COLUMN wait_until DOUBLE PRECISION;
ALTER TABLE jobs ADD COLUMN wait_for TEXT;
ALTER TABLE jobs ADD COLUMN wait_outbox_id TEXT;
ALTER TABLE jobs ADD COLUMN locked_until DOUBLE PRECISION;
