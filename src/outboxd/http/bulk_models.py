"""The answer of a bulk redrive by the ids an operator was shown
(`POST /v1/admin/jobs/redrive` with `{"jobIds": [...]}` alone): what went back to QUEUED and
what was skipped, each with a code."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from msgspec import Meta, Struct


class RedriveSkip(Struct, rename="camel"):
    """A named job the redrive left as it was, and why."""

    job_id: str
    code: Annotated[
        Literal["NOT_FOUND", "NOT_DEAD", "CREDENTIALS_ERASED"],
        Meta(description="No such job; it is not DEAD; its credentials were erased."),
    ]


class JobRedriveByIds(Struct, rename="camel"):
    """What a redrive of named jobs did: each is redriven or skipped (and then unchanged)."""

    redriven: Annotated[list[str], Meta(description="The jobs back to QUEUED, in order.")]
    skipped: list[RedriveSkip]


MODELS: Final = (RedriveSkip, JobRedriveByIds)


def skip_code(reason: str) -> Literal["NOT_FOUND", "NOT_DEAD", "CREDENTIALS_ERASED"]:
    """The code of a refusal the redrive service explained in words."""
    if reason == "no such job":
        return "NOT_FOUND"
    return "CREDENTIALS_ERASED" if "credentials" in reason else "NOT_DEAD"
