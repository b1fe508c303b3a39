"""Record-level differential privacy of horizontal FL with the noise distributed across the clients, inside secure
aggregation (``params.record_dp.placement: distributed``): distributed DP gradient descent, one noised full-batch
step per round.

Each round every selected client computes, at the global model w, the sum of its per-record clipped gradients
G_i = Σ_r clip_C(∇ℓ_r(w)) (:func:`~.clipped_gradients.clipped_gradient_sum`), rotates it (randomised Hadamard,
public per-round seed), scales it by 1/gamma with gamma = C / K, rounds every coordinate up or down at random
(unbiased, *unconditionally*), appends its record count times c, adds its share of Skellam noise to every
coordinate and submits the d' + 1 integers to secure aggregation in the ring Z_{2^k}. The server decodes the sum:
gamma · unrotate(first d') ≈ Σ_i G_i, the last coordinate / c ≈ N the records of the round (noised), and steps
w ← w − lr · (Σ G_i / max(N̂, 1) + weight_decay · w): full-batch DP-GD (Abadi et al., CCS 2016, Algorithm 1 with
the whole data set as the lot) whose noise nobody, the server included, ever sees removed. Everything after the
secure sum is post-processing.

Sensitivity (add or remove one record r of one client). The record moves G_i by v with ‖v‖₂ ≤ C (the clip), so
the scaled, rotated vector by ‖v‖₂ / gamma ≤ K. Rounding coordinate a to ⌊a + u⌋ with u ~ U[0, 1): with the same
u on both neighbours (a coupling), |⌊a + u⌋ − ⌊b + u⌋| < |a − b| + 1 per coordinate, so the two rounded vectors
differ by an integer vector of L2 norm ≤ K + √d' and L1 norm ≤ √d'·K + d'; the count coordinate differs by
exactly c. Hence Δ2 = √((K + √d')² + c²), Δ1 = √d'·K + d' + c. Conditioned on u the release is the Skellam
mechanism with those sensitivities (Agarwal, Kairouz, Liu, NeurIPS 2021, the multi-dimensional Skellam RDP bound,
:func:`secureflhv.dp.skellam_rdp`); the release itself is the mixture over u on both sides, and Rényi divergence
is jointly quasi-convex (van Erven and Harremoës, IEEE Trans. Inf. Theory 2014, Theorem 13), so the mixture is
no worse than the worst u. There are no local steps to bound (one step per round, lr applied by the server after
the noise): several un-noised local steps would let one record's effect grow through the later steps' gradients,
which no clip bounds for a non-convex loss. Rounds compose (RDP); no amplification by record or client sampling
is claimed (every record is in every round).

Constants: K = 32·√d' (the rounding adds at most 1/32 to the sensitivity) and c = ⌈K / 8⌉ (the noised count is
off by about 8·z records, z the noise over the sensitivity; the count adds 0.8 % to Δ2). Dropouts and colluders
as in :mod:`.dp_distributed`: each client adds mu / (t − c_max), each round is accounted at the variance its
honest survivors carried at least. The plan comes from the job file alone; nothing a peer says changes gamma, K
or mu, so a lying server cannot weaken the guarantee (a wrong step size or count only spoils its own model).

What each role learns: the server, the noised sums of the survivors (the gradient sum and the record count),
which are (ε, δ)-DP for any one record of any client; every client and whoever receives the released model, only
what follows from them. The clients withhold their training loss and record count from ``fl.metrics`` (the
count travels only inside the noised sum). Not protected: a client's test-set metrics and whether it took part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from torch import nn

from ..dp.calibration import MAX_POISSON_MEAN
from ..dp.mechanisms import padded_dim, rotate, rotation_seed, skellam_noise, unrotate
from ..secagg import AggregateResult, AggregationConfig
from .clipped_gradients import clipped_gradient_sum
from .dp_distributed import SkellamShares
from .dp_fedavg import ClientDP
from .local_data import Rows
from .models import set_flat
from .strategies import ClientUpdate

FIELD = "params.record_dp"
ROUNDING_RATIO = 32   # K / sqrt(d'): the unconditional rounding adds at most 1 / 32 to the sensitivity
COUNT_FRACTION = 8    # c = ceil(K / 8): the record count's weight in the noised sum
_NORM_SIGMAS = 10.0   # headroom of the noise in the server's checks (a false refusal is ~e^-50)
_SLACK = 1e-9         # relative margin on the sensitivities for the float error of the clip


@dataclass(frozen=True)
class RecordSumPlan:
    """The mechanism's parameters for a model of ``d`` parameters (integer units unless said otherwise).

    Attributes:
        clip: C (model units). gamma: model units per integer step, C / K. scale: K = C / gamma.
        count_scale: c, the integer weight of one record in the count coordinate.
        k_bits: the ring. d, d_pad: the model's dimension and the rotated length d' (a power of two).
        variance: mu, the least per-coordinate variance of the summed noise.
        l2_sensitivity, l1_sensitivity: Δ2, Δ1 of one record (module docstring).
    """

    clip: float
    gamma: float
    scale: float
    count_scale: int
    k_bits: int
    d: int
    d_pad: int
    variance: float
    l2_sensitivity: float
    l1_sensitivity: float

    @property
    def noise_std(self) -> float:
        """The gradient sum's least noise standard deviation per coordinate, in model units: gamma·sqrt(mu)."""
        return self.gamma * math.sqrt(self.variance)

    @property
    def count_std(self) -> float:
        """The noised record count's least standard deviation, in records: sqrt(mu) / c."""
        return math.sqrt(self.variance) / self.count_scale


