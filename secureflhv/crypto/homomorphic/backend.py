"""One homomorphic-encryption interface for the vertical algorithms: Paillier, OU, and identity for benchmarks.

Vertical LR (:mod:`secureflhv.vertical.lr`), the split NN (:mod:`secureflhv.vertical.split_nn`) and
vertical SecureBoost (:mod:`secureflhv.tree.vertical`) talk to encryption only through
:class:`HEBackend`, so each algorithm runs unchanged (same messages, same rounds, same masking calls)
with real encryption (:class:`PaillierHE`, the default; Okamoto-Uchiyama,
:class:`OUHE`, ``he_scheme: ou``) or with encryption replaced by identity
(:class:`IdentityHE`, *no security at all*, the plaintext baseline of ``benchmarks/*.py``).
Math and value types only: the wire encoding of keys, ciphertexts and masked values is
:mod:`secureflhv.transport.he_codec`.

Matrix products with one encrypted factor (Paillier is additively homomorphic, so a ciphertext can
only be multiplied by a plaintext). ``[[A]]`` is (b, k), plaintext ``W`` (k, o), ``D`` (b, o),
encrypted ``[[M]]`` (k, o):

* :meth:`HEBackend.dot`      ``X^T @ [[v]]``  (d,):    one multi-exponentiation per column of X;
* :meth:`HEBackend.matmul`   ``[[A]] @ W``    (b, o):  one per row (``paillier.dot(W, [[A_i]])`` = W^T A_i);
* :meth:`HEBackend.t_matmul` ``[[A]]^T @ D``  (k, o):  one per column of A (``dot(D, [[A[:, j]]])``);
* :meth:`HEBackend.matmul_t` ``D @ [[M]]^T``  (b, k):  one per row of M (``dot(D^T, [[M_j]])``).

Rows are spread over the Paillier worker pool (:func:`secureflhv.crypto.homomorphic.paillier.set_workers`).
Plaintext multipliers are encoded with ``dot_precision_bits`` fraction bits (exact integer arithmetic
afterwards; needs |value| < 2**(62 - dot_precision_bits)), encrypted values with ``precision_bits``.

Masking before decryption (Hardy et al. 2017, sec. 3; the step that keeps the key holder from seeing
a plaintext gradient): a party that lets the key holder decrypt ``[[m]]`` multiplies every ciphertext
by a *fresh* encryption of 0 and by ``1 + r n`` with r uniform in Z_n (``secrets.randbelow``):
``[[m + r mod n]]``, re-randomised (the key holder cannot trace its Paillier randomness to the
plaintext factors it was computed with). ``(m + r) mod n`` is uniform whatever m is (a one-time pad
in Z_n), so the key holder learns nothing. It may add its own fixed-point term ``t`` (encoded at the
ciphertext's exponent) mod n before returning the raw residues (:class:`MaskedValues`); the sender
subtracts r and decodes ``m + t`` exactly: no precision is lost.

Pair sums (:class:`PairSums`, vertical SecureBoost, Cheng et al. 2021 Alg. 1-2 with the SecureBoost+
engineering of Chen et al., arXiv 2110.10927): per row the guest's integer gradient/hessian mantissas
(g_i, h_i) at p fraction bits, packed into one ciphertext (two slots); hosts sum them per histogram
bin (the smaller child of each pair; the guest derives its sibling's sums in plaintext) and compress
~k candidates per ciphertext for the guest.

Errors: :class:`~secureflhv.crypto.homomorphic.paillier.CiphertextError` (a ValueError) when masked values do not
match the ciphertexts this party sent, or an unmasked value overflowed the fixed-point range.
"""
from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from . import ou
from . import paillier as pl
from . import paillier_hist as ph
from ...compute import executor as _ex
from .paillier import CiphertextError
from .paillier_encoding import DEFAULT_PRECISION_BITS, DEFAULT_SCALAR_PRECISION_BITS, encode_mantissas

log = logging.getLogger("secureflhv.crypto.homomorphic.backend")

# Fraction bits of plaintext multipliers in the vertical algorithms (LR, split NN, SecureBoost);
# deliberately finer than paillier.DEFAULT_DOT_PRECISION_BITS (24), the primitive dot()'s default.
VERTICAL_DOT_PRECISION_BITS = 32


@dataclass(frozen=True)
class Mask:
    """The sender's secret of one masked tensor: one r per value (C order), the exponent and shape."""

    r: list
    exponent: int
    shape: tuple


@dataclass(frozen=True)
class MaskedValues:
    """What the key holder returns: raw residues (m + r [+ t]) mod n per value, C order.

    ``values``: Python ints in [0, n) (Paillier) or a float64 array (identity); ``exponent``: the
    fixed-point exponent of the ciphertexts they came from; ``key_fingerprint``: the key's name.
    """

    key_fingerprint: bytes
    shape: tuple
    exponent: int
    values: object


