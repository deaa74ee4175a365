-- Limits against abuse (docs/contract.md).
--
-- portal_login_failures: one row per job that ended PORTAL_AUTH_FAILED, by a keyed hash of the
-- portal username (never the username): after scrapers.suwon.max_auth_failures of them within
-- scrapers.suwon.auth_failure_window_s, that username's further jobs fail without a login.
-- Written in the transaction of the job's FAILED outcome, which also trims the subject's old rows.
CREATE TABLE portal_login_failures (
    subject   TEXT NOT NULL,
    failed_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (subject, failed_at)
);

-- website_registrations: who registered which new website when, written only while
-- api.max_websites_per_user_per_hour is on (a user's rows older than an hour are trimmed at
-- their next registration).
CREATE TABLE website_registrations (
    user_id       TEXT NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL,
    website_id    TEXT NOT NULL,
    PRIMARY KEY (user_id, registered_at, website_id)
);
