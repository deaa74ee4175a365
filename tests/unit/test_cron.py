"""Cron and fixed-interval fire times: syntax, the day rule, month ends, leap years, DST."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from outboxd.cron import CronError, CronSchedule, EverySchedule, parse_timezone

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def fires(expr: str, after: datetime, count: int, tz: ZoneInfo = UTC_ZONE) -> list[datetime]:
    """The next `count` fire times of `expr` after `after`."""
    schedule = CronSchedule.parse(expr)
    out: list[datetime] = []
    for _ in range(count):
        after = schedule.next_after(after, tz)
        out.append(after)
    return out


# --- syntax ---------------------------------------------------------------------------


def test_every_minute() -> None:
    """`* * * * *` fires at the next whole minute, strictly after the given instant."""
    assert fires("* * * * *", utc(2024, 5, 1, 10, 0, 30), 2) == [
        utc(2024, 5, 1, 10, 1),
        utc(2024, 5, 1, 10, 2),
    ]


def test_strictly_after_a_fire_time() -> None:
    """An instant that is itself a fire time yields the following one."""
    assert fires("0 * * * *", utc(2024, 5, 1, 10, 0), 1) == [utc(2024, 5, 1, 11, 0)]


def test_result_is_utc_with_zero_seconds() -> None:
    """The fire time is an aware UTC datetime on a whole minute."""
    (fire,) = fires("*/7 * * * *", utc(2024, 5, 1, 10, 3, 59, 999999), 1)
    assert fire.tzinfo is UTC
    assert (fire.second, fire.microsecond) == (0, 0)


def test_after_may_be_in_any_zone() -> None:
    """An `after` in another zone means the same instant as its UTC equivalent."""
    schedule = CronSchedule.parse("15 * * * *")
    india = timezone(timedelta(hours=5, minutes=30))
    after = datetime(2024, 5, 1, 15, 50, tzinfo=india)  # 10:20Z
    assert schedule.next_after(after, UTC_ZONE) == utc(2024, 5, 1, 11, 15)


def test_naive_after_is_rejected() -> None:
    """A naive `after` is ambiguous, so next_after refuses it."""
    with pytest.raises(ValueError, match="aware"):
        CronSchedule.parse("* * * * *").next_after(datetime(2024, 1, 1), UTC_ZONE)


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", utc(2024, 5, 1, 10, 7), [(10, 15), (10, 30), (10, 45), (11, 0)]),
        ("5-20/5 * * * *", utc(2024, 5, 1, 10, 7), [(10, 10), (10, 15), (10, 20), (11, 5)]),
        ("10/20 * * * *", utc(2024, 5, 1, 10, 0), [(10, 10), (10, 30), (10, 50), (11, 10)]),
        ("0,30 9-10 * * *", utc(2024, 5, 1, 8, 0), [(9, 0), (9, 30), (10, 0), (10, 30)]),
        ("59 23 * * *", utc(2024, 5, 1, 0, 0), [(23, 59)]),
        ("0 */6 * * *", utc(2024, 5, 1, 1, 0), [(6, 0), (12, 0), (18, 0)]),
    ],
)
def test_lists_ranges_and_steps(
    expr: str, after: datetime, expected: list[tuple[int, int]]
) -> None:
    """Lists, ranges, `*/n`, `a-b/n` and `a/n` expand to the minutes and hours they name."""
    got = fires(expr, after, len(expected))
    assert [(f.hour, f.minute) for f in got] == expected


def test_hour_and_day_rollover() -> None:
    """Minutes past the last listed one roll into the next hour, day, month and year."""
    assert fires("30 23 31 12 *", utc(2024, 12, 31, 23, 30), 1) == [utc(2025, 12, 31, 23, 30)]
    assert fires("0 0 1 1 *", utc(2024, 12, 31, 23, 59), 1) == [utc(2025, 1, 1)]


def test_month_names_case_insensitive() -> None:
    """Month names JAN-DEC work in any case and in ranges."""
    assert fires("0 0 1 jan,Jul *", utc(2024, 2, 1), 2) == [utc(2024, 7, 1), utc(2025, 1, 1)]
    assert fires("0 0 1 NOV-dec *", utc(2024, 2, 1), 2) == [utc(2024, 11, 1), utc(2024, 12, 1)]


def test_weekday_names_and_ranges() -> None:
    """Weekday names SUN-SAT and ranges like MON-FRI select weekdays (2024-05-03 is a Friday)."""
    got = fires("0 9 * * mon-FRI", utc(2024, 5, 3, 10, 0), 2)
    assert got == [utc(2024, 5, 6, 9), utc(2024, 5, 7, 9)]


@pytest.mark.parametrize("sunday", ["0", "7", "SUN", "sun"])
def test_sunday_is_0_and_7(sunday: str) -> None:
    """0, 7 and SUN all mean Sunday (2024-05-05 and 2024-05-12 are Sundays)."""
    assert fires(f"0 0 * * {sunday}", utc(2024, 5, 1), 2) == [utc(2024, 5, 5), utc(2024, 5, 12)]


def test_weekday_range_through_7() -> None:
    """`5-7` is Friday, Saturday and Sunday."""
    got = fires("0 0 * * 5-7", utc(2024, 5, 1), 4)
    assert [f.day for f in got] == [3, 4, 5, 10]


@pytest.mark.parametrize(
    ("macro", "expansion"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, expansion: str) -> None:
    """Each macro fires exactly when its 5-field expansion does."""
    start = utc(2024, 2, 27, 13, 17)
    assert fires(macro, start, 3) == fires(expansion, start, 3)


# --- the day-of-month / day-of-week rule ----------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # With both day fields restricted, the 13th and every Friday fire (once on Friday 13th).
        pytest.param(
            "0 0 13 * FRI",
            utc(2024, 9, 1),
            [
                "2024-09-06",
                "2024-09-13",
                "2024-09-20",
                "2024-09-27",
                "2024-10-04",
                "2024-10-11",
                "2024-10-13",
            ],
            id="dom-and-dow-both-restricted-match-either",
        ),
        # With day-of-month `*`, only the weekday decides.
        pytest.param(
            "0 0 * * 1", utc(2024, 9, 1), ["2024-09-02", "2024-09-09"], id="only-dow-restricted"
        ),
        # As in Vixie cron, `*/2` in day-of-month is unrestricted, so both fields must match:
        # odd days that are Mondays (09-02, 09-16 are even).
        pytest.param(
            "0 0 */2 * MON",
            utc(2024, 9, 1),
            ["2024-09-09", "2024-09-23", "2024-10-07", "2024-10-21"],
            id="star-step-counts-as-unrestricted",
        ),
        # Feb 30 with a weekday restriction still fires, on that weekday (the OR rule).
        pytest.param(
            "0 0 30 2 MON",
            utc(2024, 2, 1),
            ["2024-02-05", "2024-02-12"],
            id="impossible-day-allowed-when-weekday-can-fire",
        ),
    ],
)
def test_the_day_rule(expr: str, after: datetime, expected: list[str]) -> None:
    """Day-of-month and day-of-week, as in Vixie cron: with both restricted, either fires."""
    got = fires(expr, after, len(expected))
    assert [f.date().isoformat() for f in got] == expected


# --- month ends and leap years --------------------------------------------------------


def test_day_31_skips_short_months() -> None:
    """The 31st fires only in months that have one."""
    got = fires("0 0 31 * *", utc(2024, 1, 31), 3)
    assert [f.date().isoformat() for f in got] == ["2024-03-31", "2024-05-31", "2024-07-31"]


def test_day_30_skips_february() -> None:
    """The 30th skips February, leap year or not."""
    got = fires("0 12 30 * *", utc(2024, 1, 30, 12), 1)
    assert got == [utc(2024, 3, 30, 12)]


def test_leap_day() -> None:
    """Feb 29 fires only in leap years."""
    assert fires("0 0 29 2 *", utc(2024, 2, 29), 2) == [utc(2028, 2, 29), utc(2032, 2, 29)]


def test_leap_day_across_a_skipped_century() -> None:
    """2100 is not a leap year, so Feb 29 after 2096 next falls in 2104."""
    assert fires("0 0 29 2 *", utc(2097, 3, 1), 1) == [utc(2104, 2, 29)]


def test_sparse_schedules_search_years_ahead() -> None:
    """A leap-day schedule 8 years from its next fire time still finds it (repeatably)."""
    schedule = CronSchedule.parse("0 0 29 2 *")
    for _ in range(20):
        assert schedule.next_after(utc(2096, 3, 1), UTC_ZONE) == utc(2104, 2, 29)


# --- time zones and DST ---------------------------------------------------------------


def test_wall_clock_of_the_zone() -> None:
    """`0 9 * * *` in Berlin is 08:00Z in winter and 07:00Z in summer."""
    assert fires("0 9 * * *", utc(2024, 1, 15), 1, BERLIN) == [utc(2024, 1, 15, 8)]
    assert fires("0 9 * * *", utc(2024, 7, 15), 1, BERLIN) == [utc(2024, 7, 15, 7)]


def test_berlin_spring_forward_fires_right_after_the_jump() -> None:
    """02:30 does not exist in Berlin on 2024-03-31: it fires at 03:00 CEST (cronie's rule)."""
    assert fires("30 2 * * *", utc(2024, 3, 30, 23), 1, BERLIN) == [utc(2024, 3, 31, 1, 0)]
    got = fires("30 2 * * *", utc(2024, 3, 30, 12), 3, BERLIN)
    assert got == [utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 0, 30), utc(2024, 4, 2, 0, 30)]
    assert got[0].astimezone(BERLIN).strftime("%H:%M %Z") == "03:00 CEST"


