"""The moto launcher lives in testkit/ (shared with bench/); re-exported for the tests."""

from testkit.moto import MotoServer, free_port

__all__ = ["MotoServer", "free_port"]
