"""How a stored key becomes the credentials key and the fingerprint key.

Ciphertexts and fingerprints live in the database across upgrades, so the derivation
is part of the contract: each purpose gets its own HKDF-SHA256 subkey of the stored
secret (never the secret itself, never one subkey for both purposes). The expected
values are computed here independently with `cryptography`.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from outboxd.security import NONCE_BYTES, KeyRing, Sealed
from tests.support.ops import sealing_key_id

RAW = bytes(range(32))
CANON = {"portal": "suwon", "username": "20201234", "password": "pw-derive"}


def hkdf(info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(RAW)


def mac(key: bytes) -> str:
    data = json.dumps(CANON, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hmac.new(key, data.encode("utf-8"), hashlib.sha256).hexdigest()


def test_the_fingerprint_is_an_hmac_under_its_own_derived_key() -> None:
    ring = KeyRing([RAW])
    key_id, _, digest = ring.fingerprint(CANON).partition(":")
    assert key_id == sealing_key_id(ring)
    assert digest == mac(hkdf(b"outboxd fingerprint v1"))
    # Neither the stored secret nor the credentials subkey signs fingerprints.
    assert digest != mac(RAW)
    assert digest != mac(hkdf(b"outboxd credentials v1"))


def test_credentials_are_sealed_under_their_own_derived_key() -> None:
    ring = KeyRing([RAW])
    sealed = ring.seal_json({"password": "pw"}, "job-1")
    nonce, body = sealed.ciphertext[:NONCE_BYTES], sealed.ciphertext[NONCE_BYTES:]
    plain = AESGCM(hkdf(b"outboxd credentials v1")).decrypt(nonce, body, b"job-1")
    assert json.loads(plain) == {"password": "pw"}

    # A ciphertext made independently with the derived key opens (an older release's row).
    nonce = bytes(NONCE_BYTES)
    made = AESGCM(hkdf(b"outboxd credentials v1")).encrypt(nonce, b'{"password":"old"}', b"j")
    assert ring.open_json(Sealed(sealing_key_id(ring), nonce + made), "j") == {"password": "old"}
