"""Request checks read from the models: each string field's limits and choices, and the
task payload's bounds, answered field by field with VALIDATION_FAILED."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import msgspec
from msgspec import Struct

from outboxd.http import inputs
from outboxd.http.bulk_models import REDRIVE_MAX_IDS, REDRIVE_MAX_LIMIT
from outboxd.http.models import (
    JOB_ID_RE,
    PortalLinkRequest,
    TaskPayload,
)
from outboxd.security import normalized_login


class _TextField:
    """One string field's checks, read once from its Struct's msgspec type info."""

    __slots__ = ("allow_bidi", "choices", "max_length", "name", "optional", "wire")

    def __init__(self, field: Any) -> None:
        self.name: str = field.name
        self.wire: str = field.encode_name
        t = field.type
        self.optional = not field.required
        if isinstance(t, msgspec.inspect.UnionType):
            t = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType))
        extra: dict[str, Any] = {}
        if isinstance(t, msgspec.inspect.Metadata):
            extra = t.extra or {}
            t = t.type
        self.choices: tuple[str, ...] | None = None
        self.max_length: int | None = None
        # Only a field that is never displayed may hold bidirectional controls.
        self.allow_bidi: bool = bool(extra.get("allow_bidi"))
        if isinstance(t, msgspec.inspect.LiteralType):
            self.choices = tuple(str(v) for v in t.values)
            # A long unknown value is refused for its length first, as for any text field.
            self.max_length = extra.get("max_length")
        else:
            assert isinstance(t, msgspec.inspect.StrType), (self.name, t)
            self.max_length = t.max_length


def wire_names(model: type[Struct]) -> frozenset[str]:
    """The JSON names of `model`'s fields (anything else in a body is refused)."""
    return frozenset(model.__struct_encode_fields__)


def _text_fields(model: type[Struct], names: tuple[str, ...]) -> tuple[_TextField, ...]:
    info = msgspec.inspect.type_info(model)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(_TextField(f) for f in info.fields if f.name in names)


def check_text_fields(
    model: type[Struct], names: tuple[str, ...]
) -> Callable[[dict[str, Any]], dict[str, str | None]]:
    """A checker for `model`'s string fields `names`, in declaration order.

    Each value must be a string, not blank, within the model's max_length, storable
    text (`inputs.bad_char`: no bidirectional controls unless the field's Meta says
    `extra={"allow_bidi": True}`) and one of the Literal's values where the field is one;
    a missing optional field or an explicit null for one is None. The checker returns
    the values by field name, or raises `inputs.InputError` for the first bad field.
    """
    fields = _text_fields(model, names)

    def check(body: dict[str, Any]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for f in fields:
            value = body.get(f.wire)
            if value is None and f.optional:
                out[f.name] = None
                continue
            if f.wire not in body:
                inputs.fail(f.wire, "is required")
            if not isinstance(value, str):
                inputs.fail(f.wire, "must be a string")
            if not value.strip():
                inputs.fail(f.wire, "must not be empty")
            if f.max_length is not None and len(value) > f.max_length:
                inputs.fail(f.wire, f"must be at most {f.max_length} characters")
            why = inputs.bad_char(value, f.allow_bidi)
            if why is not None:
                inputs.fail(f.wire, why)
            if f.choices is not None and value not in f.choices:
                inputs.fail(f.wire, "must be one of: " + ", ".join(f.choices))
            out[f.name] = value
        return out

    return check


def payload_days(payload: dict[str, Any]) -> float | None:
    """TaskPayload.older_than_days within the model's bounds (finite, 0-36500); None when
    the payload leaves it out (retention.finished_s applies)."""
    meta = _DAYS_META
    if "older_than_days" not in payload:
        return None
    days = payload["older_than_days"]
    if (
        isinstance(days, bool)
        or not isinstance(days, int | float)
        or not math.isfinite(days)
        or not meta.ge <= days <= meta.le
    ):
        inputs.fail("payload.older_than_days", f"must be a finite number {meta.ge:g}-{meta.le:g}")
    return float(days)


def redrive_selection(body: dict[str, Any]) -> tuple[list[str] | None, int]:
    """A JobRedriveRequest's job ids (None: every job in its status, which must be DEAD)
    and limit. Without `status`, `jobIds` alone (see `redrive_ids`)."""
    if "status" not in body:
        inputs.fail("status", "is required (or send jobIds alone)")
    if body["status"] != "DEAD":
        inputs.fail("status", "must be DEAD")
    limit = body.get("limit", 1000)
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)  # JSON Schema's integer: 5.0 is 5
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= REDRIVE_MAX_LIMIT:
        inputs.fail("limit", f"must be an integer 1-{REDRIVE_MAX_LIMIT}")
    if "jobIds" not in body:
        return None, limit
    ids = body["jobIds"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= REDRIVE_MAX_IDS:
        inputs.fail("jobIds", f"must be an array of 1-{REDRIVE_MAX_IDS} job ids")
    for i, job_id in enumerate(ids):
        if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
            inputs.fail(f"jobIds[{i}]", "must be a job id (a lowercase UUID)")
    return ids, limit


def redrive_ids(body: dict[str, Any]) -> list[str]:
    """The ids of a JobRedriveRequest that names its jobs alone (no status; a limit does
    not apply to named jobs)."""
    ids, _limit = redrive_selection({**body, "status": "DEAD"})
    assert ids is not None
    return ids


def _days_meta() -> Any:
    info = msgspec.inspect.type_info(TaskPayload)
    assert isinstance(info, msgspec.inspect.StructType)
    t = info.fields[0].type
    return t.type if isinstance(t, msgspec.inspect.Metadata) else t


_DAYS_META: Final = _days_meta()


NOT_NORMALIZED: Final = (
    "must be in normal form: no surrounding whitespace, NFKC, case folded (e.g. lowercase)"
)
_check_username = check_text_fields(PortalLinkRequest, ("username",))


def portal_username(value: Any) -> str:
    """A portal username as intake takes it (PortalLinkRequest.username's limits, in its one
    spelling), or `inputs.InputError` for the field `username`. The login lock counts a
    username by its normalized form: a username that form changes would be a second name
    for one person (docs/decisions/0028-login-lock-per-user.md), and the job search finds a
    job by the same form (docs/decisions/0032-job-search-by-username-key.md)."""
    username = _check_username({"username": value})["username"]
    assert username is not None  # required: the checker raises when it is missing
    if normalized_login(username) != username:
        inputs.fail("username", NOT_NORMALIZED)
    return username