def test_berlin_spring_forward_half_hourly() -> None:
    """Half-hourly jumps from 01:30 CET straight to 03:00 CEST across the gap."""
    got = fires("*/30 * * * *", utc(2024, 3, 31, 0, 0), 3, BERLIN)  # 01:00 CET
    assert got == [utc(2024, 3, 31, 0, 30), utc(2024, 3, 31, 1, 0), utc(2024, 3, 31, 1, 30)]
    assert [f.astimezone(BERLIN).strftime("%H:%M %Z") for f in got] == [
        "01:30 CET",
        "03:00 CEST",
        "03:30 CEST",
    ]


def test_berlin_fall_back_fires_once() -> None:
    """02:30 happens twice in Berlin on 2024-10-27; it fires at the first (CEST) one only."""
    got = fires("30 2 * * *", utc(2024, 10, 26, 12), 2, BERLIN)
    assert got == [utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)]


def test_berlin_fall_back_hourly_skips_the_repeat() -> None:
    """Hourly after 02:00 CEST goes to 03:00 CET: the repeated 02:00 (CET) already fired."""
    got = fires("0 * * * *", utc(2024, 10, 27, 0, 0), 1, BERLIN)  # after 02:00 CEST
    assert got == [utc(2024, 10, 27, 2, 0)]


LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # clocks go back 30 minutes, 02:00 -> 01:30


def test_lord_howe_half_hour_fall_back_fires_at_the_first_wall_time_past_the_repeat() -> None:
    """From the second pass of 01:30-02:00 (15:00Z), even hours fire at 02:00 (15:30Z), not
    02:30: cronsim, given an aware start, left the repeat by a whole hour."""
    assert fires("* */2 * * *", utc(2024, 4, 6, 15), 1, LORD_HOWE) == [utc(2024, 4, 6, 15, 30)]


def test_lord_howe_midnight_after_the_half_hour_fall_back() -> None:
    """From the first pass (01:40 LHDT), the next midnight is 00:00 LHST (13:30Z), not 00:30."""
    assert fires("* 0 * * *", utc(2024, 4, 6, 14, 40), 1, LORD_HOWE) == [utc(2024, 4, 7, 13, 30)]


def test_after_inside_the_repeated_hour() -> None:
    """From inside the second 02:xx hour, a 02:50 schedule waits for the next day."""
    after = utc(2024, 10, 27, 1, 15)  # 02:15 CET, the second pass
    assert fires("50 2 * * *", after, 1, BERLIN) == [utc(2024, 10, 28, 1, 50)]


def test_after_inside_the_first_pass_of_the_repeated_hour() -> None:
    """From inside the first 02:xx hour, a later 02:50 still fires in that first pass."""
    after = utc(2024, 10, 27, 0, 15)  # 02:15 CEST
    assert fires("50 2 * * *", after, 1, BERLIN) == [utc(2024, 10, 27, 0, 50)]


