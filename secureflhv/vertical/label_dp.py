"""Label differential privacy for the split NN: the guest's labels against the hosts.

Definition (Ghazi, Golowich, Kumar, Manurangsi, Zhang, "Deep Learning with Label Differential Privacy",
NeurIPS 2021, Definition 1): a training algorithm is (ε, δ)-label-DP when, for any two training sets that differ
in the *label* of one example (features and row order fixed), the distributions of its output differ by (ε, δ).
Here the output is everything the hosts see during training (their whole transcript), and the guest's trained
model, which the hosts' transcript and the model bundle both follow from.

Mechanism (the Gaussian mechanism on per-example clipped gradients, as Li et al., "Label Leakage and Protection
in Two-party Split Learning", ICLR 2022, Section 5 use as their noise baseline; accounted here). Per mini-batch
of b rows the guest computes, for every row i, the gradient of that row's own loss with respect to its logits,
``g_i = dl_i/dlogits_i`` ((b, out) float64: BCE ``sigmoid(l) - y``, cross-entropy ``softmax(l) - onehot(y)``,
regression ``2 (u - y)``), clips each row to L2 norm C and adds N(0, (z C)^2) to every entry::

    g'_i = g_i * min(1, C / ||g_i||_2) + N(0, (z C)^2 I)

and trains EVERYTHING from ``g' / b`` (the batch-mean gradient): the top model's gradient and the output
gradient ``delta' = dL/dz`` back-propagated through the top model and activation, from which the guest's bottom,
W_g, the bias c, the hosts' interactive shares V_h (their gradient ``A^T delta'``) and the hosts' gradients
``G = delta' W_h^T`` all follow. The labels enter the training only through g'.

Why the noise sits at the logits and not on ``delta`` alone: if the top model (or the guest's bottom, W_g or c)
trained on the true gradient, the next batch's ``delta`` of *every* row would depend on the labels seen so far,
so one changed label would move all later releases, not one row per epoch, and no per-row accounting would hold.
With every parameter a function of released g' (post-processing), the batch that holds row i is the only
release that reads y_i in an epoch.

Accounting. Neighbouring datasets differ in one example's label (replace one). Its clipped row moves by at most
2C, other rows not at all (they read only their own labels and post-processed state), so the release of that
batch is the Gaussian mechanism with sensitivity 2C and noise z C: noise multiplier z / 2. Every row is
released once per epoch; epochs compose adaptively (``dp_accounting``'s ``SelfComposedDpEvent`` of
``GaussianDpEvent(z / 2)``, built by :class:`secureflhv.dp.accounting.ClientLevelAccountant` with noise
multiplier z / 2 and clip 2C; RDP or PLD). No amplification by subsampling: the batches are cut from
``permutation([seed, epoch])``, which every host computes, so a host knows which batch holds the example it
targets; amplification needs the adversary not to know whether the example was sampled.
``target_epsilon`` calibrates z for the configured epochs with :func:`~secureflhv.dp.accounting.noise_multiplier_for`
(z = 2 z_eff).

Resume: an epoch interrupted by a failure may have released some of its batches before the run stopped; the
resumed run trains that epoch again with fresh noise. So every resume counts one more release (a conservative
bound: the interrupted epoch counted once in full), and ε after a resume can exceed ``target_epsilon``.

What is not protected: the guest learns the labels (it holds them); the guest's own reports (training loss,
metrics on labelled rows in ``metrics.json`` and in the bundle's ``metrics``) use the true labels and are not
label-DP. The hosts' features are not protected by this mechanism (their protection is the encryption).
The guarantee holds whatever the hosts send (the clip bounds every row's influence, the noise is fresh),
provided the hosts cannot predict the noise: it comes from the OS CSPRNG via
:func:`secureflhv.dp.mechanisms.noise_rng`; ``noise_seed`` exists for tests only, and every party sees it in
the job file.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..dp.accounting import ClientLevelAccountant, noise_multiplier_for
from ..dp.mechanisms import noise_rng


class LabelDPParams(BaseModel):
    """``label_dp`` of the split NN: clip C of each example's logit gradient and the noise; docs/privacy.md.

    Give ``noise_multiplier`` z, or ``target_epsilon`` and z is calibrated for ``epochs`` at ``delta``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_norm: float = Field(gt=0, allow_inf_nan=False,
                             description="C: L2 clip of each example's loss gradient w.r.t. its logits")
    noise_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                           description="z: noise std over C on each released entry")
    target_epsilon: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                         description="calibrate z so that all epochs spend this ε at delta")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the (ε, δ) label-DP guarantee")
    accountant: Literal["rdp", "pld"] = Field(default="rdp", description="dp-accounting's RDP or PLD accountant")
    noise_seed: int | None = Field(default=None, ge=0, description="TESTS ONLY: a seed for the noise (every party "
                                                                    "sees it and can remove the noise); None: OS entropy")

    @model_validator(mode="after")
    def _one_of(self) -> "LabelDPParams":
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError("label_dp.noise_multiplier / label_dp.target_epsilon: give one of the two, not both")
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("label_dp.noise_multiplier / label_dp.target_epsilon: give one of the two")
        return self


