"""Named crash points for the reliability tests.

`OUTBOXD_CRASH_AT=<name>` makes the process SIGKILL itself the first time it
reaches that point: no cleanup, no flush, exactly like a power cut or an OOM
kill at that line. Unset (always, in production) each point is one dict lookup.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = frozenset(
    {
        "after_group_commit_before_answers",
        "after_commit_before_publish",
        "after_publish_before_sent",
        "during_handler",
        "after_handler_before_commit",
        "after_handler_before_delete",
        "before_delete_batch",
        "during_claim",
        "after_classify_before_complete",
    }
)
_armed = os.environ.get("OUTBOXD_CRASH_AT", "")


def crash_point(name: str) -> None:
    if _armed == name:
        sys.stderr.write(f"outboxd: crash point {name} reached, SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
