"""Record-level differential privacy of horizontal SecureBoost: distributed Skellam noise on every sum it releases.

Horizontal SecureBoost (:mod:`secureflhv.tree.horizontal`) sums exact integer vectors through secure aggregation.
With ``dp`` (:class:`TreeDPParams`) every client adds its share of integer Skellam noise
(:mod:`secureflhv.dp.integer_sums`; Agarwal, Kairouz, Liu, NeurIPS 2021, Thm. 3.5) to each vector before masking,
so the server and every client see only noised sums; the trees, cuts, base margin and validation losses are
post-processing of them. Unit: ONE RECORD, a row of one client added or removed.

Sensitivities (integer units; the argument for each):

* binning, one release of [grid counts per feature | missing count per feature | row count | label]. A row adds,
  per feature, exactly one 1: to the grid cell of its value or to the feature's missing count (d ones); 1 to the
  row count; its label y in {0, 1} to the label sum (binary; multiclass sends 0 there, its base margin is 0).
  Δ2 = sqrt(d + 1 + b), Δ1 = d + 1 + b, b = 1 for binary, 0 for multiclass.
* each level of each tree, one release of the requested nodes' [g | h | count] by (virtual column, bin). A row is
  in exactly one node (or in a derived node, absent from the vector) and, in each of the V virtual columns, in
  exactly one bin: it adds gq = round(g 2^p) to one g cell, hq = round(h 2^q) to one h cell and S to one count
  cell per column. The gradient bounds come from the OBJECTIVE (binary logistic: |g| <= 1, h <= 1/4; softmax:
  |g_k| <= 1, h_k = 2 p_k (1 - p_k) <= 1/2), or from ``gradient_clip`` (the clients clip g to it), never from
  the clients' hsb.bound. With G = ceil(B_g 2^p), H = ceil(B_h 2^q), S: Δ2 = sqrt(V (G^2 + H^2 + S^2)),
  Δ1 = V (G + H + S). q = p + floor(log2(B_g / B_h)) and S = 2^(p + floor(log2 B_g)) balance the noise: each of
  g, h and the count carries noise of about the same std relative to one row's largest contribution.
* each validation round (when the job has validation rows), one release of [Σ_rows round(2^8 l / L), 2^8 n_val]
  with l a row's loss clipped to [0, L] (:data:`LOSS_BOUND` nats): Δ2 = 2^8 sqrt(2), Δ1 = 2^9.

The precision p is fixed for the job from public values only (:func:`dp_precision_bits`: the noise multiplier,
d, t - c and the bounds), so every sensitivity is known in advance; V (d <= V <= 2d) follows from the noised
binning (adaptive composition: each release is accounted at the V it had).

Plan (:class:`~secureflhv.dp.integer_sums.SumNoisePlan`): one noise multiplier z per job; releases = binning + one
per level of every tree (max_depth x n_trees x classes) + one per validation round. ``target_epsilon`` is
calibrated up front over those with V = d (at a fixed z the Skellam bound decreases as the sensitivity grows, so
V > d spends less). Early stopping, or nodes that stop splitting, mean fewer releases: the ε recorded is what was
spent. A round rebuilt after a dropout releases its histograms again (the discarded ones were seen): the record
counts them, and may then pass the planned ε.

Dropouts and colluders: t is the job's fixed secure-aggregation threshold and c = ``max_colluders``; each client
adds mu_r / (t - c), each release is accounted at (survivors - c) mu_r / (t - c) >= mu_r. Each client also keeps
its own bound (every release it submitted at the plan's mu_r), which needs no trust in the server's survivor count.

What each role learns: the noised sums ((ε, δ)-DP for any one row) and the model; never a client's vector.
Regression is refused (g = margin - y and the labels have no public bound). The noise comes from OS entropy;
``noise_seed`` only for tests.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from ..dp.calibration import MAX_POISSON_MEAN
from ..dp.integer_sums import SumAccountant, SumNoisePlan, SumRelease
from ..dp.mechanisms import noise_rng
from ..params.sum_privacy import SumDPParams
from .params import SecureBoostParams

__all__ = ["LOSS_BOUND", "TreeDP", "TreeDPParams", "dp_precision_bits", "row_losses"]

LOSS_BOUND = 8.0          # nats: a validation row's loss is clipped to [0, LOSS_BOUND] under DP
LOSS_BITS = 8             # a row's clipped loss is sent as round(2^8 l / LOSS_BOUND); the count as 2^8 n
DP_MAX_BITS = 20          # p under DP: N 2^p B_g < 2^52 for up to 2^32 rows
DP_MIN_BITS = 4
_SIGMAS = 4.0             # a feature has missing values when its noised missing count passes 4 noise std
OBJECTIVE_BOUNDS = {"binary": (1.0, 0.25), "multiclass": (1.0, 0.5)}   # (B_g, B_h)


class TreeDPParams(SumDPParams):
    """``params.dp`` of ``algorithm: secureboost_horizontal``: record-level distributed Skellam noise on every sum
    (module docstring). Needs public ``feature_ranges``, ``aggregation: secagg``, a classification objective and
    ``reg_lambda > 0``."""

    gradient_clip: float | None = Field(default=None, gt=0, le=1, description="clip |g| to this (default: the "
                                        "objective's bound 1); a smaller bound means less noise on h and counts")
    validation: bool = Field(default=True, description="release a noised validation loss each boosting round "
                             "(the job sets it to validation_fraction > 0)")


def dp_precision_bits(z: float, n_features: int, honest_min: int, bg: float, bh: float) -> int:
    """p under DP: the largest p <= 20 at which a client's Poisson mean for a level's histograms stays below 2^40
    with V = 2 d virtual columns (the most there can be). Public values only. ValueError below 4 bits."""
    for p in range(DP_MAX_BITS, DP_MIN_BITS - 1, -1):
        g2, h2, s2 = _maxima(p, bg, bh)
        if (z ** 2) * 2 * n_features * (g2 ** 2 + h2 ** 2 + s2 ** 2) / honest_min / 2 <= MAX_POISSON_MEAN:
            return p
    raise ValueError(f"noise multiplier {z:.4g} leaves fewer than {DP_MIN_BITS} gradient bits under the noise "
                     f"sampler's limit: lower params.dp.noise_multiplier (or raise params.dp.target_epsilon)")


def _maxima(p: int, bg: float, bh: float) -> tuple[int, int, int]:
    """(G, H, S): one row's largest |gq|, hq and its count weight at precision p (module docstring)."""
    q = p + math.floor(math.log2(bg / bh))
    return math.ceil(bg * 2.0 ** p), math.ceil(bh * 2.0 ** q), 2 ** max(0, p + math.floor(math.log2(bg)))


