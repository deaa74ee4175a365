"""`terminate` lives in testkit/ (shared with bench/); re-exported for the tests."""

from testkit.process import terminate

__all__ = ["terminate"]
