"""Record-level differential privacy at each horizontal FL client (``params.record_dp``): DP-SGD with Opacus.

What is protected: any one training record of a client (add or remove one record), against whoever sees that
client's updates (the server without secure aggregation; everyone through the released model). The noise is
added by the client itself, before anything leaves it, so no other party is trusted with it. Sources: Abadi, Chu,
Goodfellow, McMahan, Mironov, Talwar, Zhang, "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1;
Opacus (Yousefpour et al., arXiv:2109.12298). The client-side code is :mod:`secureflhv.horizontal.dp_sgd`.

Units: ``clip_norm`` is an L2 norm of one record's gradient (the loss's units per parameter unit);
``noise_multiplier`` is the noise standard deviation over ``clip_norm`` (dimensionless); ε in nats.
"""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .privacy import NoiseChoice

FIELD = "params.record_dp"  # the job-file field these settings come from (for error messages)


class RecordDPParams(NoiseChoice):
    """Record-level DP at every client: DP-SGD with local noise (``placement: local``, the default), or one noised
    full-batch gradient step per round with the noise distributed inside secure aggregation (``distributed``).

    ``placement: local`` is DP-SGD (Abadi et al. 2016, Algorithm 1, with Poisson sampling as Opacus does it).

    Each local step samples every local record independently with probability ``q = min(1, batch_size / n_local)``
    (``n_local``: the client's training rows), clips each sampled record's gradient to L2 norm ``clip_norm``, sums,
    adds N(0, (noise_multiplier · clip_norm)²) per coordinate and divides by the expected batch size ``q · n_local``
    before the optimiser's step. A round has ``epochs · ⌊1/q⌋`` steps. One Opacus accountant per client composes
    every step of every round (adaptive composition of the sampled Gaussian mechanism).

    Attributes:
        clip_norm: C > 0, the per-record gradient clip (L2).
        noise_multiplier: z > 0; or None and give ``target_epsilon``.
        target_epsilon: ε > 0 that the job's ``rounds · epochs · ⌊1/q⌋`` steps should spend at ``delta``: each
            client calibrates its own z with ``opacus.accountants.utils.get_noise_multiplier`` (q depends on its
            row count), so a client in every round ends at most at ``target_epsilon`` (0.01 below it at worst).
        delta: δ of the (ε, δ) guarantee, in (0, 1); choose it well below 1 / n_local.
        accountant: Opacus's ``rdp`` (Mironov, Talwar, Zhang, arXiv:1908.10530; the default) or ``prv`` (Gopi, Lee,
            Wutschitz, NeurIPS 2021: numerical, tighter). Opacus's ``gdp`` (a central-limit approximation that can
            *under*-estimate ε) is not offered: a job's ε must be a bound.
        placement: ``local`` (each client noises its own steps, module docstring) or ``distributed``
            (:mod:`secureflhv.horizontal.dp_record_sum`): each round every client sends the sum of its per-record
            clipped gradients at the global model, rotated, scaled, rounded and with its share of Skellam noise,
            inside secure aggregation; the server steps by the noised sum over the noised record count (DP-GD,
            ``learning_rate`` and its schedule, SGD without momentum). The noise std over the sensitivity is
            ``noise_multiplier``; FedAvg only; needs ``aggregation.kind: secagg``; ``accountant: rdp`` (the Skellam
            RDP bound). ``local_epochs`` and ``batch_size`` are not used (``batch_size`` is the chunk of
            per-record gradients computed at once).
        bits: distributed: the ring's bits per coordinate; 32 holds a round of about 5 million records (the
            count coordinate grows by about 360 per record at d' = 8192; a wrapped sum is refused, naming it).
        noise_seed: TESTS ONLY. Seeds the Poisson sampling and the noise; whoever knows it can remove the noise.
            None (the default): both are drawn from the operating system's entropy at the client.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    placement: Literal["local", "distributed"] = Field(
        default="local", description="local: DP-SGD noised by each client (Opacus); distributed: one full-batch "
                                     "step per round, Skellam shares inside secure aggregation")
    bits: int = Field(default=32, ge=16, le=52, description="distributed: the ring's bits per coordinate")
    clip_norm: float = Field(gt=0, allow_inf_nan=False, description="C: L2 clip of one record's gradient")
    noise_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                           description="z: noise std over C on each step's summed gradients")
    target_epsilon: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                         description="calibrate z so the job's rounds spend this ε at delta")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the (ε, δ) guarantee; below 1/n_local")
    accountant: Literal["rdp", "prv"] = Field(default="rdp", description="Opacus's accountant")
    noise_seed: int | None = Field(default=None, ge=0, description="TESTS ONLY: seeds sampling and noise "
                                                                    "(removes the privacy); None: OS entropy")

