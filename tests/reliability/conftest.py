"""Fixtures of the reliability suite (harness.py holds the pieces they are made of).

A module sets how many students the fake portal knows by overriding `n_students`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from tests.reliability.harness import Db, Fakes, daemon_config, new_daemon, write_keys_file

MakeDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def n_students() -> int:
    return 10


@pytest.fixture
def fakes(tmp_path: Path, n_students: int) -> Iterator[Fakes]:
    f = Fakes(tmp_path / "fakes", n_students=n_students)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    d = Db(db_url)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def make_daemon(
    tmp_path: Path,
    db_url: str,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    fakes: Fakes,
) -> Iterator[MakeDaemon]:
    """Daemons (not started) on the fakes with harness.daemon_config's small timings;
    keyword sections are merged over it. All SIGKILLed at the end if still running."""
    made: list[DaemonProcess] = []
    keys = write_keys_file(tmp_path / "keys")
    test_db_url = db_url

    def factory(
        name: str = "d",
        db_url: str | None = None,
        sqs_endpoint: str | None = None,
        **sections: Any,
    ) -> DaemonProcess:
        """`db_url` and `sqs_endpoint`: another way to the database or SQS (a proxy)."""
        config = daemon_config(
            db_url or test_db_url,
            sqs_endpoint or moto_server.endpoint_url,
            queue_names,
            fakes,
            keys,
            **sections,
        )
        d = new_daemon(tmp_path, config, name)
        made.append(d)
        return d

    yield factory
    for d in made:
        d.kill()
