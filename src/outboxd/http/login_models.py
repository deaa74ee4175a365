"""The bodies of the portal login lock's admin routes (services/portal_logins.py): the
listing of usernames with failed logins, by keyed hash, and the unlock."""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta, Struct

from outboxd.http.models import RFC3339, SHOWN_TEXT, Count, DateTime

Subject = Annotated[
    str,
    Meta(
        pattern="^[0-9a-f]{64}$",
        description="The portal username as the lock keeps it: a keyed hash (HMAC-SHA256) of "
        "its normalized form, never the username.",
    ),
]


class PortalLoginUnlockRequest(Struct, rename="camel", forbid_unknown_fields=True):
    """Forget one portal username's failed logins and throttle; unknown fields are rejected."""

    username: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            pattern=SHOWN_TEXT,
            description="The portal username (normalized before it is hashed).",
        ),
    ]


class PortalLoginUnlocked(Struct, rename="camel"):
    """What an unlock cleared."""

    subject: Subject
    failures_cleared: Annotated[int, Meta(ge=0, description="Failed logins forgotten.")]


class PortalLoginUser(Struct, rename="camel"):
    """One submitting user's failed logins for the username within the window."""

    user: Annotated[
        str | None,
        Meta(description="The user of the token that submitted them (null: not recorded)."),
    ]
    failures: Count
    locked_until: Annotated[
        DateTime | None,
        Meta(description="While this user is locked out of the username: until" + RFC3339),
    ]


class PortalLogin(Struct, rename="camel"):
    """A portal username with recent failed logins, and who caused them."""

    subject: Subject
    failures: Annotated[int, Meta(ge=0, description="Failed logins within the window, all users.")]
    users: list[PortalLoginUser]
    throttled: Annotated[
        bool,
        Meta(
            description="Past scrapers.suwon.max_auth_failures_total: its jobs wait and try "
            "one login at a time."
        ),
    ]
    next_try_at: Annotated[
        DateTime | None, Meta(description="When throttled: its next login try" + RFC3339)
    ]
    locked_until: Annotated[
        DateTime | None,
        Meta(description="When its last lock (a user's, or the throttle) runs out" + RFC3339),
    ]


class PortalLoginPage(Struct, rename="camel"):
    """Portal usernames with failed logins, the most recently failed first."""

    items: list[PortalLogin]


MODELS: Final = (
    PortalLoginUnlockRequest,
    PortalLoginUnlocked,
    PortalLoginUser,
    PortalLogin,
    PortalLoginPage,
)
