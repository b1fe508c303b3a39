"""MultiConfederated learning: the rules (Duchesne, Zhang, Talhi, "MultiConfederated Learning: Inclusive
Non-IID Data handling with Decentralized Federated Learning", 2024, arXiv:2404.13421, Alg. 1–2).

Decentralised: there is **no server**. Every party (a *peer*) is learner and aggregator at once; the
peers exchange their trained models directly over the job's mTLS transport (the protocol is
:class:`~secureflhv.horizontal.mc_peer.MultiConfederatedPeer`). Instead of one global model the network
keeps a *pool* of models (each peer holds its own copy of every model); a peer follows the models that
suit its data, and groups of peers fork new models and merge models that became alike.

This module holds the numerics, independent of the wire (float64 arithmetic, float32 models):

* **selection** (Alg. 1): a peer ranks its pool by ``score + popularity_weight · popularity / n_peers``
  — score = accuracy of its copy on its own training rows, popularity = how many peers trained the
  model in the previous round — and trains the ⌈√|pool|⌉ best (ties: model id order);
* **divergence filter** (Alg. 2): for each model it follows, a peer computes each peer's weight
  divergence δ_j = ‖W_j − W_local‖ / ‖W_local‖ against its own freshly trained W_local and aggregates
  only the peers with δ_j ≤ median(δ) + tolerance · std(δ) (population std over the peers' δ; a lone
  candidate always passes) — :func:`divergence_filter`;
* **aggregation**: W ← Σ n_j W_j / Σ n_j over the peer itself and the accepted peers (n_j: sample counts);
* **fork**: when the aggregate scores more than ``fork_margin`` (accuracy) below the peer's own trained
  model on its rows, the peer forks: a new model (id ``<peer>@<round>``) starting from its own trained
  weights, which it trains (and so announces) next round; forks stop once the pool could exceed
  ``max_models`` (:func:`may_fork`);
* **merge**: two pool models with divergence ≤ ``merge_tolerance`` become their mean under the more
  popular id; the other is retired (:func:`merge_pool`).

Where this differs from the paper, and why: the paper's learners work asynchronously and record model
versions in a DAG; here rounds are synchronous (every peer sends one update per round to every other),
so the pool, the popularity counts and the fork ids are the same at every honest peer and a run is
reproducible from its seed (a gRPC run equals an in-process run). Popularity is the number of peers that
trained a model in the previous round; the fork criterion (local accuracy gap) and the merge criterion
(divergence) are this implementation's concrete choices for the paper's fork / merge of groups.

What each peer learns (as in the paper: **peers see each other's updates in the clear**, there is no
secure aggregation here): every other peer's trained weights of the models it trains each round, its
training sample count and mean training loss, and so which models (groups) it follows. Never a row of
another peer's data. docs/security.md lists this leak.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .strategies import LocalTrainConfig, Strategy

NAME = "multiconfederated"
MODEL_ID = re.compile(r"^(m[0-9]{1,3}|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}@[0-9]{1,9})$")


@dataclass(frozen=True)
class MCConfig:
    """Settings shared by every peer (they must agree: the job file holds them).

    Attributes:
        rounds: communication rounds.
        seed: seeds the initial models (model j from ``seed + 7919·j``) and every peer's batch order.
        local: local training settings.
        initial_models: models in the pool at start (None: ⌈√n_peers⌉, at least 2).
        tolerance: the divergence filter's tolerance (median + tolerance · std), >= 0.
        popularity_weight: weight of popularity (share of peers) against local accuracy in selection.
        fork_margin: accuracy gap (own trained − aggregate, on the peer's rows) above which it forks.
        merge_tolerance: divergence at or below which two models merge.
        max_models: most models ever announced in the network (initial + forks); bounds every peer's work.
        round_timeout_s: how long a peer waits for each other peer's update of a round.
        send_timeout_s: how long a peer keeps trying to deliver its update to one peer.
    """

    rounds: int = 5
    seed: int = 0
    local: LocalTrainConfig = LocalTrainConfig()
    initial_models: int | None = None
    tolerance: float = 1.0
    popularity_weight: float = 0.1
    fork_margin: float = 0.1
    merge_tolerance: float = 0.01
    max_models: int = 8
    round_timeout_s: float = 600.0
    send_timeout_s: float = 30.0

    def __post_init__(self):
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        for name in ("tolerance", "popularity_weight", "fork_margin", "merge_tolerance"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if self.initial_models is not None and not 1 <= self.initial_models <= self.max_models:
            raise ValueError(f"initial_models must be in [1, max_models={self.max_models}], got {self.initial_models}")
        if not 1 <= self.max_models <= 64:
            raise ValueError(f"max_models must be in [1, 64], got {self.max_models}")

    def n_initial(self, n_peers: int) -> int:
        """Models in the pool at start: ``initial_models`` or max(2, ⌈√n_peers⌉), capped by ``max_models``."""
        k = self.initial_models if self.initial_models is not None else max(2, math.ceil(math.sqrt(n_peers)))
        return min(k, self.max_models)


def initial_ids(k: int) -> list[str]:
    """The ids of the ``k`` initial models: ``m0 .. m<k-1>``."""
    return [f"m{j}" for j in range(k)]


def n_selected(pool_size: int) -> int:
    """⌈√|pool|⌉: how many models a peer trains per round (Alg. 1)."""
    return max(1, math.ceil(math.sqrt(pool_size)))


def max_selected(max_models: int) -> int:
    """The most models one peer's update may carry (receivers bound messages with it)."""
    return n_selected(max_models)


def divergence(w_peer: np.ndarray, w_local: np.ndarray) -> float:
    """Weight divergence ‖W_peer − W_local‖ / ‖W_local‖ (float64; ``inf`` when W_local is all zeros)."""
    a, b = np.asarray(w_peer, np.float64), np.asarray(w_local, np.float64)
    denom = float(np.linalg.norm(b))
    diff = float(np.linalg.norm(a - b))
    return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)


