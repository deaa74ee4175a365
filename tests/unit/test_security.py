"""Encryption at rest, key rotation, fingerprints, tokens, and the keygen/token CLI."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from outboxd import cli
from outboxd.errors import SecurityError
from outboxd.security import (
    KEYS_ENV,
    KeyRing,
    Principal,
    Sealed,
    TokenVerifier,
    generate_key,
    hash_token,
)
from tests.support.ops import sealing_key_id

CANON = {"portal": "suwon", "username": "20201234", "password": "pw-unit"}


def ring(*keys: str) -> KeyRing:
    return KeyRing.from_lines(keys, "test")


def test_seal_open_round_trip() -> None:
    """A sealed value opens to the same bytes and the ciphertext does not contain them."""
    keys = ring(generate_key())
    sealed = keys.seal(b"secret-bytes", b"job-1")
    assert b"secret-bytes" not in sealed.ciphertext
    assert keys.open(sealed, b"job-1") == b"secret-bytes"
    js = keys.seal_json({"password": "pw-1", "username": "u"}, associated_data="job-2")
    assert keys.open_json(js, associated_data="job-2") == {"password": "pw-1", "username": "u"}
    # Fresh nonce each time: the same plaintext never seals to the same bytes.
    assert keys.seal(b"x", b"a").ciphertext != keys.seal(b"x", b"a").ciphertext


def test_wrong_associated_data_or_tampering_fails() -> None:
    """Opening with another job's id, or a flipped bit, raises SecurityError."""
    keys = ring(generate_key())
    sealed = keys.seal_json({"password": "pw"}, associated_data="job-1")
    with pytest.raises(SecurityError):
        keys.open_json(sealed, associated_data="job-2")
    tampered = bytearray(sealed.ciphertext)
    tampered[-1] ^= 1
    with pytest.raises(SecurityError):
        keys.open(Sealed(sealed.key_id, bytes(tampered)), b"job-1")


def test_key_rotation() -> None:
    """After rotation the new first key encrypts and the old second key still decrypts."""
    old, new = generate_key(), generate_key()
    before = ring(old)
    sealed_old = before.seal_json({"password": "pw"}, "job-1")
    rotated = ring(new, old)
    assert sealing_key_id(rotated) != sealing_key_id(before)
    assert rotated.open_json(sealed_old, "job-1") == {"password": "pw"}
    sealed_new = rotated.seal_json({"password": "pw2"}, "job-2")
    assert sealed_new.key_id == sealing_key_id(rotated) == sealing_key_id(ring(new))
    assert ring(new).open_json(sealed_new, "job-2") == {"password": "pw2"}
    with pytest.raises(SecurityError, match="not configured"):
        ring(new).open_json(sealed_old, "job-1")
    with pytest.raises(SecurityError):
        before.open_json(sealed_new, "job-2")


def test_key_id_is_stored_and_stable() -> None:
    """The sealed value names the key that sealed it; the id is derived from the key alone."""
    k = generate_key()
    keys = ring(k)
    sealed = keys.seal(b"x", b"a")
    assert sealed.key_id == sealing_key_id(keys) == sealing_key_id(ring(k))
    assert len(sealed.key_id) >= 8
    assert k not in sealed.key_id


def test_default_key_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    """With no key configured a key file is written with mode 0600, then reused as is."""
    path = tmp_path / "state" / "outboxd.db.keys"
    first, created = KeyRing.load(None, {}, default_file=path)
    assert created
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    content = path.read_text()
    second, created_again = KeyRing.load(None, {}, default_file=path)
    assert not created_again
    assert path.read_text() == content
    assert sealing_key_id(second) == sealing_key_id(first)
    sealed = first.seal(b"x", b"a")
    assert second.open(sealed, b"a") == b"x"


def test_keys_file_and_env_take_precedence(tmp_path: Path) -> None:
    """security.keys_file, else OUTBOXD_SECRET_KEYS; comments and blank lines are skipped."""
    k1, k2, k3 = generate_key(), generate_key(), generate_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# primary\n{k1}\n\n{k2}\n")
    default = tmp_path / "default.keys"
    from_file, created = KeyRing.load(keys_file, {KEYS_ENV: k3}, default_file=default)
    assert not created and not default.exists()
    assert sealing_key_id(from_file) == sealing_key_id(ring(k1))
    from_env, _ = KeyRing.load(None, {KEYS_ENV: f"{k3},{k1}"}, default_file=default)
    assert sealing_key_id(from_env) == sealing_key_id(ring(k3))
    assert not default.exists()


