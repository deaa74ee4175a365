"""One hierarchy: every exception outboxd defines is an OutboxdError, which `outboxd`'s
commands catch, except the few signals a loop or a handler uses to stop early."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import outboxd
from outboxd.errors import OutboxdError

# Not errors: control flow inside one module, never raised out of it.
SIGNALS = {"JobCancelled", "ClientDisconnected", "HeadersTooLarge", "SqsFault"}


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(outboxd.__path__, "outboxd."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_the_scan_finds_the_errors_of_every_layer() -> None:
    names = {name.rsplit(".", 1)[1] for name in _exception_classes()}
    assert {"ConfigError", "QueueError", "PortalError", "InputError", "StorageError"} <= names


def test_every_error_outboxd_defines_is_an_outboxd_error() -> None:
    outside = sorted(
        name
        for name, cls in _exception_classes().items()
        if not issubclass(cls, OutboxdError) and name.rsplit(".", 1)[1] not in SIGNALS
    )
    assert outside == []
