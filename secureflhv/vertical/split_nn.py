"""Vertical split neural network with a Paillier-protected interactive layer (hetero NN).

After Zhang et al., "Additively Homomorphic Encryption based Deep Neural Network for Asymmetrically
Collaborative Machine Learning" (arXiv 2007.06849, sections 3-4), as FATE's Hetero-NN v1 implements
it (``InteractiveGuestDenseLayer`` / ``InteractiveHostDenseLayer``). Rows are aligned beforehand (PSI).

Architecture (every width is in :class:`SplitNNConfig`)::

    host h : alpha_h = bottom_h(X_h)              torch MLP, output width k_h = host_bottom[-1]
    guest  : alpha_g = bottom_g(X_g)              (guest_bottom = []: alpha_g = X_g)
    guest  : z = alpha_g W_g + sum_h alpha_h W_h + c     interactive layer, o = interactive_units
             a = act(z); logits = top(a); loss = BCE-with-logits (2 classes) | cross-entropy (C > 2)
             regression (task = regression): one output u = top(a), prediction m + s u, loss = mean((u - (y - m)/s)^2)
             with m, s the mean and standard deviation of the guest's training targets (its own data: nothing
             leaves it; they keep the top model's output near unit scale whatever the target's units)

User modules: any of bottom_h, bottom_g and top may instead be a torch module of the consortium's code, named
by ``host_bottom_factory`` / ``guest_bottom_factory`` / ``top_factory`` (:class:`~secureflhv.params.FactoryRef`)
with the bottoms' output widths declared in the job (``host_bottom_output_width`` = k_h,
``guest_bottom_output_width`` = k_g). Each party builds its own from the job's seed and checks it on a probe of
its own rows before any message (:mod:`.split_modules`); the interactive layer is the same.

The true host weights are **shared**: W_h = V_h + E_h, the guest holds V_h and host h holds its
accumulated noise E_h (zero at start, as in FATE), so neither side holds W_h once training started.

One mini-batch, for each host h ([[.]]_h = Paillier under host h's OWN key; r = fresh masks uniform in
Z_n, each multiplied in as a fresh encryption so the ciphertext is also re-randomised)::

    forward
    h -> g : [[A]]_h                         A = alpha_h (b, k_h) of the batch rows
    g -> h : [[A V_h + r1]]_h                (b, o)
    h -> g : A V_h + r1 + A E_h  mod n       h decrypts and adds its term (exact, in Z_n)
    g      : z_h = (that - r1) = A (V_h + E_h) = A W_h       r1 cancels exactly
    backward (g runs autograd through top, act and its own bottom: delta = dL/dz (b, o))
    g -> h : [[A^T delta + r2]]_h            (k_h, o) the interactive weight gradient, masked
    h -> g : A^T delta + r2 + eps/lr_i  mod n;   [[E_h]]_h  (the old E_h, encrypted)
    h      : E_h += eps                      eps fresh, uniform(-weight_noise, weight_noise) (k_h, o)
    g      : gW = that - r2 = A^T delta + eps/lr_i;   [[G]]_h = delta' V_h^T + delta' [[E_h]]^T  (b, k_h)
    g -> h : [[G]]_h;  g updates V_h -= lr_i gW   (so V_h + E_h moves by exactly -lr_i A^T delta)
    h      : G = decrypt(..) = delta' W_h^T = dL/dalpha_h;  alpha_h.backward(G); optimiser step

``delta' = delta`` (the exact gradient) unless label DP is on (``label_dp``, below): then every delta
above, gW's included, and the guest's own updates (top, bottom, W_g, c) come from the noised gradient.
The guest's own interactive weights W_g and the bias c are plain guest parameters. The whole
interactive layer (V_h, W_g, c) is updated with plain SGD at ``interactive_lr`` -- the noise trick
needs an update that is linear in the gradient; bottom and top models use the torch optimiser
named by ``optimizer`` (sgd | adam) at ``learning_rate``.

Randomness: the job's ``seed`` / ``init_seed`` drive only what every party must agree on or may know
(batches, model initialisation); secret noise (``label_dp``'s, the hosts' ``weight_noise``) comes
from OS randomness. Batches: per epoch, ``numpy.random.default_rng([seed, epoch]).permutation(n)`` cut
into chunks of ``batch_size`` rows, computed identically at every party.

What each party learns (semi-honest, non-colluding):

* **guest**: labels, its own model, V_h; per batch ``z_h = A W_h`` (the host's contribution to the
  interactive pre-activation, (b, o) with o < k_h typically -- a linear image, not alpha_h itself) and
  the noisy gradient ``A^T delta + eps/lr_i``. It never sees A = alpha_h in plaintext, nor W_h = V_h + E_h
  after the first update (it knows the initial W_h, a data-independent random init).
  With o >= k_h and W_h invertible the guest could solve z_h = A W_h for A if it knew W_h; it does not.
* **host h**: its own bottom model, E_h, and per batch only values masked with uniform Z_n masks,
  *except* its plaintext bottom-output gradient ``G = dL/dalpha_h`` (b, k_h): that is inherent to split
  learning and is the **known limit** (FATE issue 2915): per-sample gradients leak label information,
  e.g. for binary tasks the gradient norm or direction separates positives from negatives
  ("norm/direction attacks", Li et al., "Label Leakage and Protection in Two-party Split Learning",
  ICLR 2022). It learns nothing about the guest's features or other hosts (hosts never talk).
* **label DP** (``label_dp``, :mod:`.label_dp`): (ε, δ)-label-DP against the hosts (Ghazi et al., NeurIPS
  2021). Per batch the guest clips each example's loss gradient w.r.t. its logits to L2 norm C and adds
  N(0, (z C)^2) per entry (Gaussian mechanism on per-example clipped gradients, Li et al. ICLR 2022), then
  back-propagates only that: the top model, the guest's bottom, W_g, c, the interactive shares V_h (gW uses
  delta') and every host's G = delta' W_h^T are all post-processing of the noised gradients, so the labels reach
  a host (and the trained model) only through them. Had the top model or W_g trained on the true gradient, later
  batches' delta of every row would carry earlier labels and the per-row accounting would not hold. ε(δ) is
  composed over epochs (one release per example per epoch, no subsampling amplification: the batch plan is
  public) with ``dp_accounting``; ``FitResult.epsilons`` holds it per epoch. With label DP the federated model is
  the centralised one only in distribution; without it the equivalence is exact.
* prediction: the guest learns z_h for the rows it asks about; the host learns which rows are scored.

Messages are protobuf (``messages.proto`` Bundle/EncryptedTensor/PaillierPublicKey/Control/Tensor,
MaskedValues/RowsRequest). Every payload is checked in the ``parse`` callback of
:meth:`~secureflhv.transport.Transport.recv` (shape, key fingerprint, agreed exponent, range), so a wrong-shape or
wrong-key message is rejected and logged while training continues. Round ids
``epoch * 10 * MAX_BATCHES + batch * 10 + step``. On any failure a role tells its peers and re-raises;
a dead peer surfaces as :class:`~secureflhv.transport.PeerTimeout` naming it.

Cost per mini-batch of b rows and host h (k = k_h, o = interactive_units): host h encrypts b*k + k*o
values and decrypts b*o + k*o + b*k; the guest computes three plaintext-ciphertext products of b*k*o
exponentiations in all (multi-exponentiation, :class:`~secureflhv.crypto.homomorphic.backend.PaillierHE`)
and b*o + k*o fresh encryptions for the masks. Decryption dominates: keep k and o small (4-8).
Not done yet: packing several masked values into one plaintext before decryption (would cut the
host's decryptions ~15x with 2048-bit keys at the price of statistical instead of perfect masking).

Checkpoints (``checkpoint_dir``): after every epoch each party writes ``<party>-epoch<NNN>.npz``
(numpy arrays only, loaded with ``allow_pickle=False``) and a JSON sidecar; never torch.load.

Resume (the constructor's ``callbacks`` run at the end of every epoch, :mod:`secureflhv.transport.lifecycle`;
``resume=(arrays, state)`` continues after one; the job passes both, :mod:`secureflhv.runtime.store.resume`):
every array is plain float/int numpy, no pickle. The guest stores W_g, c, its shares V_h, the top and
bottom ``state_dict`` entries, the torch optimiser state (``opt.<param index>.<key>``: Adam's step,
exp_avg, exp_avg_sq; SGD has none) and the loss history; a host stores E_h, its bottom ``state_dict``
and its optimiser state. No RNG state is needed for an identical continuation: the batch order is
drawn from ``[seed, epoch]`` and the MLPs have no dropout (a user module with dropout draws from torch's
global generator, so its runs are not reproducible bit for bit, resumed or not); the secret noise (OS
randomness) is fresh after a resume as in any run, so V_h and E_h differ from run to run while
W_h = V_h + E_h (the model) is the same up to fixed-point rounding (~2^-40). The host keys are not stored:
a resumed session makes fresh ones (no trained value depends on them).
"""
from __future__ import annotations


