"""Cryptographic building blocks of secure aggregation (Bonawitz et al., CCS 2017, Sec. 3 and 4).

All primitives come from ``cryptography`` (OpenSSL):

* key agreement: X25519 (``KA.gen``, ``KA.agree``), raw 32-byte public keys; the shared secret is
  passed through HKDF-SHA256 with a context label and the (sorted) party ids and round, so that the
  mask seed s_{u,v} and the share-encryption key of a pair are independent 256-bit keys;
* authenticated encryption of shares: AES-256-GCM, 96-bit random nonce, associated data binding
  (job, round, sender, recipient) so a share cannot be replayed to another round/recipient;
* PRG: AES-256-CTR keyed with the full 256-bit seed, zero nonce (each seed keys exactly one stream:
  self-mask seeds are fresh per round, pairwise seeds are derived per round), expanded to ``n``
  little-endian uint64/uint32 words;
* public-key validation: :func:`check_public_key` refuses a key of the wrong length or of low order
  (an X25519 exchange with it yields the all-zero secret, which OpenSSL refuses), so one peer's bad
  key cannot make the others' key agreement fail or yield a predictable secret;
* commitments: :func:`commitment`, SHA-256 over a domain label, the context (job, round, owner,
  holder) and the committed value; it hides the value when the value has >= 256 bits of min-entropy
  (the self-mask seed b_u, and Shamir shares of a polynomial with >= 1 random coefficient, i.e.
  t >= 2) and binds it (collision resistance); Bonawitz et al. Sec. 6 use commitments likewise;
* signatures: Ed25519 (the per-round ConsistencyCheck key).

Nothing here touches the network.
"""
from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["InvalidSignature", "InvalidTag", "KeyPair", "agree", "check_public_key", "commitment", "derive_key",
           "prg", "encrypt_share", "decrypt_share", "share_ad", "private_from_int", "private_to_int", "new_seed",
           "SigningKey", "verify_signature"]

KEY_BYTES = 32
_NONCE = bytes(16)  # AES-CTR initial counter block; safe because every PRG key is used once


class KeyPair:
    """An X25519 key pair. ``public`` is the raw 32-byte public key."""

    def __init__(self, private: X25519PrivateKey | None = None):
        self.private = private or X25519PrivateKey.generate()
        self.public = self.private.public_key().public_bytes_raw()


def private_to_int(key: X25519PrivateKey) -> int:
    """Raw 32 private bytes as a big-endian int (< 2^256), for Shamir sharing."""
    return int.from_bytes(key.private_bytes_raw(), "big")


def private_from_int(value: int) -> X25519PrivateKey:
    """The X25519 private key whose 32 big-endian bytes are ``value`` (one reconstructed from Shamir shares);
    ValueError when ``value`` is outside [0, 2**256).
    """
    if not 0 <= value < 1 << 256:
        raise ValueError("reconstructed X25519 key does not fit 32 bytes")
    return X25519PrivateKey.from_private_bytes(value.to_bytes(KEY_BYTES, "big"))


def new_seed() -> bytes:
    """A fresh 256-bit secret (self-mask seed b_u)."""
    return os.urandom(KEY_BYTES)


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519 shared secret (32 bytes). Raises ValueError for an invalid/low-order public key."""
    if len(peer_public) != KEY_BYTES:
        raise ValueError(f"X25519 public key must be {KEY_BYTES} bytes, got {len(peer_public)}")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise ValueError(f"X25519 public key of low order (all-zero shared secret): {exc}") from None


_PROBE = X25519PrivateKey.generate()  # any scalar: a low-order point times a clamped scalar is the identity


def check_public_key(public: bytes) -> None:
    """Raise ValueError unless ``public`` is a 32-byte X25519 public key of large order.

    A low-order point (e.g. all zeros, or the other 11 of RFC 7748's small-subgroup encodings) gives
    the all-zero shared secret with every private key; OpenSSL refuses that exchange, which is the test.
    """
    agree(_PROBE, public)


def commitment(label: str, *context: str | int, value: bytes) -> bytes:
    """SHA-256(label | context... | value): a 32-byte hash commitment to ``value`` (see the module notes)."""
    h = hashes.Hash(hashes.SHA256())
    h.update(("|".join([label, *map(str, context)]) + "|").encode())
    h.update(value)
    return h.finalize()


def derive_key(shared: bytes, label: str, *context: str | int) -> bytes:
    """HKDF-SHA256(shared, info = label | context...) -> 32-byte key."""
    info = "|".join([label, *map(str, context)]).encode()
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def prg(seed: bytes, n_words: int, dtype=np.uint64) -> np.ndarray:
    """AES-256-CTR keystream of ``seed`` as ``n_words`` little-endian words (uint64, uint32 or uint16)."""
    if len(seed) != KEY_BYTES:
        raise ValueError(f"PRG seed must be {KEY_BYTES} bytes, got {len(seed)}")
    dt = np.dtype(dtype).newbyteorder("<")
    enc = Cipher(algorithms.AES(seed), modes.CTR(_NONCE)).encryptor()
    data = enc.update(bytes(n_words * dt.itemsize))  # CTR: finalize() emits nothing more
    return np.frombuffer(data, dtype=dt).astype(np.dtype(dtype), copy=False)


def share_ad(job_id: str, round_id: int, sender: str, recipient: str) -> bytes:
    """The associated data that binds an encrypted share to its job, round, sender and recipient (UTF-8)."""
    return f"secureflhv-secagg-share|{job_id}|{round_id}|{sender}|{recipient}".encode()


def encrypt_share(key: bytes, plaintext: bytes, ad: bytes) -> tuple[bytes, bytes]:
    """AES-256-GCM; returns (nonce, ciphertext||tag)."""
    nonce = os.urandom(12)
    return nonce, AESGCM(key).encrypt(nonce, plaintext, ad)


def decrypt_share(key: bytes, nonce: bytes, ciphertext: bytes, ad: bytes) -> bytes:
    """Raises cryptography.exceptions.InvalidTag when the ciphertext, nonce or AD was altered."""
    if len(nonce) != 12:
        raise InvalidTag()
    return AESGCM(key).decrypt(nonce, ciphertext, ad)


class SigningKey:
    """Ed25519 signing key; ``public`` is the raw 32-byte verification key."""

    def __init__(self):
        self._key = Ed25519PrivateKey.generate()
        self.public = self._key.public_key().public_bytes_raw()

    def sign(self, data: bytes) -> bytes:
        """The Ed25519 signature (64 bytes) of ``data``."""
        return self._key.sign(data)


def verify_signature(public: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``data`` under the 32-byte ``public`` key
    (False, never an exception, for a malformed key or signature).
    """
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
        return True
    except (InvalidSignature, ValueError):
        return False