def clip_rows(g: np.ndarray, clip_norm: float) -> np.ndarray:
    """Each row of ``g`` (b, m) scaled by min(1, C / ||row||_2): float64 (b, m), every row's norm <= C."""
    g = np.asarray(g, dtype=np.float64)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    return g * np.minimum(1.0, clip_norm / np.maximum(norms, np.finfo(np.float64).tiny))


class LabelDP:
    """The guest's label-DP mechanism and its accountant for a run of ``epochs`` epochs.

    Args:
        params: :class:`LabelDPParams`.
        epochs: the configured epochs (what ``target_epsilon`` is calibrated for).

    ``noise_multiplier`` is z (given or calibrated); :meth:`privatise` is the per-batch release;
    :meth:`epsilon` / :meth:`record` give ε(δ) after ``releases`` releases per example.
    Raises ValueError naming the field when ``target_epsilon`` cannot be calibrated.
    """

    def __init__(self, params: LabelDPParams, epochs: int):
        self.params = params
        z = params.noise_multiplier
        if z is None:
            try:
                z = 2.0 * noise_multiplier_for(params.target_epsilon, params.delta, epochs,
                                               accountant=params.accountant)
            except ValueError as exc:
                raise ValueError(f"label_dp.target_epsilon: {exc}") from None
        self.noise_multiplier = float(z)
        self.releases = 0  # releases per example so far (epochs, plus one per resume)
        self._rng = noise_rng(params.noise_seed)
        # the release is Gaussian with sensitivity 2C and std zC: multiplier z / 2 (module docstring)
        self._accountant = ClientLevelAccountant(self.noise_multiplier / 2, 2 * params.clip_norm,
                                                 accountant=params.accountant)

    @property
    def noise_std(self) -> float:
        """z C: the standard deviation of the noise on every released entry (logit-gradient units)."""
        return self.noise_multiplier * self.params.clip_norm

    def privatise(self, g: np.ndarray) -> np.ndarray:
        """g' (b, m) float64: each row of the per-example logit gradients ``g`` (b, m) clipped to C, plus
        N(0, (z C)^2) per entry from the secret generator."""
        clipped = clip_rows(g, self.params.clip_norm)
        return clipped + self._rng.normal(0.0, self.noise_std, size=clipped.shape)

    def epsilon(self, releases: int | None = None) -> float:
        """ε (nats) at ``params.delta`` after ``releases`` releases per example (default: those counted)."""
        return self._accountant.epsilon(self.params.delta, self.releases if releases is None else releases)

    def record(self) -> dict:
        """The guarantee so far as a JSON-ready dict (metrics.json, the model bundle's ``extra.privacy``)."""
        p = self.params
        eps = self.epsilon()
        return {"mechanism": "gaussian", "unit": "label", "protects": "the guest's labels against the hosts",
                "neighbouring": "replace one example's label", "clip_norm": p.clip_norm,
                "noise_multiplier": self.noise_multiplier, "noise_std": self.noise_std,
                "sensitivity": 2 * p.clip_norm, "releases_per_example": self.releases,
                "amplification": False, "epsilon": eps if math.isfinite(eps) else None, "delta": p.delta,
                "accountant": p.accountant, "target_epsilon": p.target_epsilon,
                "test_noise_seed": p.noise_seed is not None}
