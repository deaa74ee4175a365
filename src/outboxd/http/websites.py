"""Websites: registration (upsert by normalised domain) and lookup."""

from __future__ import annotations

from aiohttp import web

from outboxd.errors import QuotaExceeded
from outboxd.http import checks, inputs, models
from outboxd.http.deps import deps_of, principal_of
from outboxd.http.problems import NOT_FOUND, TOO_MANY_ACTIVE_JOBS, ApiError, field_error
from outboxd.http.render import website_model
from outboxd.http.responses import json_response
from outboxd.services.websites import InvalidDomain, normalize_domain

_WEBSITE_FIELDS = checks.wire_names(models.WebsiteRequest)
_check_favicon = checks.check_text_fields(models.WebsiteRequest, ("favicon_url",))


async def post_website(request: web.Request) -> web.Response:
    deps = deps_of(request)
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _WEBSITE_FIELDS)
    raw_domain = body.get("domain")
    if not isinstance(raw_domain, str):
        raise field_error("domain", "is required and must be a string")
    try:
        domain = normalize_domain(raw_domain)
    except InvalidDomain as exc:
        # A control character is named as such, not as whatever IDNA made of it.
        raise field_error("domain", inputs.bad_char(raw_domain) or str(exc)) from None
    favicon = _check_favicon(body)["favicon_url"]
    if favicon is not None and not favicon.startswith(("http://", "https://")):
        raise field_error("faviconUrl", "must be an http(s) URL or null")
    try:
        website, created = await deps.websites.register(domain, favicon, principal_of(request).user)
    except QuotaExceeded as exc:
        raise ApiError(
            TOO_MANY_ACTIVE_JOBS, str(exc), headers={"Retry-After": str(exc.retry_after_s)}
        ) from None
    return json_response(website_model(website), 201 if created else 200)


def domain_in_path(request: web.Request) -> str:
    """The `{domain}` of a path, normalised; a text that is no domain names no website."""
    try:
        return normalize_domain(request.match_info["domain"])
    except InvalidDomain:
        raise ApiError(NOT_FOUND, "no such website") from None


async def get_website(request: web.Request) -> web.Response:
    deps = deps_of(request)
    website = await deps.websites.get(domain_in_path(request))
    if website is None:
        raise ApiError(NOT_FOUND, "no such website")
    return json_response(website_model(website))