def test_new_york_dst() -> None:
    """New York: 02:00 on 2024-03-10 fires at 03:00 EDT; 01:30 on 2024-11-03 fires once (EDT)."""
    assert fires("0 2 * * *", utc(2024, 3, 9), 3, NEW_YORK) == [
        utc(2024, 3, 9, 7),
        utc(2024, 3, 10, 7),
        utc(2024, 3, 11, 6),
    ]
    assert fires("30 1 * * *", utc(2024, 11, 2, 12), 2, NEW_YORK) == [
        utc(2024, 11, 3, 5, 30),
        utc(2024, 11, 4, 6, 30),
    ]


# --- invalid expressions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "minute: '61' is not valid"),
        ("* 24 * * *", "hour: '24' is not valid"),
        ("* * 0 * *", "day-of-month: '0' is not valid"),
        ("* * 32 * *", "day-of-month: '32' is not valid"),
        ("* * * 13 *", "month: '13' is not valid"),
        ("* * * 0 *", "month: '0' is not valid"),
        ("* * * * 8", "day-of-week: '8' is not valid"),
        ("* * * FOO *", "month: 'FOO' is not valid"),
        ("* * JAN * *", "day-of-month: 'JAN' is not valid"),
        ("* * * * MON-", "day-of-week: 'MON-' is not valid"),
        ("-1 * * * *", "minute: '-1' is not valid"),
        ("\u00b2 * * * *", "minute: '\u00b2' is not valid"),
        ("*/0 * * * *", "minute: '*/0' is not valid"),
        ("*/x * * * *", "minute: '*/x' is not valid"),
        ("5-1 * * * *", "minute: '5-1' is not valid"),
        ("* * * * FRI-MON", "day-of-week: 'FRI-MON' is not valid"),
        ("1,,2 * * * *", "minute: '1,,2' is not valid"),
        (
            "* * * *",
            "expression: expected 5 fields (minute hour day-of-month month day-of-week),"
            " got 4 in '* * * *'",
        ),
        (
            "* * * * * *",
            "expression: expected 5 fields (minute hour day-of-month month day-of-week),"
            " got 6 in '* * * * * *'",
        ),
        (
            "",
            "expression: expected 5 fields (minute hour day-of-month month day-of-week),"
            " got 0 in ''",
        ),
        (
            "@reboot",
            "expression: unknown macro '@reboot'"
            " (known: @hourly @daily @midnight @weekly @monthly @yearly @annually)",
        ),
        ("0 0 30 2 *", "day-of-month: '30' never occurs in month 2"),
        ("0 0 30,31 feb *", "day-of-month: '30,31' never occurs in month feb"),
        ("0 0 31 APR,JUN *", "day-of-month: '31' never occurs in month APR,JUN"),
    ],
)
def test_invalid_expressions(expr: str, message: str) -> None:
    """Each invalid or never-firing expression raises CronError naming the field and reason."""
    with pytest.raises(CronError) as info:
        CronSchedule.parse(expr)
    assert str(info.value) == message


def test_cron_error_is_a_value_error() -> None:
    """CronError is a ValueError, so config validation can catch either."""
    assert issubclass(CronError, ValueError)


# --- EverySchedule --------------------------------------------------------------------

EPOCH = utc(1970, 1, 1)


def test_every_second() -> None:
    """Every 1 s fires on whole UTC seconds, strictly after `after`."""
    every = EverySchedule(1)
    assert every.next_after(utc(2024, 5, 1, 12, 0, 0, 300000)) == utc(2024, 5, 1, 12, 0, 1)
    assert every.next_after(utc(2024, 5, 1, 12, 0, 1)) == utc(2024, 5, 1, 12, 0, 2)