import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
import torch
from pydantic import ConfigDict, Field, model_validator

from ..params import FactoryRef, HEParams, MinibatchSGD
from ..crypto.homomorphic.key_prefetch import resolve_keypair
from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.codec import whole_count
from ..transport.lifecycle import Callback, Checkpoint, Lifecycle
from ..data.dataset import check_matrix
from .label_dp import LabelDP, LabelDPParams
from .common import MAX_BATCHES, VerticalRole, control_parser, round_id
from .prediction import PredictionGuest, PredictionHost
from .split_modules import check_output, inference, probe_rows, seeded_module

log = logging.getLogger("secureflhv.vertical.split_nn")

DTYPE = torch.float64

TAG_SETUP = "vnn.setup"
TAG_HELLO = "vnn.hello"
TAG_FWD = "vnn.fwd"
TAG_FWD_MASKED = "vnn.fwd_masked"
TAG_FWD_DEC = "vnn.fwd_dec"
TAG_GW = "vnn.gw"
TAG_GW_DEC = "vnn.gw_dec"
TAG_ACC = "vnn.acc"
TAG_GIN = "vnn.gin"
TAG_CTL = "vnn.ctl"
TAG_PRED_REQ = "vnn.pred_req"
TAG_PRED_FWD = "vnn.pred_fwd"
TAG_PRED_MASKED = "vnn.pred_masked"
TAG_PRED_DEC = "vnn.pred_dec"

S_FWD, S_FWD_MASKED, S_FWD_DEC, S_GW, S_GW_DEC, S_GIN = 1, 2, 3, 4, 5, 6


def _secret_rng() -> np.random.Generator:
    """A generator for secret noise, seeded with 128 bits from the OS CSPRNG (``secrets``): not reproducible
    from any job seed. (The job seed drives only what every party must agree on: batches and model init.)"""
    return np.random.default_rng(secrets.randbits(128))


# --------------------------------------------------------------------------- configuration
class SplitNNConfig(HEParams, MinibatchSGD):
    """Hyperparameters of the split NN; every party of a job uses the same values (checked at setup).

    Every host's key and the precision of encrypted values: :class:`~secureflhv.params.HEParams`; the bottom
    and top models' mini-batches and step size: :class:`~secureflhv.params.MinibatchSGD`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    host_bottom: list[int] = Field(default=[16, 8], min_length=1,
                                   description="widths of each host's bottom MLP; the last is its output width")
    host_bottom_factory: FactoryRef | None = Field(
        default=None, description="each host's bottom model as a torch module of the consortium's code, "
                                  "factory(**kwargs, in_features, out_features), instead of the host_bottom MLP")
    host_bottom_output_width: int | None = Field(
        default=None, ge=1, le=4096, description="output width of host_bottom_factory's module (required with it)")
    guest_bottom: list[int] = Field(default=[16, 8], description="guest bottom widths; [] = raw guest features")
    guest_bottom_factory: FactoryRef | None = Field(
        default=None, description="the guest's bottom model as a torch module of the consortium's code, "
                                  "factory(**kwargs, in_features, out_features), instead of the guest_bottom MLP")
    guest_bottom_output_width: int | None = Field(
        default=None, ge=1, le=4096, description="output width of guest_bottom_factory's module (required with it)")
    interactive_units: int = Field(default=8, ge=1, le=256, description="output width o of the interactive layer")
    interactive_activation: Literal["relu", "tanh", "sigmoid", "identity"] = "relu"
    top_hidden: list[int] = Field(default=[], description="hidden widths of the guest's top model")
    top_factory: FactoryRef | None = Field(
        default=None, description="the guest's top model as a torch module of the consortium's code, "
                                  "factory(**kwargs, in_features=interactive_units, out_features=<outputs>), "
                                  "instead of the top_hidden MLP")
    activation: Literal["relu", "tanh", "sigmoid"] = "relu"
    task: Literal["classification", "regression"] = Field(
        default="classification", description="classification (labels 0..C-1) or regression (float targets, MSE)")
    n_classes: int | None = Field(default=None, ge=2, description="None: inferred from the guest's labels "
                                                                  "(classification only)")
    epochs: int = Field(default=10, ge=1)
    optimizer: Literal["sgd", "adam"] = "adam"
    interactive_lr: float = Field(default=0.1, gt=0, description="plain SGD step of the interactive layer")
    weight_noise: float = Field(default=1.0, ge=0, description="host noise per step: uniform(-s, s) added to E_h")
    label_dp: LabelDPParams | None = Field(
        default=None, description="label differential privacy against the hosts (clip, noise, accounting); "
                                  "None: off. See secureflhv.vertical.label_dp")
    seed: int = Field(default=0, ge=0, description="mini-batch shuffle seed (secret noise never derives from it)")
    init_seed: int = Field(default=0, ge=0, description="model initialisation seed")
    predict_batch_size: int = Field(default=512, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data):
        if isinstance(data, dict) and "host_grad_noise" in data:
            raise ValueError("host_grad_noise: removed (its noise had no privacy accounting); use label_dp, e.g. "
                             "label_dp: {clip_norm: 1.0, target_epsilon: 3.0} (docs/privacy.md, label DP for split NN)")
        return data

    @model_validator(mode="after")
    def _check(self):
        if self.label_dp is not None and self.task == "classification" and self.n_classes is None:
            raise ValueError("n_classes: required with label_dp (inferring the class count from the labels would "
                             "make the model's shape depend on them)")
        if self.task == "regression" and self.n_classes is not None:
            raise ValueError(f"n_classes: task 'regression' has one output; remove n_classes ({self.n_classes})")
        for name in ("host_bottom", "guest_bottom", "top_hidden"):
            if any(w < 1 or w > 4096 for w in getattr(self, name)):
                raise ValueError(f"{name}: widths must be in [1, 4096]")
        for side in ("host", "guest"):
            factory, width = getattr(self, f"{side}_bottom_factory"), getattr(self, f"{side}_bottom_output_width")
            if factory is not None and width is None:
                raise ValueError(f"{side}_bottom_output_width: required with {side}_bottom_factory (the output width "
                                 f"of its module, which the interactive layer is built for)")
            if factory is None and width is not None:
                raise ValueError(f"{side}_bottom_output_width: applies to {side}_bottom_factory only (the MLP's "
                                 f"output width is the last of {side}_bottom); remove it or set the factory")
        return self

    @property
    def host_width(self) -> int:
        """k_h, the output width of every host's bottom model (the declared one with a factory)."""
        return self.host_bottom_output_width if self.host_bottom_factory is not None else self.host_bottom[-1]

    def guest_width(self, d_guest: int) -> int:
        """k_g, the width of the guest's bottom output for ``d_guest`` feature columns."""
        if self.guest_bottom_factory is not None:
            return self.guest_bottom_output_width
        return self.guest_bottom[-1] if self.guest_bottom else d_guest

    def user_factories(self, role: str) -> list[tuple[str, FactoryRef]]:
        """(field, factory) of the user modules a ``guest`` or ``host`` builds (those set in the job)."""
        names = ("host_bottom_factory",) if role == "host" else ("guest_bottom_factory", "top_factory")
        return [(n, getattr(self, n)) for n in names if getattr(self, n) is not None]

    def resolved(self, base: Path) -> "SplitNNConfig":
        """This config with every factory's relative ``path`` made absolute against ``base`` (the job
        file's folder), so that a model bundle finds the code wherever its prediction job file is."""
        update = {n: f.model_copy(update={"path": (base / f.path).resolve()})
                  for n in FACTORY_FIELDS if (f := getattr(self, n)) is not None
                  and f.path is not None and not f.path.is_absolute()}
        return self.model_copy(update=update) if update else self

    def protocol_fields(self) -> dict:
        """The fields every party must agree on: all of them, except each factory's ``path`` (a folder
        of the party's own machine)."""
        out = self.model_dump(mode="json")
        for name in FACTORY_FIELDS:
            if out.get(name) is not None:
                out[name] = {k: v for k, v in out[name].items() if k != "path"}
        return out


