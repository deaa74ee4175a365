"""Which jobs changed: the signal that ends a request held on a job (`Prefer: wait`).

One `JobChanges` per process. It is fed from three places: the store after each commit
that changed a job (this process: `committed`, which also tells the other processes
where the database can), the database's notifications (Postgres LISTEN: every process
sharing the database), and a poll of the events table while no notification can arrive
(SQLite, or Postgres while its listening connection is down). Whoever waits on a
job registers one callback for it; a signal for a job nobody watches costs a dict lookup.
Whoever waits on any job (a held listing) registers a callback under a key of its own
with `watch_any`; it is called once per signal, whichever jobs it names.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

Wake = Callable[[str], None]


def default_instance() -> str:
    """`daemon.instance_id` when none is configured: the host name and the process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class JobChanges:
    def __init__(self, tell_others: Callable[[list[str]], None] | None = None) -> None:
        self._watch: dict[str, Wake] = {}
        self._any: dict[str, Wake] = {}
        # Where other processes can be told (Postgres: storage/notifier.py), after the commit.
        self._tell_others = tell_others

    def watch(self, job_id: str, wake: Wake) -> None:
        """Call `wake(job_id)` whenever `job_id` may have changed, until `unwatch`."""
        self._watch[job_id] = wake

    def unwatch(self, job_id: str) -> None:
        self._watch.pop(job_id, None)

    def watched(self) -> list[str]:
        return list(self._watch)

    def watch_any(self, key: str, wake: Wake) -> None:
        """Call `wake(key)` whenever any job may have changed, until `unwatch_any(key)`."""
        self._any[key] = wake

    def unwatch_any(self, key: str) -> None:
        self._any.pop(key, None)

    def watching_any(self) -> bool:
        return bool(self._any)

    def committed(self, job_ids: Iterable[str | None]) -> None:
        """This process committed changes to these jobs: its own held requests wake, and
        the other processes are told (never from `publish`: what they told us is not
        echoed back)."""
        changed = [j for j in job_ids if j is not None]
        if not changed:
            return
        if self._tell_others is not None:
            self._tell_others(changed)
        self.publish(changed)

    def publish(self, job_ids: Iterable[str | None]) -> None:
        """These jobs may have changed (a notification, a poll, this process's commit)."""
        if not self._watch and not self._any:
            return
        some = False
        for job_id in job_ids:
            if job_id is None:
                continue
            some = True
            wake = self._watch.get(job_id)
            if wake is not None:
                wake(job_id)
        if some:
            self.some_changed()

    def some_changed(self) -> None:
        """Some job changed, which one unknown (a poll of the newest event): wakes the
        `watch_any` callbacks only."""
        for key, wake in list(self._any.items()):
            wake(key)

    def publish_all(self) -> None:
        """Any watched job may have changed (notifications were lost: a listener reconnected)."""
        for job_id, wake in list(self._watch.items()):
            wake(job_id)
        self.some_changed()
