"""The bodies of the dependencies' admin routes (services/breakers.py): each outside
system's state, and an operator's pause and resume."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from msgspec import Meta, Struct

from outboxd.http.models import RFC3339, SHOWN_TEXT, Count, DateTime

DependencyName = Literal["portal", "ai", "sqs"]


class Dependency(Struct, rename="camel"):
    """One outside system as every instance sees it."""

    name: Annotated[
        DependencyName, Meta(description="portal, ai (the classifier's provider), sqs.")
    ]
    state: Annotated[
        Literal["up", "down", "maintenance", "paused"],
        Meta(
            description="up: work runs. down: its breaker is open after runs in a row ended in "
            "an outage failure; one probe at a time for the cluster. maintenance: inside a "
            "configured window, no call at all. paused: an operator paused it."
        ),
    ]
    since: Annotated[DateTime | None, Meta(description="When the state began" + RFC3339)]
    until: Annotated[
        DateTime | None,
        Meta(description="When it ends by itself (a pause's end, a window's), null when unknown"),
    ]
    reason: Annotated[str | None, Meta(description="The pause's reason (paused only).")]
    paused_by: Annotated[str | None, Meta(description="Who paused it (paused only).")]
    failures_in_a_row: Annotated[
        Count, Meta(description="Runs in a row, from any instance, that ended in an outage.")
    ]
    last_error: Annotated[str | None, Meta(description="The last outage failure's cause.")]
    last_probe_at: Annotated[
        DateTime | None, Meta(description="When the last probe was sent" + RFC3339)
    ]
    waiting: Annotated[Count, Meta(description="Jobs or rows waiting for it now.")]


class DependencyList(Struct):
    """Every outside system, by name."""

    items: list[Dependency]


class PauseRequest(Struct, rename="camel", forbid_unknown_fields=True):
    """Pause calls to a dependency: why, and until when (neither forS nor until: until
    resumed); unknown fields are rejected."""

    reason: Annotated[
        str,
        Meta(min_length=1, max_length=500, pattern=SHOWN_TEXT, description="Why (required)."),
    ]
    for_s: (
        Annotated[float, Meta(gt=0, le=31_536_000, description="Pause for this many seconds.")]
        | None
    ) = None
    until: DateTime | None = None


MODELS: Final = (Dependency, DependencyList, PauseRequest)