FACTORY_FIELDS = ("host_bottom_factory", "guest_bottom_factory", "top_factory")


def batch_plan(n_rows: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Row indices of each mini-batch of ``epoch`` (same at every party)."""
    perm = np.random.default_rng([seed, epoch]).permutation(n_rows)
    return [perm[i:i + batch_size] for i in range(0, n_rows, batch_size)]


def _act(name: str) -> torch.nn.Module:
    return {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
            "identity": torch.nn.Identity}[name]()


def build_mlp(in_dim: int, widths: Sequence[int], activation: str, seed: int, *,
              last_activation: bool = True, out_dim: int | None = None) -> torch.nn.Sequential:
    """float64 MLP: Linear(+activation) per width (activation after the last too if ``last_activation``),
    then an optional plain Linear to ``out_dim``. Weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    layers: list[torch.nn.Module] = []
    d = in_dim
    for i, w in enumerate(widths):
        layers.append(torch.nn.Linear(d, w, dtype=DTYPE))
        if last_activation or i < len(widths) - 1 or out_dim is not None:
            layers.append(_act(activation))
        d = w
    if out_dim is not None:
        layers.append(torch.nn.Linear(d, out_dim, dtype=DTYPE))
    with torch.no_grad():
        for m in layers:
            if isinstance(m, torch.nn.Linear):
                bound = 1.0 / math.sqrt(m.in_features)
                m.weight.uniform_(-bound, bound, generator=g)
                m.bias.uniform_(-bound, bound, generator=g)
    return torch.nn.Sequential(*layers)


def bottom_model(cfg: SplitNNConfig, side: Literal["host", "guest"], X: np.ndarray, seed: int,
                 party: str) -> torch.nn.Module | None:
    """The bottom model of a ``side`` party whose rows are ``X`` (n, d): the module of
    ``params.<side>_bottom_factory`` when set (seeded, float64, checked on a probe of ``X``'s first rows:
    :mod:`.split_modules`), else the MLP of the ``<side>_bottom`` widths (None for the guest's ``[]``).
    Raises FactoryError naming ``party`` and the field."""
    ref, d = getattr(cfg, f"{side}_bottom_factory"), X.shape[1]
    if ref is None:
        widths = getattr(cfg, f"{side}_bottom")
        return build_mlp(d, widths, cfg.activation, seed) if widths else None
    field, k = f"params.{side}_bottom_factory", getattr(cfg, f"{side}_bottom_output_width")
    module = seeded_module(ref, field, party, seed, d, k)
    check_output(module, probe_rows(X), k, factory_field=field, width_field=f"params.{side}_bottom_output_width",
                 party=party)
    return module


def top_model(cfg: SplitNNConfig, out_dim: int, seed: int, party: str) -> torch.nn.Module:
    """The guest's top model, (b, interactive_units) -> (b, ``out_dim``): the module of ``params.top_factory``
    when set (seeded, float64, checked on a probe batch), else the MLP of ``top_hidden`` and a last Linear.
    Raises FactoryError naming ``party`` and the field."""
    o = cfg.interactive_units
    if cfg.top_factory is None:
        return build_mlp(o, cfg.top_hidden, cfg.activation, seed, out_dim=out_dim)
    module = seeded_module(cfg.top_factory, "params.top_factory", party, seed, o, out_dim)
    outputs = ("regression: 1" if cfg.task == "regression" else
               "2 classes: 1" if out_dim == 1 else f"{out_dim} classes")
    check_output(module, np.zeros((4, o)), out_dim, factory_field="params.top_factory", party=party,
                 width_field="params.top_factory", why=f"the task's output width ({outputs})")
    return module


def target_scale(y: np.ndarray) -> tuple[float, float]:
    """(mean, std) of regression targets (std 1 when they are constant)."""
    y = np.asarray(y, dtype=np.float64)
    if not len(y):
        return 0.0, 1.0
    std = float(y.std())
    return float(y.mean()), std if std > 0 else 1.0


def task_loss(logits: torch.Tensor, yb: np.ndarray, target: tuple[float, float] | None) -> torch.Tensor:
    """The top model's loss: regression (``target`` = (mean, std)) the MSE of the standardised target;
    else BCE-with-logits for one output (binary) or cross-entropy."""
    if target is not None:
        yt = (torch.as_tensor(np.asarray(yb, dtype=np.float64), dtype=DTYPE) - target[0]) / target[1]
        return torch.nn.functional.mse_loss(logits[:, 0], yt)
    yt = torch.as_tensor(np.asarray(yb, dtype=np.int64))
    if logits.shape[1] == 1:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], yt.to(DTYPE))
    return torch.nn.functional.cross_entropy(logits, yt)


def _optimizer(cfg: SplitNNConfig, params) -> torch.optim.Optimizer | None:
    params = [p for p in params if p.requires_grad]
    if not params:
        return None
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate)
    return torch.optim.SGD(params, lr=cfg.learning_rate)


@dataclass
class FitResult:
    """What ``fit`` returns: per-epoch mean loss and per-batch losses (guest only), wall time per epoch; with
    label DP (guest only) ε after each epoch (nats, at ``label_dp.delta``) and the final privacy record."""

    losses: list[float] = field(default_factory=list)
    batch_losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=list)  # label DP: ε(δ) against the hosts after each epoch
    privacy: dict | None = None  # label DP: the final guarantee (LabelDP.record)

    @property
    def epochs(self) -> int:
        """Epochs trained (this session and any resumed from)."""
        return len(self.epoch_seconds)


