"""Websites and their category: the domain rule, and registration (the work outbox's
transaction boundary).

`normalize_domain` is the one domain rule: registration, the lookup and the admin retry
all call it, and the OpenAPI document states its limit and pattern from here.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import idna
import structlog

from outboxd.errors import CapReached, OutboxdError, QuotaExceeded
from outboxd.ids import new_id
from outboxd.storage.ports import Page
from outboxd.storage.website_ports import WEBSITE_QUOTA_PERIOD_S, Website, WebsiteStore

log = structlog.get_logger(__name__)

# A name in its ASCII text form, without the trailing dot (RFC 1035's 255 octets on the wire).
MAX_DOMAIN_CHARS: Final = 253

# What the document promises to accept as a domain: ASCII letter-digit-hyphen labels of
# 1-63 characters, no leading or trailing hyphen and no "--" in the 3rd and 4th place
# (the rules IDNA adds for ASCII labels, so never an invalid `xn--` label); two labels at
# least, the last starting with a letter. Every such name passes `normalize_domain`; IDN
# input (U-labels, valid A-labels) is accepted too and described in words.
_A: Final = "[A-Za-z0-9]"
_L: Final = "[A-Za-z0-9-]"
_LABEL_TAIL: Final = f"(?:{_L}?{_A})?|{_L}{_L}{_A}|{_L}(?:{_A}{_L}|-{_A}){_L}{{0,58}}{_A}"
HOST_NAME: Final = f"^(?:{_A}(?:{_LABEL_TAIL})\\.)+[A-Za-z](?:{_LABEL_TAIL})\\.?$"

_LDH = set("abcdefghijklmnopqrstuvwxyz0123456789-")
_FORBIDDEN = set("/\\?#@:[]% \t\r\n")
_TOO_LONG: Final = f"is longer than {MAX_DOMAIN_CHARS} characters"


class InvalidDomain(OutboxdError, ValueError):
    """The text is not a bare host name; str() says why (never echoing much of it)."""


def normalize_domain(text: str) -> str:
    """Lowercase, IDNA to ASCII, one trailing dot dropped; anything else is rejected.

    Rejecting instead of stripping is deliberate: `https://a.com/x` is a client
    bug, and guessing which part they meant would register the wrong thing. The length
    is checked first as given and again in ASCII form, so IDNA never reads a long text.
    """
    value = text.strip()
    if not value:
        raise InvalidDomain("must not be empty")
    if len(value.removesuffix(".")) > MAX_DOMAIN_CHARS:
        raise InvalidDomain(_TOO_LONG)
    if "://" in value:
        raise InvalidDomain("must be a host name, not a URL (no scheme)")
    bad = _FORBIDDEN.intersection(value)
    if bad:
        what = "port" if bad == {":"} else "path, query, port or user part"
        raise InvalidDomain(f"must be a bare host name (no {what})")
    if value.endswith("."):
        value = value[:-1]
    try:
        ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        raise InvalidDomain("must be a host name, not an IP address")
    labels = value.split(".")
    if any(label == "" for label in labels):
        raise InvalidDomain("has an empty label")
    try:
        ascii_name = idna.encode(value, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise InvalidDomain(f"is not a valid internationalised name ({str(exc)[:80]})") from None
    except UnicodeError:  # lone surrogates and the like, which IDNA cannot even read
        raise InvalidDomain("is not a valid internationalised name") from None
    ascii_name = ascii_name.lower()
    labels = ascii_name.split(".")
    if len(labels) < 2:
        raise InvalidDomain("must have at least two labels (like example.com)")
    for label in labels:
        if not label:  # IDNA maps other dots (U+3002 ...) to ".", so one can appear here
            raise InvalidDomain("has an empty label")
        if len(label) > 63:
            raise InvalidDomain("has a label longer than 63 characters")
        if not set(label) <= _LDH or label.startswith("-") or label.endswith("-"):
            raise InvalidDomain("labels may hold only letters, digits and inner hyphens")
    if labels[-1].isdigit():
        raise InvalidDomain("must be a host name, not an IP address")
    if len(ascii_name) > MAX_DOMAIN_CHARS:
        raise InvalidDomain(_TOO_LONG)
    return ascii_name


@dataclass(eq=False, repr=False)
class WebsiteService:
    store: WebsiteStore
    clock: Callable[[], float] = time.time
    max_per_user_per_hour: int = 0

    async def register(
        self, domain: str, favicon_url: str | None, user: str | None = None
    ) -> tuple[Website, bool]:
        """Upsert by domain. QuotaExceeded when api.max_websites_per_user_per_hour is on and
        `user` registered that many new websites in the last hour (a known domain, which
        costs no classification, never is); counted in the registration's own transaction,
        so concurrent requests of one user never pass the cap together."""
        now = self.clock()
        counted = user if self.max_per_user_per_hour else None
        try:
            website, created = await self.store.register_website(
                new_id(),
                new_id(),
                domain,
                favicon_url,
                now,
                registered_by=counted,
                max_per_period=self.max_per_user_per_hour if counted is not None else 0,
            )
        except CapReached as exc:
            oldest = exc.oldest if exc.oldest is not None else now
            raise QuotaExceeded(
                f"this user registered {exc.count} new websites in the last hour "
                f"(api.max_websites_per_user_per_hour = {self.max_per_user_per_hour})",
                max(1, math.ceil(oldest + WEBSITE_QUOTA_PERIOD_S - now)),
            ) from None
        if created:
            log.info("website_registered", website_id=website.id, domain=domain)
        return website, created

    async def get(self, domain: str) -> Website | None:
        return await self.store.get_website(domain)

    async def list(self, status: str | None, limit: int, cursor: str | None) -> Page[Website]:
        return await self.store.list_websites(status, limit, cursor)

    async def retry(self, domain: str, *, actor: str) -> Website:
        """A FAILED classification back to PENDING (NotFound, InvalidState otherwise)."""
        website = await self.store.retry_failed_website(domain)
        log.info(
            "website_classification_retried", website_id=website.id, domain=domain, actor=actor
        )
        return website
