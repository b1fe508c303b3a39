"""Record-level DP-SGD at one horizontal FL client, with Opacus (``params.record_dp``, :class:`RecordDPParams`).

Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang, "Deep Learning with Differential Privacy", CCS 2016,
Algorithm 1, as Opacus implements it (Yousefpour et al., "Opacus: User-Friendly Differential Privacy Library in
PyTorch", arXiv:2109.12298). Every local step of every round:

1. **Poisson sampling** (Opacus's ``DPDataLoader``): each of the client's ``n`` training records joins the batch
   independently with probability ``q = min(1, batch_size / n)``; a round has ``epochs · ⌊1/q⌋`` steps
   (Opacus's ``UniformWithReplacementSampler``), whatever the data. The sampler's generator is seeded from the
   client's own OS entropy (``secrets``), never from the job seed, unless the test-only ``noise_seed`` is set;
2. **per-record gradients** (Opacus's ``GradSampleModule`` hooks on the plain model), each clipped to L2 norm C
   over all trainable parameters together;
3. **noise** (Opacus's ``DPOptimizer``, ``secure_mode``: the floating-point-attack-resistant sum of Holohan and
   Braghin, arXiv:2107.10138, Section 5.1): ``g = (Σ_i clip_C(g_i) + N(0, (z·C)² I)) / (q·n)`` (Opacus's
   ``loss_reduction="mean"``: it divides by the *expected* batch size, not the sampled one, so that the
   sensitivity of ``g`` is C / (q·n) for every batch);
4. the job's optimiser steps on ``g`` (SGD with momentum and weight decay, Adam ...: post-processing). What
   the strategies add is a function of the current weights and of what the server sent, never of the records,
   so it is post-processing too: FedProx's gradient ``mu·(w − w_global)`` is added *after* the noise (it is not
   part of the per-record loss), SCAFFOLD's ``w ← w − lr·(c − c_i)`` after the step, FedNova's ``a_i`` counts
   the fixed number of steps.

One Opacus accountant per client (:class:`RecordDP`) composes every step of every round (Opacus's RDP, PRV or
GDP accountant, on the sampled Gaussian mechanism with ``(z, q)``); :meth:`RecordDP.epsilon` is the ε(δ) of the
client's records after the rounds so far, :func:`record_epsilon` the same for given ``(z, q, steps, δ)``.

What each role learns: the server (without secure aggregation) sees the client's update, which is a
post-processing of the noised steps; everyone sees the released model. Both are (ε, δ)-DP for each record of
the client. NOT covered: the record count ``n`` (FedAvg's weight ``n_i``, ``train_n``), which differs between
neighbouring data sets under add/remove-one; statistics the client computes on its training records outside
these steps (the training loss is not returned: :func:`dp_local_sgd` returns NaN and keeps it in
:attr:`RecordDP.last_loss`; contribution normalisation's scores; IFCA's cluster choice). Between rounds the hooks
are removed (:meth:`RecordDP.hooks`), so the FL flat view (:func:`~.models.get_flat`) reads the plain module's
parameter names.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ..params.record_privacy import FIELD, RecordDPParams
from .local_data import DatasetRows, Rows, as_inputs
from .models import label_tensor, model_device, task_loss

if TYPE_CHECKING:  # opacus is imported on first use only
    from opacus.data_loader import DPDataLoader
    from opacus.optimizers import DPOptimizer

    from .local_config import LocalTrainConfig

# Opacus is imported where it is used: it adds about a second to every process that imports the strategies

MECHANISM = "DP-SGD (Opacus)"
DP_SGD_STRATEGIES = ("fedavg", "fedprox", "scaffold", "fednova")  # the rest read training records outside DP-SGD


def sample_rate(batch_size: int, n_local: int) -> float:
    """Poisson sampling rate ``q = min(1, batch_size / n_local)``; ValueError when either is < 1."""
    if batch_size < 1 or n_local < 1:
        raise ValueError(f"{FIELD}: DP-SGD needs batch_size >= 1 and at least one record, got {batch_size}, "
                         f"{n_local}")
    return min(1.0, batch_size / n_local)


def steps_per_epoch(q: float) -> int:
    """Steps of one epoch at rate ``q``: ``⌊1/q⌋``, as Opacus's ``UniformWithReplacementSampler`` draws them."""
    return int(1 / q)


