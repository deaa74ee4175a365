"""The bodies of the bulk redrive (`POST /v1/admin/jobs/redrive`): the request, the answer
to a redrive by status, and the answer to a redrive of the ids an operator was shown
(`{"jobIds": [...]}` alone): what went back to QUEUED and what was skipped, each with a code."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta, Struct

from outboxd.http.models import JOB_ID_PATTERN, Body

# A bulk redrive names at most this many jobs, or redrives at most this many by status.
REDRIVE_MAX_IDS: Final = 1000
REDRIVE_MAX_LIMIT: Final = 10_000


class JobRedriveRequest(Body):
    """Redrive jobs in bulk: the ids shown to the operator (`jobIds` alone: the answer is
    JobRedriveByIds), or the jobs in `status` (newest first, at most `limit`; with `jobIds`,
    only those of them). Unknown fields are rejected."""

    status: (
        Annotated[
            Literal["DEAD"],
            Meta(description="The jobs in this state.", extra={"max_length": 32}),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    job_ids: (
        Annotated[
            list[Annotated[str, Meta(pattern=JOB_ID_PATTERN)]],
            Meta(
                min_length=1,
                max_length=REDRIVE_MAX_IDS,
                description="Only these jobs; one that is not DEAD, unknown or whose "
                "credentials were erased is refused and changes nothing.",
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    limit: Annotated[
        int,
        Meta(
            ge=1,
            le=REDRIVE_MAX_LIMIT,
            description="Without jobIds: redrive at most this many (default 1000); `more` "
            "in the answer says whether any are left.",
        ),
    ] = 1000


class RedriveRefusal(Struct, rename="camel"):
    """A job a bulk redrive did not redrive, and why."""

    job_id: str
    reason: str


class JobRedriveResult(Struct, rename="camel"):
    """What a bulk redrive did: each job is redriven (one transaction per hundred) or
    refused, and changes nothing when refused."""

    redriven: Annotated[int, Meta(ge=0, description="How many jobs went back to QUEUED.")]
    job_ids: Annotated[list[str], Meta(description="The jobs redriven, in order.")]
    refused: list[RedriveRefusal]
    more: Annotated[
        bool, Meta(description="The limit was reached and more jobs are in that state.")
    ]


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


MODELS: Final = (JobRedriveRequest, RedriveRefusal, JobRedriveResult, RedriveSkip, JobRedriveByIds)


def skip_code(reason: str) -> Literal["NOT_FOUND", "NOT_DEAD", "CREDENTIALS_ERASED"]:
    """The code of a refusal the redrive service explained in words."""
    if reason == "no such job":
        return "NOT_FOUND"
    return "CREDENTIALS_ERASED" if "credentials" in reason else "NOT_DEAD"