@pytest.mark.parametrize(
    ("after_s", "expected_s"),
    [(0.0, 2.5), (5.0, 7.5), (5.1, 7.5), (7.499999, 7.5), (7.5, 10.0)],
)
def test_every_two_and_a_half_seconds(after_s: float, expected_s: float) -> None:
    """Every 2.5 s fires at exact multiples of 2.5 s since the epoch."""
    after = EPOCH + timedelta(seconds=after_s)
    assert EverySchedule(2.5).next_after(after) == EPOCH + timedelta(seconds=expected_s)


def test_every_two_and_a_half_seconds_today() -> None:
    """Epoch alignment holds for present-day instants (1704067200 = 2.5 x 681626880)."""
    assert EverySchedule(2.5).next_after(utc(2024, 1, 1, 0, 0, 1)) == utc(
        2024, 1, 1, 0, 0, 2, 500000
    )


def test_every_hour_is_top_of_the_utc_hour_in_any_zone() -> None:
    """Every 3600 s fires on the UTC hour whatever zone is passed (epoch multiples are instants)."""
    every = EverySchedule(3600)
    after = utc(2024, 5, 1, 10, 59, 59)
    assert every.next_after(after) == utc(2024, 5, 1, 11)
    assert every.next_after(after, ZoneInfo("Asia/Kolkata")) == utc(2024, 5, 1, 11)
    assert every.next_after(utc(2024, 5, 1, 11)) == utc(2024, 5, 1, 12)


def test_sub_second_interval_is_exact() -> None:
    """Every 0.1 s lands on exact tenths; no float drift."""
    assert EverySchedule(0.1).next_after(EPOCH + timedelta(seconds=0.25)) == EPOCH + timedelta(
        seconds=0.3
    )


def test_instances_agree_on_fire_times() -> None:
    """Two schedules started at different moments compute the same next fire time."""
    # 2024-05-01T12:00:03Z and 12:00:10Z are consecutive multiples of 7 s since the epoch.
    first = EverySchedule(7).next_after(utc(2024, 5, 1, 12, 0, 3))
    second = EverySchedule(7).next_after(utc(2024, 5, 1, 12, 0, 9, 999999))
    assert first == second == utc(2024, 5, 1, 12, 0, 10)


@pytest.mark.parametrize("every_s", [0.0, -1.0, math.nan, math.inf, 1e-9])
def test_every_rejects_bad_intervals(every_s: float) -> None:
    """A non-positive, non-finite or sub-microsecond interval raises CronError naming every_s."""
    with pytest.raises(CronError, match=r"^every_s: "):
        EverySchedule(every_s)


def test_every_rejects_naive_after() -> None:
    """A naive `after` is refused."""
    with pytest.raises(ValueError, match="aware"):
        EverySchedule(1).next_after(datetime(2024, 1, 1))


@settings(max_examples=200, deadline=None)
@given(
    every_us=st.integers(1, 10**10),
    after_us=st.integers(0, 4 * 10**15),
)
def test_every_property(every_us: int, after_us: int) -> None:
    """The fire time is the least epoch multiple of the interval strictly after `after`."""
    every = EverySchedule(every_us / 1_000_000)
    after = EPOCH + timedelta(microseconds=after_us)
    fire = every.next_after(after)
    fire_us = (fire - EPOCH) // timedelta(microseconds=1)
    step = round(every.every_s * 1_000_000)
    assert fire_us % step == 0
    assert after_us < fire_us <= after_us + step


# --- parse_timezone -------------------------------------------------------------------


def test_parse_timezone_known() -> None:
    """An IANA name gives its ZoneInfo."""
    assert parse_timezone("Europe/Berlin") == BERLIN
    assert parse_timezone("UTC").key == "UTC"


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "Europe", "../etc/passwd", "/etc/localtime"])
def test_parse_timezone_unknown(name: str) -> None:
    """An unknown or malformed name raises CronError (a ValueError) naming it."""
    with pytest.raises(CronError) as info:
        parse_timezone(name)
    assert str(info.value) == f"timezone: unknown time zone {name!r}"


