"""The header budget's framing (http/server.py `_Framing`): which bytes of a connection are
a request's head, counted against server.max_header_bytes and 64 fields, and which are a
body, never counted, however the bytes are split across reads."""

from __future__ import annotations

import pytest

from outboxd.http.server import MAX_HEADER_FIELDS, HeadersTooLarge, _Framing

BUDGET = 1024


def _head(extra_headers: int = 0, pad: int = 0, **headers: str) -> bytes:
    lines = [b"POST /v1/websites HTTP/1.1", b"Host: 127.0.0.1"]
    lines += [f"{k.replace('_', '-')}: {v}".encode() for k, v in headers.items()]
    lines += [f"X-{i}: y".encode() for i in range(extra_headers)]
    if pad:
        lines.append(b"X-Pad: " + b"p" * pad)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _feed(stream: bytes, split: int | None) -> None:
    framing = _Framing(BUDGET)
    if split is None:
        framing.feed(stream)
        return
    for at in range(0, len(stream), split):
        framing.feed(stream[at : at + split])


SPLITS = [None, 1, 2, 3, 7, 64]


@pytest.mark.parametrize("split", SPLITS)
def test_bodies_of_any_size_between_heads_are_not_counted(split: int | None) -> None:
    body = b"x" * (5 * BUDGET)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:3000], body[3000:]))
    stream = (
        _head(Content_Length=str(len(body))) + body
        + _head(Transfer_Encoding="chunked") + chunked + b"0\r\n\r\n"
        + _head(Transfer_Encoding="chunked") + b"4;ext=1\r\nabcd\r\n0\r\nX-Trailer: t\r\n\r\n"
        + b"\r\n" + _head(pad=BUDGET - 200)
    )  # fmt: skip
    _feed(stream, split)


@pytest.mark.parametrize("split", SPLITS)
def test_a_head_one_byte_over_the_budget_is_refused(split: int | None) -> None:
    exact = _head(pad=BUDGET - len(_head(pad=1)) + 1)
    assert len(exact) == BUDGET
    _feed(exact, split)
    over = _head(pad=BUDGET - len(_head(pad=1)) + 2)
    with pytest.raises(HeadersTooLarge):
        _feed(over, split)


@pytest.mark.parametrize("split", SPLITS)
def test_a_head_that_never_ends_is_refused_at_the_budget(split: int | None) -> None:
    with pytest.raises(HeadersTooLarge):
        _feed(b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * BUDGET, split)


def test_more_than_64_fields_are_refused() -> None:
    # Host counts as one field.
    _feed(_head(extra_headers=MAX_HEADER_FIELDS - 1), None)
    with pytest.raises(HeadersTooLarge):
        _feed(_head(extra_headers=MAX_HEADER_FIELDS), None)


def test_a_pipelined_head_after_a_body_in_the_same_read_is_counted() -> None:
    body = b'{"domain": "example.com"}'
    stream = _head(Content_Length=str(len(body))) + body + _head(pad=2 * BUDGET)
    with pytest.raises(HeadersTooLarge):
        _feed(stream, None)


def test_trailers_count_against_the_budget() -> None:
    stream = _head(Transfer_Encoding="chunked") + b"0\r\nX-T: " + b"t" * BUDGET + b"\r\n\r\n"
    with pytest.raises(HeadersTooLarge):
        _feed(stream, None)
