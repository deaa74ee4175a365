"""The operator console's entries of the route table (http/routes.py): its pages, its two
assets, and the addresses a browser lands on first. Their handlers are http/console.py's."""

from __future__ import annotations

from typing import Final

from outboxd.http import console
from outboxd.http.endpoints import Ok, Param, Route
from outboxd.http.models import JOB_ID_PATTERN
from outboxd.http.problems import NOT_FOUND, ProblemKind


def _console_page(path: str, operation_id: str, summary: str, *errors: ProblemKind) -> Route:
    params: tuple[Param, ...] = ()
    router_path = None
    if "{job_id}" in path:
        params = (
            Param(
                "job_id",
                "path",
                "The job id (a UUID as the API issues it).",
                {"type": "string", "pattern": JOB_ID_PATTERN},
            ),
        )
        # Anything that is not such an id is 404 before the page is served.
        router_path = path.replace("{job_id}", "{job_id:" + JOB_ID_PATTERN[1:-1] + "}")
    return _console_file(path, operation_id, summary, "text/html", errors, params, router_path)


def _console_file(
    path: str,
    operation_id: str,
    summary: str,
    media: str,
    errors: tuple[ProblemKind, ...] = (),
    params: tuple[Param, ...] = (),
    router_path: str | None = None,
) -> Route:
    handler = console.page if media == "text/html" else console.asset(path)
    return Route(
        "GET",
        path,
        handler,
        operation_id,
        "console",
        summary,
        ok=(Ok(200, "The file.", media=media, headers=console.HEADER_NAMES),),
        errors=errors,
        access="public",
        params=params,
        router_path=router_path,
        description="Static; public, like every /ui/ response: the page asks for an admin "
        "token and sends it to the admin API as a bearer token (no cookies).",
    )


def _console_redirect(path: str, operation_id: str, summary: str) -> Route:
    return Route(
        "GET",
        path,
        console.redirect(path),
        operation_id,
        "console",
        summary,
        ok=(Ok(302, f"To {console.REDIRECTS[path]}.", media="", headers=("Location",)),),
        access="public",
    )


CONSOLE_ROUTES: Final[tuple[Route, ...]] = (
    _console_page(
        "/ui/", "consoleOverview", "Overview: counts, queues, readiness, pace, schedules, chart."
    ),
    _console_page(
        "/ui/jobs",
        "consoleJobs",
        "Jobs: lookup by id; search by status, user, error code and creation time (kept in "
        "the page's query).",
    ),
    _console_page(
        "/ui/jobs/{job_id}",
        "consoleJob",
        "One job: status, progress, error, its timeline by attempt, result, outbox rows; "
        "cancel and redrive.",
        NOT_FOUND,
    ),
    _console_page(
        "/ui/dead-letters", "consoleDeadLetters", "DEAD jobs and relay rows, with redrive."
    ),
    _console_page("/ui/websites", "consoleWebsites", "Classification states and FAILED rows."),
    _console_page("/ui/tasks", "consoleTasks", "Recent task runs and an enqueue form."),
    _console_page(
        "/ui/dependencies",
        "consoleDependencies",
        "The portal, the AI provider and SQS: state, a pause's reason and end, pause and resume.",
    ),
    _console_page(
        "/ui/audit", "consoleAudit", "The audit log: every attempted change, by actor and action."
    ),
    _console_file("/ui/assets/app.js", "consoleScript", "The console's script.", "text/javascript"),
    _console_file("/ui/assets/app.css", "consoleStyles", "The console's stylesheet.", "text/css"),
    _console_redirect("/", "rootToConsole", "The root: the console."),
    _console_redirect("/ui", "consoleSlash", "The console without its trailing slash."),
    Route(
        "GET",
        "/favicon.ico",
        console.no_icon,
        "favicon",
        "console",
        "What browsers ask every origin for: nothing (the console's icon is in its page).",
        ok=(Ok(204, "No icon.", media=""),),
        access="public",
    ),
)
