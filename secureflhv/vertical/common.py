"""Pieces shared by the vertical protocols (logistic regression and split NN)."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, parse_message
from ..transport.codec import check_shape, shape_of


def check_matrix(X, name: str) -> np.ndarray:
    """``X`` as a finite float64 (rows, features) array; ValueError naming ``name`` otherwise."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D (rows, features) array, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return X


def control_parser(epoch: int):
    """``parse`` callback for the guest's end-of-epoch Control message ("continue" / "stop")."""
    def validate(m: messages_pb2.Control):
        if m.command not in ("continue", "stop") or m.epoch != epoch:
            raise ProtocolError(f"control {m.command!r} for epoch {m.epoch}, expected continue/stop for {epoch}")
        return m
    return parse_message(messages_pb2.Control, validate)


def ldexp_int(m: int, exponent: int) -> float:
    """Exactly rounded float of ``m * 2**exponent`` for a Python int of any size."""
    extra = m.bit_length() - 1000
    if extra > 0:
        m >>= extra
        exponent += extra
    return math.ldexp(float(m), exponent)


@dataclass(frozen=True)
class IdentityKey:
    """Stand-in key of the identity (no-encryption) benchmark backends: no secret, a fixed fingerprint."""

    n_bits: int = 0
    fingerprint: bytes = hashlib.sha256(b"secureflhv identity backend: NO ENCRYPTION").digest()

    @property
    def public_key(self) -> "IdentityKey":
        return self


class IdentityCrypto:
    """Keys and "ciphertexts" of the identity benchmark backends: float64 arrays, NO SECURITY.

    Shared by :class:`~secureflhv.vertical.lr_crypto.IdentityBackend` and
    :class:`~secureflhv.vertical.interactive_layer.IdentityOps`, so a protocol runs unchanged with
    encryption replaced by identity and a benchmark measures what Paillier costs.
    """

    name = "identity"

    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        key = IdentityKey()
        return key, key

    def public_key_to_proto(self, pub):
        return messages_pb2.PaillierPublicKey(n=b"\x01", fingerprint=pub.fingerprint)

    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        if bytes(msg.fingerprint) != IdentityKey().fingerprint:
            raise ProtocolError(f"{what}: not the identity backend's key")
        return IdentityKey()

    def to_proto(self, enc) -> messages_pb2.EncryptedTensor:
        a = np.ascontiguousarray(enc, dtype="<f8")
        return messages_pb2.EncryptedTensor(key_fingerprint=IdentityKey().fingerprint, shape=list(a.shape),
                                            byte_width=8, ciphertexts=a.tobytes(), exponent=0, slots=1)

    def from_proto(self, msg, pub, expected_shape, what: str) -> np.ndarray:
        """float64 array of ``msg``; ProtocolError for another key, a wrong shape or size."""
        if bytes(msg.key_fingerprint) != pub.fingerprint:
            raise ProtocolError(f"{what}: wrong key fingerprint")
        check_shape(what, shape_of(msg), expected_shape)
        if msg.byte_width != 8 or len(msg.ciphertexts) != 8 * math.prod(shape_of(msg)):
            raise ProtocolError(f"{what}: payload size does not match the shape")
        return np.frombuffer(msg.ciphertexts, dtype="<f8").reshape(shape_of(msg)).astype(np.float64)
