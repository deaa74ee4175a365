"""Row ids are version-7 UUIDs as text: unique, in time order, with their time in front."""

from __future__ import annotations

import time
import uuid

from outboxd.ids import new_id


def test_ids_are_version_7_uuid_text_and_unique() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        u = uuid.UUID(text)
        assert str(u) == text and u.version == 7 and u.variant == uuid.RFC_4122


def test_an_id_starts_with_the_millisecond_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    u = uuid.UUID(new_id())
    after = time.time_ns() // 1_000_000
    assert before <= u.int >> 80 <= after


def test_text_order_is_time_order() -> None:
    """What keeps the primary-key indexes' inserts at their right end: ids sorted as text
    are sorted by the millisecond they were made (within one, the random bits decide), and
    an id made in a later millisecond sorts after every earlier one."""
    ids: list[str] = []
    deadline = time.monotonic() + 5
    while len({uuid.UUID(x).int >> 80 for x in ids}) < 5 and time.monotonic() < deadline:
        ids += [new_id() for _ in range(50)]
    stamps = [uuid.UUID(x).int >> 80 for x in sorted(ids)]
    assert len(set(stamps)) >= 5 and stamps == sorted(stamps)
    last = max(stamps)
    while time.time_ns() // 1_000_000 <= last:
        pass
    assert new_id() > max(ids)


def test_ids_do_not_repeat_their_random_part() -> None:
    """74 random bits per id: no two ids of one millisecond share them."""
    tails = [new_id()[15:] for _ in range(5000)]
    assert len(set(tails)) == len(tails)
