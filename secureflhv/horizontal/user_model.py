"""The user's own torch model in horizontal FL: a factory named in the job, and the agreed parameter layout.

``params.model`` may name a factory instead of a built-in architecture::

    model:
      factory: "mypkg.models:resnet8"     # importable at every party: each runs its own copy of the agreed code
      kwargs: {n_classes: 10}
      task: classification                # or regression (one output, as the built-in heads)
      n_classes: 10
      buffers: aggregate                  # or local: FedBN (Li et al., ICLR 2021)
      trainable_only: false               # true: only requires_grad parameters are aggregated (adapters, LoRA)
      weights: init.safetensors           # optional agreed initial weights (else: the factory with the job's seed)
      layout_hash: "sha256:..."           # optional: each party checks its own layout against it at preflight

**What is aggregated** (:func:`aggregated_names`, in ``state_dict`` order, a tensor shared under two names counted once):

* parameters: all of them, or with ``trainable_only`` those with ``requires_grad`` (a frozen backbone stays at
  its initial weights, identical at every party: the factory with the job's seed, or ``weights``);
* floating-point buffers (batch-norm running mean and variance) with ``buffers: aggregate``; with
  ``buffers: local`` (FedBN, Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via
  Local Batch Normalization", ICLR 2021, Algorithm 1) every buffer *and* the affine weight and bias of every
  batch-norm layer stay at the client; integer buffers (``num_batches_tracked``) never travel.

The **layout** (:class:`ParamLayout`) is the ordered list of (name, shape, dtype) of the aggregated tensors; its
digest (SHA-256 of its canonical JSON) is what parties agree on before round 1 (:mod:`.fl`: ``fl.layout``).
Updates travel as float32 whatever a tensor's dtype (cast back on load).

What each role learns: the same as with a built-in model; the layout (names, shapes, dtypes) is public to the
job. No code travels: the factory is imported locally (:class:`secureflhv.params.FactoryRef`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from ..params.factory import FactoryError, FactoryRef

MODEL_FIELD = "params.model.factory"


def check_outputs(task: str, n_classes: int | None) -> None:
    """A model spec's task and class count fit: ``n_classes`` for classification, none for regression (one output).
    ValueError naming ``n_classes`` (pydantic reports it under ``params.model``)."""
    if task == "classification" and n_classes is None:
        raise ValueError("n_classes: required for task 'classification' (an integer >= 2)")
    if task == "regression" and n_classes is not None:
        raise ValueError(f"n_classes: task 'regression' has one output; remove n_classes ({n_classes})")


class UserModelSpec(FactoryRef):
    """``params.model`` naming the consortium's own torch model (see the module docstring).

    Attributes (beyond :class:`~secureflhv.params.FactoryRef`'s factory, kwargs, path):
        task, n_classes, target_mean, target_std: as :class:`~.models.ModelSpec` (the model's output is
            (batch, n_classes) logits, or (batch, 1) for regression).
        buffers: ``aggregate`` (default) or ``local`` (FedBN).
        trainable_only: aggregate only parameters with ``requires_grad``.
        weights: a safetensors file of the agreed initial ``state_dict`` (relative to the job file).
        layout_hash: the expected :meth:`ParamLayout.digest`; preflight fails at a party whose model differs.
    """

    task: Literal["classification", "regression"] = "classification"
    n_classes: int | None = Field(default=None, ge=2)
    target_mean: float = Field(default=0.0, allow_inf_nan=False)
    target_std: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    buffers: Literal["aggregate", "local"] = Field(
        default="aggregate", description="batch-norm statistics: aggregate, or keep at each client (FedBN)")
    trainable_only: bool = Field(default=False, description="aggregate only parameters with requires_grad")
    weights: Path | None = Field(default=None, description="agreed initial weights (safetensors state_dict)")
    layout_hash: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$",
                                    description="expected digest of the aggregated layout (names, shapes, dtypes)")

    @model_validator(mode="after")
    def _task(self) -> "UserModelSpec":
        check_outputs(self.task, self.n_classes)
        return self

    @property
    def n_outputs(self) -> int:
        """Width of the model's output: n_classes, or 1 for regression."""
        return 1 if self.task == "regression" else int(self.n_classes)

    def resolved(self, base: Path) -> "UserModelSpec":
        """This spec with ``path`` and ``weights`` made absolute against the job file's folder ``base``."""
        update = {k: (base / v).resolve() for k, v in (("path", self.path), ("weights", self.weights))
                  if v is not None and not Path(v).is_absolute()}
        return self.model_copy(update=update) if update else self


@dataclass(frozen=True)
class ParamLayout:
    """The aggregated tensors of a model: ``entries`` = ((name, shape, dtype name), ...) in flat-vector order."""

    entries: tuple[tuple[str, tuple[int, ...], str], ...]

    @property
    def size(self) -> int:
        """Number of scalars in the flat vector."""
        total = 0
        for _, shape, _ in self.entries:
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    def to_json(self) -> str:
        """Canonical JSON (the digest's input and the ``fl.layout`` payload)."""
        return json.dumps([[n, list(s), d] for n, s, d in self.entries], separators=(",", ":"))

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`to_json`."""
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str, max_entries: int = 100_000) -> "ParamLayout":
        """Parse :meth:`to_json`; ValueError for anything else (a peer's payload: bounded and checked)."""
        doc = json.loads(text)
        if not isinstance(doc, list) or len(doc) > max_entries:
            raise ValueError("layout: not a list of at most %d entries" % max_entries)
        entries = []
        for e in doc:
            if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[2], str)
                    and isinstance(e[1], list) and len(e[1]) <= 16
                    and all(isinstance(s, int) and 0 <= s < 1 << 40 for s in e[1])):
                raise ValueError(f"layout: malformed entry {str(e)[:80]}")
            entries.append((e[0], tuple(e[1]), e[2]))
        return cls(tuple(entries))

    def difference(self, other: "ParamLayout", here: str, there: str) -> str:
        """One sentence naming the first difference from ``other`` ('' when equal)."""
        mine, theirs = {n: (s, d) for n, s, d in self.entries}, {n: (s, d) for n, s, d in other.entries}
        for name, (s, d) in mine.items():
            if name not in theirs:
                return f"tensor {name!r} ({d} {list(s)}) is at {here}, not at {there}"
            if theirs[name] != (s, d):
                return (f"tensor {name!r} is {d} {list(s)} at {here}, {theirs[name][1]} {list(theirs[name][0])} "
                        f"at {there}")
        extra = [n for n in theirs if n not in mine]
        if extra:
            return f"tensor {extra[0]!r} is at {there}, not at {here}"
        if self.entries != other.entries:
            return f"the tensors are in a different order at {here} and at {there}"
        return ""


