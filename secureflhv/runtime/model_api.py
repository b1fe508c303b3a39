"""The notebook API: ``secureflhv.load_model(dir)`` opens a party's saved model bundle.

::

    import secureflhv
    model = secureflhv.load_model("out/client-1")        # or "out/client-1/model"
    model.describe()                                     # job, algorithm, party, features, metrics, files
    model.predict_proba(X)                               # horizontal FL / horizontal SecureBoost only
    model.predict(X)

Local scoring works for the families whose model every party holds whole: horizontal FL (the global
torch model, rebuilt from its architecture and ``model.safetensors``) and horizontal SecureBoost (the
global trees, ``model.json``; ``model.xgboost.json`` is the same model for ``xgboost.Booster``). A
vertical model is split across parties by design: ``predict`` raises :class:`ModelBundleError`
pointing to the prediction job (``job.algorithm: predict``), which brings the parties together.

``X``: a float array (n, n_features) of raw rows (NaN = missing, categorical columns as codes) when the
bundle records a preprocessor (horizontal FL with ``params.preprocessing``: it is applied first), else of
model inputs; or a pandas DataFrame (the model's feature columns are taken by
name when the bundle records them, else all columns in order). Loading verifies the bundle
(:func:`secureflhv.runtime.model_bundle.read_bundle`: format version, hashes; ``expect_party`` /
``expect_job`` when given).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .model_bundle import ModelBundle, ModelBundleError, read_bundle

LOCAL = ("horizontal", "secureboost_horizontal")


class LoadedModel:
    """A verified bundle with local prediction where the family allows it (see the module docstring)."""

    def __init__(self, bundle: ModelBundle):
        self.bundle = bundle
        self._model = None

    def __repr__(self) -> str:
        b = self.bundle
        return f"LoadedModel({b.algorithm}, job {b.job_id!r}, party {b.party_id!r} ({b.role}), {b.path})"

    def describe(self) -> dict:
        """What the bundle holds: job, algorithm, party and role, features, metrics, peers, files, whether
        it scores locally (``local``)."""
        m = self.bundle.manifest
        return {"path": str(self.bundle.path), "job_id": m["job_id"], "algorithm": m["algorithm"],
                "party_id": m["party_id"], "role": m["role"], "created": m.get("created"),
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
        if algo == "horizontal":
            import torch

            from ..horizontal.models import ModelSpec, build_model

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
            from ..tree.model import model_from_dict

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
            from ..data.tabular import Preprocessor

            X = Preprocessor.from_dict(saved).transform(X)
        if self.bundle.algorithm == "horizontal":
            import torch

            with torch.no_grad():
                logits = model(torch.from_numpy(X.astype(np.float32)))
                return torch.softmax(logits, dim=1).numpy().astype(np.float64)
        return model.predict(X)

    def predict(self, X) -> np.ndarray:
        """Class ids (n,) int64 (binary trees: P >= 0.5), or values (n,) for regression trees."""
        p = self.predict_proba(X)
        if self.bundle.algorithm == "secureboost_horizontal" and self._built().params.objective == "regression":
            return p
        return p.argmax(axis=1).astype(np.int64) if p.ndim == 2 else (p >= 0.5).astype(np.int64)


def load_model(path: Path | str, *, expect_party: str | None = None, expect_job: str | None = None) -> LoadedModel:
    """Open and verify the bundle in ``path`` (a party's output folder or its ``model/``).

    Raises ModelBundleError naming the failed check (format version, a hash, party, job).
    """
    return LoadedModel(read_bundle(path, expect_party=expect_party, expect_job=expect_job))
