"""The daemon launcher lives in testkit/ (shared with bench/); re-exported for the tests."""

from testkit.daemon import DaemonProcess, FakeProcess, dump_toml, listening_url

__all__ = ["DaemonProcess", "FakeProcess", "dump_toml", "listening_url"]
