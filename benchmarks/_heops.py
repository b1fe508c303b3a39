"""Count the homomorphic operations a protocol run performs, to price them at the engine's own rates.

:func:`counting_backend` wraps an :class:`~secureflhv.crypto.homomorphic.backend.HEBackend` by name; every role of one run
shares the instance, so ``backend.counts`` is the run's total (thread-safe). Units, one per kind:

- ``encrypt``: values encrypted (public-key encryption);
- ``mask``: values masked before decryption (one fresh encryption of zero / of the mask each);
- ``dot``: plaintext x ciphertext entries of ``X^T [[d]]``-type products (``dot``, ``*matmul*``);
- ``decrypt``: values decrypted (``decrypt`` and ``decrypt_masked``).

Additions and power-of-two scalings are not counted: they cost < 1% of the above (plain modular products).
"""
from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from secureflhv.crypto.homomorphic.backend import make_backend


def counting_backend(scheme: str, precision_bits: int | None = None, dot_precision_bits: int | None = None):
    """A fresh backend of ``scheme`` ("paillier" | "ou") whose ``counts`` (Counter) tallies the ops above;
    precisions as the job's config (None: the backend's defaults)."""
    base = type(make_backend(scheme))
    lock = threading.Lock()

    class Counting(base):
        counts: Counter

        def _tally(self, kind: str, n: int) -> None:
            with lock:
                self.counts[kind] += int(n)

        def encrypt(self, key, x):
            self._tally("encrypt", np.size(x))
            return super().encrypt(key, x)

        def decrypt(self, priv, enc):
            self._tally("decrypt", enc.size)
            return super().decrypt(priv, enc)

        def decrypt_masked(self, priv, enc, add=None):
            self._tally("decrypt", enc.size)
            return super().decrypt_masked(priv, enc, add)

        def mask(self, pub, enc):
            self._tally("mask", enc.size)
            return super().mask(pub, enc)

        def dot(self, X, enc):
            self._tally("dot", np.size(X))
            return super().dot(X, enc)

        def matmul(self, enc, W):
            self._tally("dot", np.size(W) * enc.shape[0])
            return super().matmul(enc, W)

        def t_matmul(self, enc, D):
            self._tally("dot", np.size(D) * enc.shape[1])
            return super().t_matmul(enc, D)

        def matmul_t(self, D, enc):
            self._tally("dot", np.size(D) * enc.shape[0])
            return super().matmul_t(D, enc)

    Counting.__name__ = f"Counting{base.__name__}"
    backend = Counting(precision_bits) if dot_precision_bits is None else Counting(precision_bits, dot_precision_bits)
    backend.counts = Counter()
    return backend


def priced(counts: Counter, rates: dict, epochs: int = 1) -> tuple[float, str]:
    """Seconds per epoch of ``counts`` at ``rates`` (values/s per kind; ``mask`` at the encryption rate)
    and a one-line breakdown ``"encrypt 100,000 x ... + ..."``."""
    rate = dict(rates, mask=rates["encrypt"])
    parts = [(k, counts[k] / epochs, counts[k] / epochs / rate[k]) for k in ("encrypt", "mask", "dot", "decrypt")
             if counts.get(k)]
    return sum(s for _, _, s in parts), " + ".join(f"{k} {n:,.0f} ({s:.2f} s)" for k, n, s in parts)
