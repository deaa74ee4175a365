"""The login lock's rules as pure functions: the window rule and when a lock ends, the
username's normal form, and the operator's view of one username."""

from __future__ import annotations

import pytest

from outboxd.config import SuwonScraperSettings
from outboxd.security import normalized_login
from outboxd.services.portal_logins import _username_lock, locked_until, login_locked
from outboxd.storage.login_ports import LoginFailureRow, LoginThrottle

W = 3600.0


@pytest.mark.parametrize(
    ("failures", "locked"),
    [
        ([], False),
        ([100.0, 50.0], False),  # two of three
        ([100.0, 50.0, 0.0], True),
        ([100.0, 50.0, 100.0 - W - 1], False),  # the third is over a window before the last
        ([100.0 - W, 50.0 - W, -W], False),  # the last is a window ago
    ],
)
def test_the_window_rule(failures: list[float], locked: bool) -> None:
    assert login_locked(failures, 100.0, W, 3) is locked
    assert (locked_until(failures, 100.0, W, 3) is not None) is locked


def test_a_lock_ends_a_window_after_the_last_failure_and_zero_turns_it_off() -> None:
    assert locked_until([100.0, 50.0, 0.0], 120.0, W, 3) == 100.0 + W
    assert locked_until([100.0, 50.0, 0.0], 120.0, W, 0) is None


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("20201234", "20201234"),
        (" 20201234 ", "20201234"),
        ("２０２０１２３４", "20201234"),  # full-width digits (NFKC)
        ("Kim", "kim"),
        ("STRASSE", "strasse"),
        ("Straße", "strasse"),  # case folding, not lower()
        ("ﬁ", "fi"),  # a ligature (NFKC)
    ],
)
def test_the_normal_form(given: str, normal: str) -> None:
    assert normalized_login(given) == normal


def test_the_operators_view_names_who_caused_the_lock() -> None:
    s = SuwonScraperSettings(max_auth_failures=3, max_auth_failures_total=4)
    rows = [
        LoginFailureRow("x", "mallory", 100.0),
        LoginFailureRow("x", "mallory", 90.0),
        LoginFailureRow("x", "mallory", 80.0),
        LoginFailureRow("x", None, 70.0),  # recorded by a release before 0028
    ]
    throttle = LoginThrottle("x", next_try_at=200.0, delay_s=120.0, holder=None, held_until=None)
    view = _username_lock("x", rows, throttle, 150.0, s)
    assert [(u.user_id, u.failures, u.locked_until) for u in view.users] == [
        ("mallory", 3, 100.0 + W),
        (None, 1, None),
    ]
    assert view.failures == 4 and view.throttled and view.next_try_at == 200.0
    assert view.locked and view.locked_until == 100.0 + W
    calm = _username_lock("x", rows[:1], None, 150.0, s)
    assert not calm.locked and not calm.throttled and calm.next_try_at is None
