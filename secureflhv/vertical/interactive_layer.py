"""Crypto backends of the split-NN interactive layer: Paillier, and identity for benchmarks only.

The protocol in :mod:`secureflhv.vertical.split_nn` talks to a backend only through the methods
below, so the same protocol (same messages, rounds and masking calls) runs with real encryption
(:class:`PaillierOps`) or with encryption replaced by identity (:class:`IdentityOps`, *no security*,
only to measure what Paillier costs in ``benchmarks/split_nn.py``).

Matrix products with one encrypted factor (Paillier is additively homomorphic, so a ciphertext can
only be multiplied by a plaintext). ``[[A]]`` is (b, k) under the host's key, plaintext ``W`` (k, o),
``D`` (b, o), encrypted ``[[M]]`` (k, o):

* :meth:`PaillierOps.matmul`   ``[[A]] @ W``   (b, o):  one multi-exponentiation per row
  (``paillier.dot(W, [[A_i]])`` = W^T A_i);
* :meth:`PaillierOps.t_matmul` ``[[A]]^T @ D`` (k, o):  one per column of A (``dot(D, [[A[:, j]]])``);
* :meth:`PaillierOps.matmul_t` ``D @ [[M]]^T`` (b, k):  one per row of M (``dot(D^T, [[M_j]])``).

Rows are spread over the Paillier worker pool (:func:`secureflhv.crypto.paillier.set_workers`).
Plaintext multipliers are encoded with ``dot_precision_bits`` fraction bits (exact integer
arithmetic afterwards), encrypted values with ``precision_bits``.

Masking before decryption (as in :mod:`secureflhv.vertical.lr_crypto`): a party that lets the key
holder decrypt ``[[m]]`` multiplies every ciphertext by a *fresh* encryption of ``r``, r uniform in
Z_n (``secrets.randbelow``). The fresh randomness re-randomises the ciphertext (the key holder cannot
trace its Paillier randomness to the plaintext factors it was computed with) and ``(m + r) mod n``
is uniform whatever m is (a one-time pad in Z_n). The key holder may add its own fixed-point term
``t`` (encoded at the ciphertext's exponent) mod n before returning the values; the sender subtracts r
and decodes ``m + t`` exactly: the noise terms cancel exactly, no precision is lost.

Built on the public API of :mod:`secureflhv.crypto.paillier`; the key holder uses
:func:`~secureflhv.crypto.paillier.decrypt_raw` (residues in [0, n), never decoded).

Errors: ``from_proto``/``check_zn`` raise :class:`~secureflhv.transport.ProtocolError` for a payload
under another key, of the wrong shape or outside Z*_{n^2} / Z_n.
"""
from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass

import numpy as np

from ..crypto.paillier import decrypt_raw
from ..proto import messages_pb2
from ..transport import ProtocolError
from ..transport.codec import check_shape, shape_of
from .common import IdentityCrypto, ldexp_int

log = logging.getLogger("secureflhv.vertical.split_nn")


@dataclass(frozen=True)
class Mask:
    """The sender's secret of one masked tensor: one r per value (C order) and the exponent."""

    r: list
    exponent: int
    shape: tuple


