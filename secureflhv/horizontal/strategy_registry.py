"""The horizontal strategy registry: every strategy a job or a test can name, built by :func:`make_strategy`.

* the FedAvg family (:mod:`.strategies`): ``fedavg``, ``fedprox``, ``scaffold``, ``fednova`` — each
  composable with client contribution normalisation (:mod:`.contribution`, ``FLConfig.contribution_temperature``);
* the non-IID remedies: ``ifca`` (clustered FL, :mod:`.ifca`) and ``fedper`` (personal head, :mod:`.fedper`);
* decentralised: ``multiconfederated`` (MultiConfederated learning, :mod:`.mc_rules`): no server —
  its peers (:class:`~secureflhv.horizontal.mc_peer.MultiConfederatedPeer`) exchange their models peer to
  peer and see each other's updates; a job runs it as ``job.algorithm: multiconfederated``.

All but the decentralised ones aggregate through the job's aggregation kind (secure aggregation by default).
"""
from __future__ import annotations

from . import strategies
from .fedper import FedPer
from .ifca import IFCA
from .mc_rules import NAME as MULTICONFEDERATED
from .mc_rules import MultiConfederated
from .strategies import STRATEGIES, Strategy

REMEDIES = ("ifca", "fedper")
DECENTRALISED = (MULTICONFEDERATED,)  # no server role: run by their own peers, not HorizontalServer/Client
ALL_STRATEGIES = STRATEGIES + REMEDIES + DECENTRALISED


def make_strategy(name: str, *, mu: float = 0.01, clusters: int = 2, personal_layers: int = 1,
                  **mc) -> Strategy:
    """A fresh strategy instance by name: ``mu`` for FedProx, ``clusters`` (k) for IFCA,
    ``personal_layers`` (final linear layers kept local) for FedPer, ``mc`` (tolerance, popularity_weight,
    fork_margin, merge_tolerance, max_models, initial_models) for MultiConfederated.
    Raises ValueError naming the choices."""
    if name == MULTICONFEDERATED:
        return MultiConfederated(**mc)
    if mc:
        raise ValueError(f"strategy {name!r} takes no {sorted(mc)}")
    if name == "ifca":
        return IFCA(clusters)
    if name == "fedper":
        return FedPer(personal_layers)
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} unknown; choose one of {', '.join(ALL_STRATEGIES)}")
    return strategies.make_strategy(name, mu=mu)
