"""Differential privacy settings a job embeds (``params.dp``): what is protected, where the noise is added, and
how much (docs/privacy.md).

Names follow the field: clip norm C, noise multiplier z (noise standard deviation over C), ε and δ.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NoiseChoice(BaseModel):
    """Base of the DP settings that take the noise as ``noise_multiplier`` or as ``target_epsilon`` (exactly one;
    ValueError naming both fields otherwise). Subclasses declare the two fields."""

    @model_validator(mode="after")
    def _one_of(self):
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("noise_multiplier / target_epsilon: give one of the two")
        return self


class ClientDPParams(NoiseChoice):
    """Client-level DP of horizontal FL (DP-FedAvg, McMahan, Ramage, Talwar, Zhang, ICLR 2018): every client's
    update is clipped to L2 norm ``clip_norm`` and the sum of a round's updates gets Gaussian noise of standard
    deviation ``noise_multiplier · clip_norm`` per coordinate.

    ``placement: central``: the server adds the noise to the unmasked sum, so the server is trusted with the
    un-noised sum (secure aggregation still hides each client's own update from it). ``placement: distributed``:
    each client adds its share of Skellam noise in the integers before masking (Kairouz, Liu, Steinke, ICML 2021;
    Agarwal, Kairouz, Liu, NeurIPS 2021), in a ring of ``bits`` bits per coordinate, so nobody sees an un-noised
    sum; it needs ``aggregation.kind: secagg`` (``plain_quantised`` for tests). Give ``noise_multiplier`` (the
    sum's noise std z·C in model units), or ``target_epsilon`` and every party calibrates the same noise for
    ``rounds`` rounds at ``delta``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    placement: Literal["central", "distributed"] = Field(
        default="central", description="central: the server adds the noise to the unmasked sum (it is trusted with "
                                       "it); distributed: the clients add Skellam shares inside secure aggregation")
    clip_norm: float = Field(gt=0, allow_inf_nan=False, description="C: L2 clip of one client's update per round")
    noise_multiplier: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                           description="z: noise std over C on the round's sum")
    target_epsilon: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                         description="calibrate z so that all rounds spend this ε at delta")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the (ε, δ) guarantee; below 1/clients")
    epsilon_budget: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                         description="stop before a round would take ε beyond this")
    accountant: Literal["rdp", "pld"] = Field(default="rdp", description="dp-accounting's RDP or PLD accountant")
    bits: int = Field(default=18, ge=8, le=24, description="distributed: the ring's bits per coordinate (the "
                                                           "scale gamma is chosen so that the noised sum fits)")
    noise_seed: int | None = Field(default=None, ge=0, description="TESTS ONLY: a seed for the noise (whoever "
                                                                    "knows it can remove the noise); None: OS entropy")

