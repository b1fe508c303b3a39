"""Models of horizontal FL (torch), and their flat-vector view used by strategies and aggregation.

* :class:`SimpleCNN` — NIID-Bench's "simple-cnn" (Li et al., ICDE 2022, section V-A; ``SimpleCNNMNIST``
  for 28×28 inputs, ``SimpleCNN`` for 32×32): conv 5×5 → 6 channels, ReLU, 2×2 max-pool, conv 5×5 →
  16 channels, ReLU, 2×2 max-pool, FC 120, ReLU, FC 84, ReLU, FC n_classes. For Fashion-MNIST
  (1×28×28) it has 44,426 float32 parameters.
* :class:`MLP` — NIID-Bench's tabular ``FcNet``: hidden layers 32-16-8 with ReLU, then n_classes.

Tasks (``ModelSpec.task``): ``classification`` — ``n_classes`` logits, cross-entropy; ``regression`` —
one output, mean squared error. A regression head predicts ``target_mean + target_std · net(x)``: the
affine map is a fixed constant of the architecture (not a parameter), so the network learns the
standardised target and its updates stay inside the aggregation clip whatever the target's units,
while ``model(x)`` and every prediction are in the target's own units. The training loss is the MSE
of the standardised target, ``mean((ŷ − y)²) / target_std²`` (:func:`task_loss`).

Both take flat feature rows ``(batch, n_features)`` float32 (the layout of every
:class:`secureflhv.data.Dataset`); the CNN reshapes them to ``image_shape``.

Flat view: :func:`get_flat` / :func:`set_flat` map the parameters, in ``named_parameters()`` order,
to one float32 vector of length :func:`n_params`; :func:`named_arrays` gives the same parameters as
named float32 arrays (the ``.npz`` artifact and the wire format of the global model). Neither
model has buffers, so parameters are the whole state. A user's model (``params.model.factory``,
:mod:`.user_model`) aggregates the tensors its spec selects (buffers, trainable parameters only): the same
functions then walk :func:`fl_entries`.
"""
from __future__ import annotations

import math
import threading
from typing import Literal, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from .local_data import DatasetRows, input_batch
from .user_model import (UserModelSpec, build_user_model, check_outputs, fl_entries,  # noqa: F401 (re-exported)
                         model_device)


