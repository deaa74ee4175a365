"""Encryption at rest, key rotation, request fingerprints and API token hashing.

Keys are 32 random bytes written as URL-safe base64, one a line. The first key
encrypts; every key decrypts. A key's id is derived from the key itself, so an
operator never has to name keys and a ciphertext always says which key opens it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import threading
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from outboxd.errors import SecurityError

KEY_BYTES = 32
NONCE_BYTES = 12
KEYS_ENV = "OUTBOXD_SECRET_KEYS"


def generate_key() -> str:
    """A new key in the keys-file format (one line, no newline)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def _decode_key(text: str, where: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise SecurityError(f"{where}: not URL-safe base64") from None
    if len(raw) != KEY_BYTES:
        raise SecurityError(f"{where}: a key must be {KEY_BYTES} bytes, got {len(raw)}")
    return raw


def _derive(key: bytes, purpose: bytes) -> bytes:
    # One stored secret serves two purposes; HKDF keeps the AES key and the
    # fingerprint HMAC key independent of each other.
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(key)


@dataclass(frozen=True)
class _Key:
    key_id: str
    aead: AESGCM
    fingerprint_key: bytes
    login_key: bytes


@dataclass(frozen=True)
class Sealed:
    key_id: str
    ciphertext: bytes


class RandomBytes:
    """Bytes from os.urandom read 4 KiB at a time, handed out once each.

    os.urandom releases the GIL for its system call; on the event loop, with SQLite's
    writer thread running Python, taking the GIL back costs more than the call
    (docs/decisions/0014-http-hot-path.md). Each byte is still the kernel's CSPRNG output
    and is used once; a forked child starts with an empty buffer, so it never repeats its
    parent's next bytes (a repeated AES-GCM nonce would be fatal).
    """

    def __init__(self, chunk: int = 4096) -> None:
        self._chunk = chunk
        self._buf = b""
        self._at = 0
        # Any thread may seal: no two callers may ever be handed the same bytes.
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._drop)

    def _drop(self) -> None:
        self._buf, self._at = b"", 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._buf):
                self._buf, at = os.urandom(max(self._chunk, n)), 0
            self._at = at + n
            return self._buf[at : at + n]


random_bytes = RandomBytes()


def normalized_login(username: str) -> str:
    """A portal username as the login lock knows it: NFKC, surrounding whitespace removed,
    case folded. Intake refuses a username this changes (one person, one count)."""
    return unicodedata.normalize("NFKC", username).strip().casefold()


