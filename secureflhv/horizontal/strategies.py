"""FedAvg-family strategies: the client half (local training → update vectors) and the server half.

Every strategy follows NIID-Bench's update rules (Li, Diao, Chen, He, "Federated Learning on
Non-IID Data Silos: An Experimental Study", ICDE 2022, Algorithms 1–2, and its ``experiments.py``):

* local training is SGD with momentum ``rho`` and weight decay ``reg`` on cross-entropy (a regression
  head: the MSE of the standardised target, :func:`~.models.task_loss`), a fresh
  optimizer every round, mini-batches of a per-epoch random permutation (last batch may be short);
* **FedAvg** (McMahan et al., AISTATS 2017): ``w ← Σ_i p_i w_i`` with ``p_i = n_i / Σ n_j`` over the
  clients of the round. Each client sends ``Δ_i = w_i − w`` with weight ``n_i`` and the server adds
  the weighted mean — the same model, but deltas are small, so they fit the aggregation clip;
* **FedProx** (Li et al., MLSys 2020): FedAvg with ``(mu/2)·||w_i − w||²`` added to every batch loss;
* **SCAFFOLD** (Karimireddy et al., ICML 2020, option II): after every optimizer step
  ``w_i ← w_i − lr·(c − c_i)``; after ``K`` steps ``c_i⁺ = c_i − c + (w − w_i)/(K·lr)``; the client
  sends ``Δ_i`` (weight ``n_i``) and ``Δc_i = c_i⁺ − c_i`` (weight 1); the server sets
  ``w ← w + Σ p_i Δ_i`` and ``c ← c + (1/|S|) Σ_{i ∈ S} Δc_i`` over the round's selected clients S
  (NIID-Bench divides by the number of clients of the round, not by the total N of the paper; with
  every client selected the two agree). Both are aggregated through (secure) aggregation. A client
  whose ``Δc_i`` is not in the applied sum (dropped from that part, or the round refused) counts as
  ``Δc_i = 0`` and keeps its old ``c_i`` (:meth:`Strategy.client_round_end`): Algorithm 1 pairs
  ``c_i ← c_i⁺`` with the server adding ``Δc_i``, which keeps ``c = mean_i c_i`` (full participation);
  a client committing ``c_i⁺`` whose ``Δc_i`` the server never added would bias every later correction
  ``c − c_i`` for good. The two parts need not have the same survivors: each is its own update;
* **FedNova** (Wang et al., NeurIPS 2020): with ``tau_i`` local steps and momentum ``rho``,
  ``a_i = (tau_i − rho(1 − rho^tau_i)/(1 − rho)) / (1 − rho)`` (``= tau_i`` without momentum) and
  ``d_i = (w − w_i)/a_i``; the server sets ``w ← w − (Σ p_i a_i)·(Σ p_i d_i)``. The client sends
  ``d_i`` and ``[a_i]``, both with weight ``n_i``. NIID-Bench's code weights by the number of
  *batches*; we weight by samples, as its Algorithm 2 and the FedNova paper write ``p_i``.

Aggregated *parts*: a strategy lists named parts (``"model"``, ``"control"``, ``"nova"``); each is one
aggregation call (so each has its own weight and clip: a control variate or a step count does not
fit the model delta's clip range). What the server learns per part is what the aggregation kind
reveals (for secure aggregation: the weighted sum and the total weight over survivors).

Flat vectors are float64 for aggregation; the global model itself is float32 (what is sent).
"""
from __future__ import annotations

import hashlib
from abc import ABC
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch
from torch import nn

from ..params.record_privacy import FIELD as RECORD_DP_FIELD
from .dp_sgd import DP_SGD_STRATEGIES, RecordDP, dp_local_sgd, for_config
from .local_config import LocalTrainConfig
from .local_data import as_inputs
from .models import evaluate, fl_entries, get_flat, label_tensor, model_device, set_flat, task_loss

