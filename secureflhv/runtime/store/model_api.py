"""The notebook API: ``secureflhv.load_model(dir, ca=...)`` opens and verifies a party's signed model bundle.

::

    import secureflhv
    model = secureflhv.load_model("out/client-1", ca="certs/ca.pem")   # or "out/client-1/model"
    model.describe()                                     # job, algorithm, party, features, metrics, files
    model.predict_proba(X)                               # horizontal FL / MultiConfederated / horizontal SecureBoost only
    model.predict(X)
    model.task                                           # "binary", "multiclass" or "regression"

Local scoring works for the families whose model every party holds whole: horizontal FL (the global
torch model, rebuilt from its architecture and ``model.safetensors``; MultiConfederated learning: the peer's
personal model) and horizontal SecureBoost (the
global trees, ``model.json``; ``model.xgboost.json`` is the same model for ``xgboost.Booster``). A
vertical model is split across parties by design: ``predict`` raises :class:`ModelBundleError`
pointing to the prediction job (``job.algorithm: predict``), which brings the parties together.

The task comes from the bundle (manifest ``task``, else the model's configuration): a regression
model's ``predict`` and ``predict_proba`` both return its predicted values (n,) float64 unchanged, in
the target's units; a classifier's ``predict_proba`` returns probabilities and ``predict`` class ids.

``X``: a float array (n, n_features) of raw rows (NaN = missing, categorical columns as codes) when the
bundle records a preprocessor (horizontal FL with ``params.preprocessing``: it is applied first), else of
model inputs; or a pandas DataFrame (the model's feature columns are taken by
name when the bundle records them, else all columns in order). Loading verifies the bundle
(:func:`secureflhv.runtime.store.model_bundle.read_bundle`: format version, the party's signature under the
job CA ``ca``, hashes; ``expect_party`` / ``expect_job`` when given).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .model_bundle import ModelBundle, ModelBundleError, read_bundle

LOCAL = ("horizontal", "multiconfederated", "secureboost_horizontal")
TORCH = ("horizontal", "multiconfederated")  # a torch model every party holds whole (MultiConfederated: its personal model)


class LoadedModel:
    """A verified bundle with local prediction where the family allows it (see the module docstring)."""

    def __init__(self, bundle: ModelBundle):
        self.bundle = bundle
        self._model = None

    def __repr__(self) -> str:
        b = self.bundle
        return f"LoadedModel({b.algorithm}, job {b.job_id!r}, party {b.party_id!r} ({b.role}), {b.path})"

    @property
    def task(self) -> str:
        """``binary``, ``multiclass`` or ``regression``: the manifest's ``task``, else (bundles written
        before it was recorded) inferred from the configuration."""
        m = self.bundle.manifest
        if m.get("task") in ("binary", "multiclass", "regression"):
            return m["task"]
        return task_from_config(m.get("algorithm"), m.get("config") or {}, m.get("extra") or {})

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
                "local": m["algorithm"] in LOCAL}

    # ------------------------------------------------------------------------------------- scoring
    def _features(self, X) -> np.ndarray:
        names = self.bundle.manifest.get("feature_names") or []
        if hasattr(X, "columns"):
            missing = [c for c in names if c not in X.columns]
            if missing:
                raise ValueError(f"X: no column(s) {missing[:5]} (the model uses {names})")
            X = X[names] if names else X
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X: expected a 2-D array (rows, features), got shape {X.shape}")
        return X

    def _built(self):
        if self._model is not None:
            return self._model
        algo = self.bundle.algorithm
        if algo not in LOCAL:
            raise ModelBundleError(f"{self.bundle.path}: a {algo} model is split across the parties that trained "
                                   f"it; score it with a prediction job (job.algorithm: predict, see README "
                                   f"'Use a trained model')")
        if algo in TORCH:
            import torch

            from ...horizontal.models import ModelSpec, build_model

            net = build_model(ModelSpec(**self.bundle.config["model"]))
            state = {k: torch.from_numpy(np.array(v)) for k, v in self.bundle.file("model.safetensors").items()}
            try:
                net.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                raise ModelBundleError(f"{self.bundle.path}: files[model.safetensors]: does not fit the "
                                       f"architecture in config.model: {exc}") from None
            net.train(False)  # inference mode
            self._model = net
        else:
            from ...tree.model import model_from_dict

            try:
                self._model = model_from_dict(self.bundle.file("model.json"))
            except ValueError as exc:
                raise ModelBundleError(f"{self.bundle.path}: files[model.json]: {exc}") from None
        return self._model

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities: (n,) P(y=1) for binary trees, (n, C) for a torch classifier or multi-class
        trees; regression trees give values (n,). Raises ModelBundleError for a vertical model."""
        model = self._built()
        X = self._features(X)
        saved = (self.bundle.manifest.get("preprocessing") or {}).get("preprocessor")
        if saved:  # the federated preprocessing the model was trained behind (raw rows in, NaN = missing)
            from ...data.tabular import Preprocessor

            X = Preprocessor.from_dict(saved).transform(X)
        if self.bundle.algorithm in TORCH:
            import torch

            with torch.no_grad():
                out = model(torch.from_numpy(X.astype(np.float32)))
                if self.task == "regression":  # the head's values, in the target's units
                    return out[:, 0].numpy().astype(np.float64)
                return torch.softmax(out, dim=1).numpy().astype(np.float64)
        return model.predict(X)

    def predict(self, X) -> np.ndarray:
        """Class ids (n,) int64 (binary: P >= 0.5), or predicted values (n,) float64 for a regression model."""
        p = self.predict_proba(X)
        if self.task == "regression":
            return p
        return p.argmax(axis=1).astype(np.int64) if p.ndim == 2 else (p >= 0.5).astype(np.int64)


def task_from_config(algorithm: str | None, config: dict, extra: dict) -> str:
    """The task of a bundle from its algorithm's configuration: a horizontal FL ``model.task`` /
    ``n_classes``, a tree ``objective``, a split NN's ``task`` / ``n_classes``; ``binary`` otherwise."""
    if algorithm == "horizontal":
        model = config.get("model") or {}
        if model.get("task") == "regression":
            return "regression"
        return "binary" if model.get("n_classes") == 2 else "multiclass"
    if algorithm in ("secureboost", "secureboost_vertical", "secureboost_horizontal"):
        objective = config.get("objective")
        return objective if objective in ("regression", "binary") else "multiclass"
    if config.get("task") == "regression":
        return "regression"
    n_classes = extra.get("n_classes") or config.get("n_classes")
    return "multiclass" if n_classes and int(n_classes) > 2 else "binary"


def load_model(path: Path | str, *, ca: Path | str | bytes, expect_party: str | None = None,
               expect_job: str | None = None) -> LoadedModel:
    """Open and verify the bundle in ``path`` (a party's output folder or its ``model/``).

    Args:
        ca: the training job's CA certificate (path or PEM bytes, e.g. ``certs/ca.pem``): the bundle must
            be signed by its party's certificate issued by this CA.
        expect_party: the party the bundle must be signed by and belong to (None: the party it names).

    Raises ModelBundleError naming the failed check (format version, ca_sha256, signature, a hash, party, job).
    """
    return LoadedModel(read_bundle(path, ca=ca, expect_party=expect_party, expect_job=expect_job))
