"""`normalize_domain`: a bare host name in, its canonical ASCII form out, anything else refused.

docs/contract.md#websites: lowercase, IDNA to ASCII, one trailing dot dropped; a scheme, path,
port, IP address, empty label or label over 63 characters is rejected, never stripped.
"""

from __future__ import annotations

import pytest

from outboxd.services.websites import InvalidDomain, normalize_domain


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("example.com", "example.com"),
        ("EXAMPLE.Com", "example.com"),
        ("WWW.Sub.Example.ORG", "www.sub.example.org"),
        ("Bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("münchen.de.", "xn--mnchen-3ya.de"),
        ("example.com.", "example.com"),
        ("Example.COM.", "example.com"),
        ("my-site.example", "my-site.example"),
        ("a1.b2.example", "a1.b2.example"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
    ],
)
def test_normalises_to_lowercase_ascii(given: str, expected: str) -> None:
    assert normalize_domain(given) == expected


def test_normalising_is_idempotent() -> None:
    for name in ("Bücher.example", "EXAMPLE.com.", "münchen.de"):
        once = normalize_domain(name)
        assert normalize_domain(once) == once


@pytest.mark.parametrize(
    "given",
    [
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("https://example.com", id="scheme"),
        pytest.param("http://example.com/", id="scheme-slash"),
        pytest.param("ftp://example.com", id="ftp-scheme"),
        pytest.param("example.com/path", id="path"),
        pytest.param("example.com/", id="trailing-slash"),
        pytest.param("example.com?q=1", id="query"),
        pytest.param("example.com#frag", id="fragment"),
        pytest.param("example.com:8080", id="port"),
        pytest.param("example.com:", id="empty-port"),
        pytest.param("127.0.0.1", id="ipv4"),
        pytest.param("10.1.2.3.", id="ipv4-trailing-dot"),
        pytest.param("::1", id="ipv6"),
        pytest.param("2001:db8::1", id="ipv6-long"),
        pytest.param("[2001:db8::1]", id="ipv6-bracketed"),
        pytest.param("a..b", id="empty-label"),
        pytest.param(".example.com", id="leading-dot"),
        pytest.param("example.com..", id="two-trailing-dots"),
        pytest.param(".", id="only-dot"),
        pytest.param("a" * 64 + ".com", id="label-64"),
        pytest.param("www." + "b" * 64 + ".example", id="inner-label-64"),
        pytest.param("ü" * 60 + ".example", id="idna-label-over-63"),
        pytest.param("user@example.com", id="user"),
        pytest.param("user:pw@example.com", id="user-password"),
        pytest.param("exa mple.com", id="space"),
        pytest.param("example.com\nx", id="newline"),
        pytest.param("exa%6dple.com", id="percent"),
        pytest.param("ex\\ample.com", id="backslash"),
        pytest.param("-example.com", id="leading-hyphen"),
        pytest.param("example-.com", id="trailing-hyphen"),
        pytest.param("exa_mple.com", id="underscore"),
    ],
)
def test_rejects_what_is_not_a_bare_host_name(given: str) -> None:
    with pytest.raises(InvalidDomain):
        normalize_domain(given)


def test_rejects_names_over_253_characters() -> None:
    name = ".".join(["a" * 63] * 4)  # 255 characters, every label legal
    with pytest.raises(InvalidDomain):
        normalize_domain(name)


def test_the_limit_is_253_characters_without_the_trailing_dot() -> None:
    name = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters
    assert normalize_domain(name) == name
    assert normalize_domain(name + ".") == name
    with pytest.raises(InvalidDomain, match="longer than 253"):
        normalize_domain("a" + name)


def test_a_long_text_is_too_long_before_idna_reads_it() -> None:
    # One label of 300 characters: IDNA would call it a bad label; the length says it first.
    with pytest.raises(InvalidDomain, match="longer than 253"):
        normalize_domain("a" * 300)
    with pytest.raises(InvalidDomain, match="longer than 253"):
        normalize_domain("ü" * 254 + ".example")


def test_text_idna_cannot_read_is_an_invalid_domain() -> None:
    for text in ("exa\ud800mple.com", "exa\x00mple.com", "exa\x7fmple.com"):
        with pytest.raises(InvalidDomain):
            normalize_domain(text)


def test_reasons_name_the_problem() -> None:
    def reason(text: str) -> str:
        with pytest.raises(InvalidDomain) as info:
            normalize_domain(text)
        return str(info.value).lower()

    assert "scheme" in reason("https://example.com")
    assert "port" in reason("example.com:443")
    assert "ip" in reason("192.168.0.1")
    assert "empty label" in reason("a..b")
    assert "empty label" in reason("example.com..")
    assert "63" in reason("a" * 64 + ".com") or "too long" in reason("a" * 64 + ".com")


def test_an_empty_label_is_never_reported_as_too_long() -> None:
    # U+3002 is an IDNA label separator: "example.com。." has an empty last label.
    with pytest.raises(InvalidDomain) as info:
        normalize_domain("example.com\u3002.")
    assert "longer than 63" not in str(info.value)


def test_invalid_domain_is_a_value_error_and_does_not_echo_long_input() -> None:
    junk = "x" * 5000 + "/path"
    with pytest.raises(ValueError) as info:
        normalize_domain(junk)
    assert isinstance(info.value, InvalidDomain)
    assert len(str(info.value)) < 200
