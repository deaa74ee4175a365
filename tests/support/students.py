"""Students for the fake portal, built in one line where a test needs its own."""

from __future__ import annotations

from testkit.fakes.portal import Scalar, Semester, Student, Totals


def it_student(
    sno: str,
    password: str,
    name: str,
    year: Scalar,
    semesters: list[Semester] | None = None,
    totals: Totals | None = None,
) -> Student:
    """An enrolled student of the IT college's computer department; the rest as given
    (`totals` None: the portal sums the semesters)."""
    department = "컴퓨터학부"
    return Student(
        sno, password, name, "IT대학", department, "컴퓨터SW", "재학", year, semesters or [], totals
    )
