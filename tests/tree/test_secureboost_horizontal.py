"""Horizontal SecureBoost: for EVERY horizontal partition scheme of secureflhv.data, the federated trees
equal the centralised twin trained on the pooled rows with the same (federated) cuts; secure aggregation
gives the same model as plain quantised aggregation; the global cuts equal the cuts computed on pooled
data; the exported XGBoost JSON predicts the same in xgboost.Booster. Client dropouts:
test_secureboost_horizontal_dropout.py."""
from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_iris, make_classification, make_regression

from sb_harness import horizontal_run
from secureflhv.data import Dataset, available_schemes, make_fcube, partition
from secureflhv.tree.binning import cuts_from_grid_counts, grid, grid_counts
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.reference import fit_reference
from secureflhv.tree.xgb_export import save_xgboost_json

PARAMS = SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, sketch_bins=256, learning_rate=0.3)
SCHEME_ARGS = {"label_quantity": {"k": 1}, "label_dirichlet": {"beta": 0.3}, "quantity_dirichlet": {"beta": 0.5},
               "feature_noise": {"sigma": 0.5}, "label_noise": {"flip": 0.3},
               "label_dirichlet+quantity_dirichlet": {"beta": 0.5}, "label_dirichlet+feature_noise": {"beta": 0.5}}


def _dataset(scheme: str) -> Dataset:
    if scheme == "feature_synthetic":
        return make_fcube(900, 0, seed=1)[0]
    X, y = make_classification(900, 6, n_informative=4, random_state=2)
    rng = np.random.default_rng(3)
    return Dataset(X, y, groups=rng.integers(0, 12, len(y)), times=rng.random(len(y)))


def _shards(ds: Dataset, scheme: str, n: int = 3):
    part = partition(scheme, ds, n, seed=4, **SCHEME_ARGS.get(scheme, {}))
    return [(s.X, s.y) for s in (part.party_data(ds, i) for i in range(n))]


def _assert_twin(run, shards, params):
    assert not run["errors"], run["errors"]
    model = run["server_model"]
    X = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    ref = fit_reference(X, y, model.cuts, params, base=model.base_margin)
    assert len(ref.trees) == len(model.trees) > 0
    for tf, tr in zip(model.trees, ref.trees):
        assert tf.structure() == tr.structure()
        for nid, n in tr.nodes.items():
            if n.leaf:
                assert tf.nodes[nid].value == pytest.approx(n.value, rel=1e-6, abs=1e-12)
    np.testing.assert_allclose(model.predict(X), ref.predict(X), rtol=1e-9, atol=1e-12)
    for cm in run["client_models"]:  # every client ends with the server's model
        assert [t.structure() for t in cm.trees] == [t.structure() for t in model.trees]
        np.testing.assert_array_equal(cm.predict(X), model.predict(X))
    return ref


@pytest.mark.parametrize("scheme", available_schemes())
def test_horizontal_equals_centralised_twin_for_every_partition(scheme):
    ds = _dataset(scheme)
    shards = _shards(ds, scheme)
    run = horizontal_run(shards, PARAMS)
    _assert_twin(run, shards, PARAMS)
    # the federated cuts are the cuts of the pooled data on the same public grid
    X = np.concatenate([s[0] for s in shards])
    lo, hi = X.min(axis=0), X.max(axis=0)
    for j, cuts in enumerate(run["server_model"].cuts):
        g = grid(lo[j], hi[j], PARAMS.sketch_bins)
        np.testing.assert_array_equal(cuts, cuts_from_grid_counts(grid_counts(X[:, j], g), g, PARAMS.max_bin))


def test_secagg_gives_the_same_model_as_plain_quantised_and_multiclass_regression():
    ds = _dataset("label_dirichlet")
    shards = _shards(ds, "label_dirichlet")
    a = horizontal_run(shards, PARAMS, kind="secagg")
    b = horizontal_run(shards, PARAMS, kind="plain_quantised")
    _assert_twin(a, shards, PARAMS)
    assert [t.structure() for t in a["server_model"].trees] == [t.structure() for t in b["server_model"].trees]
    X, y = load_iris(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))
    shards = [(X[i], y[i]) for i in np.array_split(idx, 3)]
    params = PARAMS.model_copy(update={"objective": "multiclass", "n_classes": 3})
    _assert_twin(horizontal_run(shards, params), shards, params)
    Xr, yr = make_regression(600, 5, noise=5.0, random_state=1)
    shards = [(Xr[i], yr[i]) for i in np.array_split(np.arange(600), 3)]
    params = PARAMS.model_copy(update={"objective": "regression", "gamma": 10.0})
    _assert_twin(horizontal_run(shards, params), shards, params)


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_exported_model_predicts_the_same_in_xgboost(tmp_path, objective):
    if objective == "binary":
        X, y = make_classification(600, 5, random_state=3)
        params = PARAMS
    elif objective == "multiclass":
        X, y = load_iris(return_X_y=True)
        params = PARAMS.model_copy(update={"objective": "multiclass", "n_classes": 3})
    else:
        X, y = make_regression(600, 5, noise=5.0, random_state=1)
        params = PARAMS.model_copy(update={"objective": "regression"})
    shards = [(X[i], y[i]) for i in np.array_split(np.random.default_rng(1).permutation(len(y)), 3)]
    run = horizontal_run(shards, params)
    assert not run["errors"], run["errors"]
    model = run["server_model"]
    path = save_xgboost_json(model, tmp_path / "model.json")
    booster = xgb.Booster(model_file=str(path))
    Xt = X + np.random.default_rng(2).normal(scale=0.01, size=X.shape)  # rows the model has not seen
    got = booster.predict(xgb.DMatrix(Xt))
    want = model.predict(Xt)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    assert booster.num_boosted_rounds() == params.n_trees
