"""Client-level differential privacy of FedAvg / FedProx with the noise distributed across the clients, inside
secure aggregation: nobody, the server included, ever sees an un-noised sum.

Per round each selected client clips its model delta to L2 norm C, rotates it (randomised Hadamard, public seed),
scales it by 1/gamma, rounds it conditionally and adds its share of Skellam noise, all in the integers
(:func:`secureflhv.dp.mechanisms.encode`; Kairouz, Liu, Steinke, ICML 2021, Algorithms 1-2; Agarwal, Kairouz, Liu,
NeurIPS 2021, Algorithm 1). Secure aggregation sums the integer vectors in the ring Z_{2^k} (``ring_bits`` of
:class:`~secureflhv.secagg.AggregationConfig`); the server centres the sum, checks its L2 norm against what
clipped inputs plus the noise can reach, unrotates it and steps by sum / n. The plan (gamma, k, the target
variance mu) comes from the job file alone (:func:`secureflhv.dp.calibration.plan_skellam`).

Dropouts and colluders. A round of n selected clients can only be unmasked with at least t survivors (the
secure-aggregation threshold for n, :meth:`~secureflhv.secagg.AggregationConfig.resolve_threshold`), and up to c =
``max_colluders`` of them may be colluding with the server and know their own noise. Each client therefore adds
variance mu / (t - c): any surviving set allowed by the threshold carries at least mu from honest clients. Each
round is accounted with the variance its honest survivors carried at least, (survivors - c) * mu / (t - c), and
the round record gives that and the total the survivors carried.

What each role learns: the server learns the noised sum of the survivors (and who survived), which is
(ε, δ)-DP for any one client (add/remove) by the Skellam RDP bound (:class:`secureflhv.dp.SkellamAccountant`);
every client and whoever receives the released model learn only what follows from the noised sums. A malicious
client may skip its noise (the others' shares still carry mu when at most c clients misbehave) or send a vector
that is not clipped: the server's L2 check refuses a sum no clipped inputs could produce, naming no one (secure
aggregation hides which input). A sum that wraps the ring fails the same check. The noise comes from OS entropy
(``noise_seed`` only for tests: knowing the seed removes the noise).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from ..crypto.quantise import to_signed
from ..dp.calibration import SkellamPlan, plan_skellam
from ..dp.mechanisms import encode, noise_rng, rotation_seed, unrotate
from ..secagg import AggregateResult, AggregationConfig
from .dp_fedavg import ClientDP

_NORM_SIGMAS = 10.0  # headroom of the noise's L2 norm in the server's check (a false refusal is ~e^-50)


class SkellamShares:
    """What both distributed placements (client-level here, record-level in :mod:`.dp_record_sum`) share: the
    noise settings a plan is made from, the ring, each client's secret generator, each client's share
    mu / (t - c) and the accounting at the honest survivors' variance. Needs ``plan.variance``, ``plan.k_bits``,
    ``aggregation``, ``noise_multiplier`` / ``target_epsilon``, ``delta``, ``rounds`` and ``noise_seed``."""

    def noise_way(self) -> dict:
        """The plan's noise arguments: ``noise_multiplier``, or ``epsilon``, ``delta`` and ``rounds``."""
        if self.noise_multiplier is not None:
            return {"noise_multiplier": self.noise_multiplier}
        return {"epsilon": self.target_epsilon, "delta": self.delta, "rounds": self.rounds}

    def aggregation_for(self, config: AggregationConfig) -> AggregationConfig:
        """The job's aggregation with the plan's ring: integer inputs in Z_{2^k}."""
        return config.replace(ring_bits=self.plan.k_bits)

    def client_rng(self, round_id: int, party_id: str) -> np.random.Generator:
        """The client's SECRET generator for rounding and noise (:func:`~secureflhv.dp.mechanisms.noise_rng`: OS
        entropy; with the test-only ``noise_seed``, derived from it, the round and the party)."""
        if self.noise_seed is None:
            return noise_rng(None)
        party = int.from_bytes(hashlib.sha256(party_id.encode()).digest()[:8], "little")
        return noise_rng([self.noise_seed, round_id, party])

    def honest_min(self, n_selected: int) -> int:
        """t - c for a round of ``n_selected`` clients: the fewest honest survivors the server can unmask."""
        return self.aggregation.resolve_threshold(n_selected) - self.aggregation.max_colluders

    def share(self, n_selected: int) -> float:
        """Each client's noise variance in a round of ``n_selected`` clients: mu / (t - c) (integer units)."""
        return self.plan.variance / self.honest_min(n_selected)

    def account(self, accountant, res: AggregateResult, n_selected: int) -> dict:
        """Record the round at the variance its honest survivors carried at least; returns that and the total."""
        n, share = len(res.survivors), self.share(n_selected)
        honest = (n - self.aggregation.max_colluders) * share
        accountant.step(honest)
        return {"survivors": n, "variance_carried": n * share, "variance_accounted": honest}

    def replay(self, accountant, record: dict) -> None:
        """A round released before a resume, at the variance its record says its honest survivors carried (the
        nominal mu when the record lacks it, or says less: the checkpoint is not trusted beyond the plan)."""
        v = record.get("variance_accounted") if isinstance(record, dict) else None
        ok = isinstance(v, (int, float)) and math.isfinite(v) and v >= self.plan.variance
        accountant.step(float(v) if ok else None)


