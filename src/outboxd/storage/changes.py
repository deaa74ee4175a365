"""Which jobs changed: the signal that ends a request held on a job (`Prefer: wait`).

One `JobChanges` per process. It is fed from three places: the store after each commit
that changed a job (this process), the database's notifications (Postgres LISTEN: every
process sharing the database), and a poll of the events table while no notification can
arrive (SQLite, or Postgres while its listening connection is down). Whoever waits on a
job registers one callback for it; a signal for a job nobody watches costs a dict lookup.
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
    def __init__(self) -> None:
        self._watch: dict[str, Wake] = {}

    def watch(self, job_id: str, wake: Wake) -> None:
        """Call `wake(job_id)` whenever `job_id` may have changed, until `unwatch`."""
        self._watch[job_id] = wake

    def unwatch(self, job_id: str) -> None:
        self._watch.pop(job_id, None)

    def watched(self) -> list[str]:
        return list(self._watch)

    def publish(self, job_ids: Iterable[str | None]) -> None:
        """These jobs may have changed (a commit, a notification, a poll)."""
        if not self._watch:
            return
        for job_id in job_ids:
            if job_id is None:
                continue
            wake = self._watch.get(job_id)
            if wake is not None:
                wake(job_id)

    def publish_all(self) -> None:
        """Any watched job may have changed (notifications were lost: a listener reconnected)."""
        for job_id, wake in list(self._watch.items()):
            wake(job_id)