def plan_record_sum(clip: float, d: int, bits: int, honest_min: int, *, noise_multiplier: float | None = None,
                    epsilon: float | None = None, delta: float | None = None,
                    rounds: int | None = None) -> RecordSumPlan:
    """The plan of a job: K, c, Δ2, Δ1 from C and d', and mu from ``noise_multiplier`` z (mu = (z·Δ2)²) or from a
    target (``epsilon``, ``delta``) over ``rounds`` releases (:func:`secureflhv.dp.skellam_variance_for`; the
    Skellam RDP bound of Agarwal, Kairouz, Liu, NeurIPS 2021). Units: ``clip`` in model units (an L2 norm of one
    record's gradient), ``d`` the model's parameters, ``bits`` the ring's bits per coordinate; the plan's
    variance and sensitivities in integer units (module docstring).

    ``honest_min``: the fewest honest survivors a round may have (t − c_max over the job's round sizes); each
    client's Poisson means mu / honest_min / 2 must stay below :data:`~secureflhv.dp.calibration.MAX_POISSON_MEAN`.
    Raises ValueError (both or neither ways given, the noise too large for the sampler)."""
    from ..dp.accounting import skellam_variance_for

    if (noise_multiplier is None) == (epsilon is None):
        raise ValueError("give noise_multiplier, or epsilon with delta and rounds (one of the two)")
    d_pad = padded_dim(d)
    root = math.sqrt(d_pad)
    scale = ROUNDING_RATIO * root
    count = math.ceil(scale / COUNT_FRACTION)
    l2 = math.hypot(scale + root, count) * (1 + _SLACK)
    l1 = (root * scale + d_pad + count) * (1 + _SLACK)
    mu = ((noise_multiplier * l2) ** 2 if noise_multiplier is not None
          else skellam_variance_for(epsilon, delta, rounds, l2, l1))
    if mu / honest_min / 2 > MAX_POISSON_MEAN:
        raise ValueError(f"{FIELD}: the noise needs Poisson means of {mu / honest_min / 2:.3g} per client, past the "
                         f"{MAX_POISSON_MEAN:.3g} where numpy's sampler is exact: lower the noise (a larger "
                         f"target_epsilon or smaller noise_multiplier)")
    return RecordSumPlan(clip, clip / scale, scale, count, bits, d, d_pad, mu, l2, l1)


