"""Fixed-point quantisation of weighted updates into the ring Z_{2^k} for secure aggregation.

A client holding ``x`` (float, (d,)) and a weight ``w`` (e.g. its sample count) sends
``q = SR(w * clip(x, -c, c) * scale)`` together with ``SR(w * scale)`` and its clipped-coordinate
count, all as residues mod 2^k (two's complement for negatives). ``SR`` is stochastic rounding
(unbiased: E[SR(v)] = v), driven by a seeded numpy generator so that a given seed reproduces the
rounding exactly (tests compare secure aggregation with ``plain_quantised`` bit for bit).

Choice of k (Bonawitz et al. CCS 2017, Sec. 3 and 6: inputs live in Z_R with R large enough that the
sum does not overflow): every coordinate of every client satisfies |q| <= B = ceil(W * max(c, 1) * scale) + 1,
where W is the largest allowed weight; the clipped count is <= d. The sum over n clients is in
(-n*B, n*B), so k = bit_length(max(n*B, n*d)) + 1 sign bit guarantees no wrap, and the signed
residue of the sum mod 2^k is the integer sum. k is capped at 62 so words fit numpy uint64 with room.

Units: ``scale`` is a float (2**precision_bits); ``clip`` is in the units of x.
"""
from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("secureflhv.crypto.quantise")

MAX_K_BITS = 62
EXTRA_COORDS = 2  # appended to the vector: quantised weight, clipped-coordinate count


@dataclass(frozen=True)
class QuantParams:
    """Quantisation parameters of one aggregation round (identical at every party).

    Attributes:
        clip: values of x are clipped to [-clip, clip].
        scale: fixed-point scale (2**precision_bits).
        max_weight: largest weight a client may use.
        k_bits: ring Z_{2^k}.
    """

    clip: float
    scale: float
    max_weight: float
    k_bits: int

    @property
    def modulus_mask(self) -> np.uint64:
        """``2**k_bits - 1`` as uint64: reduces a uint64 sum mod 2**k_bits."""
        return np.uint64((1 << self.k_bits) - 1)

    @property
    def word_dtype(self) -> np.dtype:
        """The smallest machine word holding k bits: uint16 (k <= 16), uint32 (k <= 32), else uint64. Masking
        and summing wrap mod 2^16 / 2^32 / 2^64, which is mod 2^k once reduced, so the bytes on the wire
        follow k (distributed DP's 16-bit ring sends 2 bytes a coordinate)."""
        if self.k_bits <= 16:
            return np.dtype("<u2")
        return np.dtype("<u4") if self.k_bits <= 32 else np.dtype("<u8")


def choose_k_bits(n_clients: int, dim: int, clip: float, scale: float, max_weight: float) -> int:
    """Smallest k such that the sum of ``n_clients`` quantised inputs cannot wrap in Z_{2^k}.

    Raises:
        ValueError: parameters non-positive, or k would exceed 62 (lower precision_bits or max_weight).
    """
    if n_clients < 1 or dim < 0:
        raise ValueError(f"n_clients must be >= 1 and dim >= 0, got {n_clients}, {dim}")
    if not (clip > 0 and math.isfinite(clip)) or not scale > 0 or not max_weight > 0:
        raise ValueError(f"clip, scale and max_weight must be positive and finite, got {clip}, {scale}, {max_weight}")
    bound = math.ceil(max_weight * max(clip, 1.0) * scale) + 1
    k = max(n_clients * bound, n_clients * (dim + 1)).bit_length() + 1
    if k > MAX_K_BITS:
        raise ValueError(f"the sum of {n_clients} clients needs k={k} bits > {MAX_K_BITS}: lower precision_bits, "
                         f"clip or max_weight")
    return k


def rounding_rng(seed: int | None, round_id: int, client_id: str) -> np.random.Generator:
    """The stochastic-rounding generator of one client in one round (seeded: reproducible)."""
    cid = int.from_bytes(hashlib.sha256(client_id.encode()).digest()[:8], "little")
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(seed), int(round_id), cid])


def stochastic_round(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Round float64 ``v`` to int64, up with probability frac(v) (unbiased)."""
    fl = np.floor(v)
    up = rng.random(v.shape) < (v - fl)
    return fl.astype(np.int64) + up


def quantise(x: np.ndarray, weight: float, params: QuantParams, rng: np.random.Generator,
             who: str = "client") -> tuple[np.ndarray, int]:
    """Encode ``weight * clip(x)`` (plus the weight and the clipped count) as uint64 residues mod 2^k.

    Args:
        x: (d,) finite floats.
        weight: in [0, max_weight] (0: contributes exact zeros).
    Returns:
        (words (d+2,) uint64 already reduced mod 2^k, number of clipped coordinates).
    Raises:
        ValueError: non-finite x, weight out of range, x not 1-D.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{who}: update must be a 1-D vector, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{who}: update has {int(np.sum(~np.isfinite(x)))} non-finite values")
    if not (0 <= weight <= params.max_weight) or not math.isfinite(weight):
        raise ValueError(f"{who}: weight {weight} outside [0, max_weight={params.max_weight}]")
    n_clipped = int(np.count_nonzero(np.abs(x) > params.clip))
    if n_clipped:
        log.info("%s: clipped %d of %d coordinates to [-%g, %g]", who, n_clipped, x.size, params.clip, params.clip)
    xc = np.clip(x, -params.clip, params.clip)
    q = np.empty(x.size + EXTRA_COORDS, dtype=np.int64)
    q[:-2] = stochastic_round(xc * (weight * params.scale), rng)
    q[-2] = stochastic_round(np.array([weight * params.scale]), rng)[0]
    q[-1] = n_clipped
    words = q.view(np.uint64)  # two's complement == residue mod 2^64
    words &= params.modulus_mask
    return words, n_clipped


def to_signed(words: np.ndarray, k_bits: int) -> np.ndarray:
    """Residues mod 2^k (uint64) -> signed int64 in [-2^(k-1), 2^(k-1))."""
    w = np.asarray(words, dtype=np.uint64) & np.uint64((1 << k_bits) - 1)
    s = w.astype(np.int64)
    s[w >= np.uint64(1 << (k_bits - 1))] -= np.int64(1 << k_bits)
    return s


def dequantise(sum_words: np.ndarray, params: QuantParams) -> tuple[np.ndarray, float, int]:
    """Sum of residues (d+2,) -> (total float64 (d,), total weight, total clipped count)."""
    s = to_signed(sum_words, params.k_bits)
    return s[:-2].astype(np.float64) / params.scale, float(s[-2]) / params.scale, int(s[-1])
