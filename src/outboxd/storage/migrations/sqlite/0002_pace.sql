-- Cluster pacing (claimer.pace_scope and scrapers.suwon.pace_scope = "cluster"):
-- one row per paced resource, whose slots every instance takes with one
-- guarded UPDATE, and session leases for resources with a concurrency limit.
-- Times are Unix epoch seconds taken from the one host that holds the file.
CREATE TABLE pace (
    name         TEXT PRIMARY KEY,
    last_at      REAL,
    next_at      REAL NOT NULL DEFAULT 0,
    paused_until REAL NOT NULL DEFAULT 0,
    updated_at   REAL NOT NULL DEFAULT 0
);

CREATE TABLE pace_leases (
    name       TEXT NOT NULL,
    slot       INTEGER NOT NULL,
    holder     TEXT,
    expires_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
);
