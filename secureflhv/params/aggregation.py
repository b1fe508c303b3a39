"""How horizontal updates are summed: the ``params.aggregation`` of a job (Bonawitz et al. 2017).

:class:`secureflhv.secagg.AggregationConfig` extends it with what the job supplies (its clients, the
input timeout) and the derived quantities (threshold for n clients, quantisation); the security
argument of each field is there and in docs/security.md.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Kind = Literal["secagg", "plain", "plain_quantised"]
KINDS = ("secagg", "plain", "plain_quantised")


class AggregationParams(BaseModel):
    """Settings of the aggregation layer, identical at the server and every client.

    Raises (at validation, each message starting with the field's name):
        ValueError: an unknown kind, a threshold fraction not in (1/2, 1] or an int threshold < 2,
            min_clients < 2, max_colluders < 0, a clip that is not positive and finite, precision_bits
            outside [0, 40], a timeout <= 0.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind = Field(default="secagg", description="secagg: the server learns only the sum; plain: it sees "
                                                     "every weighted update; plain_quantised: secagg's quantisation "
                                                     "without masks (tests)")
    threshold: int | float | None = Field(default=None, description="t, or a fraction of the selected clients")
    clip: float = Field(default=1.0, description="clip range of each coordinate (before weighting)")
    precision_bits: int = Field(default=16, description="fixed-point scale 2**precision_bits")
    max_weight: float = Field(default=float(1 << 20), gt=0, description="largest weight a client may send")
    consistency_check: bool = Field(default=True, description="Bonawitz's ConsistencyCheck round")
    min_clients: int = Field(default=3, description="fewest clients a round may sum; 2 is an explicit opt-in "
                             "(each of two clients learns the other's update from the sum) and needs max_colluders 0")
    max_colluders: int = Field(default=1, description="clients that may collude with a malicious server; t is "
                               "derived so that n_C < 2t − n (Bonawitz et al. 2017, Thm 6.5)")
    stage_timeout_s: float = Field(default=30.0, description="server wait per stage after the first")
    input_timeout_s: float | None = Field(default=None, description="server wait for each client's first message "
                                                                    "(covers local training); None: job.deadline_s")
    seed: int | None = Field(default=None, ge=0, description="stochastic rounding seed (tests)")

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v):
        if v not in KINDS:
            raise ValueError(f"aggregation kind {v!r} unknown; choose one of {KINDS}")
        return v

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold(cls, th):
        if th is None:
            return th
        if isinstance(th, bool) or not isinstance(th, (int, float)):
            raise ValueError(f"threshold must be an int count, a fraction in (1/2, 1] or None, got {th!r}")
        if isinstance(th, float) and not 0.5 < th <= 1:
            raise ValueError(f"threshold fraction must be in (1/2, 1] so that t > n/2 for every n, got {th}; "
                             f"give an int for a count")
        if isinstance(th, int) and th < 2:
            raise ValueError(f"threshold must be >= 2 (t > n/2 with n >= 2 clients), got {th}")
        return th

    @field_validator("clip")
    @classmethod
    def _clip(cls, v):
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"clip must be positive and finite, got {v}")
        return v

    @field_validator("precision_bits")
    @classmethod
    def _precision(cls, v):
        if not 0 <= v <= 40:
            raise ValueError(f"precision_bits must be in [0, 40], got {v}")
        return v

    @field_validator("min_clients", "max_colluders", mode="before")
    @classmethod
    def _counts(cls, v, info):
        low, why = {"min_clients": (2, " (a sum of one client reveals its update)"), "max_colluders": (0, "")}[
            info.field_name]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{info.field_name} must be an int >= {low}{why}, got {v!r}")
        return v

    @field_validator("stage_timeout_s", "input_timeout_s")
    @classmethod
    def _timeout(cls, v, info):
        if v is not None and not v > 0:
            raise ValueError(f"{info.field_name} must be > 0, got {v}")
        return v