# --- against a brute-force oracle -----------------------------------------------------

ZONES = [
    UTC_ZONE,
    BERLIN,
    NEW_YORK,
    ZoneInfo("Australia/Lord_Howe"),  # a 30-minute DST shift
    ZoneInfo("Asia/Kathmandu"),  # +05:45
]
ANCHORS = [
    utc(2024, 3, 31, 1),  # Berlin spring forward
    utc(2024, 10, 27, 1),  # Berlin fall back
    utc(2024, 3, 10, 7),  # New York spring forward
    utc(2024, 11, 3, 6),  # New York fall back
    utc(2024, 4, 6, 15),  # Lord Howe fall back
    utc(2024, 10, 5, 15, 30),  # Lord Howe spring forward
    utc(2024, 2, 28, 23),  # leap day
    utc(2024, 12, 31, 23),  # year end
]
HORIZON = timedelta(days=2)


def _field(low: int, high: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    value = number.map(str)
    if names:
        value = value | st.sampled_from(names + [n.lower() for n in names])
    span = st.tuples(number, number).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.integers(1, high - low + 1)
    item = st.one_of(
        st.just("*"),
        step.map(lambda n: f"*/{n}"),
        value,
        span,
        st.tuples(span, step).map(lambda t: f"{t[0]}/{t[1]}"),
        st.tuples(number, step).map(lambda t: f"{t[0]}/{t[1]}"),
    )
    return st.lists(item, min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(
    _field(0, 59),
    _field(0, 23),
    _field(1, 31),
    _field(1, 12, ["JAN", "FEB", "MAR", "OCT", "NOV", "DEC"]),
    _field(0, 7, ["SUN", "MON", "SAT"]),
).map(" ".join)


def _matches(sim: CronSim, wall: datetime) -> bool:
    """Whether the wall-clock minute `wall` is one the expression names (cronsim's parse)."""
    return (
        wall.minute in sim.minutes
        and wall.hour in sim.hours
        and wall.month in sim.months
        and sim.match_day(wall.date())
    )


def _brute_force(expr: str, after: datetime, tz: ZoneInfo, until: datetime) -> datetime | None:
    """Walk real UTC minutes: a minute fires if its wall time matches and is a first occurrence,
    or, for a fixed-time expression (minute and hour not starting with `*`), if it is the first
    minute after a spring-forward jump that skipped a matching wall time."""
    sim = CronSim(expr, datetime(2000, 1, 1))
    minute_f, hour_f = expr.split()[:2]
    fixed_time = not minute_f.startswith("*") and not hour_f.startswith("*")
    minute = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < until:
        wall = minute.astimezone(tz)
        if wall.fold == 0 and _matches(sim, wall):
            return minute
        if fixed_time:
            skipped = (minute - timedelta(minutes=1)).astimezone(tz).replace(tzinfo=None)
            skipped += timedelta(minutes=1)
            while skipped < wall.replace(tzinfo=None):
                if _matches(sim, skipped):
                    return minute
                skipped += timedelta(minutes=1)
        minute += timedelta(minutes=1)
    return None


@settings(max_examples=150, deadline=None)
@given(
    expr=EXPRESSIONS,
    tz=st.sampled_from(ZONES),
    anchor=st.sampled_from(ANCHORS),
    offset_s=st.integers(-2 * 86400, 2 * 86400),
)
def test_matches_brute_force(expr: str, tz: ZoneInfo, anchor: datetime, offset_s: int) -> None:
    """next_after equals a minute-by-minute walk of real time, DST transitions included."""
    try:
        schedule = CronSchedule.parse(expr)
    except CronError:
        assume(False)
        raise
    after = anchor + timedelta(seconds=offset_s)
    until = after + HORIZON
    expected = _brute_force(expr, after, tz, until)
    fire = schedule.next_after(after, tz)
    if expected is None:
        assert fire >= until.replace(second=0, microsecond=0)
    else:
        assert fire == expected