StrategyName = Literal["fedavg", "fedprox", "scaffold", "fednova"]
STRATEGIES = ("fedavg", "fedprox", "scaffold", "fednova")  # the FedAvg family (contribution normalisation composes)


@dataclass
class ClientUpdate:
    """What local training produces: per part ``(vector float64 (d_part,), weight)`` plus statistics."""

    parts: dict[str, tuple[np.ndarray, float]]
    n_samples: int
    steps: int
    loss: float


def batch_rng(seed: int, round_id: int, client_id: str) -> np.random.Generator:
    """The mini-batch order generator of one client in one round (same seed → same batches)."""
    cid = int.from_bytes(hashlib.sha256(client_id.encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed), int(round_id), cid])


def local_sgd(model: nn.Module, X: np.ndarray, y: np.ndarray, cfg: LocalTrainConfig, rng: np.random.Generator, *,
              extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
              after_step: Callable[[nn.Module], None] | None = None) -> tuple[int, float]:
    """Train ``model`` in place; return (number of optimizer steps, mean batch loss).

    X: (n, n_features) float32; y: (n,) int labels (a regression head: float targets). Each epoch draws a permutation from ``rng`` and
    walks it in batches of ``cfg.batch_size`` (the last one may be short), as a shuffling DataLoader.
    """
    n = len(y)
    if n == 0:
        raise ValueError("local training needs at least one sample")
    Xt, yt, device = as_inputs(X), label_tensor(model, y), model_device(model)
    opt = cfg.make_optimizer(model.parameters())
    model.train()
    steps, loss_sum = 0, 0.0
    for _ in range(cfg.epochs):
        perm = torch.from_numpy(rng.permutation(n))
        for start in range(0, n, cfg.batch_size):
            idx = perm[start:start + cfg.batch_size]
            opt.zero_grad()
            loss = task_loss(model, model(Xt[idx].to(device)), yt[idx].to(device))
            if extra_loss is not None:
                loss = loss + extra_loss(model)
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step(model)
            steps += 1
            loss_sum += float(loss.detach())
    return steps, loss_sum / steps


