-- The audit log (docs/decisions/0034-roles-and-the-audit-log.md): append-only in the
-- database itself. An UPDATE fails whoever sends it; a DELETE fails unless the built-in
-- prune opened the one-row gate audit_prune in its own transaction.
CREATE TABLE audit_log (
    id         TEXT PRIMARY KEY,
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    role       TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT,
    reason     TEXT,
    outcome    INTEGER NOT NULL,
    request_id TEXT,
    instance   TEXT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at DESC, id DESC);

CREATE TABLE audit_prune (open INTEGER NOT NULL);
INSERT INTO audit_prune (open) VALUES (0);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only (UPDATE refused)');
END;

CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
WHEN (SELECT open FROM audit_prune) = 0
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only (DELETE refused)');
END;
