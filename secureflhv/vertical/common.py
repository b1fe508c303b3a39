"""Pieces shared by the vertical protocols (logistic regression and split NN)."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, parse_message


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
