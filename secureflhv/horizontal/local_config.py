"""Local training settings of a horizontal FL client (:class:`LocalTrainConfig`): epochs, batch size, the optimiser
and its learning-rate schedule, record-level DP-SGD. Its own module so that the strategies and the DP-SGD step
(:mod:`.dp_sgd`) both read it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..params.record_privacy import RecordDPParams

OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}  # params.optimizer -> torch.optim class
# torch.optim.lr_scheduler classes a job may name (stepped once per round; none needs a metric)
LR_SCHEDULERS = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "ConstantLR",
                 "PolynomialLR")


@dataclass(frozen=True)
class LocalTrainConfig:
    """Local training settings (NIID-Bench's names in brackets).

    Attributes:
        epochs: local epochs per round [epochs].
        batch_size: mini-batch size [batch-size].
        lr: learning rate [lr] (of round 1 when ``lr_scheduler`` is set).
        momentum: SGD momentum [rho], in [0, 1).
        weight_decay: L2 weight decay [reg].
        optimizer: ``sgd`` (NIID-Bench), ``adam`` or ``adamw`` (torch's, with lr and weight decay).
        lr_scheduler: None, or (name of a torch.optim.lr_scheduler class in :data:`LR_SCHEDULERS`, its keyword
            arguments as sorted (key, value) pairs): the learning rate of round r is what that scheduler gives
            after r - 1 steps (:meth:`for_round`), so every client and a resumed job agree on it.
        dp_sgd: record-level DP-SGD at the client (``params.record_dp``, :mod:`.dp_sgd`), or None. The client's
            state (accountant, generators) lives in its strategy (:attr:`Strategy.record_dp`).
        dp_sgd_rounds: the job's rounds, needed to calibrate ``dp_sgd.target_epsilon``.
    """

    epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 1e-5
    optimizer: str = "sgd"
    lr_scheduler: tuple | None = None
    dp_sgd: RecordDPParams | None = None
    dp_sgd_rounds: int | None = None

    def __post_init__(self):
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_scheduler is not None and self.lr_scheduler[0] not in LR_SCHEDULERS:
            raise ValueError(f"lr_scheduler must be one of {LR_SCHEDULERS}, got {self.lr_scheduler[0]!r}")

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """A fresh optimiser (every round, as NIID-Bench) over ``params``: SGD with momentum, or Adam / AdamW."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return getattr(torch.optim, OPTIMIZERS[self.optimizer])(params, lr=self.lr, weight_decay=self.weight_decay)

    def round_lrs(self, rounds: int) -> list[float]:
        """The learning rate of rounds 1..``rounds`` under :attr:`lr_scheduler` (torch's own scheduler class,
        stepped once per round on a throw-away optimiser; constant without one). TypeError / ValueError from
        torch for bad scheduler arguments."""
        if self.lr_scheduler is None:
            return [self.lr] * rounds
        name, kwargs = self.lr_scheduler
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=self.lr)
        scheduler = getattr(torch.optim.lr_scheduler, name)(opt, **dict(kwargs))
        lrs = []
        for _ in range(rounds):
            lrs.append(float(opt.param_groups[0]["lr"]))
            opt.step()
            scheduler.step()
        return lrs

    def for_round(self, round_id: int) -> "LocalTrainConfig":
        """These settings with the learning rate of round ``round_id`` (1-based): :meth:`round_lrs`."""
        if self.lr_scheduler is None or round_id <= 1:
            return self
        return replace(self, lr=self.round_lrs(round_id)[-1])
