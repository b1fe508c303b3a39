"""The user's own training and evaluation loops, with what each strategy needs applied for them.

``params.train`` / ``params.evaluate`` name functions of the consortium's code::

    def train(model, loader, ctx):          # one round of local training
        opt = ctx.optimizer()               # torch.optim.SGD with the job's settings, strategy-aware
        for _ in range(ctx.epochs):
            for x, y in loader:
                x, y = x.to(ctx.device), y.to(ctx.device)
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        return {"loss": float(loss)}        # optional: the mean training loss, for the round log

    def evaluate(model, loader, ctx):       # -> {"loss": mean loss, "accuracy": ...} ("mae" too for regression)

**What a custom loop must do, per strategy** (docs/byom.md): make every optimiser step through
``ctx.optimizer()`` or through ``ctx.wrap(your_optimizer)``. The wrapper applies

* FedProx (Li et al., MLSys 2020): the proximal gradient ``mu · (w − w_global)`` added to each gradient before
  the step (the gradient of ``(mu/2)‖w − w_global‖²``);
* SCAFFOLD (Karimireddy et al., ICML 2020, option II): ``w ← w − lr·(c − c_i)`` after each step, and it records
  Σ lr over the steps, which replaces K·lr in ``c_i⁺`` (equal for a constant lr; a scheduler is allowed);
* FedNova (Wang et al., NeurIPS 2020): it counts the steps τ_i; a_i assumes SGD with the job's ``momentum``,
  so the wrapper refuses another optimiser or momentum for FedNova;
* FedAvg, contribution normalisation, IFCA and FedPer need nothing more (IFCA chooses its cluster with the
  user's ``evaluate``; FedPer keeps the head out of the update itself).

The loader yields ``(x, y)`` batches of ``params.batch_size`` in an order drawn from the job's seed, the round and
the client (:func:`~.strategies.batch_rng`); each pass over it is a new permutation, so a loop of ``ctx.epochs``
passes sees the batches the built-in loop would. A loop that makes no step through the wrapper is an error
(the strategies need the step count). Nothing of the loop travels: only the update vector, as with the built-in loop.

Under record-level DP-SGD (``params.record_dp``, :mod:`.dp_sgd`) the loader is Opacus's Poisson-sampling one (batch
sizes vary, a batch may be empty), the wrapper clips and noises each step (one optimiser a round, no closure), the
model carries Opacus's per-record gradient hooks during the round, and the loss it returns is kept at the client.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from .local_data import DatasetRows, Rows
from .models import model_device
from .strategies import LocalTrainConfig, split_like


class _Permutations(Sampler):
    """A fresh permutation of ``range(n)`` from ``rng`` for every pass (one pass = one epoch)."""

    def __init__(self, rng: np.random.Generator, n: int):
        self.rng, self.n = rng, n

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def _device(optimizer: torch.optim.Optimizer) -> torch.device:
    """The device of ``optimizer``'s first parameter (CPU when it has none)."""
    return next((p.device for g in optimizer.param_groups for p in g["params"]), torch.device("cpu"))


