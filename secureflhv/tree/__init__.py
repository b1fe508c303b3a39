"""SecureBoost: federated histogram gradient boosting, vertical (Paillier) and horizontal (secure aggregation).

Modules: :mod:`.params` (hyperparameters, objectives, fixed-point grid), :mod:`.binning`,
:mod:`.split` (gain, leaf weight, candidate validity of both federated trees),
:mod:`.reference` (the centralised twin), :mod:`.vertical` (guest/host roles; encrypted histograms
through :mod:`secureflhv.crypto.homomorphic.backend`), :mod:`.horizontal` (server/client roles), :mod:`.xgb_export`.
See docs/secureboost.md.
"""
from .model import BoostedModel, Node, Tree
from .params import SecureBoostParams

__all__ = ["BoostedModel", "Node", "SecureBoostParams", "Tree"]
