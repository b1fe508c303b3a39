"""Parameter models that every job's ``params`` embeds: one definition, one name and one set of bounds per
concept (docs/parameters.md lists every field; docs/architecture.md, "Layers", places this package).

* :class:`HEKeyParams` / :class:`HEParams`: the additively homomorphic scheme, its key and the fixed-point
  precision of encrypted values (vertical LR, split NN; SecureBoost embeds the key part).
* :class:`EarlyStopping`: stop after ``early_stopping_rounds`` rounds without an improvement of more than
  ``min_delta`` (vertical LR, SecureBoost).
* :class:`MinibatchSGD` / :class:`LocalTraining`: a party's mini-batch training (split NN; horizontal FL and
  MultiConfederated).
* :class:`AggregationParams`: how horizontal updates are summed (:class:`secureflhv.secagg.AggregationConfig`
  adds what the job supplies).

Names follow XGBoost and the field (``learning_rate``, ``early_stopping_rounds``, ``min_delta``); the old
spellings are accepted for one release (:mod:`.aliases`). This package sits at the data layer's level: it
imports pydantic and crypto constants only, so every algorithm family and the runtime can embed it.
"""
from .aggregation import KINDS, AggregationParams, Kind
from .aliases import deprecated_names, with_defaults
from .he import HEKeyParams, HEParams
from .privacy import ClientDPParams
from .factory import FactoryError, FactoryRef
from .training import EarlyStopping, LocalTraining, MinibatchSGD

__all__ = ["AggregationParams", "ClientDPParams", "EarlyStopping", "FactoryError", "FactoryRef", "HEKeyParams", "HEParams", "KINDS", "Kind", "LocalTraining",
           "MinibatchSGD", "deprecated_names", "with_defaults"]
