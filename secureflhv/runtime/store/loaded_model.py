"""A verified model bundle with local scoring where its algorithm's spec allows it.

:class:`LoadedModel` is what :func:`secureflhv.load_model` returns and what the prediction job scores
with when a bundle holds the whole model. Whether it does, and how the model is rebuilt, is the
algorithm's :class:`~secureflhv.runtime.job.spec.JobSpec` (``local_model``, ``task``); this module holds
the two rebuilders the built-in algorithms use (:func:`torch_scorer`, :func:`tree_scorer`) and the
task rules (:func:`torch_task`, :func:`tree_task`, :func:`config_task`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from .model_bundle import ModelBundle, ModelBundleError

if TYPE_CHECKING:
    from ..job.spec import JobSpec

TASKS = ("binary", "multiclass", "regression")


def torch_task(config: dict, extra: dict) -> str:
    """The task of a torch model bundle (horizontal FL, MultiConfederated): ``config.model.task`` /
    ``n_classes``."""
    model = config.get("model") or {}
    if model.get("task") == "regression":
        return "regression"
    return "binary" if model.get("n_classes") == 2 else "multiclass"


def tree_task(config: dict, extra: dict) -> str:
    """The task of a tree bundle: its ``objective`` (``binary`` / ``regression``, else multi-class)."""
    objective = config.get("objective")
    return objective if objective in ("regression", "binary") else "multiclass"


def config_task(config: dict, extra: dict) -> str:
    """The task from a ``config.task`` (``regression``) or ``n_classes`` (in ``extra`` or ``config``);
    ``binary`` otherwise."""
    if config.get("task") == "regression":
        return "regression"
    n_classes = extra.get("n_classes") or config.get("n_classes")
    return "multiclass" if n_classes and int(n_classes) > 2 else "binary"


def torch_scorer(bundle: ModelBundle, task: str) -> Callable[[np.ndarray], np.ndarray]:
    """The torch model in ``config.model`` with ``model.safetensors`` loaded, in inference mode; scores
    (n,) values for regression, else (n, C) softmax probabilities. ModelBundleError when the weights do
    not fit the architecture."""
    import torch

    from ...horizontal.models import ModelSpec, build_model
    from ...horizontal.user_model import UserModelSpec
    from ...params.factory import FactoryError

    doc = bundle.config["model"]
    try:  # a user's model is rebuilt through its factory: the consortium's code must be importable here
        net = build_model(UserModelSpec(**doc) if "factory" in doc else ModelSpec(**doc))
    except FactoryError as exc:
        raise ModelBundleError(f"{bundle.path}: config.model: {exc}") from None
    state = {k: torch.from_numpy(np.array(v)) for k, v in bundle.file("model.safetensors").items()}
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelBundleError(f"{bundle.path}: files[model.safetensors]: does not fit the "
                               f"architecture in config.model: {exc}") from None
    net.train(False)  # inference mode

    def score(X: np.ndarray) -> np.ndarray:
        with torch.no_grad():  # floats as float32; integer inputs (token ids) as they are
            out = net(torch.from_numpy(X.astype(np.float32) if X.dtype.kind == "f" else X))
            if task == "regression":  # the head's values, in the target's units
                return out[:, 0].numpy().astype(np.float64)
            return torch.softmax(out, dim=1).numpy().astype(np.float64)

    return score


def tree_scorer(bundle: ModelBundle, task: str) -> Callable[[np.ndarray], np.ndarray]:
    """The trees of the bundle's ``model.json`` (:func:`secureflhv.tree.model.model_from_dict`); scores
    P(y=1) (n,), (n, C) or regression values. ModelBundleError for a malformed tree file."""
    from ...tree.model import model_from_dict

    try:
        return model_from_dict(bundle.file("model.json")).predict
    except ValueError as exc:
        raise ModelBundleError(f"{bundle.path}: files[model.json]: {exc}") from None


class LoadedModel:
    """A verified bundle and its algorithm's spec (None: an algorithm this installation does not know).

    ``predict_proba`` / ``predict`` work where the spec's ``local_model`` is set (the whole model at one
    party); otherwise they raise ModelBundleError pointing to the prediction job.
    """

    def __init__(self, bundle: ModelBundle, spec: JobSpec | None):
        self.bundle = bundle
        self.spec = spec
        self._score = None

    def __repr__(self) -> str:
        b = self.bundle
        return f"LoadedModel({b.algorithm}, job {b.job_id!r}, party {b.party_id!r} ({b.role}), {b.path})"

    @property
    def local(self) -> bool:
        """Whether this bundle scores on one machine (its algorithm's spec has a ``local_model``)."""
        return self.spec is not None and self.spec.scores_locally

    @property
    def task(self) -> str:
        """``binary``, ``multiclass`` or ``regression``: the manifest's ``task``, else (bundles written
        before it was recorded) the spec's rule on the configuration."""
        m = self.bundle.manifest
        if m.get("task") in TASKS:
            return m["task"]
        rule = (self.spec.task if self.spec is not None else None) or config_task
        return rule(m.get("config") or {}, m.get("extra") or {})

    def describe(self) -> dict:
        """What the bundle holds: job, algorithm, party and role, features, metrics, peers, files, whether
        it scores locally (``local``)."""
        m = self.bundle.manifest
        return {"path": str(self.bundle.path), "job_id": m["job_id"], "algorithm": m["algorithm"],
                "party_id": m["party_id"], "role": m["role"], "task": self.task, "created": m.get("created"),
                "format_version": m["format_version"], "feature_names": m.get("feature_names", []),
                "metrics": m.get("metrics", {}), "peers": [p["id"] for p in m.get("peers", [])],
                "paillier_key_sha256": m.get("paillier_key_sha256"),
                "files": {n: f["bytes"] for n, f in m.get("files", {}).items()},
                "local": self.local}

    def _features(self, X) -> np.ndarray:
        names = self.bundle.manifest.get("feature_names") or []
        if hasattr(X, "columns"):
            missing = [c for c in names if c not in X.columns]
            if missing:
                raise ValueError(f"X: no column(s) {missing[:5]} (the model uses {names})")
            X = X[names] if names else X
        if "factory" in ((self.bundle.config or {}).get("model") or {}):  # a user's model: its own input shape
            X = np.asarray(X)
            if X.ndim < 2 or X.dtype.kind not in "iuf":
                raise ValueError(f"X: expected a numeric array (rows, ...) of the model's inputs, got {X.dtype} "
                                 f"{X.shape}")
            return X
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X: expected a 2-D array (rows, features), got shape {X.shape}")
        return X

    def _scorer(self) -> Callable[[np.ndarray], np.ndarray]:
        if self._score is None:
            if not self.local:
                raise ModelBundleError(f"{self.bundle.path}: a {self.bundle.algorithm} model is split across the "
                                       f"parties that trained it; score it with a prediction job "
                                       f"(job.algorithm: predict, see README 'Use a trained model')")
            self._score = self.spec.local_model(self.bundle, self.task)
        return self._score

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities: (n,) P(y=1) for binary trees, (n, C) for a torch classifier or multi-class
        trees; a regression model gives its values (n,). Raises ModelBundleError for a vertical model."""
        score = self._scorer()
        X = self._features(X)
        saved = (self.bundle.manifest.get("preprocessing") or {}).get("preprocessor")
        if saved:  # the federated preprocessing the model was trained behind (raw rows in, NaN = missing)
            from ...data.tabular import Preprocessor

            X = Preprocessor.from_dict(saved).transform(X)
        return score(X)

    def predict(self, X) -> np.ndarray:
        """Class ids (n,) int64 (binary: P >= 0.5), or predicted values (n,) float64 for a regression model."""
        p = self.predict_proba(X)
        if self.task == "regression":
            return p
        return p.argmax(axis=1).astype(np.int64) if p.ndim == 2 else (p >= 0.5).astype(np.int64)