def save_checkpoint(directory: Path | str, party_id: str, epoch: int, arrays: dict[str, np.ndarray],
                    meta: dict) -> Path:
    """Write ``<party>-epoch<NNN>.npz`` (arrays only) and a ``.json`` sidecar; return the npz path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{party_id}-epoch{epoch:03d}.npz"
    np.savez(path, **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    path.with_suffix(".json").write_text(json.dumps({"party": party_id, "epoch": epoch, **meta}, indent=2))
    return path


def load_checkpoint(path: Path | str) -> dict[str, np.ndarray]:
    """Read a checkpoint written by :func:`save_checkpoint` (``allow_pickle=False``: data only)."""
    with np.load(Path(path), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _module_arrays(prefix: str, module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {f"{prefix}.{k}": v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def _load_module(prefix: str, module: torch.nn.Module, arrays: dict[str, np.ndarray]) -> None:
    state = {}
    for k, v in module.state_dict().items():
        key = f"{prefix}.{k}"
        if key not in arrays or tuple(arrays[key].shape) != tuple(v.shape):
            raise ValueError(f"checkpoint: missing or mis-shaped array {key!r}")
        state[k] = torch.as_tensor(arrays[key], dtype=v.dtype)
    module.load_state_dict(state)


def _optimizer_arrays(opt: torch.optim.Optimizer | None) -> dict[str, np.ndarray]:
    """The optimiser's per-parameter state as ``opt.<index>.<key>`` arrays (dtype kept; hyperparameters
    come from the config, so ``param_groups`` are not stored)."""
    if opt is None:
        return {}
    out = {}
    for idx, st in opt.state_dict()["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"opt.{idx}.{key}"] = v.detach().cpu().numpy().copy()
            elif isinstance(v, (int, float)):
                out[f"opt.{idx}.{key}"] = np.array(v)
    return out


def _load_optimizer(opt: torch.optim.Optimizer | None, arrays: dict[str, np.ndarray]) -> None:
    """Restore :func:`_optimizer_arrays`; ValueError for an index, key or shape that does not fit."""
    found = {k: v for k, v in arrays.items() if k.startswith("opt.")}
    if opt is None:
        if found:
            raise ValueError("checkpoint: optimiser state for a party without trainable parameters")
        return
    sd = opt.state_dict()
    params = [p for g in opt.param_groups for p in g["params"]]
    state: dict[int, dict] = {}
    for name, arr in found.items():
        _, idx, key = name.split(".", 2)
        if not idx.isdigit() or int(idx) >= len(params) or key not in ("step", "exp_avg", "exp_avg_sq",
                                                                         "momentum_buffer"):
            raise ValueError(f"checkpoint: unexpected optimiser entry {name!r}")
        if key != "step" and tuple(arr.shape) != tuple(params[int(idx)].shape):
            raise ValueError(f"checkpoint: optimiser entry {name!r} has shape {arr.shape}")
        state.setdefault(int(idx), {})[key] = torch.as_tensor(np.array(arr))
    sd["state"] = state
    opt.load_state_dict(sd)


class _Role(Lifecycle, VerticalRole):
    protocol = "split NN"
    pred_request_tag = TAG_PRED_REQ
    step_key, family, list_arrays = "epochs_done", "split NN", True

    def _restored_epochs(self, opt, history: Sequence[str]) -> tuple[int, dict]:
        """Load ``resume`` into this role and ``opt``; returns (epochs done, arrays) ((0, {}) without one).
        ValueError when it is not a split NN checkpoint of this configuration."""
        done, arrays, _ = self._restored(self.config.epochs, history, lambda done, arrays, state: all(
            arrays[h].shape == (done,) for h in history if h != "batch_losses"))
        if done:
            self.load_state(arrays)
            _load_optimizer(opt, arrays)
        return done, arrays

    def _epoch_done(self, done: int, opt, history: dict) -> None:
        """Run the callbacks after epoch ``done`` (the guest has told the hosts already: no stop request)."""
        self._after_step(done, lambda _step: ({**self.state_arrays(), **_optimizer_arrays(opt),
                                               **{k: np.asarray(v, dtype=np.float64) for k, v in history.items()}},
                                              {}))

    def __init__(self, transport: Transport, config, backend, callbacks: Sequence[Callback] = (),
                 resume: Checkpoint | None = None):
        self.config = config if isinstance(config, SplitNNConfig) else SplitNNConfig(**config)
        backend = self.config.he_scheme if backend is None else backend  # an explicit backend wins (benchmarks)
        super().__init__(transport, backend, self.config.precision_bits, self.config.dot_precision_bits)
        self._init_lifecycle(callbacks, resume)


# --------------------------------------------------------------------------- guest
class SplitNNGuest(PredictionGuest, _Role):
    """The label holder: guest bottom, the guest's shares V_h of the interactive weights, top model, loss.

    Args:
        transport: this party's transport.
        host_ids: the hosts, same order at every party.
        X: float64 (n, d_g) guest features (d_g may be 0 only with ``guest_bottom=[]``), rows aligned.
        y: (n,) integer labels 0..C-1 (``task: regression``: finite float targets).
        config: :class:`SplitNNConfig` or a dict of its fields.
        backend: "paillier" (default), "identity" (NO encryption, benchmarks only) or an
            :class:`~secureflhv.crypto.homomorphic.backend.HEBackend`.
        checkpoint_dir: write a checkpoint after every epoch there (optional).
        on_epoch: optional ``callback(epoch, loss)`` after each epoch (progress reporting;
            :attr:`label_dp_epsilon` is that epoch's ε then).
        callbacks, resume: the role lifecycle (Resume in the module docstring); the epochs are fixed.

    After ``fit``: ``bottom`` (torch, or None), ``W_g`` (d_alpha_g, o), ``bias`` (o,), ``V`` {host: (k_h, o)},
    ``top`` (torch). See the module docstring for what the guest learns.
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], X, y, config, *, backend=None,
                 checkpoint_dir: str | Path | None = None, on_epoch: Callable[[int, float], None] | None = None,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport, config, backend, callbacks, resume)
        self.on_epoch = on_epoch
        cfg = self.config
        self.host_ids = list(host_ids)
        if not self.host_ids:
            raise ValueError("host_ids: the split NN needs at least one host")
        self.X = check_matrix(X, "X")
        y = np.asarray(y).ravel()
        if y.shape[0] != self.X.shape[0]:
            raise ValueError(f"y: {y.shape[0]} labels for {self.X.shape[0]} rows")
        self.target: tuple[float, float] | None = None  # regression: (mean, std) of the training targets
        if cfg.task == "regression":
            y = np.asarray(y, dtype=np.float64)
            if not np.all(np.isfinite(y)):
                raise ValueError("y: regression targets must be finite numbers")
            self.y, self.n_classes, self.out_dim = y, None, 1
            # label DP: no standardisation, whose mean and std would read every label (targets in their units)
            self.target = (0.0, 1.0) if cfg.label_dp is not None else target_scale(y)
        else:
            if not np.all(np.equal(np.mod(y, 1), 0)) or y.min() < 0:
                raise ValueError("y: labels must be integers 0..C-1")
            self.y = y.astype(np.int64)
            self.n_classes = cfg.n_classes or max(2, int(self.y.max()) + 1)
            if self.y.max() >= self.n_classes:
                raise ValueError(f"y: label {int(self.y.max())} >= n_classes {self.n_classes}")
            self.out_dim = 1 if self.n_classes == 2 else self.n_classes
        d_g = self.X.shape[1]
        if d_g == 0 and (cfg.guest_bottom or cfg.guest_bottom_factory is not None):
            raise ValueError("X: the guest has no features; set guest_bottom=[] (and no guest_bottom_factory)")
        self.bottom = bottom_model(cfg, "guest", self.X, cfg.init_seed * 1000 + 1, self.party_id)
        k_g = cfg.guest_width(d_g)
        o = cfg.interactive_units
        k_hosts = cfg.host_width
        fan_in = k_g + k_hosts * len(self.host_ids)
        lim = math.sqrt(6.0 / (fan_in + o))  # Xavier over the concatenated input of the interactive layer
        rng = np.random.default_rng([cfg.init_seed, 7])
        self.W_g = rng.uniform(-lim, lim, size=(k_g, o))
        self.V = {h: rng.uniform(-lim, lim, size=(k_hosts, o)) for h in self.host_ids}
        self.bias = np.zeros(o)
        self.top = top_model(cfg, self.out_dim, cfg.init_seed * 1000 + 2, self.party_id)
        self.checkpoint_dir = checkpoint_dir
        self._keys: dict[str, object] = {}
        # label DP's noise is secret (OS entropy): a host knows the job seed, noise drawn from it would hide nothing
        self._label_dp = LabelDP(cfg.label_dp, cfg.epochs) if cfg.label_dp is not None else None
        self.result: FitResult | None = None

    @classmethod
    def from_state(cls, transport: Transport, host_ids: Sequence[str], X, n_classes: int | None, config,
                   arrays: dict[str, np.ndarray], *, backend=None) -> "SplitNNGuest":
        """A guest that only predicts on ``X`` (the prediction set) with saved :meth:`state_arrays`;
        call :meth:`start_prediction` (the hosts send fresh keys), then :meth:`predict_proba`.
        ``n_classes``: the saved class count (None for regression). ValueError for arrays that do not
        fit ``config``."""
        X = check_matrix(X, "X")
        y = np.zeros(X.shape[0], dtype=np.int64)
        if n_classes is not None:
            y[:1] = int(n_classes) - 1  # no labels here: this only makes the class count the saved one
        guest = cls(transport, host_ids, X, y, config, backend=backend)
        if guest.n_classes != (None if n_classes is None else int(n_classes)):
            raise ValueError(f"n_classes: {n_classes} saved, config gives {guest.n_classes}")
        guest.load_state(arrays)
        return guest

    @property
    def label_dp_epsilon(self) -> float | None:
        """Label DP: ε (nats) at ``label_dp.delta`` against the hosts for the releases so far (an epoch counts
        from its first batch); None without label DP."""
        return None if self._label_dp is None else self._label_dp.epsilon()

    def start_prediction(self) -> None:
        """Before predicting with a saved model: send the setup, receive every host's public key."""
        self._guarded(self._setup)

    def _peers(self):
        return list(self.host_ids)

    # ---- model pieces -------------------------------------------------------
    def _alpha_g(self, Xb: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(Xb, dtype=DTYPE)
        return self.bottom(x) if self.bottom is not None else x

    def _head(self, z_hosts: torch.Tensor, alpha_g: torch.Tensor, W_g: torch.Tensor, c: torch.Tensor):
        z = z_hosts + alpha_g @ W_g + c
        return self.top(_act(self.config.interactive_activation)(z))

    def _loss(self, logits: torch.Tensor, yb: np.ndarray) -> torch.Tensor:
        return task_loss(logits, yb, self.target)

    def _proba(self, logits: torch.Tensor) -> np.ndarray:
        if self.target is not None:
            return (self.target[0] + self.target[1] * logits[:, 0]).detach().numpy()
        if self.out_dim == 1:
            return torch.sigmoid(logits[:, 0]).detach().numpy()
        return torch.softmax(logits, dim=1).detach().numpy()

    # ---- training ----------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train with the hosts; returns the guest's :class:`FitResult`."""
        self.result = self._guarded(self._trained, self._fit)
        return self.result

    def _setup(self) -> None:
        cfg, t = self.config, self.t
        setup = messages_pb2.Bundle(scalars={"n_rows": float(self.X.shape[0])},
                                    text={"config": json.dumps(cfg.protocol_fields(), sort_keys=True),
                                          "hosts": ",".join(self.host_ids)})
        for h in self.host_ids:
            t.send(h, TAG_SETUP, setup, round=0)

        for h in self.host_ids:
            self._keys[h] = t.recv(h, TAG_HELLO, parse=self.wire.public_key_parser(cfg.insecure_test_key,
                                                                                  f"{TAG_HELLO} from {h}"))

    def _fit(self) -> FitResult:
        cfg = self.config
        n = self.X.shape[0]
        if -(-n // cfg.batch_size) >= MAX_BATCHES:
            raise ValueError(f"batch_size: {cfg.batch_size} gives too many batches for {n} rows")
        self._setup()
        params = list(self.top.parameters()) + (list(self.bottom.parameters()) if self.bottom is not None else [])
        opt = _optimizer(cfg, params)
        res = FitResult()
        dp = self._label_dp
        first, arrays = self._restored_epochs(opt, ("losses", "batch_losses", "seconds")
                                              + (("epsilon", "label_dp_releases") if dp is not None else ()))
        if first:
            res.losses, res.batch_losses = arrays["losses"].tolist(), arrays["batch_losses"].tolist()
            res.epoch_seconds = arrays["seconds"].tolist()
            if dp is not None:  # the interrupted epoch may have released batches: count it (module label_dp)
                res.epsilons = arrays["epsilon"].tolist()
                dp.releases = int(arrays["label_dp_releases"][-1]) + 1
        releases = list(arrays["label_dp_releases"]) if first and dp is not None else []
        for epoch in range(first, cfg.epochs):
            t0 = time.perf_counter()
            if dp is not None:
                dp.releases += 1  # counted before the first batch goes out
            losses = []
            for b, idx in enumerate(batch_plan(n, cfg.batch_size, cfg.seed, epoch)):
                losses.append(self._train_batch(opt, idx, round_id(epoch, b, 0)))
            res.batch_losses.extend(losses)
            res.losses.append(float(np.mean(losses)))
            ctl = messages_pb2.Control(command="continue" if epoch + 1 < cfg.epochs else "stop", epoch=epoch)
            for h in self.host_ids:
                self.t.send(h, TAG_CTL, ctl, round=epoch + 1)
            if self.checkpoint_dir is not None:
                res.checkpoints.append(str(save_checkpoint(self.checkpoint_dir, self.party_id, epoch,
                                                           self.state_arrays(), {"loss": res.losses[-1]})))
            res.epoch_seconds.append(time.perf_counter() - t0)
            history = {"losses": res.losses, "batch_losses": res.batch_losses, "seconds": res.epoch_seconds}
            if dp is not None:
                res.epsilons.append(dp.epsilon())
                res.privacy = dp.record()
                releases.append(dp.releases)
                history.update(epsilon=res.epsilons, label_dp_releases=releases)
            self._epoch_done(epoch + 1, opt, history)
            log.info("%s: epoch %d/%d loss %.6f %.2fs%s", self.party_id, epoch + 1, cfg.epochs, res.losses[-1],
                     res.epoch_seconds[-1], "" if dp is None else
                     f"; label DP epsilon {res.epsilons[-1]:.4g} at delta {dp.params.delta:g} against the hosts")
            if self.on_epoch is not None:
                self.on_epoch(epoch, res.losses[-1])
        return res

    def _host_forward(self, rnd: int, nb: int, tags=(TAG_FWD, TAG_FWD_MASKED, TAG_FWD_DEC)) -> np.ndarray:
        """Run the forward exchange with every host; return sum_h z_h (nb, o) and keep [[A]]_h."""
        he, t, cfg = self.he, self.t, self.config
        k, o = cfg.host_width, cfg.interactive_units
        tf, tm, td = tags
        enc_A, masks = {}, {}
        for h in self.host_ids:
            enc_A[h] = t.recv(h, tf, round=rnd + S_FWD,
                              parse=self._enc_parser(self._keys[h], (nb, k), f"{tf} from {h}", self._exponent()))
            masks[h] = self._ask_decrypt(self._keys[h], he.matmul(enc_A[h], self.V[h]), h, tm, rnd + S_FWD_MASKED)
        z = np.zeros((nb, o))
        for h in self.host_ids:
            z += self._take_decrypted(self._keys[h], masks[h], h, td, rnd + S_FWD_DEC, (nb, o))
        self._enc_A = enc_A
        return z

    def _train_batch(self, opt, idx: np.ndarray, rnd: int) -> float:
        cfg, he, t = self.config, self.he, self.t
        nb = len(idx)
        k, o = cfg.host_width, cfg.interactive_units
        z_hosts = torch.as_tensor(self._host_forward(rnd, nb), dtype=DTYPE).requires_grad_(True)
        W_g = torch.as_tensor(self.W_g, dtype=DTYPE).requires_grad_(True)
        c = torch.as_tensor(self.bias, dtype=DTYPE).requires_grad_(True)
        if opt is not None:
            opt.zero_grad()
        alpha_g = self._alpha_g(self.X[idx])
        logits = self._head(z_hosts, alpha_g, W_g, c)
        loss = self._loss(logits, self.y[idx])
        if self._label_dp is None:
            loss.backward()
        else:  # every gradient below follows from the released g' only (module label_dp)
            (g,) = torch.autograd.grad(loss, logits, retain_graph=True)  # per-example dl_i/dlogits_i over nb
            released = self._label_dp.privatise(g.numpy() * nb)
            logits.backward(torch.as_tensor(released / nb, dtype=DTYPE))
        # dL/dz (nb, o), the same for every host's term; with label DP delta' (noised), else the exact delta
        delta = z_hosts.grad.numpy().copy()
        # interactive weight gradients of the hosts' shares, masked, and the hosts' old noise E_h
        masks = {}
        for h in self.host_ids:
            masks[h] = self._ask_decrypt(self._keys[h], he.t_matmul(self._enc_A[h], delta), h, TAG_GW, rnd + S_GW)
        grads_V = {}
        for h in self.host_ids:
            pub = self._keys[h]
            grads_V[h] = self._take_decrypted(pub, masks[h], h, TAG_GW_DEC, rnd + S_GW_DEC, (k, o))
            enc_E = t.recv(h, TAG_ACC, round=rnd + S_GW_DEC,
                           parse=self._enc_parser(pub, (k, o), f"{TAG_ACC} from {h}", self._exponent()))
            # [[G]] = delta' (V_h + [[E_h]])^T : the host's bottom-output gradient, under its own key
            enc_G = he.add(he.matmul_t(delta, enc_E), delta @ self.V[h].T)
            self._send_enc(h, TAG_GIN, enc_G, rnd + S_GIN)
        lr_i = cfg.interactive_lr
        for h in self.host_ids:
            self.V[h] = self.V[h] - lr_i * grads_V[h]
        self.W_g = self.W_g - lr_i * W_g.grad.numpy()
        self.bias = self.bias - lr_i * c.grad.numpy()
        if opt is not None:
            opt.step()
        self._enc_A = {}
        return float(loss.detach())

    # ---- state ----------------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The guest's parameters as named float64 arrays (what a checkpoint holds)."""
        out = {"interactive.W_g": self.W_g, "interactive.bias": self.bias}
        out.update({f"interactive.V.{h}": v for h, v in self.V.items()})
        out.update(_module_arrays("top", self.top))
        if self.bottom is not None:
            out.update(_module_arrays("bottom", self.bottom))
        if self.target is not None:
            out["target"] = np.array(self.target, dtype=np.float64)  # regression: training targets' mean, std
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore parameters from :func:`load_checkpoint` output (shapes checked, ValueError)."""
        def get(key, shape):
            if key not in arrays or tuple(arrays[key].shape) != tuple(shape):
                raise ValueError(f"checkpoint: missing or mis-shaped array {key!r}")
            return np.array(arrays[key], dtype=np.float64)
        self.W_g = get("interactive.W_g", self.W_g.shape)
        self.bias = get("interactive.bias", self.bias.shape)
        self.V = {h: get(f"interactive.V.{h}", v.shape) for h, v in self.V.items()}
        if self.target is not None:
            mean, std = get("target", (2,))
            if not (math.isfinite(mean) and math.isfinite(std) and std > 0):
                raise ValueError(f"checkpoint: 'target' must be a finite mean and a positive std, got {[mean, std]}")
            self.target = (float(mean), float(std))
        _load_module("top", self.top, arrays)
        if self.bottom is not None:
            _load_module("bottom", self.bottom, arrays)

    # ---- prediction ----------------------------------------------------------------
    def predict_proba(self, X, rows: Sequence[int] | None = None) -> np.ndarray:
        """Federated prediction: P(y=1) (m,) for 2 classes, else class probabilities (m, C); a regression
        model's predicted values (m,) in the target's units.

        Args:
            X: guest features of the prediction set (m, d_g), rows aligned with every host's set.
            rows: row indices into that set (default all). Hosts must be in :meth:`SplitNNHost.serve_predictions`.
        Raises PeerTimeout if a host does not answer.
        """
        return self._guarded(self._predict, X, rows)

    def _predict(self, X, rows):
        X, sel = self._prediction_rows(X, self.X.shape[1], rows)
        if not self._keys:
            raise RuntimeError("predict_proba: call fit() first (the hosts' keys come with training)")
        out = []
        step = self.config.predict_batch_size
        for s in range(0, len(sel), step):
            chunk = sel[s:s + step]
            rnd = self._request_rows(X.shape[0], chunk.tolist()) * 10
            z = self._host_forward(rnd, len(chunk), (TAG_PRED_FWD, TAG_PRED_MASKED, TAG_PRED_DEC))
            with torch.no_grad(), inference(self.bottom, self.top):
                logits = self._head(torch.as_tensor(z, dtype=DTYPE), self._alpha_g(X[chunk]),
                                    torch.as_tensor(self.W_g, dtype=DTYPE), torch.as_tensor(self.bias, dtype=DTYPE))
            out.append(self._proba(logits))
        self._enc_A = {}
        if not out:
            return np.zeros((0,) if self.out_dim == 1 else (0, self.n_classes))
        return np.concatenate(out, axis=0)


# --------------------------------------------------------------------------- host
class SplitNNHost(PredictionHost, _Role):
    """A feature holder: its bottom model, its Paillier key pair and its noise share E_h.

    Args:
        transport, config, backend, checkpoint_dir: as for :class:`SplitNNGuest`.
        guest_id: the guest's party id.
        host_ids: every host in the guest's order (this party included).
        X: float64 (n, d_h) features aligned with the guest's rows.
        keypair: (public, private) key of ``config.he_scheme``, or a Future of one
            (:func:`~secureflhv.crypto.homomorphic.key_prefetch.prefetch_keypair`; default: generated with ``config.key_bits``).
        record_gradients: keep the per-row norm of the plaintext gradient received in the last epoch
            (``gradient_norms``: (n,) array) -- what an honest-but-curious host can look at; used to
            measure label leakage.

    After ``fit``: ``bottom`` (torch), ``E`` (k_h, o) the accumulated noise. See the module docstring
    for what the host learns.
    """

    def __init__(self, transport: Transport, guest_id: str, host_ids: Sequence[str], X, config, *, backend=None,
                 keypair=None, checkpoint_dir: str | Path | None = None, record_gradients: bool = False,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport, config, backend, callbacks, resume)
        cfg = self.config
        self.guest_id = guest_id
        self.host_ids = list(host_ids)
        if self.party_id not in self.host_ids:
            raise ValueError(f"host_ids: {self.party_id!r} is not listed in {self.host_ids}")
        self.index = self.host_ids.index(self.party_id)
        self.X = check_matrix(X, "X")
        if self.X.shape[1] == 0:
            raise ValueError("X: a host needs at least one feature")
        self.bottom = bottom_model(cfg, "host", self.X, cfg.init_seed * 1000 + 10 + self.index, self.party_id)
        self.E = np.zeros((cfg.host_width, cfg.interactive_units))
        self._keypair = keypair
        self.public_key = None
        self.checkpoint_dir = checkpoint_dir
        self.record_gradients = record_gradients
        self.gradient_norms = np.full(self.X.shape[0], np.nan)
        self._noise_rng = _secret_rng()  # E_h's noise is secret: never derived from a shared seed
        self.result: FitResult | None = None

    def _peers(self):
        return [self.guest_id]

    def _recv(self, tag: str, round: int = 0, parse=None):
        # A host waits twice the deadline for the guest: when another host dies, the guest's own
        # (shorter) wait expires first and its error names the dead host.
        return self.t.recv(self.guest_id, tag, round=round, timeout=2 * self.t.deadline, parse=parse)

    def fit(self) -> FitResult:
        """Train with the guest; returns this host's :class:`FitResult` (times only)."""
        self.result = self._guarded(self._trained, self._fit)
        return self.result

    def _check_setup(self, msg: messages_pb2.Bundle) -> None:
        """The guest's plan must equal ours (config, host list, row count); ProtocolError names the field."""
        try:
            theirs = json.loads(msg.text.get("config", "{}"))
        except ValueError as exc:
            raise ProtocolError(f"{self.party_id}: the guest's config is not JSON: {exc}") from None
        if not isinstance(theirs, dict):
            raise ProtocolError(f"{self.party_id}: the guest's config is not a JSON object")
        ours = self.config.protocol_fields()
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        if diff:
            k = diff[0]
            raise ProtocolError(f"{self.party_id}: config field {k!r} is {ours.get(k)!r} here but "
                                f"{theirs.get(k)!r} at the guest" + (f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""))
        if msg.text.get("hosts") != ",".join(self.host_ids):
            raise ProtocolError(f"{self.party_id}: host list {self.host_ids} differs from the guest's "
                                f"{msg.text.get('hosts')!r}")
        rows = whole_count(msg.scalars.get("n_rows", -1.0), f"{self.party_id}: the guest's n_rows")
        if rows != self.X.shape[0]:
            raise ProtocolError(f"{self.party_id}: {self.X.shape[0]} aligned rows here but {rows} at the guest "
                                "(run PSI first)")

    def _key_setup(self) -> None:
        """Check the guest's plan (config, hosts, rows), make this host's key pair, send the public key."""
        cfg = self.config
        self._check_setup(self._recv(TAG_SETUP, parse=parse_message(messages_pb2.Bundle)))
        pub, priv = resolve_keypair(self._keypair) or self.he.generate_keypair(cfg.key_bits, cfg.insecure_test_key)
        self.public_key, self._priv = pub, priv
        self.t.send(self.guest_id, TAG_HELLO, self.wire.public_key_to_proto(pub), round=0)

    @classmethod
    def from_state(cls, transport: Transport, guest_id: str, host_ids: Sequence[str], X, config,
                   arrays: dict[str, np.ndarray], *, backend=None) -> "SplitNNHost":
        """A host that only predicts on ``X`` (its rows of the prediction set) with saved
        :meth:`state_arrays`; call :meth:`start_prediction`, then :meth:`serve_predictions` (X).
        ValueError for arrays that do not fit ``config``."""
        host = cls(transport, guest_id, host_ids, X, config, backend=backend)
        host.load_state(arrays)
        return host

    def start_prediction(self) -> None:
        """Before serving a saved model: the guest's setup (same config, hosts and rows) and a fresh key."""
        self._guarded(self._key_setup)

    def _fit(self) -> FitResult:
        cfg = self.config
        self._key_setup()
        opt = _optimizer(cfg, self.bottom.parameters())
        n = self.X.shape[0]
        res = FitResult()
        first, arrays = self._restored_epochs(opt, ("seconds",))
        if first:
            res.epoch_seconds = arrays["seconds"].tolist()
        for epoch in range(first, cfg.epochs):
            t0 = time.perf_counter()
            for b, idx in enumerate(batch_plan(n, cfg.batch_size, cfg.seed, epoch)):
                self._train_batch(opt, idx, round_id(epoch, b, 0))
            ctl = self._recv(TAG_CTL, round=epoch + 1, parse=control_parser(epoch))
            if self.checkpoint_dir is not None:
                res.checkpoints.append(str(save_checkpoint(self.checkpoint_dir, self.party_id, epoch,
                                                           self.state_arrays(), {})))
            res.epoch_seconds.append(time.perf_counter() - t0)
            self._epoch_done(epoch + 1, opt, {"seconds": res.epoch_seconds})
            log.info("%s: epoch %d/%d done in %.2fs", self.party_id, epoch + 1, cfg.epochs, res.epoch_seconds[-1])
            if ctl.command == "stop":
                break
        return res

    def _forward(self, Xb: np.ndarray, rnd: int, tags=(TAG_FWD, TAG_FWD_MASKED, TAG_FWD_DEC)):
        he, cfg = self.he, self.config
        tf, tm, td = tags
        nb = Xb.shape[0]
        alpha = self.bottom(torch.as_tensor(Xb, dtype=DTYPE))
        A = alpha.detach().numpy().astype(np.float64)
        self._send_enc(self.guest_id, tf, he.encrypt(self._priv, A), rnd + S_FWD)
        enc = self._recv(tm, round=rnd + S_FWD_MASKED,
                     parse=self._enc_parser(self.public_key, (nb, cfg.interactive_units), f"{tm} from {self.guest_id}",
                                            self._exponent(dots=1)))
        self._send_decrypted(self._priv, enc, self.guest_id, td, rnd + S_FWD_DEC, A @ self.E)
        return alpha, A

    def _train_batch(self, opt, idx: np.ndarray, rnd: int) -> None:
        cfg, he = self.config, self.he
        pub, priv = self.public_key, self._priv
        nb = len(idx)
        k, o = cfg.host_width, cfg.interactive_units
        if opt is not None:
            opt.zero_grad()
        alpha, A = self._forward(self.X[idx], rnd)
        enc = self._recv(TAG_GW, round=rnd + S_GW,
                     parse=self._enc_parser(pub, (k, o), f"{TAG_GW} from {self.guest_id}", self._exponent(dots=1)))
        w = cfg.weight_noise
        eps = self._noise_rng.uniform(-w, w, size=(k, o)) if w > 0 else np.zeros((k, o))
        self._send_decrypted(priv, enc, self.guest_id, TAG_GW_DEC, rnd + S_GW_DEC, eps / cfg.interactive_lr)
        self._send_enc(self.guest_id, TAG_ACC, he.encrypt(priv, self.E), rnd + S_GW_DEC)
        self.E = self.E + eps
        enc_G = self._recv(TAG_GIN, round=rnd + S_GIN,
                       parse=self._enc_parser(pub, (nb, k), f"{TAG_GIN} from {self.guest_id}", self._exponent(dots=1)))
        G = he.decrypt(priv, enc_G)
        if self.record_gradients:
            self.gradient_norms[idx] = np.linalg.norm(G, axis=1)
        alpha.backward(torch.as_tensor(G, dtype=DTYPE))
        if opt is not None:
            opt.step()

    # ---- state ------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """This host's trained state as float64 arrays: its interactive-layer share ``interactive.E`` (d_bottom,
        units) and its bottom model's parameters (``bottom.<name>``), as saved in the model bundle.
        """
        out = {"interactive.E": self.E}
        out.update(_module_arrays("bottom", self.bottom))
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Load :meth:`state_arrays`' arrays. ValueError naming a missing or mis-shaped array."""
        if "interactive.E" not in arrays or arrays["interactive.E"].shape != self.E.shape:
            raise ValueError("checkpoint: missing or mis-shaped array 'interactive.E'")
        self.E = np.array(arrays["interactive.E"], dtype=np.float64)
        _load_module("bottom", self.bottom, arrays)

    # ---- prediction (the loop is :meth:`PredictionHost.serve_predictions`) ---------------------
    @property
    def max_request_rows(self) -> int:
        """The most rows one prediction request may ask for (``predict_batch_size``)."""
        return self.config.predict_batch_size

    def _prediction_matrix(self, X) -> np.ndarray:
        X = self._prediction_features(X, self.X.shape[1])
        if self.public_key is None:
            raise RuntimeError("serve_predictions: call fit() first")
        return X

    def _recv_request(self, rnd: int, parse):
        return self._recv(TAG_PRED_REQ, round=rnd, parse=parse)

    def _answer(self, X, rows, rnd):
        with torch.no_grad(), inference(self.bottom):
            self._forward(X[rows], rnd * 10, (TAG_PRED_FWD, TAG_PRED_MASKED, TAG_PRED_DEC))


# --------------------------------------------------------------------------- centralised reference
class CentralisedSplitNN:
    """The same split architecture trained in one place with plain torch (reference and baseline).

    Same pieces, same update rules: bottom/top with the configured optimiser, the interactive layer
    (W_g, W_h, c) with plain SGD at ``interactive_lr``; same batch plan. Build it from the initial
    federated roles (:meth:`from_roles`, test use: it reads the host's E_h) or fresh (:meth:`create`).
    """

    def __init__(self, config: SplitNNConfig, guest_bottom, host_bottoms: list, W_g, W_hosts: list, bias, top,
                 n_classes: int | None, target: tuple[float, float] | None = None):
        self.config = config
        self.guest_bottom = guest_bottom
        self.host_bottoms = host_bottoms
        self.W_g = torch.as_tensor(np.array(W_g), dtype=DTYPE).requires_grad_(True)
        self.W_hosts = [torch.as_tensor(np.array(W), dtype=DTYPE).requires_grad_(True) for W in W_hosts]
        self.bias = torch.as_tensor(np.array(bias), dtype=DTYPE).requires_grad_(True)
        self.top = top
        self.n_classes = n_classes
        self.out_dim = 1 if config.task == "regression" or n_classes == 2 else n_classes
        self.target = target  # regression: (mean, std); None: taken from the targets at fit
        mods = [m for m in [guest_bottom, *host_bottoms, top] if m is not None]
        self.opt = _optimizer(config, [p for m in mods for p in m.parameters()])

    @classmethod
    def from_roles(cls, guest: SplitNNGuest, hosts: Sequence[SplitNNHost]) -> "CentralisedSplitNN":
        """The centralised network the trained roles make together: copies of the bottom models, the guest's
        W_g, each host's interactive weights V_h + E_h, the bias and the top model (for tests and checks).
        """
        import copy

        return cls(guest.config, copy.deepcopy(guest.bottom), [copy.deepcopy(h.bottom) for h in hosts],
                   guest.W_g, [guest.V[h.party_id] + h.E for h in hosts], guest.bias, copy.deepcopy(guest.top),
                   guest.n_classes, guest.target)

    @classmethod
    def create(cls, config: SplitNNConfig, d_guest: int, d_hosts: Sequence[int], n_classes: int | None,
               seed: int = 0) -> "CentralisedSplitNN":
        """A freshly initialised centralised twin of the split network for ``d_guest`` and ``d_hosts`` input
        columns (Glorot-uniform interactive weights, seeded as the federated roles are).
        """
        cfg = config
        gb = bottom_model(cfg, "guest", np.zeros((0, d_guest)), seed * 1000 + 1, "guest")
        hbs = [bottom_model(cfg, "host", np.zeros((0, d)), seed * 1000 + 10 + i, f"host {i}")
               for i, d in enumerate(d_hosts)]
        k_g, k_h = cfg.guest_width(d_guest), cfg.host_width
        o = cfg.interactive_units
        lim = math.sqrt(6.0 / (k_g + k_h * len(d_hosts) + o))
        rng = np.random.default_rng([seed, 7])
        W_g = rng.uniform(-lim, lim, size=(k_g, o))
        W_h = [rng.uniform(-lim, lim, size=(k_h, o)) for _ in d_hosts]
        out = 1 if cfg.task == "regression" or n_classes == 2 else n_classes
        top = top_model(cfg, out, seed * 1000 + 2, "guest")
        return cls(cfg, gb, hbs, W_g, W_h, np.zeros(o), top, n_classes)

    def logits(self, Xg: np.ndarray, Xhs: Sequence[np.ndarray]) -> torch.Tensor:
        """Output logits (n, out) of the whole network on the guest's (n, d_g) and each host's (n, d_h) rows."""
        xg = torch.as_tensor(Xg, dtype=DTYPE)
        ag = self.guest_bottom(xg) if self.guest_bottom is not None else xg
        z = ag @ self.W_g + self.bias
        for bottom, W, Xh in zip(self.host_bottoms, self.W_hosts, Xhs):
            z = z + bottom(torch.as_tensor(Xh, dtype=DTYPE)) @ W
        return self.top(_act(self.config.interactive_activation)(z))

    def _loss(self, logits, yb):
        return task_loss(logits, yb, self.target)

    def fit(self, Xg, Xhs, y, epochs: int | None = None) -> list[float]:
        """Train; returns the per-batch losses."""
        cfg = self.config
        n = len(y)
        if cfg.task == "regression" and self.target is None:
            self.target = target_scale(y)
        out = []
        for epoch in range(cfg.epochs if epochs is None else epochs):
            for idx in batch_plan(n, cfg.batch_size, cfg.seed, epoch):
                if self.opt is not None:
                    self.opt.zero_grad()
                for p in [self.W_g, self.bias, *self.W_hosts]:
                    p.grad = None
                loss = self._loss(self.logits(Xg[idx], [X[idx] for X in Xhs]), np.asarray(y)[idx])
                loss.backward()
                with torch.no_grad():
                    for p in [self.W_g, self.bias, *self.W_hosts]:
                        p -= cfg.interactive_lr * p.grad
                if self.opt is not None:
                    self.opt.step()
                out.append(float(loss.detach()))
        return out

    def predict_proba(self, Xg, Xhs) -> np.ndarray:
        """Predictions (n,) float64: P(y=1) for binary, class probabilities (n, K) for multiclass, values in
        label units for regression.
        """
        with torch.no_grad(), inference(self.guest_bottom, *self.host_bottoms, self.top):
            logits = self.logits(Xg, Xhs)
        if self.target is not None:
            return (self.target[0] + self.target[1] * logits[:, 0]).numpy()
        if self.out_dim == 1:
            return torch.sigmoid(logits[:, 0]).numpy()
        return torch.softmax(logits, dim=1).numpy()