@dataclass(frozen=True)
class IdentityKey:
    """Stand-in key of :class:`IdentityHE`: no secret, a fixed fingerprint."""

    n_bits: int = 0
    fingerprint: bytes = hashlib.sha256(b"secureflhv identity backend: NO ENCRYPTION").digest()

    @property
    def public_key(self) -> "IdentityKey":
        """The key itself (the identity backend's public and private keys are one object)."""
        return self


def constant_shift_bits(c: float) -> int:
    """How many bits :meth:`HEBackend.mul_const` by ``c`` lowers a ciphertext's exponent: 0 for an
    integer, s for +-2^-s (s < DEFAULT_SCALAR_PRECISION_BITS), else DEFAULT_SCALAR_PRECISION_BITS (the
    constant is encoded with that many fraction bits). Parties compute expected wire exponents with it."""
    if float(c).is_integer():
        return 0
    m, ex = math.frexp(abs(c))
    return 1 - ex if m == 0.5 and 1 - ex < DEFAULT_SCALAR_PRECISION_BITS else DEFAULT_SCALAR_PRECISION_BITS


def ldexp_int(m: int, exponent: int) -> float:
    """Exactly rounded float of ``m * 2**exponent`` for a Python int of any size."""
    extra = m.bit_length() - 1000
    if extra > 0:
        m >>= extra
        exponent += extra
    return math.ldexp(float(m), exponent)


