-- Job changes are notified after the commit, by the process that made them, in a
-- statement of its own (storage/notifier.py), no longer by a trigger on job_events: a
-- transaction that notifies holds a cluster-wide lock until its commit is flushed, so the
-- trigger made every job write wait for the others' WAL flushes
-- (docs/decisions/0023-notify-after-commit.md).
DROP TRIGGER job_events_notify ON job_events;
DROP FUNCTION outboxd_job_events_notify();
