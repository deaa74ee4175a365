"""Fire times for the scheduler: 5-field cron expressions (through cronsim) and fixed intervals.

cronsim follows Debian's cronie, which operators check expressions against (the day OR rule,
names, 0 and 7 both Sunday; a fixed-time job inside a spring-forward gap runs right after the
jump). Ours around it: exactly five fields, the `@` macros, a wall time occurring twice fires
once (the first time), `every_s` anchored on the epoch, one-line `CronError`s naming the field.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from outboxd.errors import OutboxdError


class CronError(OutboxdError, ValueError):
    """An invalid schedule; the message names the field and the reason."""


class Schedule(Protocol):  # what the scheduler needs: the next fire time after a moment
    def next_after(self, after: datetime, tz: ZoneInfo) -> datetime: ...


_MACROS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *"}  # fmt: skip
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_ANCHOR = datetime(2000, 1, 1)  # cronsim parses when constructed; any moment will do


@dataclass(frozen=True)
class CronSchedule:
    """A validated 5-field cron expression; build it with `CronSchedule.parse`."""

    expr: str
    fields: str  # the five fields cronsim is given (a macro expanded)

    @classmethod
    def parse(cls, expr: str) -> CronSchedule:
        """Parse `expr`; raise `CronError` naming the field if it is invalid or can never fire."""
        text = expr.strip()
        if text.startswith("@"):
            if text.lower() not in _MACROS:
                raise CronError(f"expression: unknown macro {text!r} (known: {' '.join(_MACROS)})")
            text = _MACROS[text.lower()]
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                "expression: expected 5 fields (minute hour day-of-month month day-of-week),"
                f" got {len(parts)} in {expr!r}"
            )
        try:
            CronSim(" ".join(parts), _ANCHOR)
        except CronSimError as exc:
            name = str(exc).removeprefix("Bad ")  # cronsim says "Bad <field>"
            part, reason = parts[_FIELDS.index(name)] if name in _FIELDS else text, "is not valid"
            if name == "day-of-month":  # valid alone: no chosen month has such a day
                with contextlib.suppress(CronSimError):
                    CronSim(f"* * {part} * *", _ANCHOR)
                    reason = f"never occurs in month {parts[3]}"
            raise CronError(f"{name}: {part!r} {reason}") from None
        return cls(expr=expr, fields=" ".join(parts))

    def next_after(self, after: datetime, tz: ZoneInfo) -> datetime:
        """First fire time strictly after the aware `after`, as an aware UTC datetime."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("next_after needs an aware datetime")
        # cronsim walks naive wall time; the time zone is applied here. (Given an aware start,
        # cronsim assumes clocks move by whole hours: in Lord Howe's 30-minute shift it skipped
        # fire times.) A wall time is never before `after`'s own: in a repeated hour's second
        # pass the earlier wall times already fired in the first one.
        minute, hour = self.fields.split()[:2]
        fixed_time = not minute.startswith("*") and not hour.startswith("*")
        try:
            for wall in CronSim(self.fields, after.astimezone(tz).replace(tzinfo=None)):
                fire = _first_instant(wall, tz, fixed_time)
                if fire is not None and fire > after:
                    return fire
        except (OverflowError, ValueError):
            pass  # walked past datetime.max (year 9999)
        raise CronError(f"expression: {self.expr!r} has no fire time after {after.isoformat()}")


def _first_instant(wall: datetime, tz: ZoneInfo, fixed_time: bool) -> datetime | None:
    """When the naive `wall` time first occurs in `tz` (a repeated one fires once, the first
    time), in UTC. One that a spring-forward skipped: the moment of the jump for a fixed-time
    job (as cronie runs it), None for a wildcard one."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    if not fixed_time:
        return None
    # Skipped: fold=1 reads it with the offset after the jump, an instant before the jump.
    moment = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    while moment.astimezone(tz).replace(tzinfo=None) < wall:  # at most the jump's length
        moment += _MINUTE
    return moment


_MINUTE = timedelta(minutes=1)


_EPOCH, _MICROSECOND = datetime(1970, 1, 1, tzinfo=UTC), timedelta(microseconds=1)


@dataclass(frozen=True)
class EverySchedule:
    """Fire at whole multiples of `every_s` since the Unix epoch: every instance computes the
    same fire times, so their dedup ids collide and only one enqueue survives."""

    every_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.every_s) or self.every_s <= 0:
            raise CronError(f"every_s: {self.every_s} must be a positive number of seconds")
        if self._every_us < 1:
            raise CronError(f"every_s: {self.every_s} is below one microsecond")

    @property
    def _every_us(self) -> int:
        # Integer microseconds keep the arithmetic exact (5.0 / 2.5 may round either way).
        return round(self.every_s * 1_000_000)

    def next_after(self, after: datetime, tz: ZoneInfo | None = None) -> datetime:
        """First multiple of `every_s` since the epoch strictly after `after`, in UTC (any `tz`)."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("next_after needs an aware datetime")
        ticks = ((after - _EPOCH) // _MICROSECOND) // self._every_us + 1
        return _EPOCH + timedelta(microseconds=ticks * self._every_us)


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA zone `name` (e.g. "Europe/Berlin"); `CronError` if it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: keys such as "../x"; OSError: a directory name such as "Europe".
        raise CronError(f"timezone: unknown time zone {name!r}") from None
