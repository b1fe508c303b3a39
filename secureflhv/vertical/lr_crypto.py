"""Crypto backends for vertical logistic regression: Paillier, and an identity stand-in for benchmarks.

The protocol code in :mod:`secureflhv.vertical.lr` only talks to a backend through the interface
below, so the same protocol runs with real encryption (:class:`PaillierBackend`, the default) or with
encryption replaced by identity (:class:`IdentityBackend`, *no security at all*, only to measure the
cost of encryption in ``benchmarks/vertical_lr.py``).

Masking (the step that keeps the key holder from seeing a plaintext gradient or loss)
--------------------------------------------------------------------------------------
A Paillier plaintext lives in Z_n. A party that wants the key holder to decrypt ``[[g]]`` for it adds a
fresh mask ``r`` drawn *uniformly from Z_n* (``secrets.randbelow(n)``) to the raw plaintext of every
element by multiplying with a fresh encryption of ``r``: ``[[m + r mod n]]`` (this also re-randomises the
ciphertext, so its Paillier randomness, which the key holder could extract, says nothing about how it
was computed). The key holder decrypts and returns the raw integers ``(m + r) mod n``,
which are uniformly distributed whatever ``m`` is: a one-time pad in Z_n, so the key holder learns
nothing about ``g`` (perfect hiding, not merely statistical). The party subtracts ``r`` mod n, maps
the result to a signed mantissa (values above n/2 are negative) and decodes it with the ciphertext's
fixed-point exponent (value = mantissa * 2**exponent). Unmasking is exact: no precision is lost.

Errors: ``from_proto``/``unmask`` raise :class:`~secureflhv.transport.ProtocolError` for a payload
under another key, of the wrong shape, or outside Z*_{n^2}.
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError
from ..transport.codec import check_shape, shape_of
from .common import IdentityCrypto, ldexp_int

log = logging.getLogger("secureflhv.vertical.lr")


# --------------------------------------------------------------------------- Paillier
class PaillierBackend:
    """Paillier through :mod:`secureflhv.crypto.paillier` (phe + gmpy2).

    Args:
        precision_bits: fixed-point precision passed to ``encrypt`` (``None``: the module default).
    """

    name = "paillier"

    def __init__(self, precision_bits: int | None = None, dot_precision_bits: int = 32):
        from ..crypto import paillier  # imported lazily so the identity backend needs no Paillier module

        self._p = paillier
        self.precision_bits = paillier.DEFAULT_PRECISION_BITS if precision_bits is None else precision_bits
        self.dot_precision_bits = dot_precision_bits

    # keys ---------------------------------------------------------------
    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        return self._p.generate_keypair(n_bits, insecure_test_key=insecure_test_key)

    def public_key_to_proto(self, pub):
        return pub.to_proto()

    def public_key_from_proto(self, msg, insecure_test_key: bool):
        """Parse a peer's key; keys below 2048 bits only with ``insecure_test_key`` (ProtocolError)."""
        try:
            return self._p.PublicKey.from_proto(msg, insecure_test_key=insecure_test_key)
        except ValueError as exc:
            raise ProtocolError(f"public key: {exc}") from exc

    def fingerprint(self, pub) -> bytes:
        return pub.fingerprint

    # arithmetic -----------------------------------------------------------
    def encrypt(self, key, x: np.ndarray):
        """Encrypt under ``key`` (a public key, or the private key of the key holder: CRT, faster)."""
        return self._p.encrypt(key, np.asarray(x, dtype=np.float64), precision_bits=self.precision_bits)

    def dot(self, X: np.ndarray, enc):
        """``X.T @ enc`` for plaintext ``X`` (n, d) and ciphertext vector ``enc`` (n,) -> (d,).

        X is encoded with ``dot_precision_bits`` fraction bits (needs |X| < 2**(62 - bits))."""
        return self._p.dot(np.ascontiguousarray(X, dtype=np.float64), enc, precision_bits=self.dot_precision_bits)

    # wire -------------------------------------------------------------------
    def to_proto(self, enc) -> messages_pb2.EncryptedTensor:
        return enc.to_proto()

    def from_proto(self, msg, pub, expected_shape, what: str):
        try:
            return self._p.EncryptedArray.from_proto(msg, pub, expected_shape=tuple(expected_shape))
        except (ValueError, OverflowError) as exc:  # CiphertextError is a ValueError
            raise ProtocolError(f"{what}: {exc}") from exc

    # masking ------------------------------------------------------------------
    def mask(self, pub, enc):
        """Add a fresh uniform mask in Z_n to every raw plaintext. Returns (masked ciphertexts, mask)."""
        n = pub.n
        nsq = n * n
        msg = enc.to_proto()
        width = msg.byte_width
        if msg.slot_bits:
            raise ValueError("masking packed ciphertexts is not supported")
        count = int(np.prod(shape_of(msg), dtype=np.int64))
        raw = msg.ciphertexts
        r = [secrets.randbelow(n) for _ in range(count)]
        # Enc(m) * Enc(0) * (1 + r n) = Enc(m + r mod n) (g = n + 1). Enc(0) is a *fresh* encryption, so the
        # result is also re-randomised: the key holder cannot trace its Paillier randomness back to the
        # ciphertexts (and plaintext multipliers) it was computed from.
        zeros = self._p.encrypt(pub, np.zeros(count)).to_proto().ciphertexts
        out = bytearray()
        for i in range(count):
            c = int.from_bytes(raw[i * width:(i + 1) * width], "big")
            z = int.from_bytes(zeros[i * width:(i + 1) * width], "big")
            out += (c * z % nsq * (1 + r[i] * n) % nsq).to_bytes(width, "big")
        masked = messages_pb2.EncryptedTensor()
        masked.CopyFrom(msg)
        masked.ciphertexts = bytes(out)
        return self._p.EncryptedArray.from_proto(masked, pub, expected_shape=shape_of(msg)), _Mask(r, msg.exponent)

    def decrypt_masked(self, priv, enc) -> messages_pb2.MaskedValues:
        """Key holder: decrypt masked ciphertexts to raw plaintexts (m + r) mod n, uniform in Z_n."""
        out_width = (priv.public_key.n.bit_length() + 7) // 8
        raw = self._p.decrypt_raw(priv, enc)  # parallel CRT decryption, never decoded
        out = b"".join(m.to_bytes(out_width, "big") for m in raw)
        return messages_pb2.MaskedValues(key_fingerprint=priv.public_key.fingerprint, shape=list(enc.shape),
                                    byte_width=out_width, values=out, exponent=enc.exponent)

    def check_masked(self, msg: messages_pb2.MaskedValues, pub, expected_shape, what: str) -> messages_pb2.MaskedValues:
        if msg.key_fingerprint != pub.fingerprint:
            raise ProtocolError(f"{what}: values for key {msg.key_fingerprint.hex()[:16]}, "
                                f"expected key {pub.fingerprint.hex()[:16]}")
        check_shape(what, shape_of(msg), expected_shape)
        count = int(np.prod(shape_of(msg), dtype=np.int64))
        if msg.byte_width == 0 or len(msg.values) != count * msg.byte_width:
            raise ProtocolError(f"{what}: {len(msg.values)} bytes for {count} values of width {msg.byte_width}")
        for i in range(count):
            if int.from_bytes(msg.values[i * msg.byte_width:(i + 1) * msg.byte_width], "big") >= pub.n:
                raise ProtocolError(f"{what}: value {i} is not in Z_n")
        return msg

    def unmask(self, pub, msg: messages_pb2.MaskedValues, mask: "_Mask") -> np.ndarray:
        """Remove the mask and decode the fixed-point values -> float64 array of ``msg.shape``."""
        n = pub.n
        if msg.exponent != mask.exponent or len(mask.r) * msg.byte_width != len(msg.values):
            raise ProtocolError("masked values do not match the ciphertexts this party sent")
        w = msg.byte_width
        out = np.empty(len(mask.r), dtype=np.float64)
        for i, r in enumerate(mask.r):
            m = (int.from_bytes(msg.values[i * w:(i + 1) * w], "big") - r) % n
            if m > n // 2:
                m -= n
            out[i] = ldexp_int(m, msg.exponent)
        return out.reshape(shape_of(msg))