def record_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                   accountant: str = "rdp", alphas: Sequence[float] | None = None) -> float:
    """ε (nats) at ``delta`` of ``steps`` DP-SGD steps with noise multiplier z and Poisson rate q, by Opacus's
    accountant ``accountant`` (``rdp``: at the RDP orders ``alphas``, default ``RDPAccountant.DEFAULT_ALPHAS``;
    or ``prv``).

    The same number :meth:`RecordDP.epsilon` gives after ``steps`` steps (its accountant merges equal steps into
    one history entry ``(z, q, steps)``, which is what this builds). 0 for ``steps == 0``."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if steps == 0:
        return 0.0
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism=accountant)
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    if alphas is not None:
        if accountant != "rdp":
            raise ValueError(f"alphas: RDP orders are for the rdp accountant, not {accountant!r}")
        return float(acc.get_epsilon(delta=delta, alphas=list(alphas)))
    return float(acc.get_epsilon(delta=delta))


def calibrate_noise_multiplier(params: RecordDPParams, q: float, steps: int) -> float:
    """z such that ``steps`` steps at rate ``q`` spend at most ``params.target_epsilon`` at ``params.delta``
    (``opacus.accountants.utils.get_noise_multiplier``, its bisection to 0.01 in ε, with ``params.accountant``).
    ValueError naming the field when the budget is out of reach (z would exceed 10⁶)."""
    from opacus.accountants.utils import get_noise_multiplier

    try:
        return float(get_noise_multiplier(target_epsilon=params.target_epsilon, target_delta=params.delta,
                                          sample_rate=q, steps=steps, accountant=params.accountant))
    except ValueError as exc:
        raise ValueError(f"{FIELD}.target_epsilon: {params.target_epsilon} over {steps} steps at q = {q:.4g} "
                         f"cannot be met ({exc})") from None


def _seed(params: RecordDPParams, stream: str) -> int:
    """A 63-bit generator seed: from the OS (secret, per client) unless the test-only noise_seed is set."""
    if params.noise_seed is None:
        return secrets.randbits(63)
    digest = hashlib.sha256(f"{params.noise_seed}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class _Records(Dataset):
    """(input, label) items of a client's rows: a numpy matrix's rows or a :class:`DatasetRows`' inputs."""

    def __init__(self, X: Rows, labels: torch.Tensor):
        self.X, self.labels = as_inputs(X), labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.X.dataset[int(i)][0] if isinstance(self.X, DatasetRows) else self.X[int(i)]
        return torch.as_tensor(x), self.labels[int(i)]