# --------------------------------------------------------------------------- raw decryption
# --------------------------------------------------------------------------- Paillier
class PaillierOps:
    """Interactive-layer arithmetic over :mod:`secureflhv.crypto.paillier`.

    Args:
        precision_bits: fraction bits of encrypted values (bottom outputs, accumulated noise).
        dot_precision_bits: fraction bits of plaintext multipliers (weights, gradients); needs
            |value| < 2**(62 - dot_precision_bits).
    """

    name = "paillier"

    def __init__(self, precision_bits: int = 40, dot_precision_bits: int = 32):
        from ..crypto import paillier

        self._p = paillier
        self.precision_bits = int(precision_bits)
        self.dot_precision_bits = int(dot_precision_bits)

    # keys ------------------------------------------------------------------
    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        return self._p.generate_keypair(n_bits, insecure_test_key=insecure_test_key)

    def public_key_to_proto(self, pub):
        return pub.to_proto()

    def public_key_from_proto(self, msg, insecure_test_key: bool, what: str = "public key"):
        try:
            return self._p.PublicKey.from_proto(msg, insecure_test_key=insecure_test_key)
        except ValueError as exc:
            raise ProtocolError(f"{what}: {exc}") from exc

    # wire ------------------------------------------------------------------
    def to_proto(self, enc) -> messages_pb2.EncryptedTensor:
        return enc.to_proto()

    def from_proto(self, msg, pub, expected_shape, what: str):
        try:
            return self._p.EncryptedArray.from_proto(msg, pub, expected_shape=tuple(expected_shape))
        except (ValueError, OverflowError) as exc:  # CiphertextError is a ValueError
            raise ProtocolError(f"{what}: {exc}") from exc

    # arithmetic --------------------------------------------------------------
    def encrypt(self, key, x) -> object:
        return self._p.encrypt(key, np.asarray(x, dtype=np.float64), precision_bits=self.precision_bits)

    def decrypt(self, priv, enc) -> np.ndarray:
        return self._p.decrypt(priv, enc)

    def _dots(self, X_list, vecs):
        """[paillier.dot(X_i, vec_i)] for i, each (n_i, d) x (n_i,) -> (d,)."""
        return [self._p.dot(X, v, precision_bits=self.dot_precision_bits) for X, v in zip(X_list, vecs)]

    def _stack(self, parts, axis: int):
        c = np.stack([np.asarray(p.ciphertexts) for p in parts], axis=axis)
        e = parts[0].exponent
        if any(p.exponent != e for p in parts):
            raise AssertionError("dot results with different exponents")
        return self._p.EncryptedArray(parts[0].public_key, c, e)

    def matmul(self, enc, W: np.ndarray):
        """``[[A]] @ W``: enc (b, k), W (k, o) plaintext -> (b, o) encrypted."""
        W = np.ascontiguousarray(W, dtype=np.float64)
        rows = [enc[i] for i in range(enc.shape[0])]
        return self._stack(_parallel_dots(self, [W] * len(rows), rows), axis=0)

    def t_matmul(self, enc, D: np.ndarray):
        """``[[A]]^T @ D``: enc (b, k), D (b, o) plaintext -> (k, o) encrypted."""
        D = np.ascontiguousarray(D, dtype=np.float64)
        cols = [enc[:, j] for j in range(enc.shape[1])]
        return self._stack(_parallel_dots(self, [D] * len(cols), cols), axis=0)

    def matmul_t(self, D: np.ndarray, enc):
        """``D @ [[M]]^T``: D (b, o) plaintext, enc (k, o) -> (b, k) encrypted."""
        Dt = np.ascontiguousarray(np.asarray(D, dtype=np.float64).T)
        rows = [enc[j] for j in range(enc.shape[0])]
        return self._stack(_parallel_dots(self, [Dt] * len(rows), rows), axis=1)

    def add(self, enc, x):
        """enc + plaintext (numpy broadcasting)."""
        return enc + np.asarray(x, dtype=np.float64)

    # masking -------------------------------------------------------------------
    def mask(self, pub, enc):
        """``[[m + r mod n]]`` re-randomised, r uniform in Z_n per value. Returns (masked, Mask)."""
        n, n2 = pub.n, pub.n * pub.n
        count = int(enc.size)
        r = [secrets.randbelow(n) for _ in range(count)]
        zeros = self._p.encrypt(pub, np.zeros(count)).ciphertexts  # fresh Enc(0): re-randomisation
        flat = enc.ciphertexts.reshape(-1)
        out = np.empty(count, dtype=object)
        for i in range(count):
            # Enc(m) * Enc(0) * (1 + r n) = Enc(m + r mod n)  (g = n + 1)
            out[i] = flat[i] * zeros[i] % n2 * (1 + r[i] * n) % n2
        masked = self._p.EncryptedArray(pub, out.reshape(enc.shape), enc.exponent)
        return masked, Mask(r, enc.exponent, tuple(enc.shape))

    def decrypt_masked(self, priv, enc, add: np.ndarray | None = None) -> messages_pb2.MaskedValues:
        """Key holder: raw (m + r + t) mod n with ``t = add`` encoded at enc's exponent (``add`` has enc's shape)."""
        from ..crypto.paillier_encoding import encode_mantissas

        n = priv.public_key.n
        raw = decrypt_raw(priv, enc)
        if add is not None:
            add = np.asarray(add, dtype=np.float64)
            if add.shape != tuple(enc.shape):
                raise ValueError(f"decrypt_masked: term of shape {add.shape} for ciphertexts {enc.shape}")
            t = encode_mantissas(add, -enc.exponent, n)
            raw = [(a + b) % n for a, b in zip(raw, t)]
        w = (n.bit_length() + 7) // 8
        return messages_pb2.MaskedValues(key_fingerprint=priv.public_key.fingerprint, shape=list(enc.shape), byte_width=w,
                                values=b"".join(int(v).to_bytes(w, "big") for v in raw), exponent=enc.exponent)

    def check_zn(self, msg: messages_pb2.MaskedValues, pub, expected_shape, what: str) -> messages_pb2.MaskedValues:
        if bytes(msg.key_fingerprint) != pub.fingerprint:
            raise ProtocolError(f"{what}: values for key {bytes(msg.key_fingerprint).hex()[:16]}, "
                                f"expected key {pub.fingerprint.hex()[:16]}")
        check_shape(what, shape_of(msg), expected_shape)
        count = math.prod(shape_of(msg))
        w = msg.byte_width
        if w == 0 or w > (pub.n.bit_length() + 7) // 8 or len(msg.values) != count * w:
            raise ProtocolError(f"{what}: {len(msg.values)} bytes for {count} values of width {w}")
        vals = msg.values
        for i in range(count):
            if int.from_bytes(vals[i * w:(i + 1) * w], "big") >= pub.n:
                raise ProtocolError(f"{what}: value {i} is not in Z_n")
        return msg

    def unmask(self, pub, msg: messages_pb2.MaskedValues, mask: Mask) -> np.ndarray:
        """Subtract the mask mod n, take the signed residue, decode -> float64 of the mask's shape."""
        n = pub.n
        w = msg.byte_width
        if msg.exponent != mask.exponent or len(mask.r) * w != len(msg.values):
            raise ProtocolError("masked values do not match the ciphertexts this party sent")
        out = np.empty(len(mask.r), dtype=np.float64)
        limit = n // 3
        for i, r in enumerate(mask.r):
            m = (int.from_bytes(msg.values[i * w:(i + 1) * w], "big") - r) % n
            if m > n // 2:
                m -= n
            if abs(m) > limit:
                raise ProtocolError("unmasked value overflowed the fixed-point range (a peer added garbage?)")
            out[i] = ldexp_int(m, msg.exponent)
        return out.reshape(mask.shape)


