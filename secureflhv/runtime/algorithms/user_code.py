"""The user's code in a horizontal FL job: its dataset, its loops, its device, and their preflight.

* :func:`load_dataset`: ``parties[i].data.factory`` called with its kwargs (a relative ``root`` / ``path`` is taken
  against the job file), as :class:`~secureflhv.horizontal.local_data.DatasetRows` and its labels.
* :func:`make_loop`: ``params.train`` / ``params.evaluate`` bound to this client
  (:class:`~secureflhv.horizontal.user_loop.UserLoop`), or None when the job names neither.
* :func:`resolve_device`: ``params.device`` (``auto``: CUDA when torch sees a GPU, else the CPU).
* :func:`party_checks`: what preflight runs before the party sends anything: the model factory imports and builds
  (seeded as in the job) an ``nn.Module``, its layout equals ``params.model.layout_hash`` when the job declares one,
  the loops import, and at a client the dataset builds, has rows, labels in range, and one batch of two rows goes
  through the model to (2, n_classes). Each problem names the job-file field; nothing leaves the party.
"""
from __future__ import annotations

import numpy as np

from ...horizontal.local_data import DatasetRows
from ...horizontal.models import build_model
from ...horizontal.user_loop import UserLoop
from ...horizontal.user_model import UserModelSpec, layout_of, probe_output
from ...params.factory import FactoryError
from ..job.job_file import JobConfig, JobConfigError, PartySpec


def load_dataset(cfg: JobConfig, party: PartySpec) -> tuple[DatasetRows, np.ndarray]:
    """(rows, labels (n,)) of the client's dataset factory. JobConfigError naming ``parties[i].data.factory``
    when it cannot be imported, raises, or does not return a sized dataset of ``(x, y)`` items."""
    from ...data.torch_datasets import dataset_targets

    field = cfg.where(party, "data.factory")
    try:
        ds = party.data.factory_ref(cfg.base_dir).call(field, path_field=cfg.where(party, "data.code_path"))
    except FactoryError as exc:
        raise JobConfigError(str(exc)) from None
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise JobConfigError(f"{field}: {party.data.factory} returned a {type(ds).__name__}, not a torch Dataset "
                             f"(with __len__ and __getitem__)")
    try:
        y = np.asarray(dataset_targets(ds))
    except (ValueError, TypeError, IndexError) as exc:
        raise JobConfigError(f"{field}: cannot read the dataset's labels: {exc}") from None
    return DatasetRows(ds), y


def resolve_device(name: str) -> str:
    """``cpu`` or ``cuda`` for ``params.device``; JobConfigError for ``cuda`` without a GPU."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise JobConfigError("params.device: cuda, but torch sees no GPU on this machine (use auto or cpu)")
    return name


def make_loop(cfg: JobConfig, party: PartySpec, params) -> UserLoop | None:
    """The user's loops bound to client ``party`` (None when the job names neither). JobConfigError naming
    ``params.train`` / ``params.evaluate`` when one cannot be imported."""
    if params.train is None and params.evaluate is None:
        return None
    fns = {}
    for name in ("train", "evaluate"):
        ref = getattr(params, name)
        try:
            fns[name] = ref.resolve(f"params.{name}", cfg.base_dir) if ref is not None else None
        except FactoryError as exc:
            raise JobConfigError(str(exc.at(party.id))) from None
    return UserLoop(fns["train"], fns["evaluate"], party.id, params.strategy, params.local_config())


def party_checks(cfg: JobConfig, party: PartySpec, params) -> list[tuple[str, str]]:
    """Preflight of the user's code at ``party`` (module docstring); [(field, problem)], empty when fine."""
    spec = params.model
    user_model = isinstance(spec, UserModelSpec)
    data_factory = party.data is not None and party.data.factory is not None
    if not (user_model or data_factory or params.train or params.evaluate):
        return []
    problems: list[tuple[str, str]] = []
    model = None
    try:
        model = build_model(spec.resolved(cfg.base_dir) if user_model else spec, seed=params.seed)
    except FactoryError as exc:
        problems.append((exc.field, exc.message))
    if model is not None and user_model and spec.layout_hash and layout_of(model).digest() != spec.layout_hash:
        layout = layout_of(model)
        problems.append(("params.model.layout_hash", f"this party's model has layout {layout.digest()} "
                                                     f"({len(layout.entries)} tensors), the job declares "
                                                     f"{spec.layout_hash}: is the consortium's code the agreed version?"))
    for name in ("train", "evaluate"):
        ref = getattr(params, name)
        if ref is not None and party.role != "server":
            try:
                ref.resolve(f"params.{name}", cfg.base_dir)
            except FactoryError as exc:
                problems.append((exc.field, exc.message))
    if data_factory:
        problems += _dataset_checks(cfg, party, spec, model)
    return problems


def _dataset_checks(cfg: JobConfig, party: PartySpec, spec, model) -> list[tuple[str, str]]:
    """The client's dataset builds, has rows and labels in range, and a batch of two goes through ``model``."""
    try:
        rows, y = load_dataset(cfg, party)
    except JobConfigError as exc:
        return [("data.factory", str(exc).split(": ", 1)[-1])]
    if len(rows) == 0 or len(y) != len(rows):
        return [("data.factory", f"the dataset has {len(rows)} rows and {len(y)} labels")]
    if spec.task == "classification" and (y.min() < 0 or y.max() >= spec.n_classes
                                          or not np.all(np.asarray(y) == np.round(np.asarray(y, float)))):
        return [("data.factory", f"labels range {y.min()}..{y.max()}: expected class ids 0..{spec.n_classes - 1} "
                                 f"(params.model.n_classes)")]
    if model is None:
        return []
    try:
        probe_output(model, rows[0:min(2, len(rows))], spec.n_outputs)
    except FactoryError as exc:
        return [("params.model.factory", exc.message)]
    except ValueError as exc:
        return [("data.factory", str(exc))]
    return []