def row_losses(margin: np.ndarray, y: np.ndarray, objective: str) -> np.ndarray:
    """Per-row validation loss (logloss, probabilities clipped to [1e-15, 1]) clipped to [0, LOSS_BOUND]."""
    if objective == "binary":
        p = np.clip(1.0 / (1.0 + np.exp(-margin[:, 0])), 1e-15, 1 - 1e-15)
        lo = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    else:
        z = margin - margin.max(axis=1, keepdims=True)
        lo = -(z[np.arange(len(y)), y.astype(np.int64)] - np.log(np.exp(z).sum(axis=1)))
    return np.clip(lo, 0.0, LOSS_BOUND)


@dataclass(frozen=True)
class TreeDP:
    """The noise of one horizontal SecureBoost job, identical at the server and every client (:meth:`of`).

    Attributes:
        plan: z and δ; ``plan.releases`` the planned ones.
        objective: "binary" | "multiclass".
        n_features: d.
        honest_min: t - c (t the job's fixed threshold, c = max_colluders).
        colluders: c.
        precision: p of g; ``h_bits`` of h; ``count_scale`` S.
        bg, bh: the public bounds of |g| and h.
        validation: whether each round releases a validation loss.
        noise_seed: tests only (None: OS entropy).
    """

    plan: SumNoisePlan
    objective: str
    n_features: int
    honest_min: int
    colluders: int
    precision: int
    bg: float
    bh: float
    validation: bool
    noise_seed: int | None = None

    @classmethod
    def of(cls, dp: TreeDPParams, params: SecureBoostParams, n_features: int, threshold: int,
           colluders: int) -> "TreeDP":
        """Plan the job's noise. ValueError names the field of a configuration DP cannot hold, or a calibration
        that fails."""
        if params.objective not in OBJECTIVE_BOUNDS:
            raise ValueError("params.objective: regression is not supported under params.dp (its gradients "
                             "margin - y and its labels have no public bound for a record-level guarantee)")
        if params.reg_lambda <= 0:
            raise ValueError("params.reg_lambda: must be > 0 under params.dp (a noised hessian sum may be 0)")
        if threshold - colluders < 1:
            raise ValueError(f"params.max_colluders: t - c = {threshold} - {colluders} leaves no honest survivor")
        bg, bh = OBJECTIVE_BOUNDS[params.objective]
        bg = min(bg, dp.gradient_clip or bg)
        n_rel = params.n_trees * params.trees_per_round * params.max_depth
        z0 = 1.0 if dp.noise_multiplier is None else dp.noise_multiplier
        half = cls(SumNoisePlan(z0, dp.delta), params.objective, n_features, threshold - colluders, colluders,
                   DP_MIN_BITS, bg, bh, dp.validation, dp.noise_seed)
        # calibrated at p = DP_MIN_BITS and V = d: the least sensitivities (the most ε at a given z)
        planned = [half.binning_release(n_features + 2)] + [half.level_release(n_features, 3 * n_features)] * n_rel
        planned += [half.validation_release()] * (params.n_trees if dp.validation else 0)
        plan = SumNoisePlan.calibrate(planned, dp.delta, epsilon=dp.target_epsilon,
                                      noise_multiplier=dp.noise_multiplier)
        p = dp_precision_bits(plan.noise_multiplier, n_features, threshold - colluders, bg, bh)
        return cls(plan, params.objective, n_features, threshold - colluders, colluders, p, bg, bh,
                   dp.validation, dp.noise_seed)

    # ------------------------------------------------------------------ grid and sensitivities
    @property
    def h_bits(self) -> int:
        """q: the fraction bits of h (module docstring)."""
        return self.precision + math.floor(math.log2(self.bg / self.bh))

    @property
    def count_scale(self) -> int:
        """S: what one row adds to a count cell."""
        return _maxima(self.precision, self.bg, self.bh)[2]

    @property
    def log2_bound(self) -> int:
        """The public power-of-two bound of |g| and h sent in hsb.bound (0: both <= 1)."""
        return 0

    def binning_release(self, dim: int) -> SumRelease:
        """The binning vector (``dim`` coordinates): d + 1 ones and the 0/1 label (binary)."""
        k = self.n_features + 1 + int(self.objective == "binary")
        return SumRelease("binning", dim, math.sqrt(k), float(k))

    def level_release(self, n_virtual: int, dim: int) -> SumRelease:
        """One level's histograms over ``n_virtual`` virtual columns (``dim`` coordinates)."""
        g, h, s = _maxima(self.precision, self.bg, self.bh)
        return SumRelease("histograms", dim, math.sqrt(n_virtual * (g * g + h * h + s * s)),
                          float(n_virtual * (g + h + s)))

    def validation_release(self) -> SumRelease:
        """[Σ round(2^8 l / L), 2^8 n_val]."""
        return SumRelease("validation", 2, 2.0 ** LOSS_BITS * math.sqrt(2), 2.0 ** (LOSS_BITS + 1))

    # ------------------------------------------------------------------ clients
    def noised(self, vec: np.ndarray, release: SumRelease, round_id: int, party: str) -> np.ndarray:
        """A client's integer vector (int64 (dim,)) plus its Skellam share of variance mu_r / (t - c)."""
        vec = np.asarray(vec)
        if vec.shape != (release.dim,) or not np.array_equal(vec, np.rint(vec)):
            raise ValueError(f"{release.name}: expected {release.dim} integers, got shape {vec.shape}")
        return vec.astype(np.int64) + self.plan.noise(release, self.honest_min, self._rng(round_id, party))

    def _rng(self, round_id: int, party: str) -> np.random.Generator | None:
        if self.noise_seed is None:
            return None
        return noise_rng([self.noise_seed, round_id,
                          int.from_bytes(hashlib.sha256(party.encode()).digest()[:8], "little")])

    def clipped_gradients(self, g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """g clipped to [-B_g, B_g], h to [0, B_h] (a no-op for the objective's own bounds)."""
        return np.clip(g, -self.bg, self.bg), np.clip(h, 0.0, self.bh)

    def validation_vector(self, margin: np.ndarray | None, y: np.ndarray | None) -> np.ndarray:
        """[Σ round(2^8 l / L), 2^8 n_val] of this client's validation rows (zeros without)."""
        if margin is None or not len(margin):
            return np.zeros(2)
        q = np.rint(row_losses(margin, y, self.objective) * (2.0 ** LOSS_BITS / LOSS_BOUND))
        return np.array([q.sum(), 2.0 ** LOSS_BITS * len(margin)])

    # ------------------------------------------------------------------ server
    def accountant(self) -> SumAccountant:
        """A fresh accountant of this plan."""
        return SumAccountant(self.plan)

    def step(self, acc: SumAccountant, release: SumRelease, survivors: int) -> None:
        """Account ``release`` at the variance its ``survivors`` carried ((s - c) mu_r / (t - c))."""
        acc.step(release, self.plan.honest_variance(release, survivors, self.honest_min, self.colluders))

    def noise_std(self, release: SumRelease, survivors: int) -> float:
        """Std of the summed noise of one coordinate with ``survivors`` clients (integer units)."""
        return math.sqrt(survivors * self.plan.share(release, self.honest_min))

    def missing_threshold(self, release: SumRelease, survivors: int) -> float:
        """A noised missing count above this (4 noise std) marks a feature as having missing values."""
        return _SIGMAS * self.noise_std(release, survivors)

    def validation_loss(self, v: np.ndarray, std: float) -> float | None:
        """The mean clipped loss from the noised [Σ, 2^8 n] (None when the noised count is below 4 std: no
        validation rows), clamped into [0, L]."""
        if v[1] <= max(_SIGMAS * std, 2.0 ** LOSS_BITS):
            return None
        return float(np.clip(v[0] * LOSS_BOUND / v[1], 0.0, LOSS_BOUND))