class KeyRing:
    """The configured keys; the first encrypts and signs, all decrypt and verify."""

    def __init__(self, raw_keys: Sequence[bytes]) -> None:
        if not raw_keys:
            raise SecurityError("no encryption key configured")
        keys: list[_Key] = []
        for raw in raw_keys:
            key_id = hashlib.sha256(b"outboxd key id" + raw).hexdigest()[:12]
            keys.append(
                _Key(
                    key_id=key_id,
                    aead=AESGCM(_derive(raw, b"outboxd credentials v1")),
                    fingerprint_key=_derive(raw, b"outboxd fingerprint v1"),
                    login_key=_derive(raw, b"outboxd portal login v1"),
                )
            )
        self._keys = keys
        self._by_id = {k.key_id: k for k in keys}

    @classmethod
    def from_lines(cls, lines: Iterable[str], source: str) -> KeyRing:
        raw: list[bytes] = []
        for n, line in enumerate(lines, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            raw.append(_decode_key(text, f"{source} line {n}"))
        return cls(raw)

    @classmethod
    def load(
        cls,
        keys_file: Path | None,
        env: Mapping[str, str],
        default_file: Path | None = None,
    ) -> tuple[KeyRing, bool]:
        """Keys from `keys_file`, else `OUTBOXD_SECRET_KEYS`, else `default_file`.

        With none of them configured and a `default_file` given, a new key is
        written there (mode 0600); the second value is True when that happened.
        """
        if keys_file is not None:
            try:
                text = keys_file.read_text(encoding="ascii")
            except OSError as exc:
                raise SecurityError(
                    f"security.keys_file: cannot read {keys_file}: {exc.strerror}"
                ) from None
            return cls.from_lines(text.splitlines(), str(keys_file)), False
        if env.get(KEYS_ENV, "").strip():
            parts = env[KEYS_ENV].replace(",", " ").split()
            return cls.from_lines(parts, KEYS_ENV), False
        if default_file is None:
            raise SecurityError(f"no key: set security.keys_file or {KEYS_ENV}")
        created = False
        if not default_file.exists():
            default_file.parent.mkdir(parents=True, exist_ok=True)
            # O_EXCL: two processes starting at once must not both write a key.
            try:
                fd = os.open(default_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w", encoding="ascii") as fh:
                    fh.write(generate_key() + "\n")
                created = True
        text = default_file.read_text(encoding="ascii")
        return cls.from_lines(text.splitlines(), str(default_file)), created

    def seal(self, plaintext: bytes, associated_data: bytes) -> Sealed:
        key = self._keys[0]
        nonce = random_bytes(NONCE_BYTES)
        return Sealed(key.key_id, nonce + key.aead.encrypt(nonce, plaintext, associated_data))

    def open(self, sealed: Sealed, associated_data: bytes) -> bytes:
        key = self._by_id.get(sealed.key_id)
        if key is None:
            raise SecurityError(f"key {sealed.key_id} is not configured (rotated out?)")
        blob = sealed.ciphertext
        try:
            return key.aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], associated_data)
        except InvalidTag:
            raise SecurityError("ciphertext does not open with its key") from None

    def seal_json(self, value: Mapping[str, Any], associated_data: str) -> Sealed:
        data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")
        return self.seal(data, associated_data.encode("utf-8"))

    def open_json(self, sealed: Sealed, associated_data: str) -> dict[str, Any]:
        value = json.loads(self.open(sealed, associated_data.encode("utf-8")))
        if not isinstance(value, dict):
            raise SecurityError("sealed value is not an object")
        return value

    def fingerprint(self, canonical: Mapping[str, Any]) -> str:
        """`<key id>:<hex HMAC-SHA256>` of the canonical JSON of a request body."""
        key = self._keys[0]
        return f"{key.key_id}:{self._mac(key, canonical)}"

    def fingerprint_matches(self, stored: str, canonical: Mapping[str, Any]) -> bool:
        key_id, _, mac = stored.partition(":")
        key = self._by_id.get(key_id)
        if key is None:
            # The key that signed it was rotated out: the best we can do is the
            # current key, which will not match, so the caller answers a conflict.
            return False
        return hmac.compare_digest(mac, self._mac(key, canonical))

    def login_subject(self, portal: str, username: str) -> str:
        """Who a portal login is for, as the login lock stores it: a hex HMAC-SHA256 of the
        portal and the username's normalized form (`normalized_login`) under a key derived
        from the first key (never the username). A new first key starts every count afresh."""
        data = f"{portal}\x00{normalized_login(username)}".encode("utf-8", "surrogatepass")
        return hmac.new(self._keys[0].login_key, data, hashlib.sha256).hexdigest()

    @staticmethod
    def _mac(key: _Key, canonical: Mapping[str, Any]) -> str:
        data = json.dumps(canonical, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        # hmac.new, not the one-shot hmac.digest: the one-shot call releases the GIL even
        # for a few bytes, and getting it back behind SQLite's writer thread cost up to
        # milliseconds per request (docs/architecture.md, "The GIL and the writer thread").
        return hmac.new(key.fingerprint_key, data.encode("utf-8"), hashlib.sha256).hexdigest()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def generate_token() -> str:
    return "obx_" + secrets.token_urlsafe(32)


# The roles, lowest first: each may do what the ones before it may
# (docs/contract.md#roles-and-the-audit-log).
# `user`: its own jobs and websites; `viewer`: reads every admin route and the console;
# `operator`: viewer, plus cancel of any job, redrive, pause and resume; `admin`: everything.
ROLES: Final = ("user", "viewer", "operator", "admin")
_RANK: Final = {role: rank for rank, role in enumerate(ROLES)}


@dataclass(frozen=True)
class Principal:
    user: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def can(self, role: str) -> bool:
        """Whether this caller has `role` or a higher one."""
        return _RANK.get(self.role, -1) >= _RANK[role]


class TokenVerifier:
    """Bearer tokens checked against configured SHA-256 hashes in constant time."""

    def __init__(self, entries: Iterable[tuple[str, str, str]]) -> None:
        # Hashes decoded and principals built once, at startup; a request only hashes
        # the token it sent and compares.
        self._entries = [(bytes.fromhex(h), Principal(user, role)) for h, user, role in entries]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def verify(self, token: str) -> Principal | None:
        # A header's non-UTF-8 bytes arrive surrogate-escaped: hash them as the bytes they
        # were (they match no configured token) instead of failing to encode.
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found: Principal | None = None
        # Compare against every entry, never stopping early, so timing says
        # nothing about which entry (if any) matched.
        for expected, principal in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        return found