@pytest.mark.parametrize("bad", ["not base64!", "c2hvcnQ=", ""])
def test_bad_keys_are_rejected(tmp_path: Path, bad: str) -> None:
    """A key that is not 32 bytes of URL-safe base64, or no key at all, raises SecurityError."""
    keys_file = tmp_path / "keys"
    keys_file.write_text(bad + "\n")
    with pytest.raises(SecurityError):
        KeyRing.load(keys_file, {}, None)


def test_missing_keys_file_is_a_clear_error(tmp_path: Path) -> None:
    """A configured keys_file that cannot be read names security.keys_file."""
    with pytest.raises(SecurityError, match=r"security\.keys_file"):
        KeyRing.load(tmp_path / "absent", {}, None)


def test_fingerprint_is_stable_and_survives_rotation() -> None:
    """The fingerprint is the same across calls and still matches after rotation (old key kept)."""
    old, new = generate_key(), generate_key()
    before = ring(old)
    fp = before.fingerprint(CANON)
    assert fp == before.fingerprint(dict(reversed(list(CANON.items()))))
    assert before.fingerprint_matches(fp, CANON)
    assert not before.fingerprint_matches(fp, {**CANON, "password": "other"})
    assert "pw-unit" not in fp
    rotated = ring(new, old)
    assert rotated.fingerprint_matches(fp, CANON)
    assert not rotated.fingerprint_matches(fp, {**CANON, "password": "other"})
    assert not ring(new).fingerprint_matches(fp, CANON)
    # Another server key gives another fingerprint: no offline guessing from the DB alone.
    assert ring(generate_key()).fingerprint(CANON) != fp


def test_token_verification() -> None:
    """A configured token maps to its user and role; anything else is refused."""
    verifier = TokenVerifier(
        [(hash_token("tok-a"), "alice", "user"), (hash_token("tok-b"), "root", "admin")]
    )
    assert verifier.enabled
    assert verifier.verify("tok-a") == Principal("alice", "user")
    assert verifier.verify("tok-b") == Principal("root", "admin")
    assert verifier.verify("tok-b").is_admin  # type: ignore[union-attr]
    for bad in ("", "tok-c", "tok-a ", hash_token("tok-a")):
        assert verifier.verify(bad) is None
    assert not TokenVerifier([]).enabled


def test_keygen_prints_one_loadable_key(capsys: pytest.CaptureFixture[str]) -> None:
    """`outboxd keygen` prints one line that KeyRing.from_lines accepts; each call a new key."""
    assert cli.run(["keygen"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0] == lines[0].strip() and lines[0]
    keys = KeyRing.from_lines(lines, "keygen")
    assert keys.open(keys.seal(b"x", b"a"), b"a") == b"x"
    assert cli.run(["keygen"]) == 0
    assert capsys.readouterr().out.strip() != lines[0]


def test_token_create_prints_token_then_entry(capsys: pytest.CaptureFixture[str]) -> None:
    """`outboxd token create` prints the token alone, then an [[auth.tokens]] entry that matches."""
    assert cli.run(["token", "create", "--user", "U", "--role", "admin"]) == 0
    out = capsys.readouterr().out
    first, _, rest = out.partition("\n")
    token = first
    assert token and token == token.strip() and " " not in token
    entry = tomllib.loads(rest)["auth"]["tokens"]
    assert entry == [{"sha256": hash_token(token), "user": "U", "role": "admin"}]
    verifier = TokenVerifier((e["sha256"], e["user"], e["role"]) for e in entry)
    assert verifier.verify(token) == Principal("U", "admin")


def test_generated_keys_are_random() -> None:
    """Two generated keys differ and decode to 32 bytes."""
    a, b = generate_key(), generate_key()
    assert a != b
    assert len(ring(a).seal(b"", b"").ciphertext) == 12 + 16


def test_buffered_random_bytes_are_never_handed_out_twice() -> None:
    """Across buffer refills and from several threads, no byte range is given twice:
    an AES-GCM nonce must never repeat."""
    import threading

    from outboxd.security import RandomBytes

    source = RandomBytes(chunk=64)  # small: many refills
    out: list[bytes] = []
    lock = threading.Lock()

    def take() -> None:
        got = [source(12) for _ in range(2000)]
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 8000
    assert all(len(b) == 12 for b in out)
    assert len(set(out)) == 8000


def test_a_forked_child_does_not_repeat_its_parents_next_bytes() -> None:
    import os

    from outboxd.security import RandomBytes

    source = RandomBytes()
    source(12)  # the buffer is filled: the parent's next bytes are known in memory
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next nonce and leave at once
        os.write(write, source(12))
        os._exit(0)
    os.close(write)
    child = os.read(read, 12)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 12
    assert child != source(12)
