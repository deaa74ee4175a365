"""The academic record a SUCCEEDED portal job carries, as the API documents it.

scrapers/suwon.py builds this document and the job stores it as it is; these Structs
type it for the OpenAPI document (`Job.result` in http/models.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct


class PortalStudent(Struct, rename="camel"):
    """The student's profile."""

    student_number: Annotated[str | None, Meta(description="Student number.")]
    name: Annotated[str | None, Meta(description="Name.")]
    college: Annotated[str | None, Meta(description="College.")]
    department: Annotated[str | None, Meta(description="Department.")]
    major: Annotated[str | None, Meta(description="Major.")]
    status: Annotated[str | None, Meta(description="Enrolment status, as the portal words it.")]
    year: Annotated[int | None, Meta(description="Year of study.")]


class PortalCourse(Struct, rename="camel"):
    """One course taken in a semester."""

    code: Annotated[str | None, Meta(description="Course code.")]
    title: Annotated[str | None, Meta(description="Course title.")]
    credits: Annotated[float | None, Meta(description="Credits.")]
    grade: Annotated[str | None, Meta(description="Letter grade (A+ ... F, or P).")]
    grade_points: Annotated[float | None, Meta(description="Grade points.")]
    category: Annotated[str | None, Meta(description="Category, e.g. 전공필수 or 교양선택.")]
    department: Annotated[str | None, Meta(description="Offering department.")]


class PortalSemester(Struct, rename="camel"):
    """One semester taken, with its courses."""

    year: Annotated[int | None, Meta(description="Academic year.")]
    term: Annotated[
        Literal["1", "summer", "2", "winter"],
        Meta(description="First, summer, second or winter term."),
    ]
    credits_attempted: Annotated[float | None, Meta(description="Credits attempted.")]
    credits_earned: Annotated[float | None, Meta(description="Credits earned.")]
    gpa: Annotated[float | None, Meta(description="Grade point average.")]
    percentile: Annotated[float | None, Meta(description="Percentile score.")]
    rank: Annotated[str | None, Meta(description='Rank in the department, e.g. "6/33".')]
    courses: list[PortalCourse]


class PortalTotals(Struct, rename="camel"):
    """Totals over all semesters."""

    credits_attempted: Annotated[float | None, Meta(description="Credits attempted.")]
    credits_earned: Annotated[float | None, Meta(description="Credits earned.")]
    gpa: Annotated[float | None, Meta(description="Grade point average.")]
    percentile: Annotated[float | None, Meta(description="Percentile score.")]


class PortalResult(Struct):
    """The academic record a SUCCEEDED portal job fetched."""

    student: PortalStudent
    semesters: list[PortalSemester]
    totals: PortalTotals
