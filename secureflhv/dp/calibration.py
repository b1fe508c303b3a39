"""Choosing the distributed Skellam mechanism's parameters for a ring of k bits per coordinate.

Kairouz, Liu and Steinke (ICML 2021, Sec. 5, "choosing the parameters") and Agarwal, Kairouz and Liu (NeurIPS
2021, Sec. 4) fix the modulus 2^k first and then pick the granularity gamma: a finer gamma (smaller steps) means
less rounding error and a sensitivity closer to clip / gamma, but larger integers, so the signal and the noise
must still fit the ring. :func:`plan_skellam` finds the smallest gamma whose sum fits k bits for every round
size the job allows, with the noise calibrated either to a noise multiplier (the sum's noise standard deviation
in model units is ``noise_multiplier * clip``, as in central DP-FedAvg) or to a target (ε, δ) over the job's
rounds (Skellam RDP, :func:`secureflhv.dp.accounting.skellam_variance_for`).

Units: clip and gamma in model units; variances in integer units squared (model units / gamma).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .accounting import skellam_variance_for
from .mechanisms import BETA, modulus_bits, padded_dim, sensitivity

__all__ = ["SkellamPlan", "plan_skellam"]

# numpy's Poisson sampler (PTRS, float64) drifts from its mean's variance past ~1e13 (0.8% at 1e14, measured with
# 2e6 draws); each client's Poisson(mu_i / 2) stays below this
MAX_POISSON_MEAN = 2.0 ** 40
_BISECTIONS = 60  # halvings of the log-gamma bracket: gamma to within 2^-60 relative of the smallest that fits


@dataclass(frozen=True)
class SkellamPlan:
    """The distributed Skellam mechanism of a job (identical at every party: derived from the job file only).

    Attributes:
        clip: C, the L2 clip of one client's update (model units).
        gamma: model units per integer step.
        k_bits: the ring Z_{2^k} of the secure sum.
        d, d_pad: the model's dimension and the rotated length d' (a power of two).
        variance: mu, the per-coordinate variance the sum must carry at least (integer units): the target noise
            that the fewest honest survivors allowed by the threshold carry.
        l2_sensitivity, l1_sensitivity: of one client's rounded vector (integer units; :func:`sensitivity`).
        beta: the conditional-rounding parameter.
        sigmas: the ring's headroom in standard deviations (:func:`modulus_bits`).
        wrap_probability: the largest union bound on a wrap over the allowed round sizes.
    """

    clip: float
    gamma: float
    k_bits: int
    d: int
    d_pad: int
    variance: float
    l2_sensitivity: float
    l1_sensitivity: float
    beta: float
    sigmas: float
    wrap_probability: float

    @property
    def noise_std(self) -> float:
        """The sum's least noise standard deviation per coordinate, in model units: gamma * sqrt(mu)."""
        return self.gamma * math.sqrt(self.variance)

    @property
    def bits_per_coordinate(self) -> float:
        """Bits on the wire per model coordinate: k * d' / d (the padding's coordinates are sent too)."""
        return self.k_bits * self.d_pad / self.d


def plan_skellam(clip: float, d: int, bits: int, sizes: Sequence[tuple[int, int]], *,
                 noise_multiplier: float | None = None, epsilon: float | None = None, delta: float | None = None,
                 rounds: int | None = None, sigmas: float = 8.0, beta: float = BETA) -> SkellamPlan:
    """The smallest gamma whose encoded sum fits ``bits`` for every round size, and the noise it needs.

    Args:
        clip: C > 0 (model units). d: the model's dimension. bits: k, the ring's bits per coordinate.
        sizes: (n, h) pairs: a round may sum up to n clients of which at least h are honest survivors (the
            secure-aggregation threshold minus the colluders); each client adds variance mu / h, so n of them
            add n mu / h, which the ring must hold.
        noise_multiplier: z: mu = (z C / gamma)^2, the sum's noise std z C in model units; or
        epsilon, delta, rounds: mu from the Skellam RDP bound over ``rounds`` releases (one of the two ways).
        sigmas, beta: as in :func:`modulus_bits`.

    Returns:
        The :class:`SkellamPlan`.

    Raises:
        ValueError: both or neither ways given, an empty ``sizes``, ``bits`` too few for any gamma (the
            message gives the fewest bits that would fit at gamma = clip), or so many that a client's noise
            would need Poisson means past :data:`MAX_POISSON_MEAN`.
    """
    if (noise_multiplier is None) == (epsilon is None):
        raise ValueError("give noise_multiplier, or epsilon with delta and rounds (one of the two)")
    if not sizes or any(h < 1 or n < h for n, h in sizes):
        raise ValueError(f"sizes must be (n, h) pairs with 1 <= h <= n, got {list(sizes)[:4]}")
    d_pad = padded_dim(d)

    def variance(gamma: float) -> float:
        if noise_multiplier is not None:
            return (noise_multiplier * clip / gamma) ** 2
        l1, l2 = sensitivity(clip, gamma, d_pad, beta)
        return skellam_variance_for(epsilon, delta, rounds, l2, l1)

    def needed(gamma: float) -> int:
        mu = variance(gamma)
        return max(modulus_bits(n, clip, gamma, mu / h, d, sigmas, beta).k_bits for n, h in sizes)

    hi = clip  # one integer step per clip norm: the coarsest sensible grid
    if needed(hi) > bits:
        raise ValueError(f"bits: {bits} bits per coordinate cannot hold the sum of up to {max(n for n, _ in sizes)} "
                         f"clients even at gamma = clip (it needs {needed(hi)}): raise bits")
    lo = hi
    while needed(lo) <= bits and lo > clip * 2.0 ** -50:
        hi, lo = lo, lo / 2
    for _ in range(_BISECTIONS):  # needed(lo) > bits >= needed(hi): needed is non-increasing in gamma
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if needed(mid) <= bits else (mid, hi)
        if hi / lo - 1 < 1e-9:
            break
    mu = variance(hi)
    if mu / min(h for _, h in sizes) / 2 > MAX_POISSON_MEAN:
        raise ValueError(f"bits: {bits} bits per coordinate need Poisson means of {mu / min(h for _, h in sizes) / 2:.3g}"
                         f" per client, past the {MAX_POISSON_MEAN:.3g} where numpy's sampler is exact to float "
                         f"precision: lower bits")
    l1, l2 = sensitivity(clip, hi, d_pad, beta)
    wrap = max(modulus_bits(n, clip, hi, mu / h, d, sigmas, beta).wrap_probability for n, h in sizes)
    return SkellamPlan(clip, hi, bits, d, d_pad, mu, l2, l1, beta, sigmas, wrap)
