"""A party's training loop settings: early stopping and mini-batch SGD.

Names follow XGBoost (``early_stopping_rounds``, ``learning_rate``) and Keras / XGBoost's
``EarlyStopping`` callback (``min_delta``).
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .aliases import deprecated_names


class EarlyStopping(BaseModel):
    """Stop after ``early_stopping_rounds`` rounds in a row whose monitored loss is not more than
    ``min_delta`` below the best so far (XGBoost's ``early_stopping_rounds``; Keras' ``patience`` /
    ``min_delta``). A round is an epoch (vertical LR) or a boosting round (SecureBoost); the monitored
    loss is :attr:`early_stopping_metric` of the embedding model. Off by default here; an algorithm
    sets its own defaults with :func:`~secureflhv.params.aliases.with_defaults`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    early_stopping_metric: ClassVar[str] = "validation loss"

    early_stopping_rounds: int | None = Field(
        default=None, ge=1, description="stop after this many rounds in a row without an improvement of more than "
                                        "min_delta; None: off")
    min_delta: float = Field(default=0.0, ge=0,
                             description="minimum decrease of the monitored loss that counts as an improvement")


class MinibatchSGD(BaseModel):
    """Mini-batch gradient steps of a party's own model: rows per batch and step size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(default=64, ge=1, description="rows per mini-batch")
    learning_rate: float = Field(default=0.01, gt=0, description="step size of the optimiser")


class LocalTraining(MinibatchSGD):
    """A client's local SGD in each round of horizontal FL (``torch.optim.SGD``: momentum, L2 weight
    decay). ``lr`` is the deprecated spelling of ``learning_rate``."""

    local_epochs: int = Field(default=1, ge=1, description="passes over the party's training rows per round")
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(default=1e-5, ge=0, description="SGD L2 weight decay")

    _old_names = model_validator(mode="before")(deprecated_names({"lr": "learning_rate"}))
