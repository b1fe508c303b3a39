"""Model parameters on the wire, shared by every horizontal protocol that sends models (FL server/clients,
MultiConfederated peers): one bundle tensor ``model/<name>`` per parameter, float32 little-endian.

:func:`model_tensors` is the one validator of incoming models: exactly the expected parameter names, each
of its expected shape, dtype ``<f4`` and finite values (:func:`~secureflhv.transport.codec.tensor_from_proto`
bounds the sizes before decoding); anything else raises :class:`~secureflhv.transport.base.ProtocolError`
naming the message and the parameter, so the receiver rejects and logs it and keeps waiting.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..proto import messages_pb2
from ..transport.base import ProtocolError
from ..transport.codec import tensor_from_proto, tensor_to_proto

PREFIX = "model/"


def float32_tensor(t: messages_pb2.Tensor, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Decode a float32 tensor of ``shape`` with finite values; raises ProtocolError naming ``what``."""
    return tensor_from_proto(t, what=what, dtype="<f4", shape=shape)


def model_tensors(b: messages_pb2.Bundle, shapes: Mapping[str, tuple[int, ...]], what: str = "",
                  *, only: bool = False) -> dict[str, np.ndarray]:
    """The parameters ``model/<name>`` of bundle ``b``: {name: float32 array of ``shapes[name]``}.

    ``only``: the bundle may hold no other tensor (else other prefixes, e.g. ``extra/``, are left alone).
    Raises ProtocolError (prefixed ``what``) for missing or unexpected parameters, a wrong shape or dtype,
    or a non-finite value.
    """
    names = {k[len(PREFIX):] for k in b.tensors if k.startswith(PREFIX)}
    if names != set(shapes) or (only and len(b.tensors) != len(names)):
        got = sorted(b.tensors if only else names)[:8]
        raise ProtocolError(f"{what + ': ' if what else ''}model parameters {got} do not match {sorted(shapes)[:8]}")
    return {n: float32_tensor(b.tensors[PREFIX + n], s, f"{what + ' ' if what else ''}{PREFIX}{n}")
            for n, s in shapes.items()}


def model_bundle(shapes: dict[str, tuple[int, ...]], vector: np.ndarray, **text) -> messages_pb2.Bundle:
    """A bundle with the flat model ``vector`` split into its parameters of ``shapes`` (and ``text`` fields)."""
    b = messages_pb2.Bundle(text={k: str(v) for k, v in text.items()})
    offset = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        b.tensors[PREFIX + name].CopyFrom(tensor_to_proto(vector[offset:offset + n].reshape(shape), "<f4"))
        offset += n
    return b


def read_model(b: messages_pb2.Bundle, shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
    """The flat float32 model in a bundle (:func:`model_tensors`, in ``shapes`` order); ProtocolError if bad."""
    return np.concatenate([t.reshape(-1) for t in model_tensors(b, shapes).values()]).astype(np.float32)
