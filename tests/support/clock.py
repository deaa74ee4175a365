"""The one hand-driven clock the tests pass where the code takes `clock: Callable[[], float]`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Clock:
    """Epoch seconds that move only when the test moves them, so windows are exact."""

    now: float = field(default_factory=time.time)

    def __call__(self) -> float:
        return self.now
