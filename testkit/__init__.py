"""Process launchers and sample data shared by the tests and the benchmarks (never shipped:
outside src/).

`testkit.moto` starts moto's SQS server on loopback; `testkit.daemon` runs `outboxd serve`
and the loopback fakes as subprocesses; `testkit.records` is the record the scraper makes
of the fake portal's sample student. Both `tests/` and `bench/` import from here, so
bench/ needs nothing from tests/.
"""
