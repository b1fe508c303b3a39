"""Tensors on the wire: dtype + shape + raw little-endian bytes
(docs/architecture.md, "One message, from the job file to the wire").

A plaintext numeric array travels as a ``messages_pb2.Tensor`` made and read by
:func:`tensor_to_proto` / :func:`tensor_from_proto`, so a peer's array is checked the same way
everywhere (dtype, shape, byte count, finiteness) and a bad one raises
:class:`~secureflhv.transport.base.ProtocolError`, which makes ``Transport.recv`` reject and log the
message and keep waiting. Also here: the shape and whole-count checks of peer values.

Not everything on the wire is encoded here. Elsewhere, each with its own checks:
homomorphic keys, ciphertexts and masked values (:mod:`secureflhv.transport.he_codec`); model
parameters as bundles of these tensors (:mod:`secureflhv.horizontal.model_wire`); SecureBoost's row
masks as packed bits and its scalar messages of ``tree.proto`` (:mod:`secureflhv.tree.vertical`);
PSI's curve points and OT keys as raw bytes (:mod:`secureflhv.crypto.ecdh_psi`,
:mod:`secureflhv.crypto.kkrt`); secure aggregation's Shamir shares (:mod:`secureflhv.crypto.shamir`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..proto import messages_pb2
from .base import ProtocolError


def shape_of(msg) -> tuple[int, ...]:
    """The ``shape`` field of a Tensor / EncryptedTensor / similar message as a tuple of ints."""
    return tuple(int(s) for s in msg.shape)


def check_shape(what: str, got: Sequence[int], expected: Sequence[int] | None) -> None:
    """Raise ProtocolError naming ``what`` when ``got`` differs from ``expected`` (None: anything goes)."""
    if expected is not None and tuple(got) != tuple(expected):
        raise ProtocolError(f"{what}: shape {tuple(got)}, expected {tuple(expected)}")


def whole_count(value: float, what: str, lo: int = 0, hi: int = 1 << 31) -> int:
    """A peer's count sent as a float (``Scalars``): finite, whole and in [lo, hi), else ProtocolError."""
    if not (math.isfinite(value) and value == int(value) and lo <= value < hi):
        raise ProtocolError(f"{what}: {value!r} is not a whole number in [{lo}, {hi})")
    return int(value)


def tensor_to_proto(a, dtype: str | None = None) -> messages_pb2.Tensor:
    """Encode an array (C order, little-endian); ``dtype`` (e.g. ``"<f8"``) converts first."""
    a = np.asarray(a)
    a = np.ascontiguousarray(a, dtype=np.dtype(dtype or a.dtype).newbyteorder("<"))
    return messages_pb2.Tensor(dtype=a.dtype.str, shape=list(a.shape), data=a.tobytes())


def tensor_from_proto(msg: messages_pb2.Tensor, *, what: str, dtype: str | None = "<f8",
                      shape: Sequence[int] | None = None, finite: bool = True) -> np.ndarray:
    """Decode and check a Tensor from a peer; returns a writable array in native byte order.

    Args:
        what: names the message in errors (e.g. ``"vlr.pred from host-1"``).
        dtype: the dtype the protocol expects (``None``: any numeric dtype).
        shape: the shape the protocol expects (``None``: any).
        finite: reject NaN/inf in float tensors.
    Raises:
        ProtocolError: wrong dtype, shape or byte count, or non-finite values.
    """
    got = shape_of(msg)
    check_shape(what, got, shape)
    try:
        dt = np.dtype(msg.dtype)
    except TypeError:
        raise ProtocolError(f"{what}: unknown dtype {msg.dtype!r}") from None
    if dtype is not None and dt != np.dtype(dtype):
        raise ProtocolError(f"{what}: dtype {msg.dtype}, expected {dtype}")
    if dt.kind not in "biuf" or dt.byteorder == ">":
        raise ProtocolError(f"{what}: dtype {msg.dtype} is not a little-endian number type")
    count = int(np.prod(got, dtype=np.int64))
    if len(msg.data) != count * dt.itemsize:
        raise ProtocolError(f"{what}: {len(msg.data)} bytes for {count} values of {dt.itemsize} bytes")
    a = np.frombuffer(msg.data, dtype=dt).reshape(got).astype(dt.newbyteorder("="))
    if finite and dt.kind == "f" and not np.all(np.isfinite(a)):
        raise ProtocolError(f"{what}: non-finite values")
    return a