def fl_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The aggregated tensors of ``model`` as (name, tensor), in flat-vector order: every parameter of a built-in
    model, or the ``state_dict`` entries a user model's spec selects (``model.fl_names``, :mod:`.user_model`)."""
    names = getattr(model, "fl_names", None)
    if names is None:
        return list(model.named_parameters())
    state = model.state_dict(keep_vars=True)
    return [(n, state[n]) for n in names]


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s tensors live (CPU for a model without any)."""
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def _batch_norm_tensors(model: nn.Module) -> set[str]:
    """State-dict names of every batch-norm layer's affine weight and bias (FedBN keeps them local)."""
    names = set()
    for prefix, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            names.update(f"{prefix}.{n}" if prefix else n for n, _ in m.named_parameters(recurse=False))
    return names


def aggregated_names(model: nn.Module, buffers: str = "aggregate", trainable_only: bool = False) -> list[str]:
    """The ``state_dict`` names that are aggregated (module docstring), in ``state_dict`` order."""
    params = {id(p) for p in model.parameters()}
    local = _batch_norm_tensors(model) if buffers == "local" else set()
    seen, names = set(), []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue  # tied weights: one copy
        seen.add(id(t))
        if id(t) in params:
            keep = (t.requires_grad or not trainable_only) and name not in local
        else:
            keep = buffers == "aggregate" and t.is_floating_point()
        if keep:
            names.append(name)
    return names


def layout_of(model: nn.Module) -> ParamLayout:
    """The :class:`ParamLayout` of ``model``'s aggregated tensors (:func:`fl_entries`)."""
    return ParamLayout(tuple((n, tuple(t.shape), str(t.dtype).replace("torch.", "")) for n, t in fl_entries(model)))


def build_user_model(spec: UserModelSpec) -> nn.Module:
    """Call the factory (the caller seeds torch) and load the agreed weights; returns the module with its
    aggregated names set (``fl_names``) and the task attributes the loss and metrics read.

    Raises FactoryError naming ``params.model.factory`` (not importable, raised, not an ``nn.Module``) or
    ``params.model.weights`` (unreadable, or not this model's ``state_dict``)."""
    model = spec.call(MODEL_FIELD)
    if not isinstance(model, nn.Module):
        raise FactoryError(MODEL_FIELD, f"{spec.factory} returned a {type(model).__name__}, not a torch nn.Module")
    if spec.weights is not None:
        _load_weights(model, spec.weights)
    model.task = spec.task
    model.target = (float(spec.target_mean), float(spec.target_std))
    model.fl_names = aggregated_names(model, spec.buffers, spec.trainable_only)
    if not model.fl_names:
        raise FactoryError(MODEL_FIELD, f"{spec.factory}: nothing to aggregate (no parameter"
                                        f"{' with requires_grad' if spec.trainable_only else ''})")
    return model


def _load_weights(model: nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - missing file, not safetensors
        raise FactoryError("params.model.weights", f"cannot read {path}: {exc}") from None
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise FactoryError("params.model.weights", f"{path} does not fit the model: {str(exc).splitlines()[0]}") \
            from None


def probe_output(model: nn.Module, x: torch.Tensor, n_outputs: int, field: str = MODEL_FIELD) -> None:
    """Check that ``model`` maps a batch ``x`` to (batch, n_outputs); FactoryError naming ``field`` otherwise."""
    model.train(False)
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:  # noqa: BLE001 - the user's forward pass on the user's data
        raise FactoryError(field, f"the model's forward pass on a batch of shape {list(x.shape)} raised "
                                  f"{type(exc).__name__}: {exc}") from None
    if not isinstance(out, torch.Tensor) or out.shape != (x.shape[0], n_outputs):
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise FactoryError(field, f"the model maps a batch of {x.shape[0]} to {shape}, expected [{x.shape[0]}, "
                                  f"{n_outputs}] (n_classes, or 1 for regression)")
