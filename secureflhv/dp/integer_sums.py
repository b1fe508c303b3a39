"""Distributed Skellam noise on sums of exact integer vectors (record-level DP of federated statistics).

Some jobs sum vectors that are already integers through secure aggregation, exactly: federated preprocessing's
counts and moments (:mod:`secureflhv.fedstats.statistics`) and horizontal SecureBoost's histograms. Nothing is
clipped, rotated or rounded there; each client adds its share of integer Skellam noise to its integer vector
before masking, so the unmasked sum is the pooled integers plus Skellam noise and nobody (the server included)
sees an un-noised sum. The mechanism is Agarwal, Kairouz and Liu's ("The Skellam Mechanism for Differentially
Private Federated Learning", NeurIPS 2021, arXiv:2110.04995, Sec. 3, Thm. 3.5) without their quantisation step;
the dropout-robust split of the noise is the one of :mod:`secureflhv.horizontal.dp_distributed`.

Terms:

* a **release** (:class:`SumRelease`) is one noised sum (or one block of coordinates of a sum that gets its own
  noise level), with its L2 and L1 sensitivity in integer units: how far the pooled integers can move when ONE
  RECORD (row) is added or removed. The caller states the sensitivity argument for its vectors;
* the **plan** (:class:`SumNoisePlan`) fixes one noise multiplier z for the job: release r's summed noise has
  per-coordinate variance mu_r = (z Δ2_r)^2 (so each release's Gaussian-like RDP term is α / (2 z^2)). z is given,
  or calibrated (:meth:`SumNoisePlan.calibrate`) so that the job's planned releases spend a target ε at δ;
* each client adds Skellam of variance mu_r / (t - c) (:meth:`SumNoisePlan.share`): t the secure-aggregation
  threshold of the round (the fewest survivors the server can unmask), c the colluding clients tolerated, who
  know their own noise. Any surviving set allowed carries at least mu_r from honest clients;
* :class:`SumAccountant` composes the releases (RDP adds, Mironov, CSF 2017, Prop. 1), each at the variance its
  honest survivors carried, (survivors - c) mu_r / (t - c) >= mu_r, and converts with
  ``dp_accounting.rdp.compute_epsilon`` (Canonne, Kamath, Steinke, arXiv:2004.00010, Prop. 12).

Adaptive composition: a later release may depend on earlier noised outputs (its sensitivity too: e.g. moments
quantised on a grid chosen from a noised row count); RDP composition holds for adaptively chosen mechanisms, so
each release is accounted at the sensitivity it actually had. Units: sensitivities and variances are in the
summed integers' units (and their squares); ε in nats. The noise comes from OS entropy (``rng`` only for tests).
No transport here (dp layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .accounting import SKELLAM_ORDERS, library, skellam_rdp
from .calibration import MAX_POISSON_MEAN
from .mechanisms import skellam_noise

__all__ = ["SumAccountant", "SumNoisePlan", "SumRelease", "job_epsilon"]

_Z_BRACKET = (1e-3, 1e6)  # noise multipliers searched by calibrate (ε is monotone decreasing in z)


@dataclass(frozen=True)
class SumRelease:
    """One noised sum (or one block of a sum's coordinates with its own noise level).

    Attributes:
        name: names the release in records and errors (e.g. "counts", "sum_q").
        dim: its number of coordinates.
        l2_sensitivity: Δ2 > 0, the largest L2 change of the pooled integers when one record is added or removed.
        l1_sensitivity: Δ1, the same in L1; Δ2 <= Δ1 <= sqrt(dim) Δ2 (true of every vector: a larger value is cut
            to sqrt(dim) Δ2).

    Raises:
        ValueError: dim < 1, Δ2 not positive and finite, Δ1 < Δ2.
    """

    name: str
    dim: int
    l2_sensitivity: float
    l1_sensitivity: float

    def __post_init__(self):
        if int(self.dim) < 1 or not (0 < self.l2_sensitivity < math.inf):
            raise ValueError(f"release {self.name!r}: need dim >= 1 and a positive finite l2_sensitivity, got "
                             f"{self.dim}, {self.l2_sensitivity}")
        if not self.l1_sensitivity >= self.l2_sensitivity * (1 - 1e-12):
            raise ValueError(f"release {self.name!r}: l1_sensitivity {self.l1_sensitivity} < l2_sensitivity "
                             f"{self.l2_sensitivity}")
        object.__setattr__(self, "l1_sensitivity",
                           float(min(self.l1_sensitivity, math.sqrt(self.dim) * self.l2_sensitivity)))


def job_epsilon(entries: Sequence[tuple[float, float, float]], delta: float,
                orders: Sequence[int] = SKELLAM_ORDERS) -> float:
    """ε (nats) at ``delta`` of releases composed: ``entries`` are (variance, Δ2, Δ1) per release, each the
    per-coordinate variance of its summed noise (integer units squared). 0.0 for no release."""
    if not entries:
        return 0.0
    rdp = sum(skellam_rdp(v, l2, l1, orders) for v, l2, l1 in entries)
    return float(library().rdp.compute_epsilon(list(orders), rdp, delta)[0])


@dataclass(frozen=True)
class SumNoisePlan:
    """The job's noise: one multiplier z for every release (module docstring).

    Attributes:
        noise_multiplier: z > 0; release r's summed noise has variance (z Δ2_r)^2 per coordinate.
        delta: δ of the reported (ε, δ).
        releases: the releases the job plans (what :meth:`planned_epsilon` composes); a release made later may
            have other sensitivities (adaptive composition) and is accounted at those.
    """

    noise_multiplier: float
    delta: float
    releases: tuple[SumRelease, ...] = field(default=())

    def __post_init__(self):
        if not (0 < self.noise_multiplier < math.inf) or not 0 < self.delta < 1:
            raise ValueError(f"need noise_multiplier > 0 and 0 < delta < 1, got {self.noise_multiplier}, "
                             f"{self.delta}")

    @classmethod
    def calibrate(cls, releases: Sequence[SumRelease], delta: float, *, epsilon: float | None = None,
                  noise_multiplier: float | None = None, rtol: float = 1e-6) -> "SumNoisePlan":
        """The plan for ``releases``: the given ``noise_multiplier``, or the smallest z (to ``rtol`` relative,
        bisection in log z) whose releases compose to at most ``epsilon`` at ``delta``.

        Raises:
            ValueError: not exactly one of epsilon / noise_multiplier, no releases, epsilon not positive, or a
                target not met within z <= 1e6 or already met at z = 1e-3.
        """
        releases = tuple(releases)
        if (epsilon is None) == (noise_multiplier is None) or not releases:
            raise ValueError("give one of epsilon / noise_multiplier, and at least one release")
        if noise_multiplier is not None:
            return cls(float(noise_multiplier), delta, releases)
        if not (0 < epsilon < math.inf):
            raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
        lo, hi = _Z_BRACKET

        def eps(z: float) -> float:
            return cls(z, delta, releases).planned_epsilon()

        if eps(hi) > epsilon or eps(lo) <= epsilon:
            raise ValueError(f"epsilon={epsilon} at delta={delta} over {len(releases)} releases needs a noise "
                             f"multiplier outside [{lo}, {hi}]")
        while hi / lo - 1 > rtol:  # ε(lo) > target >= ε(hi)
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
        return cls(hi, delta, releases)

    def variance(self, release: SumRelease) -> float:
        """mu_r = (z Δ2_r)^2: the least per-coordinate variance the release's sum carries (integer units^2)."""
        return (self.noise_multiplier * release.l2_sensitivity) ** 2

    def share(self, release: SumRelease, honest_min: int) -> float:
        """A client's noise variance: mu_r / (t - c), ``honest_min`` = t - c >= 1. ValueError below 1, or when
        a Poisson mean would pass :data:`~secureflhv.dp.calibration.MAX_POISSON_MEAN` (numpy's sampler drifts)."""
        if int(honest_min) < 1:
            raise ValueError(f"t - c must be at least 1, got {honest_min}: the threshold leaves no honest survivor")
        v = self.variance(release) / int(honest_min)
        if v / 2 > MAX_POISSON_MEAN:
            raise ValueError(f"release {release.name!r}: a client's noise variance {v:.3g} passes the sampler's "
                             f"limit 2^41: lower the sensitivity or the noise multiplier")
        return v

    def noise(self, release: SumRelease, honest_min: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """A client's Skellam share for ``release``: int64 (dim,), variance :meth:`share` per coordinate, from
        OS entropy (``rng``: a seeded generator, tests only)."""
        return skellam_noise(self.share(release, honest_min), int(release.dim), rng, secure=rng is None)

    def honest_variance(self, release: SumRelease, survivors: int, honest_min: int, colluders: int) -> float:
        """What the honest survivors' shares carry at least: (survivors - c) mu_r / (t - c) (>= mu_r when
        survivors >= t)."""
        return max(int(survivors) - int(colluders), 0) * self.share(release, honest_min)

    def noise_bound(self, release: SumRelease, participants: int, honest_min: int, sigmas: float = 10.0) -> float:
        """``sigmas`` standard deviations of the most noise one coordinate of the sum can carry (every
        participant surviving, V = participants * share): |noise| exceeds it with chance at most
        2 skellam_tail(sigmas sqrt(V), V) (:func:`~secureflhv.dp.mechanisms.skellam_tail`; ~e^-50 at 10)."""
        return sigmas * math.sqrt(int(participants) * self.share(release, honest_min))

    def planned_epsilon(self) -> float:
        """ε at ``delta`` of the planned releases, each at its nominal variance mu_r."""
        return job_epsilon([(self.variance(r), r.l2_sensitivity, r.l1_sensitivity) for r in self.releases],
                           self.delta)


class SumAccountant:
    """Record-level (ε, δ) of a job's noised sums, each at the variance its honest survivors carried.

    ``step`` records one release; ε composes every recorded release by the Skellam RDP bound
    (:func:`~secureflhv.dp.accounting.skellam_rdp`; Agarwal et al. 2021, Thm. 3.5). Neighbouring relation: add or
    remove one record. No amplification by sampling is claimed.
    """

    def __init__(self, plan: SumNoisePlan):
        self.plan = plan
        self.entries: list[tuple[SumRelease, float]] = []

    def step(self, release: SumRelease, variance: float) -> None:
        """Record ``release`` whose summed noise carried ``variance`` per coordinate from honest clients.
        ValueError when it is below the plan's mu_r (the release carried less noise than calibrated)."""
        nominal = self.plan.variance(release)
        if not variance >= nominal * (1 - 1e-12):
            raise ValueError(f"release {release.name!r} carried variance {variance:.6g} < the planned "
                             f"{nominal:.6g}: fewer honest survivors than the threshold allows")
        self.entries.append((release, float(variance)))

    def epsilon(self) -> float:
        """ε (nats) at the plan's δ of the recorded releases."""
        return job_epsilon([(v, r.l2_sensitivity, r.l1_sensitivity) for r, v in self.entries], self.plan.delta)

    def record(self) -> dict:
        """JSON-ready: mechanism, unit, noise_multiplier, per release (name, dim, sensitivities, nominal and
        accounted variance), epsilon, planned_epsilon, delta, accountant."""
        return {"mechanism": "skellam", "unit": "record", "placement": "distributed",
                "noise_multiplier": self.plan.noise_multiplier,
                "releases": [{"name": r.name, "dim": r.dim, "l2_sensitivity": r.l2_sensitivity,
                              "l1_sensitivity": r.l1_sensitivity, "variance": self.plan.variance(r),
                              "variance_accounted": v} for r, v in self.entries],
                "epsilon": self.epsilon(), "planned_epsilon": self.plan.planned_epsilon(),
                "delta": self.plan.delta, "accountant": "rdp"}
