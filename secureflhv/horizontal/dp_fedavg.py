"""Client-level differential privacy of FedAvg / FedProx with the noise added centrally (DP-FedAvg, McMahan,
Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018, Algorithm 1 with
fixed client weights).

Per round, each selected client clips its model delta to L2 norm C (:func:`secureflhv.dp.mechanisms.clip_l2`) and
submits it with weight 1 through the job's aggregation; the server, after unmasking the sum Σ of the survivors'
clipped deltas, checks ‖Σ‖₂ ≤ n·C (up to the quantisation's slack; a round above it is refused, the model left as
it was), adds N(0, (z·C)²) to every coordinate and steps by (Σ + noise) / n. The sum's sensitivity to one client
(added or removed) is C, so each released round is the Gaussian mechanism with noise multiplier z; rounds compose
(:class:`secureflhv.dp.ClientLevelAccountant`, dp-accounting's RDP or PLD). Client sampling here is drawn from a
seed the server knows, so no amplification by subsampling is claimed.

What each role learns, beyond FedAvg: nothing more; the **server is trusted with the un-noised sum** of each round
(placement ``central``; secure aggregation still hides each client's own update). Whoever receives the released
models (every client, and anyone a bundle reaches) learns only what the (ε, δ) bound allows about any one client's
data. The noise comes from OS entropy (``noise_seed`` only for tests: knowing the seed removes the noise).
"""
from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..dp.mechanisms import clip_l2
from ..secagg import AggregateResult, AggregationConfig


class ClientDP(ABC):
    """What the FL roles ask of client-level DP, whichever the placement of the noise (:class:`CentralDP` here,
    :class:`~secureflhv.horizontal.dp_distributed.DistributedDP`). Implementations are frozen dataclasses with
    ``delta``, ``epsilon_budget`` and ``placement``."""

    placement: str
    delta: float
    epsilon_budget: float | None
    # a placement that replaces the clients' local training sets a method local_update(model, global_vec, X, y)
    # -> ClientUpdate (record-level DP-GD, :mod:`.dp_record_sum`); None: the strategy trains as usual
    local_update = None

    def bound(self, dim: int) -> "ClientDP":
        """These settings for a model of ``dim`` parameters (default: the same)."""
        return self

    def aggregation_for(self, config: AggregationConfig) -> AggregationConfig:
        """The aggregation settings of the ``model`` part (default: the job's)."""
        return config

    def agg_dim(self, dim: int) -> int:
        """The length of the vector the ``model`` part aggregates for a model of ``dim`` parameters."""
        return dim

    @abstractmethod
    def client_input(self, update: np.ndarray, round_id: int, n_selected: int, party_id: str, weight: float = 1.0
                     ) -> tuple[np.ndarray, float]:
        """What a client submits for its model delta ``update`` (float64 (d,)) with the strategy's ``weight``
        (its record count): (vector, weight)."""

    @abstractmethod
    def release(self, global_vec: np.ndarray, res: AggregateResult, round_id: int, n_selected: int
                ) -> tuple[np.ndarray | None, str]:
        """(the new global model float32 (d,), "") from the round's unmasked sum, or (None, why it is refused)."""

    @abstractmethod
    def accountant_for(self):
        """A fresh accountant (no round recorded): :class:`~secureflhv.dp.ClientLevelAccountant` or
        :class:`~secureflhv.dp.SkellamAccountant`."""

    def account(self, accountant, res: AggregateResult, n_selected: int) -> dict:
        """Record the released round in ``accountant``; returns what the round's record adds (default nothing)."""
        accountant.step()
        return {}

    def replay(self, accountant, record: dict) -> None:
        """Record in ``accountant`` a round released before a resume, from its round record's ``privacy``."""
        accountant.step()

    def describe(self) -> dict:
        """The placement's parameters for the round records and the bundle (JSON-ready)."""
        return {"placement": self.placement}


@dataclass(frozen=True)
class CentralDP(ClientDP):
    """DP-FedAvg with the noise added by the server (module docstring).

    Attributes:
        clip_norm: C, the L2 clip of a client's model delta per round.
        noise_multiplier: z > 0 (noise std z·C per coordinate of the sum).
        delta: δ of the reported (ε, δ).
        epsilon_budget: stop before a round would take ε past it (None: no budget).
        accountant: ``rdp`` or ``pld``.
        sampling_rate: the share of clients selected per round (recorded; not amplified).
        noise_seed: tests only; None draws the noise from OS entropy.
    """

    clip_norm: float
    noise_multiplier: float
    delta: float = 1e-5
    epsilon_budget: float | None = None
    accountant: str = "rdp"
    sampling_rate: float = 1.0
    noise_seed: int | None = None
    placement = "central"

    def clip(self, delta_vec: np.ndarray) -> np.ndarray:
        """A client's model delta (float64 (d,)) clipped to L2 norm C."""
        return clip_l2(delta_vec, self.clip_norm)[0]

    def client_input(self, update, round_id, n_selected, party_id, weight=1.0):
        """The delta clipped to C, with weight 1 (every client counts the same in DP-FedAvg)."""
        return self.clip(update), 1.0

    def accountant_for(self):
        """A fresh :class:`secureflhv.dp.ClientLevelAccountant` of these settings (no round recorded)."""
        from ..dp.accounting import ClientLevelAccountant

        return ClientLevelAccountant(self.noise_multiplier, self.clip_norm, self.sampling_rate, amplification=False,
                                     accountant=self.accountant)

    def sum_refusal(self, total: np.ndarray, n: float, slack: float) -> str:
        """Why the unmasked sum of ``n`` clipped deltas is impossible ('' when it is not): its L2 norm exceeds n·C
        plus ``slack`` (the quantisation's worst case), so some client did not clip."""
        norm = float(np.linalg.norm(total))
        if not math.isfinite(norm) or norm > n * self.clip_norm + slack:
            return (f"the sum of {n:g} clipped updates has L2 norm {norm:.6g} > {n:g} x clip_norm {self.clip_norm:g} "
                    f"(+ {slack:.3g} quantisation slack): a client did not clip its update")
        return ""

    def release(self, global_vec, res, round_id, n_selected):
        """Check ‖Σ‖₂ ≤ n·C (+ the quantisation's slack), then step by (Σ + noise) / n."""
        slack = math.sqrt(res.total.size) * res.weight / res.scale if res.k_bits else 1e-9 * res.weight
        why = self.sum_refusal(res.total, res.weight, slack)
        return (None, why) if why else (self.noised_step(global_vec, res.total, res.weight, round_id), "")

    def noised_step(self, global_vec: np.ndarray, total: np.ndarray, n: float, round_id: int) -> np.ndarray:
        """The new global model (float32): ``w + (Σ + N(0, (z·C)² I)) / n``."""
        rng = np.random.default_rng(secrets.randbits(128) if self.noise_seed is None else [self.noise_seed, round_id])
        noise = rng.normal(0.0, self.noise_multiplier * self.clip_norm, size=total.shape)
        return (np.asarray(global_vec, np.float64) + (total + noise) / n).astype(np.float32)
