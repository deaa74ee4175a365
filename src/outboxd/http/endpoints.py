"""What a route of the table in http/routes.py is: its method, path, handler, who may
call it, its parameters, request body, success responses and problems."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import UnionType
from typing import Any, Literal

from aiohttp import web
from msgspec import Struct

from outboxd.http.problems import FORBIDDEN, INTERNAL_ERROR, UNAUTHENTICATED, ProblemKind

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Who may call a route: anyone (`public`), any token (`user`), or a role and those above
# it (security.py ROLES).
Access = Literal["public", "user", "viewer", "operator", "admin"]
Schema = dict[str, Any]


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["path", "query"]
    description: str
    schema: Schema


@dataclass(frozen=True)
class Link:
    """An OpenAPI link: `param` of `operation` comes from this response's body at `pointer`."""

    name: str
    operation: str
    param: str
    pointer: str


@dataclass(frozen=True)
class Ok:
    """A success response: a model (a Struct, or a union named in the document) as JSON,
    or another media type."""

    status: int
    description: str
    # A model, a union named in the document, or the name of a ONE_OF answer (openapi.py).
    body: type[Struct] | UnionType | str | None = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()
    links: tuple[Link, ...] = ()


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    operation_id: str
    tag: str
    summary: str
    ok: tuple[Ok, ...]
    errors: tuple[ProblemKind, ...] = ()
    access: Access = "user"
    request: type[Struct] | None = None
    params: tuple[Param, ...] = ()
    headers: tuple[str, ...] = ()  # request headers (components.parameters)
    # The router's path when it is stricter than the documented template.
    router_path: str | None = None
    description: str | None = None

    def all_errors(self) -> tuple[ProblemKind, ...]:
        """The route's problems, with what its access level and the edge add."""
        implied: tuple[ProblemKind, ...] = ()
        if self.access != "public":
            implied += (UNAUTHENTICATED,)
        if self.access not in ("public", "user"):
            implied += (FORBIDDEN,)
        return (*self.errors, *implied, INTERNAL_ERROR)
