"""Fire-time arithmetic for the scheduler: 5-field cron expressions and fixed intervals.

Dependency-free on purpose: the scheduler only needs "the next fire time after t", and the
rules below (DST, the day-of-month/day-of-week OR rule) are easier to pin down in tests
than to audit in a third-party library.

Cron semantics (Vixie/cronie, which is what operators check expressions against):

- Fields: minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC,
  day-of-week 0-7 or SUN-SAT (0 and 7 are both Sunday). Names are case-insensitive.
- Items: ``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, ``a/n`` (= ``a-<max>/n``), joined by commas.
- Day rule: when both day fields are restricted (neither starts with ``*``) a day matches if
  EITHER matches; otherwise both must match. As in Vixie cron, ``*/2`` counts as unrestricted.
- Wall-clock time of the schedule's time zone: a wall time that does not exist (spring
  forward) is skipped; a wall time that occurs twice (fall back) fires once, at its first
  occurrence (fold=0).
- Macros: ``@hourly @daily @midnight @weekly @monthly @yearly @annually``.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "CronError",
    "CronSchedule",
    "EverySchedule",
    "Schedule",
    "parse_timezone",
]


class CronError(ValueError):
    """An invalid schedule; the message names the field and the reason."""


class Schedule(Protocol):
    """What the scheduler needs from a schedule: the next fire time strictly after a moment."""

    def next_after(self, after: datetime, tz: ZoneInfo) -> datetime: ...


_MACROS: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_MONTH_NAMES = {
    name: i
    for i, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}

# Longest each month can be (February in a leap year), to reject never-firing schedules.
_MAX_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# str.isdigit() accepts characters such as "²"; cron numbers are ASCII digits only.
_NUMBER = re.compile(r"[0-9]+")

# A schedule that parse() accepted fires at least once every 8 years (Feb 29 across a
# skipped leap year such as 2100) unless DST removes every candidate; the bound turns
# that pathological case into an error instead of a long loop.
_SEARCH_YEARS = 50


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTH_NAMES),
    # 7 is accepted as Sunday and folded onto 0 after expansion.
    _Field("day-of-week", 0, 7, _DOW_NAMES),
)


def _value(spec: _Field, token: str) -> int:
    if spec.names is not None and token.upper() in spec.names:
        return spec.names[token.upper()]
    if not _NUMBER.fullmatch(token):
        raise CronError(f"{spec.name}: {token!r} is not a number")
    value = int(token)
    if not spec.low <= value <= spec.high:
        raise CronError(f"{spec.name}: {value} out of range {spec.low}-{spec.high}")
    return value


def _expand(spec: _Field, text: str) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{spec.name}: empty list item in {text!r}")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text):
                raise CronError(f"{spec.name}: step {step_text!r} is not a number")
            step = int(step_text)
            if step == 0:
                raise CronError(f"{spec.name}: step must be at least 1")
        if base == "*":
            low, high = spec.low, spec.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = _value(spec, first), _value(spec, last)
            if low > high:
                raise CronError(f"{spec.name}: range {base} runs backwards")
        else:
            low = _value(spec, base)
            # "a/n" is cronie's shorthand for "a-<max>/n"; a bare "a" is the single value.
            high = spec.high if slash else low
        values.update(range(low, high + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class CronSchedule:
    """A parsed 5-field cron expression; build it with `CronSchedule.parse`."""

    expr: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    dom_restricted: bool
    dow_restricted: bool

    @classmethod
    def parse(cls, expr: str) -> CronSchedule:
        """Parse `expr`; raise `CronError` naming the field if it is invalid or can never fire."""
        text = expr.strip()
        if text.startswith("@"):
            macro = _MACROS.get(text.lower())
            if macro is None:
                known = " ".join(_MACROS)
                raise CronError(f"expression: unknown macro {text!r} (known: {known})")
            text = macro
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                "expression: expected 5 fields (minute hour day-of-month month day-of-week),"
                f" got {len(parts)} in {expr!r}"
            )
        minute, hour, dom, month, dow = (
            _expand(spec, part) for spec, part in zip(_FIELDS, parts, strict=True)
        )
        dow = frozenset(d % 7 for d in dow)
        dom_restricted = not parts[2].startswith("*")
        dow_restricted = not parts[4].startswith("*")
        # With the OR rule the weekday alone always fires; otherwise some chosen day must
        # exist in some chosen month, or the search would never end ("0 0 30 2 *").
        if not (dom_restricted and dow_restricted) and not any(
            day <= _MAX_MONTH_DAYS[m - 1] for m in month for day in dom
        ):
            raise CronError(f"day-of-month: {parts[2]} never occurs in month {parts[3]}")
        return cls(
            expr=expr,
            minutes=tuple(sorted(minute)),
            hours=tuple(sorted(hour)),
            days=dom,
            months=tuple(sorted(month)),
            weekdays=dow,
            dom_restricted=dom_restricted,
            dow_restricted=dow_restricted,
        )

    def _day_matches(self, when: datetime) -> bool:
        in_dom = when.day in self.days
        in_dow = (when.weekday() + 1) % 7 in self.weekdays  # Python counts from Monday
        if self.dom_restricted and self.dow_restricted:
            return in_dom or in_dow
        return in_dom and in_dow

    def matches(self, wall: datetime) -> bool:
        """Whether the wall-clock minute `wall` (its tzinfo ignored) is one the expression names."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self._day_matches(wall)
        )

    def next_after(self, after: datetime, tz: ZoneInfo) -> datetime:
        """First fire time strictly after the aware `after`, as an aware UTC datetime."""
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("next_after needs an aware datetime")
        local = after.astimezone(tz)
        # Naive wall-clock arithmetic: candidates are walked in wall time and mapped to
        # instants one at a time, which is where DST gaps and folds are decided.
        t = local.replace(tzinfo=None, second=0, microsecond=0, fold=0) + timedelta(minutes=1)
        limit_year = t.year + _SEARCH_YEARS
        try:
            while t.year <= limit_year:
                if t.month not in self.months:
                    i = bisect.bisect_right(self.months, t.month)
                    if i < len(self.months):
                        t = datetime(t.year, self.months[i], 1)
                    else:
                        t = datetime(t.year + 1, self.months[0], 1)
                    continue
                if not self._day_matches(t):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    continue
                if t.hour not in self.hours:
                    i = bisect.bisect_right(self.hours, t.hour)
                    if i < len(self.hours):
                        t = t.replace(hour=self.hours[i], minute=0)
                    else:
                        t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    continue
                if t.minute not in self.minutes:
                    i = bisect.bisect_right(self.minutes, t.minute)
                    if i < len(self.minutes):
                        t = t.replace(minute=self.minutes[i])
                    else:
                        t = t.replace(minute=0) + timedelta(hours=1)
                    continue
                fire = _resolve(t, tz)
                # None: the wall time falls in a spring-forward gap. Not after `after`: the
                # second pass through a fall-back hour, whose first occurrence already fired.
                if fire is not None and fire > after:
                    return fire
                t += timedelta(minutes=1)
        except (OverflowError, ValueError):
            pass  # walked past datetime.max (year 9999)
        raise CronError(f"expression: {self.expr!r} has no fire time after {after.isoformat()}")