class ModelSpec(BaseModel):
    """Architecture of the global model, identical at the server and every client.

    Attributes:
        name: ``cnn`` (NIID-Bench simple CNN, images) or ``mlp`` (tables).
        task: ``classification`` (``n_classes`` outputs, cross-entropy) or ``regression`` (one output, MSE).
        n_features: length of a feature row (784 for Fashion-MNIST).
        n_classes: number of classes (every client uses the same, even if it holds fewer labels);
            classification only (leave unset for regression).
        target_mean, target_std: regression only: the head predicts ``target_mean + target_std · net(x)``
            (a prior on the target's location and scale in its own units, e.g. from the data dictionary;
            the defaults 0 and 1 suit an already standardised target).
        image_shape: (channels, height, width) for ``cnn``; default: 1×s×s when n_features = s², else
            3×s×s when n_features = 3s².
        hidden: hidden layer widths of ``mlp`` (NIID-Bench: 32, 16, 8); ``[]`` gives softmax regression.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["cnn", "mlp"] = "cnn"
    task: Literal["classification", "regression"] = "classification"
    n_features: int = Field(gt=0)
    n_classes: int | None = Field(default=None, ge=2)
    target_mean: float = Field(default=0.0, allow_inf_nan=False)
    target_std: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    image_shape: tuple[int, int, int] | None = None
    hidden: tuple[int, ...] = (32, 16, 8)

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        check_outputs(self.task, self.n_classes)
        if self.task == "classification" and (self.target_mean, self.target_std) != (0.0, 1.0):
            raise ValueError("target_mean, target_std: only for task 'regression'")
        if self.name == "cnn":
            c, h, w = self.resolved_image_shape()
            if c * h * w != self.n_features:
                raise ValueError(f"image_shape {[c, h, w]} has {c * h * w} values, n_features is {self.n_features}")
            if (h - 4) // 2 - 4 < 2 or (w - 4) // 2 - 4 < 2:
                raise ValueError(f"image_shape {[c, h, w]}: images must be at least 16×16 for two 5×5 convolutions")
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"hidden: layer widths must be >= 1, got {list(self.hidden)}")
        return self

    @property
    def n_outputs(self) -> int:
        """Width of the output layer: n_classes (classification) or 1 (regression)."""
        return 1 if self.task == "regression" else int(self.n_classes)

    def resolved_image_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of a CNN's input: ``image_shape``, else the square of 1 or 3 channels that
        ``n_features`` makes; ValueError when it makes neither.
        """
        if self.image_shape is not None:
            return tuple(self.image_shape)
        for c in (1, 3):
            s = math.isqrt(self.n_features // c)
            if c * s * s == self.n_features:
                return (c, s, s)
        raise ValueError(f"image_shape: n_features={self.n_features} is not c*s*s for c in (1, 3); give image_shape")


def _head(model: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Regression: ``target_mean + target_std · out`` (constants, not parameters); classification: ``out``."""
    if model.task == "regression":
        mean, std = model.target
        return out * std + mean
    return out


def task_loss(model: nn.Module, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The training loss of ``model``'s task on its output ``out``: cross-entropy of logits (batch, K)
    against int64 labels, or for regression the MSE of the standardised target,
    ``(out[:, 0] − y)² / target_std²`` (float ``y`` in the target's units)."""
    if model.task == "regression":
        std = model.target[1]
        return nn.functional.mse_loss(out[:, 0], y.to(out.dtype), reduction=reduction) / (std * std)
    return nn.functional.cross_entropy(out, y, reduction=reduction)


def label_tensor(model: nn.Module, y: np.ndarray) -> torch.Tensor:
    """Labels as the loss wants them: int64 class ids, or float32 regression targets."""
    if model.task == "regression":
        return torch.from_numpy(np.asarray(y, dtype=np.float32))
    return torch.from_numpy(np.asarray(y, dtype=np.int64))


class SimpleCNN(nn.Module):
    """NIID-Bench simple CNN (see module docstring). Input (batch, c*h*w) float32; output logits (batch, K)."""

    def __init__(self, image_shape: Sequence[int] = (1, 28, 28), n_classes: int = 10):
        super().__init__()
        self.task, self.target = "classification", (0.0, 1.0)  # build_model sets a regression head
        c, h, w = image_shape
        self.image_shape = (c, h, w)
        self.conv1 = nn.Conv2d(c, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        flat = 16 * (((h - 4) // 2 - 4) // 2) * (((w - 4) // 2 - 4) // 2)  # 16*4*4 for 28x28, 16*5*5 for 32x32
        self.fc1 = nn.Linear(flat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (or, for regression, de-standardised values) of ``x`` float32 (batch, n_features)."""
        x = x.reshape(x.shape[0], *self.image_shape)
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = x.flatten(1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return _head(self, self.fc3(x))


class MLP(nn.Module):
    """Fully connected net ``n_features → hidden... → n_classes`` with ReLU (NIID-Bench FcNet, no dropout)."""

    def __init__(self, n_features: int, hidden: Sequence[int] = (32, 16, 8), n_classes: int = 2):
        super().__init__()
        self.task, self.target = "classification", (0.0, 1.0)  # build_model sets a regression head
        widths = [n_features, *hidden, n_classes]
        layers: list[nn.Module] = []
        for i in range(len(widths) - 1):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (or, for regression, de-standardised values) of ``x`` float32 (batch, n_features)."""
        return _head(self, self.net(x))


def check_local_data(party_id: str, spec: ModelSpec, X_train, y_train, X_test, y_test) -> None:
    """Check a party's own training and test data against the model spec before any round starts.

    X_*: (rows, spec.n_features), or a user dataset's :class:`~.local_data.DatasetRows` (any input shape: the
    forward pass is probed at preflight); y_*: (rows,), class indices in [0, spec.n_classes) or, for
    ``spec.task == "regression"``, finite numbers. Raises ValueError naming the party, the split and the
    job-file field to fix; at least one training row is required.
    """
    for what, X, y in (("training", X_train, y_train), ("test", X_test, y_test)):
        if isinstance(X, DatasetRows) or isinstance(spec, UserModelSpec):
            pass  # the user's model takes its own input shape (probed at preflight)
        elif X.ndim != 2 or X.shape[1] != spec.n_features:
            raise ValueError(f"{party_id}: {what} data has shape {X.shape}, the model expects "
                             f"(rows, {spec.n_features}) (model.n_features)")
        if len(y) != len(X):
            raise ValueError(f"{party_id}: {what} data has {len(X)} rows but {len(y)} labels")
        if spec.task == "regression":
            if not np.all(np.isfinite(np.asarray(y, np.float64))):
                raise ValueError(f"{party_id}: {what} regression targets must be finite numbers")
        elif len(y) and (y.min() < 0 or y.max() >= spec.n_classes):
            raise ValueError(f"{party_id}: {what} labels must be integers in [0, {spec.n_classes}) "
                             f"(model.n_classes), found {y.min()}..{y.max()}")
    if len(y_train) == 0:
        raise ValueError(f"{party_id}: no training rows")


def build_model(spec, seed: int | None = None) -> nn.Module:
    """A fresh model of ``spec`` (a :class:`ModelSpec`, or a :class:`~.user_model.UserModelSpec`: the user's
    factory, FactoryError when it fails); with ``seed``, its initial weights depend only on the seed.

    Thread-safe: torch's initialisers draw from its one global generator, so builds are serialised (peers
    or clients simulated in threads of one process would otherwise interleave their draws)."""
    with _BUILD_LOCK:
        gen_state = None
        if seed is not None:
            gen_state = torch.random.get_rng_state()
            torch.manual_seed(seed)
        try:
            if isinstance(spec, UserModelSpec):
                return build_user_model(spec)
            if spec.name == "cnn":
                model = SimpleCNN(spec.resolved_image_shape(), spec.n_outputs)
            else:
                model = MLP(spec.n_features, spec.hidden, spec.n_outputs)
            if spec.task == "regression":
                model.task = "regression"
                model.target = (float(spec.target_mean), float(spec.target_std))
            return model
        finally:
            if gen_state is not None:
                torch.random.set_rng_state(gen_state)


_BUILD_LOCK = threading.Lock()


def param_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Aggregated tensor name → shape, in the flat-vector order."""
    return {name: tuple(p.shape) for name, p in fl_entries(model)}


def n_params(model: nn.Module) -> int:
    """The number of scalars in the flat vector (every parameter of a built-in model)."""
    return sum(p.numel() for _, p in fl_entries(model))


def get_flat(model: nn.Module) -> np.ndarray:
    """All aggregated tensors as one float32 vector (a copy, on the CPU), in :func:`fl_entries` order."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for _, p in fl_entries(model)]
                         ).numpy().astype(np.float32, copy=True)


def set_flat(model: nn.Module, vector: np.ndarray) -> None:
    """Load a flat vector (any float dtype; cast to float32, then to each tensor's dtype and device) into the
    aggregated tensors. Raises ValueError when the length differs from :func:`n_params`.
    """
    vector = np.asarray(vector)
    entries = fl_entries(model)
    total = sum(p.numel() for _, p in entries)
    if vector.shape != (total,):
        raise ValueError(f"flat parameter vector has shape {vector.shape}, the model has {total} parameters")
    flat = torch.from_numpy(vector.astype(np.float32, copy=True))
    offset = 0
    with torch.no_grad():
        for _, p in entries:
            n = p.numel()
            p.copy_(flat[offset:offset + n].reshape(p.shape))
            offset += n


def named_arrays(model: nn.Module, vector: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Parameters as ``{name: float32 array}`` (from ``vector`` if given, else from the model)."""
    flat = get_flat(model) if vector is None else np.asarray(vector, dtype=np.float32)
    out, offset = {}, 0
    for name, shape in param_shapes(model).items():
        n = int(np.prod(shape))
        out[name] = flat[offset:offset + n].reshape(shape).copy()
        offset += n
    if offset != flat.size:
        raise ValueError(f"vector has {flat.size} values, the model has {offset} parameters")
    return out


def flatten_named(model: nn.Module, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Inverse of :func:`named_arrays`: check names/shapes against ``model`` and concatenate (float32).

    Raises ValueError naming a missing, unexpected or mis-shaped parameter.
    """
    shapes = param_shapes(model)
    extra = sorted(set(arrays) - set(shapes))
    missing = [n for n in shapes if n not in arrays]
    if extra or missing:
        raise ValueError(f"parameters do not match the model: missing {missing}, unexpected {extra}")
    parts = []
    for name, shape in shapes.items():
        a = np.asarray(arrays[name])
        if a.shape != shape:
            raise ValueError(f"parameter {name!r} has shape {a.shape}, the model expects {shape}")
        parts.append(a.astype(np.float32, copy=False).reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


@torch.no_grad()
def predict(model: nn.Module, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Class predictions (int64, (n,)), or for a regression head the predicted values (float64, (n,)),
    for feature rows ``X`` (n, n_features)."""
    model.train(False)  # inference mode
    regression = model.task == "regression"
    out, device = [], model_device(model)
    for start in range(0, len(X), batch_size):
        o = model(input_batch(X, start, start + batch_size).to(device)).cpu()
        out.append(o[:, 0].double().numpy() if regression else o.argmax(1).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float64 if regression else np.int64)


@torch.no_grad()
def evaluate(model: nn.Module, X: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> dict[str, float]:
    """Metrics of ``model`` on (X, y) as sums, so that clients' results add up.

    Classification: accuracy, mean cross-entropy ``loss``, ``correct`` count and ``n``. Regression:
    ``loss`` = mean squared error (target units²), ``sse`` = Σ(ŷ − y)², ``sae`` = Σ|ŷ − y|,
    ``y_sum`` = Σy, ``y2_sum`` = Σy², ``n`` (``accuracy`` NaN, ``correct`` 0).
    """
    model.train(False)  # inference mode
    n = len(y)
    if model.task == "regression":
        pred = predict(model, X, batch_size)
        yy = np.asarray(y, dtype=np.float64)
        err = pred - yy
        sse = float(err @ err)
        return {"accuracy": float("nan"), "loss": sse / n if n else float("nan"), "correct": 0.0, "n": float(n),
                "sse": sse, "sae": float(np.abs(err).sum()), "y_sum": float(yy.sum()), "y2_sum": float(yy @ yy)}
    correct, loss_sum, device = 0, 0.0, model_device(model)
    for start in range(0, n, batch_size):
        xb = input_batch(X, start, start + batch_size).to(device)
        yb = torch.from_numpy(np.asarray(y[start:start + batch_size], dtype=np.int64)).to(device)
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return {"accuracy": correct / n if n else float("nan"), "loss": loss_sum / n if n else float("nan"),
            "correct": float(correct), "n": float(n)}