@dataclass(frozen=True)
class _Mask:
    r: list  # one uniform element of Z_n (or float for identity) per value, C order
    exponent: int


# --------------------------------------------------------------------------- identity (benchmarks only)
class IdentityBackend(IdentityCrypto):
    """Encryption replaced by identity: ciphertexts are float64 arrays. NO SECURITY — benchmarks only.

    Has the same interface as :class:`PaillierBackend`, so :mod:`secureflhv.vertical.lr` runs the
    identical protocol (same messages, same rounds, same masking calls) with it; the difference in
    time is the cost of Paillier.
    """

    def __init__(self):
        log.warning("IdentityBackend: encryption replaced by identity, no security (benchmark baseline only)")

    def fingerprint(self, pub) -> bytes:
        return pub.fingerprint

    def encrypt(self, pub, x: np.ndarray):
        return np.array(x, dtype=np.float64)

    def dot(self, X: np.ndarray, enc):
        return np.asarray(X, dtype=np.float64).T @ enc

    def mask(self, pub, enc):
        return np.array(enc, dtype=np.float64), _Mask([], 0)

    def decrypt_masked(self, priv, enc) -> messages_pb2.MaskedValues:
        a = np.ascontiguousarray(enc, dtype="<f8")
        return messages_pb2.MaskedValues(key_fingerprint=priv.fingerprint, shape=list(a.shape), byte_width=8,
                                         values=a.tobytes(), exponent=0)

    def check_masked(self, msg, pub, expected_shape, what: str):
        if msg.key_fingerprint != pub.fingerprint:
            raise ProtocolError(f"{what}: wrong key fingerprint")
        check_shape(what, shape_of(msg), expected_shape)
        if msg.byte_width != 8 or len(msg.values) != 8 * int(np.prod(shape_of(msg), dtype=np.int64)):
            raise ProtocolError(f"{what}: payload size does not match the shape")
        return msg

    def unmask(self, pub, msg, mask) -> np.ndarray:
        return np.frombuffer(msg.values, dtype="<f8").reshape(shape_of(msg)).astype(np.float64)