@dataclass(frozen=True)
class RecordSumDP(SkellamShares, ClientDP):
    """Distributed record-level DP-GD (module docstring), behind the :class:`~.dp_fedavg.ClientDP` interface the
    FL roles call; :meth:`local_update` replaces the strategy's local training at the client.

    Attributes:
        clip_norm: C, the per-record gradient clip. bits: k, the ring's bits per coordinate.
        aggregation: the job's aggregation settings. least_honest: the fewest honest survivors t − c_max of any
            round the job allows. lrs: the step size of every round (``learning_rate`` and its schedule).
        weight_decay: the L2 weight decay of the server's step (data-independent).
        noise_multiplier / target_epsilon, rounds, delta, epsilon_budget, job_seed, noise_seed: as in
            :class:`~.dp_distributed.DistributedDP`. chunk: records per vectorised gradient batch.
        plan: set by :meth:`bound`.
    """

    clip_norm: float
    bits: int
    aggregation: AggregationConfig
    least_honest: int
    lrs: tuple[float, ...]
    weight_decay: float = 0.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    rounds: int = 1
    job_seed: int = 0
    delta: float = 1e-5
    epsilon_budget: float | None = None
    noise_seed: int | None = None
    chunk: int = 256
    plan: RecordSumPlan | None = None
    placement = "distributed"
    level = "record"

    def bound(self, dim: int) -> "RecordSumDP":
        """These settings planned for a model of ``dim`` parameters (ValueError naming ``params.record_dp``)."""
        return replace(self, plan=plan_record_sum(self.clip_norm, dim, self.bits, self.least_honest,
                                                  **self.noise_way()))

    def agg_dim(self, dim: int) -> int:
        """d' + 1: the rotated gradient sum and the record count."""
        if dim != self.plan.d:
            raise ValueError(f"the model has {dim} parameters, the DP plan {self.plan.d}")
        return self.plan.d_pad + 1

    def local_update(self, model: nn.Module, global_vec: np.ndarray, X: Rows, y: np.ndarray) -> ClientUpdate:
        """The client's round: the clipped gradient sum G_i (float64 (d,), :func:`clipped_gradient_sum`) at
        ``global_vec`` (float32 (d,), loaded into ``model``) over its records X (n, ...), y (n,), with weight n
        (its record count, encoded by :meth:`client_input`); one step; the loss is withheld (NaN). ValueError
        from :func:`clipped_gradient_sum`."""
        set_flat(model, global_vec)
        total = clipped_gradient_sum(model, X, y, self.clip_norm, self.chunk)
        return ClientUpdate({"model": (total, float(len(y)))}, len(y), 1, float("nan"))

    def client_input(self, update, round_id, n_selected, party_id, weight=1.0):
        """Rotate, scale by 1/gamma, round, append the count ``weight`` · c, add the Skellam share: signed
        integers (float64 (d' + 1,)) in [-2^(k-1), 2^(k-1)), weight 1. ValueError when this client's own vector
        leaves the ring (raise ``bits``)."""
        p = self.plan
        rng = self.client_rng(round_id, party_id)
        scaled = rotate(update, rotation_seed(self.job_seed, round_id)) / p.gamma
        rounded = np.floor(scaled + rng.random(scaled.size))
        vec = np.append(rounded, float(weight) * p.count_scale)
        vec += skellam_noise(self.share(n_selected), vec.size, None if self.noise_seed is None else rng,
                             secure=self.noise_seed is None)
        half = 2.0 ** (p.k_bits - 1)
        if not np.all(np.abs(vec) < half):
            raise ValueError(f"{FIELD}.bits: this client's encoded gradient sum ({np.abs(vec).max():.3g}) leaves the "
                             f"{p.k_bits}-bit ring: raise bits")
        return vec, 1.0

    def release(self, global_vec, res, round_id, n_selected):
        """Decode the noised count and gradient sum, check the sum's L2 norm against what N̂ clipped records and the
        noise can reach, then take the DP-GD step."""
        p, n = self.plan, len(res.survivors)
        v = n * self.share(n_selected)
        spread = _NORM_SIGMAS * math.sqrt(v)
        count = float(res.total[-1]) / p.count_scale
        grad = res.total[:-1]
        bound = (max(count, 0.0) + spread / p.count_scale) * p.scale + n * math.sqrt(p.d_pad) \
            + math.sqrt(p.d_pad * v) + spread
        norm = float(np.linalg.norm(grad))
        if count < -spread / p.count_scale or not norm <= bound:
            return None, (f"the noised sum of {n} clients' clipped gradients has L2 norm {norm:.6g} for {count:.6g} "
                          f"records (bound {bound:.6g}, integer units): a client did not clip, or the sum wrapped "
                          f"the {p.k_bits}-bit ring ({FIELD}.bits)")
        g = unrotate(grad * p.gamma, rotation_seed(self.job_seed, round_id), p.d) / max(count, 1.0)
        w = np.asarray(global_vec, np.float64)
        lr = self.lrs[min(max(round_id, 1), len(self.lrs)) - 1]
        return (w - lr * (g + self.weight_decay * w)).astype(np.float32), ""

    def accountant_for(self):
        """A fresh :class:`secureflhv.dp.SkellamAccountant` (unit: record) at the plan's variance."""
        from ..dp.accounting import SkellamAccountant

        return SkellamAccountant(self.plan.variance, self.plan.l2_sensitivity, self.plan.l1_sensitivity,
                                 unit="record")

    def account(self, accountant, res: AggregateResult, n_selected: int) -> dict:
        """:meth:`SkellamShares.account`, and the round's noised record count."""
        return {**super().account(accountant, res, n_selected),
                "records_noised": float(res.total[-1]) / self.plan.count_scale}

    def describe(self) -> dict:
        """placement, level, mechanism, clip_norm, gamma, bits, noise_std (model units), count_std (records)."""
        p = self.plan
        return {"placement": self.placement, "level": self.level, "mechanism": "distributed DP-GD (Skellam)",
                "clip_norm": p.clip, "gamma": p.gamma, "bits": p.k_bits, "noise_std": p.noise_std,
                "count_std": p.count_std, "max_colluders": self.aggregation.max_colluders}
