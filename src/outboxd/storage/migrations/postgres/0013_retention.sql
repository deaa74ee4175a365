-- Retention (docs/decisions/0035-retention.md). Autovacuum for the tables every job churns (docs/decisions/0035-retention.md). The defaults
-- vacuum a table once a fifth of it is dead: on a jobs table of millions of rows that is
-- hundreds of thousands of dead rows scanned past by every claim first. These tables are
-- vacuumed and analyzed after 2% of them changed (and at least a thousand rows), and the
-- rows only inserted (job_events, audit_log) are vacuumed often enough to keep the
-- visibility map fresh. Storage parameters only: the previous release runs unchanged.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
ALTER TABLE relay_outbox SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
ALTER TABLE work_outbox SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
ALTER TABLE job_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
ALTER TABLE task_runs SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
-- Rows updated many times a second and never grown: vacuumed after a few hundred updates.
ALTER TABLE pace SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE pace_leases SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
ALTER TABLE dependencies SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