class _Counted:
    """A loader that counts the batches it yields (DP-SGD accounts one sampled batch per step); everything else
    is the wrapped loader's."""

    def __init__(self, loader):
        self.loader, self.drawn = loader, 0

    def __iter__(self):
        for batch in self.loader:
            self.drawn += 1
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class StrategyOptimizer:
    """A torch optimiser with the strategy's per-step work around ``step()`` (module docstring); every other
    attribute (``param_groups``, ``state_dict`` ...) is the wrapped optimiser's, so schedulers work on it."""

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: str, cfg: LocalTrainConfig,
                 prox: list | None, mu: float, correction: list | None, dp=None):
        if strategy == "fednova" and not (isinstance(optimizer, torch.optim.SGD)
                                          and all(g.get("momentum", 0.0) == cfg.momentum for g in optimizer.param_groups)):
            raise ValueError(f"FedNova's a_i assumes torch.optim.SGD with params.momentum = {cfg.momentum}; the training "
                             f"loop's optimiser is {type(optimizer).__name__}")
        self.inner, self.prox, self.mu, self.correction = optimizer, prox, mu, correction
        # record-level DP-SGD (:mod:`.dp_sgd`): (RecordDP, Opacus's DPOptimizer around ``optimizer``), or None
        self.dp = (dp, dp.privatize(optimizer, _device(optimizer))) if dp is not None else None
        self.steps, self.lr_sum = 0, 0.0
        self._group_lr = {id(p): g for g in optimizer.param_groups for p in g["params"]}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimiser's ``zero_grad`` (under DP-SGD Opacus's, which clears the per-record gradients)."""
        (self.dp[1] if self.dp is not None else self.inner).zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable | None = None):
        """Proximal gradient, the optimiser's step, SCAFFOLD's correction; counts the step. Under DP-SGD Opacus
        first clips and noises the per-record gradients and the proximal gradient joins after the noise
        (:meth:`~.dp_sgd.RecordDP.step`); a closure is refused there (it would recompute the gradients)."""
        if self.dp is not None:
            if closure is not None:
                raise ValueError("params.record_dp: DP-SGD does not take optimizer.step(closure)")
            self.dp[0].step(self.dp[1], (self.mu, self.prox) if self.prox is not None else None)
            result = None
        else:
            if self.prox is not None:
                with torch.no_grad():
                    for p, anchor in self.prox:
                        if p.grad is not None:
                            p.grad.add_(p.detach() - anchor, alpha=self.mu)
            result = self.inner.step(closure)
        lr = float(self.inner.param_groups[0]["lr"])
        if self.correction is not None:
            with torch.no_grad():
                for p, d in self.correction:
                    group = self._group_lr.get(id(p))
                    p.sub_((group["lr"] if group is not None else lr) * d)
        self.steps += 1
        self.lr_sum += lr
        return result


@dataclass
class TrainContext:
    """What the user's ``train`` / ``evaluate`` receive besides the model and the loader.

    Attributes: ``round`` (1-based), ``client`` (this party's id), ``epochs``, ``batch_size``, ``lr`` (this
    round's), ``momentum``, ``weight_decay`` (the job's local training settings), ``device`` (torch.device),
    ``strategy`` (its name), ``optimizer_name`` (``params.optimizer``); :meth:`optimizer` and :meth:`wrap`.
    """

    round: int
    client: str
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    device: torch.device
    strategy: str
    optimizer_name: str = "sgd"
    _model: nn.Module | None = None
    _prox: tuple | None = None
    _correction: np.ndarray | None = None
    wrapped: list = field(default_factory=list)
    _dp: object | None = None  # record-level DP-SGD (:class:`~.dp_sgd.RecordDP`), or None

    def optimizer(self, params=None) -> StrategyOptimizer:
        """The job's optimiser (``params.optimizer``: SGD by default) over ``params`` (default: the model's trainable
        ones) with the job's lr (this round's, under ``params.lr_scheduler``), momentum and weight decay, wrapped
        (:meth:`wrap`)."""
        params = [p for p in self._model.parameters() if p.requires_grad] if params is None else params
        return self.wrap(self._config().make_optimizer(params))

    def _config(self) -> LocalTrainConfig:
        return LocalTrainConfig(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                                weight_decay=self.weight_decay, optimizer=self.optimizer_name)

    def wrap(self, optimizer: torch.optim.Optimizer) -> StrategyOptimizer:
        """``optimizer`` with the strategy's per-step work (module docstring). ValueError for FedNova with
        another optimiser than SGD at the job's momentum."""
        prox = split_like(self._model, self._prox[1]) if self._prox is not None else None
        corr = split_like(self._model, self._correction) if self._correction is not None else None
        mu = self._prox[0] if self._prox else 0.0
        if self._dp is not None and self.wrapped:
            raise ValueError("params.record_dp: under DP-SGD the training loop may use one optimiser a round "
                             "(each step is accounted as one Poisson-sampled batch)")
        opt = StrategyOptimizer(optimizer, self.strategy, self._config(), prox, mu, corr, self._dp)
        self.wrapped.append(opt)
        return opt


def _dataset(X: Rows, y: np.ndarray) -> Dataset:
    if isinstance(X, DatasetRows):
        return X.dataset
    labels = torch.from_numpy(np.asarray(y, np.float32 if y.dtype.kind == "f" else np.int64))
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)), labels)


