"""Record-level differential privacy of the exact integer sums a job releases (``params.preprocessing.dp``, and
later horizontal SecureBoost's histograms): distributed Skellam noise inside secure aggregation
(:mod:`secureflhv.dp.integer_sums`; docs/privacy.md).

The unit is one record (a row added or removed); every client adds its share of integer Skellam noise to its
integer vector before masking, so nobody sees an un-noised sum. Give ``noise_multiplier`` (each release's summed
noise std over its L2 sensitivity), or ``target_epsilon`` and every party calibrates the same multiplier for the
job's releases at ``delta``.
"""
from __future__ import annotations

from pydantic import ConfigDict, Field

from .privacy import NoiseChoice


class SumDPParams(NoiseChoice):
    """Distributed Skellam noise on a job's integer sums, record-level (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    noise_multiplier: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False,
                                           description="z: each release's noise std over its L2 sensitivity")
    target_epsilon: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                         description="calibrate z so that all the job's releases spend this ε")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the (ε, δ) guarantee; below 1/rows")
    noise_seed: int | None = Field(default=None, ge=0, description="TESTS ONLY: a seed for the noise (whoever "
                                                                    "knows it can remove the noise); None: OS entropy")