def divergence_filter(divergences, tolerance: float) -> np.ndarray:
    """Boolean mask of the accepted peers: δ_j <= median(δ) + tolerance · std(δ) (population std).

    An empty list gives an empty mask; the smallest δ always passes (it is <= the median).
    """
    d = np.asarray(list(divergences), dtype=np.float64)
    if d.size == 0:
        return np.zeros(0, dtype=bool)
    if not np.all(np.isfinite(d)):
        # an infinite divergence (zero local model) cannot be compared: keep only the finite ones' rule
        finite = np.isfinite(d)
        out = np.zeros(d.size, dtype=bool)
        out[finite] = divergence_filter(d[finite], tolerance)
        return out
    return d <= np.median(d) + tolerance * np.std(d)


def weighted_mean(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Σ w_j v_j / Σ w_j in float64, returned as float32."""
    acc = np.zeros(np.asarray(vectors[0]).shape, dtype=np.float64)
    for v, w in zip(vectors, weights):
        acc += float(w) * np.asarray(v, np.float64)
    return (acc / float(sum(weights))).astype(np.float32)


def rank(pool_ids, scores: dict[str, float], popularity: dict[str, int], n_peers: int,
         popularity_weight: float) -> list[str]:
    """Pool ids best first by ``score + popularity_weight · popularity / n_peers`` (ties: id order)."""
    def key(m):
        return (-(scores[m] + popularity_weight * popularity.get(m, 0) / n_peers), m)
    return sorted(pool_ids, key=key)


def select(pool_ids, scores, popularity, n_peers, popularity_weight, must: str | None = None) -> list[str]:
    """The ⌈√|pool|⌉ best models (Alg. 1), in rank order; ``must`` (a fresh fork) replaces the last if absent."""
    ranked = rank(pool_ids, scores, popularity, n_peers, popularity_weight)
    chosen = ranked[:n_selected(len(ranked))]
    if must is not None and must not in chosen:
        chosen = chosen[:-1] + [must]
    return chosen


def may_fork(n_announced: int, n_peers: int, max_models: int) -> bool:
    """Whether forks are allowed after a round whose shared announced set has ``n_announced`` ids: every
    peer might fork in the same round, so forking stops while n_announced + n_peers > max_models.
    Every honest peer evaluates this on the same set, so receivers can check a fork with it."""
    return n_announced + n_peers <= max_models


def merge_pool(pool: dict[str, np.ndarray], popularity: dict[str, int], tol: float) -> list[tuple[str, str]]:
    """Merge models of ``pool`` (in place) whose divergence is <= ``tol``: the pair becomes its mean under
    the more popular id (ties: the smaller id), the other id is removed. Returns [(kept, retired)].
    One greedy pass over the sorted ids, so the result does not depend on dict order."""
    merged = []
    ids = sorted(pool)
    gone: set[str] = set()
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            if a in gone or b in gone:
                continue
            if divergence(pool[b], pool[a]) <= tol:
                keep, drop = (b, a) if popularity.get(b, 0) > popularity.get(a, 0) else (a, b)
                pool[keep] = weighted_mean([pool[a], pool[b]], [1.0, 1.0])
                del pool[drop]
                gone.add(drop)
                merged.append((keep, drop))
    return merged


class MultiConfederated(Strategy):
    """The MultiConfederated strategy: hyperparameters and local training for the peers.

    It has no server half: :class:`~secureflhv.horizontal.fl.HorizontalServer` / ``HorizontalClient``
    refuse it (``decentralised``); run :class:`~secureflhv.horizontal.mc_peer.MultiConfederatedPeer`
    (job algorithm ``multiconfederated``). Local training is the FedAvg family's (:meth:`client_update`).
    """

    name = NAME
    decentralised = True
    sample_weighted_parts = ()

    def __init__(self, tolerance: float = 1.0, popularity_weight: float = 0.1, fork_margin: float = 0.1,
                 merge_tolerance: float = 0.01, max_models: int = 8, initial_models: int | None = None):
        probe = MCConfig(tolerance=tolerance, popularity_weight=popularity_weight, fork_margin=fork_margin,
                         merge_tolerance=merge_tolerance, max_models=max_models, initial_models=initial_models)
        self.tolerance, self.popularity_weight = probe.tolerance, probe.popularity_weight
        self.fork_margin, self.merge_tolerance = probe.fork_margin, probe.merge_tolerance
        self.max_models, self.initial_models = probe.max_models, probe.initial_models

    def hyperparameters(self) -> dict:
        """The model-management settings, for the model bundle's metadata."""
        return {"tolerance": self.tolerance, "popularity_weight": self.popularity_weight,
                "fork_margin": self.fork_margin, "merge_tolerance": self.merge_tolerance,
                "max_models": self.max_models, "initial_models": self.initial_models}

    def config(self, *, rounds: int, seed: int, local: LocalTrainConfig, round_timeout_s: float = 600.0,
               send_timeout_s: float = 30.0) -> MCConfig:
        """The peers' :class:`MCConfig` with these hyperparameters."""
        return MCConfig(rounds=rounds, seed=seed, local=local, round_timeout_s=round_timeout_s,
                        send_timeout_s=send_timeout_s, **self.hyperparameters())

    def server_init(self, dim, initial=None):
        """Always ValueError: the algorithm has no server (its peers run :class:`MultiConfederatedPeer`)."""
        raise ValueError("multiconfederated is decentralised: it has no server (run MultiConfederatedPeer)")