class UserLoop:
    """The job's ``train`` / ``evaluate`` functions (either may be None: the built-in one is used), bound to a
    client. :meth:`begin` tells it the round before the strategy trains."""

    def __init__(self, train: Callable | None, evaluate: Callable | None, client: str, strategy: str,
                 cfg: LocalTrainConfig):
        self.train_fn, self.evaluate_fn, self.client, self.strategy, self.cfg = train, evaluate, client, strategy, cfg
        self.round = 0
        self.lr_sum: float | None = None  # Σ lr of the last training (SCAFFOLD's K·lr)

    def begin(self, round_id: int) -> None:
        """The round that the next :meth:`train` belongs to."""
        self.round = round_id

    def context(self, model: nn.Module, cfg: LocalTrainConfig, prox=None, correction=None) -> TrainContext:
        """The :class:`TrainContext` of this round."""
        return TrainContext(self.round, self.client, cfg.epochs, cfg.batch_size, cfg.lr, cfg.momentum,
                            cfg.weight_decay, model_device(model), self.strategy, cfg.optimizer, model, prox, correction)

    def train(self, model: nn.Module, X: Rows, y: np.ndarray, cfg: LocalTrainConfig, rng: np.random.Generator | None,
              *, prox=None, correction=None, dp=None) -> tuple[int, float]:
        """Run the user's ``train`` for one round; (steps, mean loss or NaN). ValueError when it made no step
        through the context's optimiser, or returned something other than None, a number or a dict.

        ``dp`` (:class:`~.dp_sgd.RecordDP`): record-level DP-SGD; the loader is Opacus's Poisson-sampling one (from
        the client's own entropy, ``rng`` unused), the optimisers clip and noise, the model gets per-record
        gradient hooks for the round (ValueError naming ``params.model`` when Opacus does not support it); the
        loss returned is NaN (not private), a loop that steps more often than it drew batches is refused."""
        ctx = self.context(model, cfg, prox, correction)
        model.train()
        if dp is None:
            loader = DataLoader(_dataset(X, y), batch_size=cfg.batch_size, sampler=_Permutations(rng, len(y)))
            out = self.train_fn(model, loader, ctx)
        else:
            ctx._dp, loader = dp, _Counted(dp.loader(_dataset(X, y)))
            with dp.hooks(model):
                out = self.train_fn(model, loader, ctx)
        steps = sum(o.steps for o in ctx.wrapped)
        if dp is not None and steps > loader.drawn:
            raise ValueError(f"params.record_dp: {self.client}'s training loop made {steps} optimiser steps from "
                             f"{loader.drawn} batches of the loader; DP-SGD accounts one sampled batch per step")
        if steps == 0:
            raise ValueError(f"params.train: {self.client}'s training loop made no optimiser step through "
                             f"ctx.optimizer() or ctx.wrap(optimizer) ({self.strategy} needs them)")
        self.lr_sum = sum(o.lr_sum for o in ctx.wrapped)
        loss = out.get("loss", math.nan) if isinstance(out, dict) else (math.nan if out is None else out)
        if not isinstance(loss, (int, float)):
            raise ValueError(f"params.train: the training loop returned {type(out).__name__}; return None, the loss "
                             f"or a dict with 'loss'")
        if dp is not None:
            dp.last_loss = float(loss)
            return steps, math.nan
        return steps, float(loss) if math.isfinite(loss) else 0.0

    @torch.no_grad()
    def evaluate(self, model: nn.Module, X: Rows, y: np.ndarray) -> dict[str, float]:
        """The user's ``evaluate`` on (X, y), as :func:`~.models.evaluate`'s sums (correct, n, sse, sae, y sums).
        ValueError when its result lacks ``loss`` (and ``accuracy`` or ``correct``, or for regression ``mae``)."""
        n = len(y)
        loader = DataLoader(_dataset(X, y), batch_size=self.cfg.batch_size, shuffle=False)
        model.train(False)
        out = self.evaluate_fn(model, loader, self.context(model, self.cfg))
        if not isinstance(out, dict) or not isinstance(out.get("loss"), (int, float)):
            raise ValueError("params.evaluate: return a dict with 'loss' (the mean loss) and 'accuracy' (or 'mae')")
        loss = float(out["loss"])
        if model.task == "regression":
            if "mae" not in out:
                raise ValueError("params.evaluate: a regression model's evaluate must return 'mae' too")
            yy = np.asarray(y, np.float64)
            return {"accuracy": math.nan, "loss": loss, "correct": 0.0, "n": float(n), "sse": loss * n,
                    "sae": float(out["mae"]) * n, "y_sum": float(yy.sum()), "y2_sum": float(yy @ yy)}
        if "correct" in out:
            correct = float(out["correct"])
        elif "accuracy" in out:
            correct = float(round(float(out["accuracy"]) * n))
        else:
            raise ValueError("params.evaluate: return 'accuracy' or 'correct' for a classifier")
        if not 0 <= correct <= n:
            raise ValueError(f"params.evaluate: {correct} correct of {n} rows")
        return {"accuracy": correct / n if n else math.nan, "loss": loss, "correct": correct, "n": float(n)}
