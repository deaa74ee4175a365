-- The audit log: one row for every attempted change through an admin route, a cancel of
-- another user's job, or a state-changing CLI command, done or refused
-- (docs/decisions/0034-roles-and-the-audit-log.md). Append-only in the database itself:
-- an UPDATE or DELETE fails whoever sends it, except the built-in prune's DELETE, which
-- runs with outboxd.audit_prune set for its own transaction only. Additive: the previous
-- release ignores the table.
CREATE TABLE audit_log (
    id         TEXT PRIMARY KEY,
    at         DOUBLE PRECISION NOT NULL,
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

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('outboxd.audit_prune', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP;
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
