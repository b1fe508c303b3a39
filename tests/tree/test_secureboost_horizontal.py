"""Horizontal SecureBoost with secure aggregation: for EVERY horizontal partition scheme of secureflhv.data,
the federated trees equal an independent numpy twin (tests/tree/numpy_gbdt.py: its own cuts from the pooled
rows, its own base margin, float64 gradients) trained on the pooled rows; every client ends with the server's
model; ``plain_quantised`` aggregation, the control, gives the same model as ``secagg``; the exported XGBoost
JSON predicts the same in xgboost.Booster. Client dropouts: test_secureboost_horizontal_dropout.py.

Data: ``feature_natural`` and ``temporal`` split the Palmer penguins by their real island and study year
(multiclass, with missing values); the other schemes a 900-row binary set (FCUBE with 15% of its labels
flipped for ``feature_synthetic``).
"""
from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_iris, make_classification, make_regression

import numpy_gbdt as twin
from sb_harness import assert_trees_equal_twin, horizontal_nodes, horizontal_run, pooled_grid_cuts
from secureflhv.data import Dataset, available_schemes, load_penguins, make_fcube, partition
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.xgb_export import save_xgboost_json

PARAMS = SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, sketch_bins=256, learning_rate=0.3)
SCHEME_ARGS = {"label_quantity": {"k": 1}, "label_dirichlet": {"beta": 0.3}, "quantity_dirichlet": {"beta": 0.5},
               "feature_noise": {"sigma": 0.5}, "label_noise": {"flip": 0.3},
               "label_dirichlet+quantity_dirichlet": {"beta": 0.5}, "label_dirichlet+feature_noise": {"beta": 0.5}}
REAL_GROUPS = ("feature_natural", "temporal")   # island / study year of the penguins


def _dataset(scheme: str) -> Dataset:
    if scheme == "feature_synthetic":   # FCUBE's label is sign(x0): 15% flipped, so trees grow past a stump
        ds = make_fcube(900, 0, seed=1)[0]
        flip = np.random.default_rng(5).random(len(ds.y)) < 0.15
        return Dataset(ds.X, np.where(flip, 1 - ds.y, ds.y), groups=ds.groups)
    if scheme in REAL_GROUPS:
        ds = load_penguins()
        assert ds.groups is not None and ds.times is not None
        return ds
    X, y = make_classification(900, 6, n_informative=4, random_state=2)
    return Dataset(X, y)


def _params(ds: Dataset) -> SecureBoostParams:
    k = len(np.unique(ds.y))
    return PARAMS if k == 2 else PARAMS.model_copy(update={"objective": "multiclass", "n_classes": k})


def _shards(ds: Dataset, scheme: str, n: int = 3):
    part = partition(scheme, ds, n, seed=4, **SCHEME_ARGS.get(scheme, {}))
    return [(s.X, s.y) for s in (part.party_data(ds, i) for i in range(n))]


def _assert_twin(run, shards, params):
    """The run's model equals the numpy twin on the pooled rows (cuts, base margin, trees, predictions)."""
    assert not run["errors"], run["errors"]
    model = run["server_model"]
    X = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    cuts = pooled_grid_cuts(X, params)
    for j, (got, want) in enumerate(zip(model.cuts, cuts, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"feature {j}: federated cuts != pooled cuts")
    ref = twin.fit(X, y, cuts, twin.Config.of(params))
    # regression: the label sum is aggregated on a 2^-20 grid (LABEL_BITS), so the mean may differ by 2^-21
    np.testing.assert_allclose(model.base_margin, ref.base, rtol=1e-12,
                               atol=2.0 ** -21 if params.objective == "regression" else 0)
    assert_trees_equal_twin([(t.output, horizontal_nodes(t)) for t in model.trees], ref)
    np.testing.assert_allclose(model.predict_margin(X), ref.predict_margin(X), rtol=0, atol=1e-5)
    for cm in run["client_models"]:  # every client ends with the server's model
        assert [t.structure() for t in cm.trees] == [t.structure() for t in model.trees]
        np.testing.assert_array_equal(cm.predict(X), model.predict(X))
    return ref


@pytest.mark.parametrize("scheme", available_schemes())
def test_secure_aggregation_equals_numpy_twin_for_every_partition(scheme):
    ds = _dataset(scheme)
    shards = _shards(ds, scheme)
    params = _params(ds)
    run = horizontal_run(shards, params, kind="secagg")
    ref = _assert_twin(run, shards, params)
    splits = {n[1:3] for t in ref.trees for n in t.nodes.values() if n[0] == "split"}
    assert len(splits) >= 3, "fewer than 3 distinct splits: the comparison would be weak"
    if scheme in REAL_GROUPS:   # the shards really differ: penguins' islands / years
        labels = [np.bincount(s[1].astype(int), minlength=3) / len(s[1]) for s in shards]
        assert max(np.abs(a - b).sum() for a in labels for b in labels) > (1.0 if scheme == "feature_natural" else 0.05)


def test_plain_quantised_control_gives_the_secure_aggregation_model():
    """The control: with plain quantised sums (each client's histogram revealed to the server) the model is
    the same as with secure aggregation, bit for bit, and equals the twin."""
    ds = _dataset("label_dirichlet")
    shards = _shards(ds, "label_dirichlet")
    a = horizontal_run(shards, PARAMS, kind="secagg")
    b = horizontal_run(shards, PARAMS, kind="plain_quantised")
    _assert_twin(a, shards, PARAMS)
    _assert_twin(b, shards, PARAMS)
    assert [horizontal_nodes(t) for t in a["server_model"].trees] == \
        [horizontal_nodes(t) for t in b["server_model"].trees]


def test_multiclass_and_regression_with_secure_aggregation_equal_twin():
    X, y = load_iris(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))
    shards = [(X[i], y[i]) for i in np.array_split(idx, 3)]
    params = PARAMS.model_copy(update={"objective": "multiclass", "n_classes": 3})
    _assert_twin(horizontal_run(shards, params, kind="secagg"), shards, params)
    Xr, yr = make_regression(600, 5, noise=5.0, random_state=1)
    shards = [(Xr[i], yr[i]) for i in np.array_split(np.arange(600), 3)]
    params = PARAMS.model_copy(update={"objective": "regression", "gamma": 1e5})
    ref = _assert_twin(horizontal_run(shards, params, kind="secagg"), shards, params)
    # gamma prunes: an inner node of the full depth-3 tree ended as a leaf
    assert any(n[0] == "leaf" for t in ref.trees for nid, n in t.nodes.items() if nid < 2 ** params.max_depth - 1)


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
