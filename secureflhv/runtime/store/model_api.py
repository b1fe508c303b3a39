"""The notebook API: ``secureflhv.load_model(dir, ca=...)`` opens and verifies a party's signed model bundle.

::

    import secureflhv
    model = secureflhv.load_model("out/client-1", ca="certs/ca.pem")   # or "out/client-1/model"
    model.describe()                                     # job, algorithm, party, features, metrics, files
    model.predict_proba(X)                               # algorithms whose bundle scores locally only
    model.predict(X)
    model.task                                           # "binary", "multiclass" or "regression"

Local scoring works for the algorithms whose model every party holds whole: the job registry says which
(``JobSpec.local_model``, the "prediction" column of the registry table in ``docs/architecture.md``):
horizontal FL (the global torch model, rebuilt from its architecture and ``model.safetensors``),
MultiConfederated learning (the peer's personal torch model) and horizontal SecureBoost (the global
trees, ``model.json``; ``model.xgboost.json`` is the same model for ``xgboost.Booster``). A vertical
model is split across parties by design: ``predict`` raises :class:`ModelBundleError` pointing to the
prediction job (``job.algorithm: predict``), which brings the parties together.

The task comes from the bundle (manifest ``task``, else the algorithm's rule on the model's
configuration): a regression model's ``predict`` and ``predict_proba`` both return its predicted values
(n,) float64 unchanged, in the target's units; a classifier's ``predict_proba`` returns probabilities
and ``predict`` class ids.

``X``: a float array (n, n_features) of raw rows (NaN = missing, categorical columns as codes) when the
bundle records a preprocessor (horizontal FL with ``params.preprocessing``: it is applied first), else of
model inputs; or a pandas DataFrame (the model's feature columns are taken by
name when the bundle records them, else all columns in order). Loading verifies the bundle
(:func:`secureflhv.runtime.store.model_bundle.read_bundle`: format version, the party's signature under the
job CA ``ca``, hashes; ``expect_party`` / ``expect_job`` when given).
"""
from __future__ import annotations

from pathlib import Path

from ..job.registry import JOBS
from .loaded_model import LoadedModel
from .model_bundle import read_bundle

__all__ = ["LoadedModel", "load_model"]


def load_model(path: Path | str, *, ca: Path | str | bytes, expect_party: str | None = None,
               expect_job: str | None = None) -> LoadedModel:
    """Open and verify the bundle in ``path`` (a party's output folder or its ``model/``).

    Args:
        ca: the training job's CA certificate (path or PEM bytes, e.g. ``certs/ca.pem``): the bundle must
            be signed by its party's certificate issued by this CA.
        expect_party: the party the bundle must be signed by and belong to (None: the party it names).

    Returns a :class:`LoadedModel` with its algorithm's registry entry (None for an algorithm this
    installation does not register: it describes itself but does not score).

    Raises ModelBundleError naming the failed check (format version, ca_sha256, signature, a hash, party, job).
    """
    bundle = read_bundle(path, ca=ca, expect_party=expect_party, expect_job=expect_job)
    return LoadedModel(bundle, JOBS.get(bundle.algorithm))