@dataclass(frozen=True)
class DistributedDP(SkellamShares, ClientDP):
    """DP-FedAvg with distributed Skellam noise (module docstring).

    Attributes:
        clip_norm: C, the L2 clip of a client's model delta per round.
        bits: k, the ring's bits per coordinate.
        aggregation: the job's aggregation settings (threshold and colluders fix each client's share).
        sizes: every (n, t - c) a round of the job may have (:func:`~secureflhv.dp.calibration.plan_skellam`).
        noise_multiplier: the sum's noise std over C (model units), or None with ``target_epsilon``.
        target_epsilon: calibrate the noise so that ``rounds`` rounds spend this ε at ``delta``.
        rounds: the job's rounds (for ``target_epsilon``).
        job_seed: seeds the PUBLIC rotation of each round.
        delta: δ of the reported (ε, δ).
        epsilon_budget: stop before a round would take ε past it (None: no budget).
        sampling_rate: the share of clients selected per round (recorded; not amplified).
        noise_seed: tests only; None draws rounding and noise from OS entropy.
        plan: the mechanism's parameters for the model's dimension (gamma, target variance mu, sensitivities),
            set by :meth:`bound`.
    """

    clip_norm: float
    bits: int
    aggregation: AggregationConfig
    sizes: tuple[tuple[int, int], ...]
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    rounds: int = 1
    job_seed: int = 0
    delta: float = 1e-5
    epsilon_budget: float | None = None
    sampling_rate: float = 1.0
    noise_seed: int | None = None
    plan: SkellamPlan | None = None
    placement = "distributed"

    def bound(self, dim: int) -> "DistributedDP":
        """These settings planned for a model of ``dim`` parameters. ValueError naming ``params.dp.bits`` when
        no scale fits the ring."""
        try:
            plan = plan_skellam(self.clip_norm, dim, self.bits, self.sizes, **self.noise_way())
        except ValueError as exc:
            raise ValueError(f"params.dp.{exc}") from None
        return replace(self, plan=plan)

    def agg_dim(self, dim: int) -> int:
        """d': the rotated, padded length (a power of two)."""
        if dim != self.plan.d:
            raise ValueError(f"the model has {dim} parameters, the DP plan {self.plan.d}")
        return self.plan.d_pad

    def client_input(self, update, round_id, n_selected, party_id, weight=1.0):
        """The encoded delta as signed integers (float64 (d',)) in [-2^(k-1), 2^(k-1)), weight 1."""
        p = self.plan
        rng = self.client_rng(round_id, party_id)
        enc = encode(update, clip=p.clip, gamma=p.gamma, seed=rotation_seed(self.job_seed, round_id),
                     k_bits=p.k_bits, mu=self.share(n_selected), rng=rng, beta=p.beta,
                     secure=self.noise_seed is None)
        return to_signed(enc.words, p.k_bits).astype(np.float64), 1.0

    def norm_bound(self, n_survivors: int, n_selected: int) -> float:
        """The largest L2 norm (integer units) of the centred sum that clipped inputs with their noise reach, but
        for a chance below e^-50: n Δ2 for the rounded vectors (every try is conditioned on it) plus
        sqrt(d' V) + 10 sqrt(V) for the noise of per-coordinate variance V (a Lipschitz function of the noise
        concentrates around its mean within a few standard deviations)."""
        v = n_survivors * self.share(n_selected)
        return n_survivors * self.plan.l2_sensitivity + math.sqrt(self.plan.d_pad * v) + _NORM_SIGMAS * math.sqrt(v)

    def release(self, global_vec, res, round_id, n_selected):
        """Check the centred sum's L2 norm, then step by gamma · unrotate(sum) / n."""
        n = len(res.survivors)
        norm, bound = float(np.linalg.norm(res.total)), self.norm_bound(n, n_selected)
        if not norm <= bound:
            return None, (f"the noised sum of {n} encoded updates has L2 norm {norm:.6g} > {bound:.6g} (integer "
                          f"units): a client did not clip its update, or the sum wrapped the {self.plan.k_bits}-bit "
                          f"ring")
        total = unrotate(res.total * self.plan.gamma, rotation_seed(self.job_seed, round_id), self.plan.d)
        return (np.asarray(global_vec, np.float64) + total / n).astype(np.float32), ""

    def accountant_for(self):
        """A fresh :class:`secureflhv.dp.SkellamAccountant` at the plan's variance and sensitivities."""
        from ..dp.accounting import SkellamAccountant

        return SkellamAccountant(self.plan.variance, self.plan.l2_sensitivity, self.plan.l1_sensitivity)

    def describe(self) -> dict:
        """placement, clip_norm, gamma, bits, bits_per_coordinate, noise_std (model units), wrap_probability."""
        p = self.plan
        return {"placement": self.placement, "clip_norm": p.clip, "gamma": p.gamma, "bits": p.k_bits,
                "bits_per_coordinate": p.bits_per_coordinate, "noise_std": p.noise_std,
                "wrap_probability": p.wrap_probability, "max_colluders": self.aggregation.max_colluders}
