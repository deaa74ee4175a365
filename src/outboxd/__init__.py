"""outboxd: durable, rate-limited background work over HTTP, a database outbox and SQS.

`__version__` is the release number, in one place: the wheel's metadata takes it from here
(pyproject.toml, `[tool.hatch.version]`), and `outboxd --version` and
`outboxd_build_info{version}` read it from here, so a source tree, an editable install and a
wheel all say the same. CHANGELOG.md says what each release changed and how to upgrade.
"""

__version__ = "0.2.0"