class RecordDP:
    """One client's DP-SGD across rounds: its settings, z, q, its two generators and its Opacus accountant.

    Args:
        params: the job's :class:`RecordDPParams`.
        n_local: the client's training rows (the same every round).
        batch_size, epochs: the job's local training settings (``q = min(1, batch_size / n_local)``).
        rounds: the job's rounds; needed with ``target_epsilon`` (calibration over ``rounds · epochs · ⌊1/q⌋``).

    Raises ValueError naming ``params.record_dp`` for a missing ``rounds`` or an unreachable ``target_epsilon``.
    """

    def __init__(self, params: RecordDPParams, n_local: int, batch_size: int, epochs: int, rounds: int | None = None):
        self.params, self.n_local, self.batch_size, self.epochs = params, int(n_local), int(batch_size), int(epochs)
        self.q = sample_rate(self.batch_size, self.n_local)
        self.steps_per_round = self.epochs * steps_per_epoch(self.q)
        if params.noise_multiplier is not None:
            self.noise_multiplier = float(params.noise_multiplier)
        elif rounds is None or rounds < 1:
            raise ValueError(f"{FIELD}.target_epsilon: calibrating z needs the job's rounds (LocalTrainConfig."
                             f"dp_sgd_rounds), got {rounds!r}")
        else:
            self.noise_multiplier = calibrate_noise_multiplier(params, self.q, rounds * self.steps_per_round)
        self.expected_batch_size = min(self.batch_size, self.n_local)  # q · n
        from opacus.accountants import create_accountant

        self.accountant = create_accountant(mechanism=params.accountant)
        self.sampling = torch.Generator().manual_seed(_seed(params, "sampling"))
        self._noise_seed = _seed(params, "noise")
        self._noise: torch.Generator | None = None  # on the model's device, made by the first privatize
        self.rounds = 0
        self.last_loss = math.nan  # the last round's mean batch loss: a statistic of the records, not released

    def matches(self, params: RecordDPParams, n_local: int, batch_size: int, epochs: int) -> bool:
        """Whether a round with these settings continues this client's DP-SGD (same q, z and steps)."""
        return (params, int(n_local), int(batch_size), int(epochs)) == (self.params, self.n_local, self.batch_size,
                                                                       self.epochs)

    # ------------------------------------------------------------------ accounting
    @property
    def steps(self) -> int:
        """DP-SGD steps accounted so far (all rounds)."""
        return int(sum(h[2] for h in self.accountant.history))

    def epsilon(self, delta: float | None = None) -> float:
        """ε (nats) of this client's records at ``delta`` (default ``params.delta``) after every step so far, by
        its Opacus accountant (0 before the first step)."""
        if not self.accountant.history:
            return 0.0
        return float(self.accountant.get_epsilon(delta=self.params.delta if delta is None else delta))

    def record(self) -> dict:
        """What the client may publish about its guarantee (for metrics and the model bundle): epsilon, delta,
        mechanism, clip_norm, noise_multiplier, sample_rate, steps, rounds, accountant."""
        return {"epsilon": self.epsilon(), "delta": self.params.delta, "mechanism": MECHANISM, "unit": "record",
                "clip_norm": self.params.clip_norm, "noise_multiplier": self.noise_multiplier,
                "sample_rate": self.q, "steps": self.steps, "rounds": self.rounds,
                "accountant": self.params.accountant}

    def state_dict(self) -> dict:
        """JSON-able cross-round state for a checkpoint: the accountant's history, rounds and z. (The generators
        restart from fresh entropy on resume; that keeps the guarantee.)"""
        return {"history": [list(h) for h in self.accountant.history], "rounds": self.rounds,
                "noise_multiplier": self.noise_multiplier}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; ValueError when its z differs from this client's (other settings)."""
        if not math.isclose(float(state["noise_multiplier"]), self.noise_multiplier, rel_tol=1e-12):
            raise ValueError(f"{FIELD}: checkpoint noise multiplier {state['noise_multiplier']} is not this job's "
                             f"{self.noise_multiplier}")
        self.accountant.history = [(float(z), float(q), int(k)) for z, q, k in state["history"]]
        self.rounds = int(state["rounds"])

    # ------------------------------------------------------------------ training pieces
    def check_model(self, model: nn.Module, field: str = "params.model") -> None:
        """ValueError naming ``field`` and ``params.record_dp`` when Opacus cannot compute per-record gradients
        of ``model`` (``opacus.validators.ModuleValidator.validate``: BatchNorm mixes records in a batch ...)."""
        from opacus.validators import ModuleValidator

        model.train()
        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ValueError(f"{FIELD}: DP-SGD (Opacus) does not support the model of {field}: "
                             + "; ".join(str(e) for e in errors)
                             + " (e.g. replace BatchNorm by GroupNorm, opacus.validators.ModuleValidator.fix)")

    @contextlib.contextmanager
    def hooks(self, model: nn.Module, field: str = "params.model"):
        """Opacus's per-record gradient hooks on the plain ``model`` for one round (:meth:`check_model` first);
        on exit the hooks and every attribute Opacus set are removed, so the model is plain again. Yields the
        ``GradSampleModule`` (calling it or ``model`` is the same forward)."""
        from opacus.grad_sample import GradSampleModule

        self.check_model(model, field)
        gsm = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True)
        gsm.forbid_grad_accumulation()  # Poisson batches: one backward per step, as Opacus's PrivacyEngine
        try:
            yield gsm
        finally:
            gsm._close()
            for p in model.parameters():  # DPOptimizer's sum is not among what Opacus's cleanup removes
                if hasattr(p, "summed_grad"):
                    del p.summed_grad
            for m in model.modules():  # a forward without backward leaves these behind
                for attr in ("activations", "max_batch_len"):
                    if attr in m.__dict__:
                        delattr(m, attr)
            self.rounds += 1

    def loader(self, dataset: Dataset) -> "DPDataLoader":
        """Opacus's Poisson-sampling loader over ``dataset`` (⌊1/q⌋ batches a pass, possibly empty), drawing
        from this client's sampling generator."""
        from opacus.data_loader import DPDataLoader

        loader = DPDataLoader(dataset, sample_rate=self.q, generator=self.sampling)
        assert len(loader) == steps_per_epoch(self.q)
        return loader

    def privatize(self, optimizer: torch.optim.Optimizer, device: torch.device) -> "DPOptimizer":
        """``optimizer`` as Opacus's ``DPOptimizer`` (clip C, noise z·C from this client's noise generator on
        ``device``, mean over the expected batch size q·n); each step is recorded by the accountant."""
        from opacus.optimizers import DPOptimizer

        if self._noise is None or self._noise.device != torch.device(device):
            self._noise = torch.Generator(device=device).manual_seed(self._noise_seed)
        opt = DPOptimizer(optimizer, noise_multiplier=self.noise_multiplier, max_grad_norm=self.params.clip_norm,
                          expected_batch_size=self.expected_batch_size, loss_reduction="mean",
                          generator=self._noise, secure_mode=True)
        opt.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate=self.q))
        return opt

    @staticmethod
    def step(optimizer: "DPOptimizer", prox: tuple[float, list] | None = None) -> None:
        """One private step: Opacus clips, sums, noises and scales (``pre_step``, which also steps the
        accountant); then FedProx's ``mu·(w − anchor)`` joins the noised gradient (``prox`` = (mu, [(param,
        anchor)])), and the wrapped optimiser steps. ValueError (Opacus's) when a parameter has no per-record
        gradient (no backward since the last step)."""
        if not optimizer.pre_step():
            raise RuntimeError("DP-SGD: Opacus skipped a step (gradient accumulation is not used here)")
        if prox is not None:
            mu, anchors = prox
            with torch.no_grad():
                for p, anchor in anchors:
                    if p.grad is not None:
                        p.grad.add_(p.detach() - anchor, alpha=mu)
        optimizer.original_optimizer.step()
        for p in optimizer.params:  # the next step starts from fresh per-record gradients
            p.grad_sample, p.summed_grad = None, None


