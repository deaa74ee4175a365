"""The record the scraper makes of the fake portal's sample student
(`fakes.portal.sample_student`), and pieces of it.

Shared by the scraper, consumer and OpenAPI tests, and by the benchmarks' result rows, so
the values are written once.
"""

from __future__ import annotations

from typing import Any

SAMPLE_STUDENT_RECORD: dict[str, Any] = {
    "studentNumber": "20201234",
    "name": "김수원",
    "college": "IT대학",
    "department": "컴퓨터학부",
    "major": "컴퓨터SW",
    "status": "재학",
    "year": 3,
}

CS101_RECORD: dict[str, Any] = {
    "code": "CS101",
    "title": "자료구조",
    "credits": 3,
    "grade": "A+",
    "gradePoints": 4.5,
    "category": "전공필수",
    "department": "컴퓨터학부",
}

EXPECTED_RECORD: dict[str, Any] = {
    "student": SAMPLE_STUDENT_RECORD,
    "semesters": [
        {
            "year": 2020,
            "term": "1",
            "creditsAttempted": 18,
            "creditsEarned": 18,
            "gpa": 4.12,
            "percentile": 93.5,
            "rank": "6/33",
            "courses": [
                CS101_RECORD,
                {
                    "code": "GE110",
                    "title": "글쓰기와 소통",
                    "credits": 2,
                    "grade": "B+",
                    "gradePoints": 3.5,
                    "category": "교양필수",
                    "department": "교양대학",
                },
            ],
        },
        {
            "year": 2020,
            "term": "summer",
            "creditsAttempted": 3,
            "creditsEarned": 3,
            "gpa": 4.0,
            "percentile": 90,
            "rank": "1/5",
            "courses": [
                {
                    "code": "GE201",
                    "title": "창업과 혁신",
                    "credits": 3,
                    "grade": "A0",
                    "gradePoints": 4.0,
                    "category": "교양선택",
                    "department": "교양대학",
                }
            ],
        },
        {
            "year": 2020,
            "term": "2",
            "creditsAttempted": 19,
            "creditsEarned": 19,
            "gpa": 3.85,
            "percentile": 91.2,
            "rank": "8/33",
            "courses": [
                {
                    "code": "CS201",
                    "title": "운영체제",
                    "credits": 3,
                    "grade": "A0",
                    "gradePoints": 4.0,
                    "category": "전공필수",
                    "department": "컴퓨터학부",
                },
                {
                    "code": "CS230",
                    "title": "캡스톤 세미나",
                    "credits": 1,
                    "grade": "P",
                    "gradePoints": 0,
                    "category": "전공선택",
                    "department": "컴퓨터학부",
                },
            ],
        },
    ],
    "totals": {"creditsAttempted": 40, "creditsEarned": 40, "gpa": 3.99, "percentile": 92.1},
}