def _resolve(wall: datetime, tz: ZoneInfo) -> datetime | None:
    """The UTC instant of the first occurrence of `wall` in `tz`, or None if it does not exist."""
    instant = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) != wall:
        return None
    return instant


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, init=False)
class EverySchedule:
    """Fire every `every_s` seconds, at whole multiples of `every_s` since the Unix epoch.

    Anchoring on the epoch (not on start-up) makes every instance compute the same fire
    times, so their dedup ids collide and only one enqueue survives.
    """

    every_s: float
    _every_us: int = field(repr=False, compare=False)

    def __init__(self, every_s: float) -> None:
        if not math.isfinite(every_s) or every_s <= 0:
            raise CronError(f"every_s: {every_s} must be a positive number of seconds")
        # Integer microseconds (datetime's resolution) keep the arithmetic exact: float
        # division would put 5.0 / 2.5 on either side of 2 depending on rounding.
        every_us = round(every_s * 1_000_000)
        if every_us < 1:
            raise CronError(f"every_s: {every_s} is below one microsecond")
        object.__setattr__(self, "every_s", every_s)
        object.__setattr__(self, "_every_us", every_us)

    def next_after(self, after: datetime, tz: ZoneInfo | None = None) -> datetime:
        """First multiple of `every_s` since the epoch strictly after `after`, in UTC.

        `tz` is accepted so both schedule kinds share one signature; epoch multiples are
        the same instants in every zone.
        """
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("next_after needs an aware datetime")
        elapsed_us = (after - _EPOCH) // _MICROSECOND
        ticks = elapsed_us // self._every_us + 1
        return _EPOCH + timedelta(microseconds=ticks * self._every_us)


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA zone `name` (e.g. "Europe/Berlin"); `CronError` if it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: keys such as "../x" or absolute paths; OSError: e.g. a directory
        # name like "Europe" on some platforms.
        raise CronError(f"timezone: unknown time zone {name!r}") from None