def for_config(current: RecordDP | None, cfg: "LocalTrainConfig", n_local: int) -> RecordDP:
    """The client's :class:`RecordDP` for a round of ``cfg`` (``cfg.dp_sgd`` set): ``current`` when it has the
    same settings, a new one (no rounds yet) when ``current`` is None. ValueError when they changed mid-job
    (the accountant's ε would no longer describe the steps)."""
    if current is None:
        return RecordDP(cfg.dp_sgd, n_local, cfg.batch_size, cfg.epochs, cfg.dp_sgd_rounds)
    if not current.matches(cfg.dp_sgd, n_local, cfg.batch_size, cfg.epochs):
        raise ValueError(f"{FIELD}: the DP-SGD settings, batch size, epochs or the client's row count changed "
                         f"between rounds ({current.n_local} -> {n_local} rows)")
    return current


def dp_local_sgd(model: nn.Module, X: Rows, y: np.ndarray, cfg: "LocalTrainConfig", dp: RecordDP, *,
                 prox: tuple[float, list] | None = None,
                 after_step: Callable[[nn.Module], None] | None = None) -> tuple[int, float]:
    """One round of DP-SGD on ``model`` in place (module docstring); returns (steps, NaN).

    X: (n, n_features) float32 rows or a :class:`DatasetRows`; y: (n,) labels (float for a regression head).
    ``cfg``: the job's optimiser settings (:meth:`LocalTrainConfig.make_optimizer`); ``prox`` = (mu, [(param,
    anchor tensor)]): FedProx's gradient, added after the noise; ``after_step``: SCAFFOLD's correction. The loss is
    not returned (NaN: it is a non-private statistic of the records); it stays in ``dp.last_loss``.
    """
    loader = dp.loader(_Records(X, label_tensor(model, y)))
    device = model_device(model)
    steps, loss_sum, nonempty = 0, 0.0, 0
    with dp.hooks(model):
        private = dp.privatize(cfg.make_optimizer([p for p in model.parameters() if p.requires_grad]), device)
        for _ in range(cfg.epochs):
            for xb, yb in loader:
                private.zero_grad(set_to_none=True)
                loss = task_loss(model, model(xb.to(device)), yb.to(device))
                loss.backward()  # an empty batch: loss NaN, zero per-record gradients; the step is noise only
                dp.step(private, prox)
                if after_step is not None:
                    after_step(model)
                steps += 1
                if len(yb):
                    loss_sum, nonempty = loss_sum + float(loss.detach()), nonempty + 1
        private.zero_grad(set_to_none=True)
    dp.last_loss = loss_sum / nonempty if nonempty else math.nan
    return steps, math.nan