def split_like(model: nn.Module, flat: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A flat vector cut as the aggregated tensors (:func:`~.user_model.fl_entries`): (tensor, float32 piece on its
    device) for each tensor with ``requires_grad`` (what SGD moves; buffers and frozen weights are skipped)."""
    out, offset = [], 0
    t = torch.from_numpy(np.asarray(flat, dtype=np.float32).copy())
    for _, p in fl_entries(model):
        if p.requires_grad:
            out.append((p, t[offset:offset + p.numel()].reshape(p.shape).to(p.device)))
        offset += p.numel()
    return out


class Strategy(ABC):
    """A federated optimisation rule with a client half and a server half.

    Client half: :meth:`client_update` trains a model from the global vector and returns the parts
    to aggregate; per-client state (SCAFFOLD's ``c_i``) lives in the instance, so each client owns
    its own instance. Server half: :meth:`broadcast` (extra arrays sent with the global model) and
    :meth:`server_update` (new global vector from the aggregated parts).

    Attributes:
        name: strategy name.
        parts: names of the aggregated parts, in aggregation order.
        sample_weighted_parts: the parts weighted by the client's sample count ν_r: contribution
            normalisation (:mod:`.contribution`) multiplies their weight by Λ_r.
        n_models: how many differently initialised models the server starts from (IFCA: k clusters).
        zero_weight_parts: whether a part's total weight may be 0 (IFCA: a cluster nobody chose); else
            the server refuses such a sum as out of range (:mod:`secureflhv.secagg.bounds`).
        joint_parts: whether :meth:`server_update` combines the parts' sums into one step, so they must be over
            the same clients (FedNova: ``(Σ p_i a_i)·(Σ p_i d_i)``); the server refuses a round whose parts
            have different survivors (each part is its own aggregation, and a client may miss one of them).
            SCAFFOLD's parts are two separate updates (w and c), so it does not: a client's ``c_i`` follows
            what the server applied (:meth:`client_round_end`).
    """

    name: str = ""
    parts: tuple[str, ...] = ("model",)
    sample_weighted_parts: tuple[str, ...] = ("model",)
    n_models: int = 1
    zero_weight_parts: bool = False
    joint_parts: bool = False
    trainer = None  # a batched trainer's handle (:mod:`.batched`, simulations only); None = train here
    loop = None     # the user's train / evaluate functions (:class:`~.user_loop.UserLoop`); None = the built-in ones
    record_dp: RecordDP | None = None  # this client's DP-SGD state across rounds (``cfg.dp_sgd``); ε: .epsilon()

    def local_train(self, model: nn.Module, X: np.ndarray, y: np.ndarray, cfg: LocalTrainConfig,
                    rng: np.random.Generator, *, prox: tuple[float, np.ndarray] | None = None,
                    correction: np.ndarray | None = None) -> tuple[int, float]:
        """Local SGD of ``model`` in place (:func:`local_sgd`), or through :attr:`trainer` when set (same
        maths, batched with the other clients of the process). ``prox`` = (mu, anchor (dim,)): FedProx's
        ``(mu/2)||w − anchor||²``; ``correction`` (dim,): SCAFFOLD's ``w ← w − lr·correction`` per step.
        With ``cfg.dp_sgd``: DP-SGD (:mod:`.dp_sgd`; ``rng`` unused, the batches come from the client's own
        entropy), the loss returned is NaN."""
        if cfg.dp_sgd is not None:
            return self._dp_train(model, X, y, cfg, prox, correction)
        if self.trainer is not None:
            return self.trainer.train(model, X, y, cfg, rng, prox=prox, correction=correction)
        if self.loop is not None and self.loop.train_fn is not None:
            return self.loop.train(model, X, y, cfg, rng, prox=prox, correction=correction)
        extra_loss = after_step = None
        if prox is not None:
            mu, anchors = prox[0], split_like(model, prox[1])

            def prox_loss(m: nn.Module) -> torch.Tensor:
                return (mu / 2) * sum(torch.sum((p - a) ** 2) for p, a in anchors)
            extra_loss = prox_loss
        if correction is not None:
            corr, lr = split_like(model, correction), cfg.lr

            def correct(m: nn.Module) -> None:  # w_i <- w_i - lr (c - c_i), after every optimizer step
                with torch.no_grad():
                    for p, d in corr:
                        p.sub_(lr * d)
            after_step = correct
        return local_sgd(model, X, y, cfg, rng, extra_loss=extra_loss, after_step=after_step)

    def _dp_train(self, model: nn.Module, X, y: np.ndarray, cfg: LocalTrainConfig, prox,
                  correction) -> tuple[int, float]:
        """:meth:`local_train` under record-level DP-SGD, built-in loop or the user's; ValueError naming
        ``params.record_dp`` for a strategy or batched trainer it does not cover."""
        if self.name not in DP_SGD_STRATEGIES:
            raise ValueError(f"{RECORD_DP_FIELD}: DP-SGD covers {', '.join(DP_SGD_STRATEGIES)}; {self.name} reads "
                             f"the training records outside the private steps")
        if self.trainer is not None:
            raise ValueError(f"{RECORD_DP_FIELD}: DP-SGD needs per-client training (the batched simulation trainer "
                             f"does not compute per-record gradients)")
        self.record_dp = for_config(self.record_dp, cfg, len(y))
        pairs = (prox[0], split_like(model, prox[1])) if prox is not None else None
        if self.loop is not None and self.loop.train_fn is not None:
            return self.loop.train(model, X, y, cfg, None, prox=prox, correction=correction, dp=self.record_dp)
        corr, lr = (split_like(model, correction) if correction is not None else []), cfg.lr

        def correct(m: nn.Module) -> None:  # SCAFFOLD's w <- w - lr (c - c_i): data-independent, after the step
            with torch.no_grad():
                for p, d in corr:
                    p.sub_(lr * d)
        return dp_local_sgd(model, X, y, cfg, self.record_dp, prox=pairs,
                            after_step=correct if correction is not None else None)

    def evaluate_rows(self, model: nn.Module, X, y: np.ndarray) -> dict[str, float]:
        """:func:`~.models.evaluate` of ``model`` on (X, y), or the user's ``evaluate`` when the job names one."""
        if self.loop is not None and self.loop.evaluate_fn is not None:
            return self.loop.evaluate(model, X, y)
        return evaluate(model, X, y)

    def lr_total(self, steps: int, lr: float) -> float:
        """Σ lr over the last local training's steps: ``steps · lr`` (the built-in loop), or what the user's loop
        stepped (a scheduler may vary it)."""
        if self.loop is not None and self.loop.train_fn is not None:
            return self.loop.lr_sum
        return steps * lr

    # ---------------------------------------------------------------- shared
    def part_dims(self, dim: int) -> dict[str, int]:
        """Length of each part's vector for a model of ``dim`` parameters."""
        return {"model": dim}

    def hyperparameters(self) -> dict:
        """The strategy's own settings, for the model bundle's metadata (none by default)."""
        return {}

    # ---------------------------------------------------------------- checkpoints
    state_names: tuple[str, ...] = ()  # attributes that carry over from one round to the next

    def state_arrays(self) -> dict[str, np.ndarray]:
        """This instance's cross-round state (float32 (dim,) arrays, those set so far) for a checkpoint:
        SCAFFOLD's c (server) / c_i (client), IFCA's cluster models, FedPer's head; FedAvg, FedProx and
        FedNova keep none."""
        return {n: np.asarray(getattr(self, n)) for n in self.state_names if getattr(self, n) is not None}

    def load_state(self, arrays: dict[str, np.ndarray], dim: int) -> None:
        """Restore :meth:`state_arrays`; ValueError for an unknown name or an array that is not float32 (dim,)."""
        for name, arr in arrays.items():
            if name not in self.state_names:
                raise ValueError(f"checkpoint: {self.name} keeps no state {name!r}")
            want = self._state_length(name, dim)
            if arr.dtype != np.float32 or arr.ndim != 1 or not (arr.size == want if want else 0 < arr.size < dim):
                raise ValueError(f"checkpoint: {self.name} state {name!r} is {arr.dtype} {arr.shape}, "
                                 f"expected float32 ({want or f'< {dim}'},)")
            setattr(self, name, np.array(arr))

    def _state_length(self, name: str, dim: int) -> int | None:
        """Length of state array ``name`` (None: a part of the model, shorter than ``dim``)."""
        return dim

    # ---------------------------------------------------------------- server half
    def server_init(self, dim: int, initial: list[np.ndarray] | None = None) -> None:
        """Prepare server state for a model of ``dim`` parameters; ``initial``: :attr:`n_models` float32
        (dim,) initial models (the first is the global model), each from its own seed."""

    def eval_extras(self) -> dict[str, np.ndarray]:
        """Arrays (float32, (dim,)) sent with the model to evaluate (``fl.eval``); default none."""
        return {}

    def broadcast(self) -> dict[str, np.ndarray]:
        """Arrays (float32, 1-D) sent to the selected clients with the global model."""
        return {}

    def server_update(self, global_vec: np.ndarray, results: dict) -> np.ndarray:
        """New global float32 vector from ``results`` (part → AggregateResult)."""
        new = np.asarray(global_vec, dtype=np.float64) + results["model"].mean
        return new.astype(np.float32)

    # ---------------------------------------------------------------- client half
    def client_update(self, model: nn.Module, global_vec: np.ndarray, X: np.ndarray, y: np.ndarray,
                      cfg: LocalTrainConfig, rng: np.random.Generator,
                      extras: dict[str, np.ndarray] | None = None) -> ClientUpdate:
        """Load ``global_vec`` into ``model``, train on (X, y), return the parts to aggregate."""
        set_flat(model, global_vec)
        steps, loss = self.local_train(model, X, y, cfg, rng, prox=self._prox(global_vec))
        delta = get_flat(model).astype(np.float64) - np.asarray(global_vec, dtype=np.float32).astype(np.float64)
        return ClientUpdate({"model": (delta, float(len(y)))}, len(y), steps, loss)

    def _prox(self, global_vec: np.ndarray) -> tuple[float, np.ndarray] | None:
        """(mu, anchor) of a proximal term in the local loss (FedProx); None = none."""
        return None

    def client_round_end(self, applied: set[str]) -> None:
        """After a round, when the server's new global model came: ``applied`` = the parts of this client's
        update that are in the sums the server applied (empty when the round was refused or this client
        was dropped from every sum). State that must match the server's is committed here (SCAFFOLD's c_i);
        default: nothing."""

    def eval_vector(self, model: nn.Module, global_vec: np.ndarray, extras: dict[str, np.ndarray], X: np.ndarray,
                    y: np.ndarray) -> np.ndarray:
        """The float32 (dim,) model this client evaluates after a round (default: the global model).
        ``extras``: :meth:`eval_extras` as received; (X, y): the client's training rows."""
        return global_vec


class FedAvg(Strategy):
    """FedAvg (McMahan et al. 2017) as in NIID-Bench: sample-weighted average of the local models."""

    name = "fedavg"


class FedProx(Strategy):
    """FedProx (Li et al. 2020): FedAvg plus ``(mu/2)||w_i − w||²`` in every local batch loss."""

    name = "fedprox"

    def __init__(self, mu: float = 0.01):
        if not mu >= 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = float(mu)

    def hyperparameters(self) -> dict:
        """``{"mu": ...}``."""
        return {"mu": self.mu}

    def _prox(self, global_vec):
        return self.mu, global_vec


class Scaffold(Strategy):
    """SCAFFOLD (Karimireddy et al. 2020) with NIID-Bench's update of the control variates."""

    name = "scaffold"
    parts = ("model", "control")
    state_names = ("c_global", "c_local")

    def __init__(self):
        self.c_global: np.ndarray | None = None  # server: c
        self.c_local: np.ndarray | None = None   # client: c_i
        self.c_pending: np.ndarray | None = None  # client: c_i⁺ of the round, until the server applied Δc_i

    def part_dims(self, dim):
        """The model delta and the control-variate delta, ``dim`` each."""
        return {"model": dim, "control": dim}

    def server_init(self, dim, initial=None):
        """Start the server's control variate c at zeros (float32 (dim,))."""
        self.c_global = np.zeros(dim, dtype=np.float32)

    def broadcast(self):
        """The server's control variate c, sent with the global model."""
        return {"control": self.c_global}

    def server_update(self, global_vec, results):
        """FedAvg's step for the model, and ``c += (1/|S|) Σ Δc_i`` over the round's selected clients S, a
        dropped client's Δc_i counting as 0 (it keeps its c_i: :meth:`client_round_end`), so that c stays
        the mean of the c_i (Karimireddy et al. 2020, Alg. 1 with global step size 1).
        """
        new = super().server_update(global_vec, results)
        ctrl = results["control"]
        selected = len(ctrl.survivors) + len(ctrl.dropped)
        self.c_global = (self.c_global.astype(np.float64) + ctrl.total / selected).astype(np.float32)
        return new

    def client_update(self, model, global_vec, X, y, cfg, rng, extras=None):
        """Local SGD corrected by ``c - c_i`` every step, then the client's new c_i⁺ (option II of the paper),
        kept aside until the server applies its delta (:meth:`client_round_end`); sends the model delta and
        the control delta. ValueError without the server's ``control``.
        """
        if extras is None or "control" not in extras:
            raise ValueError("SCAFFOLD needs the server's control variate ('control') with the global model")
        c = np.asarray(extras["control"], dtype=np.float32)
        if self.c_local is None:
            self.c_local = np.zeros_like(c)
        set_flat(model, global_vec)
        steps, loss = self.local_train(model, X, y, cfg, rng,
                                       correction=c.astype(np.float64) - self.c_local.astype(np.float64))
        w_i = get_flat(model).astype(np.float64)
        w = np.asarray(global_vec, dtype=np.float32).astype(np.float64)
        c_new = self.c_local.astype(np.float64) - c + (w - w_i) / self.lr_total(steps, cfg.lr)
        delta_c = c_new - self.c_local.astype(np.float64)
        self.c_pending = c_new.astype(np.float32)
        return ClientUpdate({"model": (w_i - w, float(len(y))), "control": (delta_c, 1.0)}, len(y), steps, loss)

    def client_round_end(self, applied):
        """c_i ← c_i⁺ when the server added this client's Δc_i to c (``"control" in applied``); otherwise
        c_i stays, as the server counted Δc_i = 0 (Karimireddy et al. 2020, Alg. 1: the client's update of
        c_i and the server's of c go together, so c remains the mean of the c_i)."""
        if self.c_pending is not None and "control" in applied:
            self.c_local = self.c_pending
        self.c_pending = None


def fednova_a(tau: int, rho: float) -> float:
    """FedNova's normaliser a_i for ``tau`` SGD steps with momentum ``rho`` (``tau`` when rho = 0)."""
    if rho == 0:
        return float(tau)
    return (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)


class FedNova(Strategy):
    """FedNova (Wang et al. 2020) with NIID-Bench's normalised update."""

    name = "fednova"
    parts = ("model", "nova")
    sample_weighted_parts = ("model", "nova")  # p_i weights both Σ p_i d_i and Σ p_i a_i
    joint_parts = True  # Σ p_i a_i and Σ p_i d_i over the same clients, or the step is rescaled by their ratio

    def part_dims(self, dim):
        """The normalised delta d_i (``dim``) and the step count a_i (1)."""
        return {"model": dim, "nova": 1}

    def server_update(self, global_vec, results):
        """``w - (Σ p_i a_i) · Σ p_i d_i`` (FedNova, Wang et al. NeurIPS 2020; p_i by row count)."""
        d = results["model"].mean                 # Σ p_i d_i
        coeff = float(results["nova"].mean[0])    # Σ p_i a_i
        new = np.asarray(global_vec, dtype=np.float64) - coeff * d
        return new.astype(np.float32)

    def client_update(self, model, global_vec, X, y, cfg, rng, extras=None):
        """Local SGD, then the delta normalised by this client's a_i (:func:`fednova_a` of its steps and
        momentum), both weighted by the row count.
        """
        set_flat(model, global_vec)
        steps, loss = self.local_train(model, X, y, cfg, rng)
        a = fednova_a(steps, cfg.momentum)
        w = np.asarray(global_vec, dtype=np.float32).astype(np.float64)
        d = (w - get_flat(model).astype(np.float64)) / a
        n = float(len(y))
        return ClientUpdate({"model": (d, n), "nova": (np.array([a]), n)}, len(y), steps, loss)


def make_strategy(name: str, *, mu: float = 0.01) -> Strategy:
    """A fresh FedAvg-family strategy by name (``mu`` is used by FedProx only). Raises ValueError.

    :func:`secureflhv.horizontal.strategy_registry.make_strategy` also builds IFCA and FedPer."""
    if name == "fedavg":
        return FedAvg()
    if name == "fedprox":
        return FedProx(mu)
    if name == "scaffold":
        return Scaffold()
    if name == "fednova":
        return FedNova()
    raise ValueError(f"strategy {name!r} unknown; choose one of {', '.join(STRATEGIES)}")
