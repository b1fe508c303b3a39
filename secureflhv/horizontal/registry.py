"""The horizontal strategy registry: every strategy a job or a test can name, built by :func:`make_strategy`.

* the FedAvg family (:mod:`.strategies`): ``fedavg``, ``fedprox``, ``scaffold``, ``fednova`` — each
  composable with client contribution normalisation (:mod:`.contribution`, ``FLConfig.contribution_temperature``);
* the non-IID remedies: ``ifca`` (clustered FL, :mod:`.ifca`) and ``fedper`` (personal head, :mod:`.fedper`).

All of them aggregate through the job's aggregation kind (secure aggregation by default).
"""
from __future__ import annotations

from . import strategies
from .fedper import FedPer
from .ifca import IFCA
from .strategies import STRATEGIES, Strategy

REMEDIES = ("ifca", "fedper")
ALL_STRATEGIES = STRATEGIES + REMEDIES


def make_strategy(name: str, *, mu: float = 0.01, clusters: int = 2, personal_layers: int = 1) -> Strategy:
    """A fresh strategy instance by name: ``mu`` for FedProx, ``clusters`` (k) for IFCA,
    ``personal_layers`` (final linear layers kept local) for FedPer. Raises ValueError naming the choices."""
    if name == "ifca":
        return IFCA(clusters)
    if name == "fedper":
        return FedPer(personal_layers)
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} unknown; choose one of {', '.join(ALL_STRATEGIES)}")
    return strategies.make_strategy(name, mu=mu)