class PairSums(ABC):
    """(g, h) integer mantissa pairs of one tree, summed homomorphically by the hosts.

    Args (of the implementations): the key, p (fraction bits), e (log2 of the power-of-two bound of
    |g|, |h|), n (rows: the most pairs any sum adds up).
    ``per``: candidates per transmitted sum element (compression factor; 1 without encryption).
    """

    per: int = 1
    compress_seconds: float = 0.0  # time spent compressing so far (the host's second cost)

    @abstractmethod
    def encrypt(self, key, gq: np.ndarray, hq: np.ndarray):
        """Guest: the n row pairs under ``key`` (int64 mantissas gq, hq of shape (n,)).

        Returns: Paillier, an :class:`~secureflhv.crypto.homomorphic.paillier.EncryptedArray` (n,) of GH-packed
        ciphertexts (two slots, :func:`gh_packing`); identity, the tuple (gq, hq) unchanged.
        """

    @abstractmethod
    def histogram(self, rows_data, rows: np.ndarray, bins: np.ndarray, n_bins: list[int]):
        """Host: per feature and bin the sum of the pairs of ``rows`` (bins: (n, d) of all rows).

        Returns: Paillier, per feature a list of per-bin raw gmpy2 ciphertexts (mod n^2, None for an
        empty bin, see :func:`secureflhv.crypto.homomorphic.paillier_hist.build_node`); identity, int64 (2, d, max(n_bins)) sums
        of the g and h mantissas.
        """

    def histograms(self, rows_data, rows_list: list[np.ndarray], bins: np.ndarray, n_bins: list[int]) -> list:
        """Host: :meth:`histogram` of each node of a tree level, as one batch where that is faster
        (Paillier: nodes too small for the workers on their own go to them together)."""
        return [self.histogram(rows_data, rows, bins, n_bins) for rows in rows_list]

    def release(self, rows_data) -> None:
        """Host: the tree is finished; its row pairs are no longer needed (Paillier: the workers holding
        them drop them)."""

    @abstractmethod
    def select(self, hist, cands: list[tuple[int, int]]) -> list:
        """Host: cumulative left sums of candidates (feature, bin), compressed ``per`` to an element.

        Returns: Paillier, ceil(len(cands) / per) raw compressed ciphertexts; identity, one [G, H]
        int list per candidate.
        """

    def select_level(self, items: list[tuple[object, list[tuple[int, int]]]]) -> list[list]:
        """Host: :meth:`select` of each (hist, cands) of one tree level, as one batch where that is
        faster (Paillier: one parallel compression call for all nodes). Returns one list per item."""
        return [self.select(hist, cands) for hist, cands in items]

    @abstractmethod
    def collect(self, elements: list):
        """Host: the elements of every node as one value for the wire.

        Returns: Paillier, an EncryptedArray (len(elements),) with the compressed packing ``cspec``;
        identity, int64 (len(elements), 2).
        """

    @abstractmethod
    def decrypt(self, priv, value, counts: list[int]) -> np.ndarray:
        """Guest: float64 (sum(counts), 2) left sums (G_L, H_L) of each node's candidates, in order.

        Both backends return that array (Paillier: decrypted and unpacked, the padding slots of each
        node's last element dropped; identity: the mantissas scaled by 2**-precision_bits).
        """

    def n_elements(self, counts: list[int]) -> int:
        """Elements on the wire for nodes with ``counts`` candidates."""
        return sum(-(-c // self.per) for c in counts)


class HEBackend(ABC):
    """Additively homomorphic encryption as the vertical algorithms use it (see the module docstring).

    Args:
        precision_bits: fraction bits of encrypted values.
        dot_precision_bits: fraction bits of plaintext multipliers.
    """

    name = "abstract"

    def __init__(self, precision_bits: int | None = None, dot_precision_bits: int = VERTICAL_DOT_PRECISION_BITS):
        self.precision_bits = DEFAULT_PRECISION_BITS if precision_bits is None else int(precision_bits)
        self.dot_precision_bits = int(dot_precision_bits)

    @abstractmethod
    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        """(public, private) key pair; keys below 2048 bits only with ``insecure_test_key``."""

    @abstractmethod
    def encrypt(self, key, x):
        """Encrypt float values under ``key`` (public, or the holder's private key: CRT, faster).

        Args: x, array-like of any shape (converted to float64).
        Returns: a ciphertext array of x's shape (Paillier: EncryptedArray at exponent
        ``-precision_bits``; identity: a float64 copy).
        Raises: OverflowError (Paillier) if a value needs more than n_bits - 2 bits at this precision.
        """

    @abstractmethod
    def decrypt(self, priv, enc) -> np.ndarray:
        """Decrypt to float64 of enc's shape (only for values the key holder may see).

        Raises: CiphertextError (Paillier) for ciphertexts under another key; OverflowError if a
        result overflowed the fixed-point range.
        """

    @abstractmethod
    def dot(self, X, enc):
        """``X.T @ enc`` for plaintext X (n, d) and a ciphertext vector (n,) -> (d,)."""

    @abstractmethod
    def matmul(self, enc, W):
        """``[[A]] @ W``: enc (b, k), W (k, o) plaintext -> (b, o) encrypted."""

    @abstractmethod
    def t_matmul(self, enc, D):
        """``[[A]]^T @ D``: enc (b, k), D (b, o) plaintext -> (k, o) encrypted."""

    @abstractmethod
    def matmul_t(self, D, enc):
        """``D @ [[M]]^T``: D (b, o) plaintext, enc (k, o) -> (b, k) encrypted."""

    @abstractmethod
    def add(self, enc, x):
        """enc + plaintext (numpy broadcasting)."""

    def mul_const(self, enc, c: float):
        """enc * c for a constant float c; the exponent drops by :func:`constant_shift_bits` (c)."""
        return enc if c == 1.0 else enc * c

    @abstractmethod
    def mask(self, pub, enc) -> tuple[object, Mask]:
        """``[[m + r]]`` re-randomised with a fresh uniform r per value; returns (masked, Mask).

        ``masked`` has enc's shape and exponent (identity: a float64 copy, r = 0); the Mask holds
        enc.size Python ints r in [0, n) (C order; identity: none), the exponent and the shape.
        Raises nothing for valid ciphertexts under ``pub``.
        """

    @abstractmethod
    def decrypt_masked(self, priv, enc, add=None) -> MaskedValues:
        """Key holder: raw (m + r + t) with ``t = add`` (enc's shape) at enc's exponent."""

    @abstractmethod
    def unmask(self, pub, masked: MaskedValues, mask: Mask) -> np.ndarray:
        """Sender: remove the mask, decode -> float64 of the mask's shape (CiphertextError on mismatch)."""

    @abstractmethod
    def pair_sums(self, key, precision_bits: int, log2_bound: int, n_rows: int) -> PairSums:
        """The :class:`PairSums` of one tree (gradient/hessian mantissas at ``precision_bits``).

        ``key`` is the guest's *public* key (guest and hosts alike); |g|, |h| < 2**log2_bound, at
        most ``n_rows`` pairs per sum.
        """


# --------------------------------------------------------------------------------------- Paillier
class PaillierHE(HEBackend):
    """Paillier through :mod:`secureflhv.crypto.homomorphic.paillier` (phe keys, gmpy2 arithmetic, worker pool)."""

    name = "paillier"

    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        """A Paillier key pair of ``n_bits`` (:func:`secureflhv.crypto.homomorphic.paillier.generate_keypair`); the
        executor's workers start meanwhile. ValueError below the secure minimum unless ``insecure_test_key``.
        """
        _ex.start()  # the workers start while the key is generated, not in the first batch
        return pl.generate_keypair(n_bits, insecure_test_key=insecure_test_key)

    def encrypt(self, key, x):
        """``x`` (float64, any shape) encrypted at ``precision_bits`` fraction bits: an EncryptedArray of x's shape."""
        return pl.encrypt(key, np.asarray(x, dtype=np.float64), precision_bits=self.precision_bits)

    def decrypt(self, priv, enc) -> np.ndarray:
        """The float64 values of ``enc`` (its shape); raises DecryptedRangeError outside the encodable range."""
        return pl.decrypt(priv, enc)

    def dot(self, X, enc):
        """``X^T · enc`` (X float (n, d), enc (n,)): EncryptedArray (d,), X at ``dot_precision_bits`` fraction bits."""
        return pl.dot(np.ascontiguousarray(X, dtype=np.float64), enc, precision_bits=self.dot_precision_bits)

    def _stack(self, parts, axis: int):
        c = np.stack([np.asarray(p.ciphertexts) for p in parts], axis=axis)
        e = parts[0].exponent
        if any(p.exponent != e for p in parts):
            raise AssertionError(f"dot results with different exponents: {sorted({p.exponent for p in parts})}")
        return pl.EncryptedArray(parts[0].public_key, c, e)

    def matmul(self, enc, W):
        """``enc · W`` (enc (n, k) encrypted, W float (k, m)): EncryptedArray (n, m), rows on the executor."""
        W = np.ascontiguousarray(W, dtype=np.float64)
        rows = [enc[i] for i in range(enc.shape[0])]
        return self._stack(_parallel_dots(self.dot_precision_bits, [W] * len(rows), rows), axis=0)

    def t_matmul(self, enc, D):
        """``enc^T · D`` (enc (n, k) encrypted, D float (n, m)): EncryptedArray (k, m), columns on the executor."""
        D = np.ascontiguousarray(D, dtype=np.float64)
        cols = [enc[:, j] for j in range(enc.shape[1])]
        return self._stack(_parallel_dots(self.dot_precision_bits, [D] * len(cols), cols), axis=0)

    def matmul_t(self, D, enc):
        """``D · enc^T`` (D float (m, k), enc (n, k) encrypted): EncryptedArray (m, n)."""
        Dt = np.ascontiguousarray(np.asarray(D, dtype=np.float64).T)
        rows = [enc[j] for j in range(enc.shape[0])]
        return self._stack(_parallel_dots(self.dot_precision_bits, [Dt] * len(rows), rows), axis=1)

    def add(self, enc, x):
        """``enc + x`` (x float, broadcast to enc's shape), still encrypted."""
        return enc + np.asarray(x, dtype=np.float64)

    def mul_const(self, enc, c: float):
        """A power of two +-2^-s is exact and free: the same ciphertexts read at exponent - s (and negated
        for -2^-s), where ``enc * 0.25`` was a 2^30-th power of every ciphertext (0.25 at 32 fraction bits)."""
        s = constant_shift_bits(c)
        if 0 < s < DEFAULT_SCALAR_PRECISION_BITS:
            out = pl.EncryptedArray(enc.public_key, enc.ciphertexts.copy(), enc.exponent - s)
            return -out if c < 0 else out
        return super().mul_const(enc, c)

    def mask(self, pub, enc):
        """``enc`` plus a uniform r in Z_n per entry, re-randomised by a fresh Enc(0); returns (masked
        EncryptedArray, :class:`Mask` holding the r to remove after the key holder decrypts).
        """
        n, n2 = pub.n, pub.nsquare
        count = int(enc.size)
        r = [secrets.randbelow(n) for _ in range(count)]
        zeros = pl.encrypt(pub, np.zeros(count)).ciphertexts  # fresh Enc(0): re-randomisation
        flat = enc.ciphertexts.reshape(-1)
        out = np.empty(count, dtype=object)
        for i in range(count):
            # Enc(m) * Enc(0) * (1 + r n) = Enc(m + r mod n)  (g = n + 1)
            out[i] = flat[i] * zeros[i] % n2 * (1 + r[i] * n) % n2
        masked = pl.EncryptedArray(pub, out.reshape(enc.shape), enc.exponent)
        return masked, Mask(r, enc.exponent, tuple(enc.shape))

    def decrypt_masked(self, priv, enc, add=None) -> MaskedValues:
        """The key holder's side of masking: the raw residues in Z_n of masked ``enc`` (plus ``add``, float of
        enc's shape, encoded at enc's exponent), never decoded. ValueError on a shape mismatch.
        """
        n = priv.public_key.n
        raw = pl.decrypt_raw(priv, enc)  # parallel CRT decryption, never decoded
        if add is not None:
            add = np.asarray(add, dtype=np.float64)
            if add.shape != tuple(enc.shape):
                raise ValueError(f"decrypt_masked: term of shape {add.shape} for ciphertexts {enc.shape}")
            t = encode_mantissas(add, -enc.exponent, n)
            raw = [(a + b) % n for a, b in zip(raw, t)]
        return MaskedValues(priv.public_key.fingerprint, tuple(enc.shape), enc.exponent, raw)

    def unmask(self, pub, masked: MaskedValues, mask: Mask) -> np.ndarray:
        """The float64 values (mask's shape) of ``masked`` minus the mask's r mod n, read as signed (|v| < n/3).
        Raises CiphertextError when ``masked`` does not answer ``mask`` (count or exponent), DecryptedRangeError
        outside the range.
        """
        n = pub.n
        if masked.exponent != mask.exponent or len(masked.values) != len(mask.r):
            raise CiphertextError(f"masked values do not match the ciphertexts this party sent: received "
                                  f"{len(masked.values)} values at exponent {masked.exponent}, sent "
                                  f"{len(mask.r)} at exponent {mask.exponent}")
        out = np.empty(len(mask.r), dtype=np.float64)
        limit = n // 3
        for i, (v, r) in enumerate(zip(masked.values, mask.r)):
            m = (v - r) % n
            if m > n // 2:
                m -= n
            if abs(m) > limit:
                raise CiphertextError("unmasked value overflowed the fixed-point range (a peer added garbage?)")
            out[i] = ldexp_int(m, masked.exponent)
        return out.reshape(mask.shape)

    def pair_sums(self, key, precision_bits: int, log2_bound: int, n_rows: int) -> PairSums:
        """A :class:`PaillierPairSums` for one tree (GH-packed, compressed sums)."""
        return PaillierPairSums(key, precision_bits, log2_bound, n_rows)


def _dots_task(precision_bits: int, n: int, scheme: str, Xs: list, rows: list, exponent: int) -> list:
    """Worker-pool entry: ciphertext lists of dot(X_i, row_i) (see :func:`_parallel_dots`)."""
    if scheme == "ou":  # ciphertexts mod n: only the modulus is needed for the arithmetic
        pub = ou.arith_key(n)
    else:
        pub = pl.PublicKey(n, insecure_test_key=True)  # only used for arithmetic, size already checked
    out = []
    for X, cts in zip(Xs, rows):
        enc = pl.EncryptedArray(pub, np.asarray(cts, dtype=object), exponent)
        out.append(list(pl.dot(X, enc, precision_bits=precision_bits).ciphertexts))
    return out


def _parallel_dots(precision_bits: int, Xs: list, vecs: list) -> list:
    """dot(X_i, vec_i) for every i, spread over the Paillier worker pool when it pays off."""
    work = sum(X.size for X in Xs)
    parts = _ex.parallel_chunks(len(vecs), 8) if work >= 4000 else 1
    if parts <= 1:
        return [pl.dot(X, v, precision_bits=precision_bits) for X, v in zip(Xs, vecs)]
    pub, e = vecs[0].public_key, vecs[0].exponent
    bounds = [len(vecs) * i // parts for i in range(parts + 1)]
    chunks = [(Xs[bounds[i]:bounds[i + 1]], [list(v.ciphertexts) for v in vecs[bounds[i]:bounds[i + 1]]], e)
              for i in range(parts)]
    res = _ex.run(_dots_task, (precision_bits, int(pub.n), getattr(pub, "scheme", "paillier")), chunks)
    e_out = e - precision_bits
    return [pl.EncryptedArray(pub, np.asarray(c, dtype=object), e_out) for r in res for c in r]


def gh_packing(key_bits: int, precision_bits: int, log2_bound: int, n_rows: int) -> pl.PackingSpec:
    """(g, h) in two slots of one plaintext, sized so that n_rows values summed cannot overflow.

    GH packing of SecureBoost+ (Chen et al. 2021, arXiv 2110.10927: one ciphertext per row
    instead of two).
    """
    return pl.PackingSpec.create(key_bits, precision_bits=precision_bits, value_bound=float(2 ** log2_bound),
                                 n_summands=max(1, n_rows), slots=2)


def compressed_packing(spec: pl.PackingSpec, key_bits: int) -> tuple[pl.PackingSpec, int]:
    """Spec of a compressed ciphertext (2k slots) and k = candidates per ciphertext.

    Ciphertext compression of SecureBoost+ (Chen et al. 2021, arXiv 2110.10927): k packed (g, h)
    sums shifted into one plaintext, so the host sends ~k times fewer ciphertexts.
    """
    k = max(1, (key_bits - 2) // (2 * spec.slot_bits))
    return pl.PackingSpec(2 * k, spec.slot_bits, spec.precision_bits, spec.slot_bound), k


class PaillierPairSums(PairSums):
    """GH packing (two slots per row ciphertext), histograms on raw gmpy2 integers, cipher compression.

    ``spec``: the row ciphertexts' packing; ``cspec``: that of a compressed element (``per`` candidates).
    """

    def __init__(self, pub, precision_bits: int, log2_bound: int, n_rows: int):
        self.pub, self.n_rows = pub, n_rows
        self.spec = gh_packing(pub.n_bits, precision_bits, log2_bound, n_rows)
        self.cspec, self.per = compressed_packing(self.spec, pub.n_bits)
        self.n2 = pub.nsquare
        self.compress_seconds = 0.0

    def encrypt(self, key, gq, hq):
        """The row pairs as ciphertexts of two slots each (see :meth:`PairSums.encrypt`)."""
        p = self.spec.precision_bits
        return pl.encrypt_packed(key, np.stack([np.ldexp(gq.astype(np.float64), -p),
                                                np.ldexp(hq.astype(np.float64), -p)], axis=1), self.spec)

    def histogram(self, rows_data, rows, bins, n_bins):
        """Per feature the per-bin ciphertext sums of ``rows`` (:func:`~.paillier_hist.build_node`)."""
        return ph.build_node(rows_data, rows, bins, n_bins, self.n2)

    def histograms(self, rows_data, rows_list, bins, n_bins):
        """:meth:`histogram` of every node of a level in one batch (:func:`~.paillier_hist.build_nodes`)."""
        return ph.build_nodes(rows_data, rows_list, bins, n_bins, self.n2)

    def release(self, rows_data):
        """Tell the workers to drop this tree's row ciphertexts."""
        ph.release(rows_data)

    def select(self, hist, cands):
        """Cumulative sums of the candidates, ``per`` compressed into each ciphertext (see :meth:`PairSums.select`);
        the time spent is added to ``compress_seconds``.
        """
        cum = ph.cumulative(hist, self.n2)
        tc = time.perf_counter()
        out = ph.compress([cum[j][b] for j, b in cands], self.per, 2 * self.spec.slot_bits, self.n2)
        self.compress_seconds += time.perf_counter() - tc
        return out

    def select_level(self, items):
        """:meth:`select` of every node of a level in one parallel compression call."""
        lists = []
        for hist, cands in items:
            cum = ph.cumulative(hist, self.n2)
            lists.append([cum[j][b] for j, b in cands])
        tc = time.perf_counter()
        out = ph.compress_many(lists, self.per, 2 * self.spec.slot_bits, self.n2)
        self.compress_seconds += time.perf_counter() - tc
        return out

    def collect(self, elements):
        """The compressed elements as one EncryptedArray with the compressed packing ``cspec``."""
        arr = np.empty(len(elements), dtype=object)
        arr[:] = elements
        return pl.EncryptedArray(self.pub, arr, self.cspec.exponent, self.cspec, self.n_rows)

    def decrypt(self, priv, value, counts):
        """Decrypt and unpack to float64 (sum(counts), 2), dropping each node's padding slots (see
        :meth:`PairSums.decrypt`).
        """
        n_ct = self.n_elements(counts)
        dec = pl.decrypt(priv, value).reshape(n_ct * self.per, 2) if n_ct else np.zeros((0, 2))
        parts, off = [], 0
        for c in counts:
            parts.append(dec[off:off + c])
            off += -(-c // self.per) * self.per
        return np.concatenate(parts) if parts else np.zeros((0, 2))


# --------------------------------------------------------------------------------------- OU
OU_HIDE_BITS = 40


def ou_mask_bits(pub: ou.OUPublicKey) -> int:
    """R: masks are uniform in [2^(R-1), 2^R)."""
    return pub.plain_bits - 2


class OUHE(PaillierHE):
    """The OU backend of :class:`HEBackend` (``he_scheme: ou``): Okamoto-Uchiyama.

    Same interface, messages and rounds as :class:`PaillierHE`; the scheme is
    :mod:`secureflhv.crypto.homomorphic.ou` (keys from SecretFlow HEU, 2048 bits by default, ~112-bit security).
    Ciphertexts are :class:`~secureflhv.crypto.homomorphic.paillier.EncryptedArray` under an
    :class:`~secureflhv.crypto.homomorphic.ou.OUPublicKey`, so sums, plaintext products, ``dot`` and the matrix
    products are the Paillier backend's code with modulus n (and the worker pool likewise).

    Masking before decryption differs: OU's plaintext space Z_p has a *secret* order p, so the sender
    cannot draw a one-time pad uniform mod p. It draws r uniformly from [2^(R-1), 2^R) with
    ``R = plain_bits - 2`` (678+ bits at 2048-bit keys) and sends ``[[m + r]]`` re-randomised (r is
    encrypted with fresh randomness). The key holder learns the integer m + r (+ its own term t): for
    |m| < 2^(R-1-OU_HIDE_BITS) its distribution is within statistical distance 2^-OU_HIDE_BITS
    (OU_HIDE_BITS = 40) of one that does not depend on m — statistical hiding, where Paillier's pad is
    perfect. The sender checks that bound when it removes r (a larger |m| raises CiphertextError
    instead of silently weakening the mask); vertical values are far smaller (|m| < 2^200 or so).
    Vertical SecureBoost's packed pair sums: :class:`OUPairSums`.
    """

    name = "ou"

    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        """An OU key pair of ``n_bits`` (:func:`secureflhv.crypto.homomorphic.ou.generate_keypair`); the workers
        start meanwhile. ValueError below the secure minimum unless ``insecure_test_key``.
        """
        _ex.start()
        return ou.generate_keypair(n_bits, insecure_test_key=insecure_test_key)

    def encrypt(self, key, x):
        """``x`` (float64, any shape) encrypted under OU at ``precision_bits`` fraction bits."""
        return ou.encrypt(key, np.asarray(x, dtype=np.float64), self.precision_bits)

    def decrypt(self, priv, enc) -> np.ndarray:
        """The float64 values of ``enc``; DecryptedRangeError outside the plaintext bound."""
        return ou.decrypt(priv, enc)

    def mask(self, pub, enc):
        """``enc`` plus a random r of :func:`ou_mask_bits` bits (top bit set) per entry, added as a fresh
        Enc(r), which also re-randomises it; returns (masked EncryptedArray, :class:`Mask` of the r).
        """
        R, n = ou_mask_bits(pub), pub._n
        count = int(enc.size)
        r = [(1 << (R - 1)) | secrets.randbits(R - 1) for _ in range(count)]
        enc_r = ou.encrypt_ints(pub, r)  # fresh H^r': re-randomises the product
        flat = enc.ciphertexts.reshape(-1).tolist()
        out = np.empty(count, dtype=object)
        out[:] = [c * e % n for c, e in zip(flat, enc_r)]
        return pl.EncryptedArray(pub, out.reshape(enc.shape), enc.exponent), Mask(r, enc.exponent, tuple(enc.shape))

    def decrypt_masked(self, priv, enc, add=None) -> MaskedValues:
        """The key holder's side: the signed plaintexts of masked ``enc`` (plus ``add`` encoded at enc's
        exponent), never decoded. ValueError on a shape mismatch.
        """
        pub = priv.public_key
        raw = ou.decrypt_signed(priv, enc)
        if add is not None:
            add = np.asarray(add, dtype=np.float64)
            if add.shape != tuple(enc.shape):
                raise ValueError(f"decrypt_masked: term of shape {add.shape} for ciphertexts {enc.shape}")
            t = encode_mantissas(add, -enc.exponent, 3 * (1 << (ou_mask_bits(pub) - 1 - OU_HIDE_BITS)))
            raw = [a + b for a, b in zip(raw, t)]
        top = 1 << (ou_mask_bits(pub) + 1)
        if any(not 0 <= v < top for v in raw):
            raise CiphertextError("masked OU value outside the mask range: the sender's values overflowed "
                                  "(or were not masked)")
        return MaskedValues(pub.fingerprint, tuple(enc.shape), enc.exponent, raw)

    def unmask(self, pub, masked: MaskedValues, mask: Mask) -> np.ndarray:
        """The float64 values of ``masked`` minus the mask's r. Raises CiphertextError when ``masked`` does not
        answer ``mask``, DecryptedRangeError when a value leaves the range the masking hides.
        """
        if masked.exponent != mask.exponent or len(masked.values) != len(mask.r):
            raise CiphertextError(f"masked values do not match the ciphertexts this party sent: received "
                                  f"{len(masked.values)} values at exponent {masked.exponent}, sent "
                                  f"{len(mask.r)} at exponent {mask.exponent}")
        limit = 1 << (ou_mask_bits(pub) - 1 - OU_HIDE_BITS)
        out = np.empty(len(mask.r), dtype=np.float64)
        for i, (v, r) in enumerate(zip(masked.values, mask.r)):
            m = int(v) - r
            if abs(m) >= limit:
                raise CiphertextError("unmasked OU value outside the statistically hidden range "
                                      "(a peer added garbage, or the values overflowed)")
            out[i] = ldexp_int(m, masked.exponent)
        return out.reshape(mask.shape)

    def pair_sums(self, key, precision_bits: int, log2_bound: int, n_rows: int) -> PairSums:
        """An :class:`OUPairSums` for one tree."""
        return OUPairSums(key, precision_bits, log2_bound, n_rows)


class OUPairSums(PaillierPairSums):
    """:class:`PaillierPairSums` under OU: the same GH packing, histograms and compression
    (modulus n), with slots sized to OU's plaintext space (``plain_bits`` instead of the key size), so
    fewer candidates share a compressed ciphertext (``per``)."""

    def __init__(self, pub, precision_bits: int, log2_bound: int, n_rows: int):
        self.pub, self.n_rows = pub, n_rows
        bits = pub.plain_bits + 2  # PackingSpec keeps slots * slot_bits <= key_bits - 2 = plain_bits
        self.spec = gh_packing(bits, precision_bits, log2_bound, n_rows)
        self.cspec, self.per = compressed_packing(self.spec, bits)
        self.n2 = pub.nsquare
        self.compress_seconds = 0.0

    def encrypt(self, key, gq, hq):
        """The row pairs packed two to a plaintext and encrypted by the key holder's CRT path; ValueError for a
        key other than this table's.
        """
        p = self.spec.precision_bits
        packed = pl.pack(np.stack([np.ldexp(gq.astype(np.float64), -p), np.ldexp(hq.astype(np.float64), -p)],
                                  axis=1), self.spec)
        if (key.public_key if isinstance(key, ou.OUPrivateKey) else key) != self.pub:
            raise ValueError("OUPairSums.encrypt: a key other than this table's public key")
        cts = ou.encrypt_ints(key, packed.reshape(-1).tolist())  # the key holder's by the CRT
        return pl.EncryptedArray(self.pub, np.fromiter(cts, dtype=object, count=len(cts)), self.spec.exponent,
                                 self.spec, 1)

    def decrypt(self, priv, value, counts):
        """Decrypt (signed) and unpack to float64 (sum(counts), 2); DecryptedRangeError outside the plaintext bound."""
        n_ct = self.n_elements(counts)
        if not n_ct:
            return np.zeros((0, 2))
        signed = ou.decrypt_signed(priv, value)
        limit = priv.public_key.max_int
        if max(abs(v) for v in signed) >= limit:
            raise pl.DecryptedRangeError("decrypted OU histogram sum out of the encodable range")
        packed = np.empty(len(signed), dtype=object)
        packed[:] = signed
        dec = pl.unpack(packed, value.packing, value.summands).reshape(n_ct * self.per, 2)
        parts, off = [], 0
        for c in counts:
            parts.append(dec[off:off + c])
            off += -(-c // self.per) * self.per
        return np.concatenate(parts) if parts else np.zeros((0, 2))


# --------------------------------------------------------------------------------------- identity
class IdentityHE(HEBackend):
    """Encryption replaced by identity: "ciphertexts" are float64 arrays. NO SECURITY — benchmarks only.

    Same interface as :class:`PaillierHE`; masks are zero, so the algorithm's arithmetic is the
    plaintext arithmetic and the difference in time is what Paillier costs.
    """

    name = "identity"

    def __init__(self, precision_bits: int | None = None, dot_precision_bits: int = VERTICAL_DOT_PRECISION_BITS):
        super().__init__(precision_bits, dot_precision_bits)
        log.warning("IdentityHE: encryption replaced by identity, no security (benchmark baseline only)")

    def generate_keypair(self, n_bits: int, insecure_test_key: bool):
        """One :class:`IdentityKey` as both halves (no encryption: benchmarks only)."""
        key = IdentityKey()
        return key, key

    def encrypt(self, key, x):
        """``x`` as a float64 copy."""
        return np.array(x, dtype=np.float64)

    def decrypt(self, priv, enc):
        """``enc`` as a float64 copy."""
        return np.array(enc, dtype=np.float64)

    def dot(self, X, enc):
        """``X^T · enc`` in float64."""
        return np.asarray(X, dtype=np.float64).T @ enc

    def matmul(self, enc, W):
        """``enc · W``."""
        return enc @ W

    def t_matmul(self, enc, D):
        """``enc^T · D``."""
        return enc.T @ D

    def matmul_t(self, D, enc):
        """``D · enc^T``."""
        return D @ enc.T

    def add(self, enc, x):
        """``enc + x``."""
        return enc + x

    def mask(self, pub, enc):
        """``enc`` unchanged and an empty :class:`Mask` (nothing is hidden)."""
        return np.array(enc, dtype=np.float64), Mask([], 0, tuple(np.shape(enc)))

    def decrypt_masked(self, priv, enc, add=None) -> MaskedValues:
        """``enc`` (+ ``add``) as float64 :class:`MaskedValues` at exponent 0."""
        a = np.asarray(enc if add is None else enc + add, dtype=np.float64)
        return MaskedValues(priv.fingerprint, a.shape, 0, a)

    def unmask(self, pub, masked: MaskedValues, mask: Mask) -> np.ndarray:
        """The masked values as float64 of their shape."""
        return np.array(masked.values, dtype=np.float64).reshape(masked.shape)

    def pair_sums(self, key, precision_bits: int, log2_bound: int, n_rows: int) -> PairSums:
        """A :class:`PlainPairSums` (integer sums in the clear)."""
        return PlainPairSums(precision_bits)


class PlainPairSums(PairSums):
    """Identity pair sums: int64 mantissa sums, no packing, no compression."""

    def __init__(self, precision_bits: int):
        self.precision_bits = precision_bits

    def encrypt(self, key, gq, hq):
        """``(gq, hq)`` unchanged."""
        return gq, hq

    def histogram(self, rows_data, rows, bins, n_bins):
        """int64 (2, d, max bins) sums of the g and h mantissas."""
        g, h = rows_data
        B = max(n_bins)
        out = np.zeros((2, bins.shape[1], B), dtype=np.int64)
        for j in range(bins.shape[1]):
            b = bins[rows, j]
            out[0, j] = np.bincount(b, g[rows].astype(np.float64), B).astype(np.int64)
            out[1, j] = np.bincount(b, h[rows].astype(np.float64), B).astype(np.int64)
        return out

    def select(self, hist, cands):
        """Per candidate (feature j, bin b) the cumulative [G, H] mantissa sums up to bin b."""
        cum = np.cumsum(hist, axis=2)
        return [cum[:, j, b].tolist() for j, b in cands]

    def collect(self, elements):
        """The elements as int64 (len(elements), 2)."""
        return np.asarray(elements, dtype=np.int64).reshape(-1, 2)

    def decrypt(self, priv, value, counts):
        """The mantissa sums scaled by 2**-precision_bits, float64 (sum(counts), 2)."""
        return np.ldexp(np.asarray(value, dtype=np.float64), -self.precision_bits)


BACKENDS = {"paillier": PaillierHE, "ou": OUHE, "identity": IdentityHE}


def make_backend(backend=None, precision_bits: int | None = None,
                 dot_precision_bits: int = VERTICAL_DOT_PRECISION_BITS) -> HEBackend:
    """An :class:`HEBackend` from a name ("paillier", "ou", "identity"), an instance or None (Paillier).

    An :class:`HEBackend` instance is used as given: its own ``precision_bits`` and
    ``dot_precision_bits`` apply and the arguments here are ignored. Raises ValueError for an
    unknown name.
    """
    if isinstance(backend, HEBackend):
        return backend
    name = "paillier" if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"backend: one of {sorted(BACKENDS)}, got {backend!r}")
    return BACKENDS[name](precision_bits, dot_precision_bits)