def _dots_task(precision_bits: int, n: int, Xs: list, rows: list, exponent: int) -> list:
    """Worker-pool entry: ciphertext lists of dot(X_i, row_i) (see :func:`_parallel_dots`)."""
    from ..crypto import paillier

    pub = paillier.PublicKey(n, insecure_test_key=True)  # only used for arithmetic, size already checked
    out = []
    for X, cts in zip(Xs, rows):
        enc = paillier.EncryptedArray(pub, np.asarray(cts, dtype=object), exponent)
        out.append(list(paillier.dot(X, enc, precision_bits=precision_bits).ciphertexts))
    return out


def _parallel_dots(ops: PaillierOps, Xs: list, vecs: list) -> list:
    """dot(X_i, vec_i) for every i, spread over the Paillier worker pool when it pays off."""
    from ..crypto import paillier
    from ..crypto import paillier_parallel as par

    work = sum(X.size for X in Xs)
    parts = par.parallel_chunks(len(vecs), 8) if work >= 4000 else 1
    if parts <= 1:
        return ops._dots(Xs, vecs)
    pub, e = vecs[0].public_key, vecs[0].exponent
    bounds = [len(vecs) * i // parts for i in range(parts + 1)]
    chunks = [(Xs[bounds[i]:bounds[i + 1]], [list(v.ciphertexts) for v in vecs[bounds[i]:bounds[i + 1]]], e)
              for i in range(parts)]
    res = par.run(_dots_task, (ops.dot_precision_bits, int(pub.n)), chunks)
    e_out = e - ops.dot_precision_bits
    return [paillier.EncryptedArray(pub, np.asarray(c, dtype=object), e_out) for r in res for c in r]


# --------------------------------------------------------------------------- identity (benchmarks only)
class IdentityOps(IdentityCrypto):
    """Encryption replaced by identity: "ciphertexts" are float64 arrays. NO SECURITY — benchmarks only.

    Same interface as :class:`PaillierOps`; masks are real (uniform float noise) so the protocol's
    arithmetic is unchanged, only the Paillier cost disappears.
    """

    def __init__(self):
        log.warning("IdentityOps: encryption replaced by identity, no security (benchmark baseline only)")

    def encrypt(self, key, x):
        return np.array(x, dtype=np.float64)

    def decrypt(self, priv, enc):
        return np.array(enc, dtype=np.float64)

    def matmul(self, enc, W):
        return enc @ W

    def t_matmul(self, enc, D):
        return enc.T @ D

    def matmul_t(self, D, enc):
        return D @ enc.T

    def add(self, enc, x):
        return enc + x

    def mask(self, pub, enc):
        r = np.random.default_rng().uniform(-1, 1, size=np.shape(enc))
        return enc + r, Mask(list(r.reshape(-1)), 0, tuple(np.shape(enc)))

    def decrypt_masked(self, priv, enc, add=None):
        a = np.ascontiguousarray(enc if add is None else enc + add, dtype="<f8")
        return messages_pb2.MaskedValues(key_fingerprint=priv.fingerprint, shape=list(a.shape), byte_width=8,
                                values=a.tobytes(), exponent=0)

    def check_zn(self, msg, pub, expected_shape, what: str):
        if bytes(msg.key_fingerprint) != pub.fingerprint:
            raise ProtocolError(f"{what}: wrong key fingerprint")
        check_shape(what, shape_of(msg), expected_shape)
        if msg.byte_width != 8 or len(msg.values) != 8 * math.prod(shape_of(msg)):
            raise ProtocolError(f"{what}: payload size does not match the shape")
        return msg

    def unmask(self, pub, msg, mask: Mask) -> np.ndarray:
        v = np.frombuffer(msg.values, dtype="<f8").reshape(mask.shape)
        return v - np.asarray(mask.r).reshape(mask.shape)
