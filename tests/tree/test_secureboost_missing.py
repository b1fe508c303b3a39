"""SecureBoost with missing values (XGBoost's sparsity-aware default directions, Chen & Guestrin 2016,
Alg. 3): vertical and horizontal equal the independent numpy twin (tests/tree/numpy_gbdt.py: splits, bins,
default directions, leaves; its own cuts and base margin) whatever the feature split or partition; held-out
AUC on breast cancer with 20% of cells missing within 0.005 of xgboost trained on the same NaN-bearing matrix;
the exported model predicts in xgboost exactly as ours on NaN data; prediction rows with NaN in a column that
had none in training go the XGBoost way (right).

Small Paillier keys (512 bits, insecure_test_key=True) and the worker pool off keep it fast.
"""
from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from sb_harness import vertical_run
from test_secureboost_vertical import _assert_twin as assert_vertical_twin
from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.data import load_dataset, vertical_split
from secureflhv.tree.binning import fit_cuts
from secureflhv.tree.params import SecureBoostParams, transform
from secureflhv.tree.reference import fit_reference
from secureflhv.tree.xgb_export import to_xgboost_json

KEY = pl.generate_keypair(512, insecure_test_key=True)
FULL = [0, 7, 13, 22]          # columns given back their values: no NaN in training, NaN at prediction


@pytest.fixture(autouse=True, scope="module")
def _inline_paillier():
    pl.set_workers(1)
    yield
    pl.set_workers(None)


def _params(**kw):
    base = dict(n_trees=3, max_depth=3, max_bin=12, learning_rate=0.3, key_bits=512, insecure_test_key=True)
    base.update(kw)
    return SecureBoostParams(**base)


def _data():
    """breast_cancer_missing (20% NaN) with the FULL columns complete; prediction rows with NaN there too."""
    ds, full = load_dataset("breast_cancer_missing"), load_dataset("breast_cancer")
    X = ds.X.copy()
    X[:, FULL] = full.X[:, FULL]
    X_pred = X[:200].copy()
    sub = X_pred[:, FULL]
    sub[np.random.default_rng(1).random(sub.shape) < 0.3] = np.nan
    X_pred[:, FULL] = sub
    return ds, X, ds.y, X_pred


@pytest.mark.parametrize("scheme", ["even", "random", "overlap"])
def test_vertical_with_missing_values_equals_numpy_twin(scheme):
    ds, X, y, X_pred = _data()
    vp = vertical_split(ds, 2, scheme, seed=5, **({"shared_fraction": 0.2} if scheme == "overlap" else {}))
    cols = [np.asarray(c) for c in vp.columns]
    params = _params()
    run = vertical_run(X, y, cols, params, X_pred=X_pred, keypair=KEY)
    # prediction rows: NaN in columns with and without NaN in training, routed by each owner's default direction
    assert np.isnan(X_pred[:, FULL]).any() and not np.isnan(X[:, FULL]).any()
    ref = assert_vertical_twin(run, X, y, cols, params, X_pred=X_pred)
    assert len(ref.trees) == 3
    # the test exercises both default directions, and host splits that send missing values left
    splits = [n for t in ref.trees for n in t.nodes.values() if n[0] == "split"]
    assert {n[4] for n in splits} == {False, True}
    assert any(r[3] for h in run["hosts"] for r in h.records), "no host split sends missing values left"


def test_missing_values_route_like_xgboost_where_training_had_none():
    """A column complete in training: its splits send NaN right (XGBoost's default_left = 0 there)."""
    _, X, y, X_pred = _data()
    params = _params(n_trees=4)
    model = fit_reference(X, y, fit_cuts(X, params.max_bin), params)
    full_splits = [n for t in model.trees for n in t.nodes.values() if not n.leaf and n.feature in FULL]
    assert full_splits and not any(n.default_left for n in full_splits)
    # NaN there is routed as a value right of every threshold (these splits' thresholds are finite)
    assert all(np.isfinite(n.threshold) for n in full_splits)
    huge = X_pred.copy()
    sub = huge[:, FULL]
    sub[np.isnan(sub)] = 1e30
    huge[:, FULL] = sub
    np.testing.assert_array_equal(model.predict_margin(X_pred), model.predict_margin(huge))
    sub[sub == 1e30] = -1e30                      # ... and not as a value left of them
    huge[:, FULL] = sub
    assert not np.array_equal(model.predict_margin(X_pred), model.predict_margin(huge))
    # and exported to xgboost, every prediction row (NaN in FULL columns too) agrees
    booster = _booster(model, X.shape[1])
    np.testing.assert_allclose(booster.predict(xgb.DMatrix(X_pred)), model.predict(X_pred), rtol=1e-5, atol=1e-6)


def _booster(model, d):
    import json
    booster = xgb.Booster()
    booster.load_model(bytearray(json.dumps(to_xgboost_json(model, d)).encode()))
    return booster


@pytest.mark.parametrize("objective", ["binary", "multiclass"])
def test_exported_model_predicts_as_ours_on_nan_data(objective):
    if objective == "binary":
        _, X, y, X_pred = _data()
        params = _params(n_trees=8, max_depth=4, max_bin=32)
    else:
        ds = load_dataset("penguins")
        X, y, X_pred = ds.X, ds.y, ds.X
        params = _params(objective="multiclass", n_classes=3, n_trees=5, max_bin=16)
    model = fit_reference(X, y, fit_cuts(X, params.max_bin), params)
    assert any(n.default_left for t in model.trees for n in t.nodes.values() if not n.leaf)
    ours = model.predict(X_pred)
    theirs = _booster(model, X.shape[1]).predict(xgb.DMatrix(X_pred))
    assert np.isnan(X_pred).any()
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-6)


def test_federated_auc_with_missing_values_close_to_xgboost():
    """Held-out AUC of vertical SecureBoost (3 parties, Paillier) on breast cancer with 20% of cells
    missing, against xgboost (hist, same max_bin/depth/eta/lambda/gamma/min_child_weight) on the same
    NaN-bearing matrix."""
    ds = load_dataset("breast_cancer_missing")
    Xtr, Xte, ytr, yte = train_test_split(ds.X, ds.y, test_size=0.3, random_state=0, stratify=ds.y)
    params = _params(n_trees=20, max_depth=4, max_bin=32)
    cols = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    run = vertical_run(Xtr, ytr, cols, params, X_pred=Xte, keypair=KEY, deadline=120.0)
    assert not run["errors"], run["errors"]
    ours = roc_auc_score(yte, transform(run["pred"], params))
    booster = xgb.train({"objective": "binary:logistic", "tree_method": "hist", "max_depth": params.max_depth,
                         "eta": params.learning_rate, "max_bin": params.max_bin, "lambda": params.reg_lambda,
                         "gamma": params.gamma, "min_child_weight": params.min_child_weight, "nthread": 2,
                         "seed": 0}, xgb.DMatrix(Xtr, ytr), params.n_trees)
    theirs = roc_auc_score(yte, booster.predict(xgb.DMatrix(Xte)))
    assert ours > 0.95 and abs(ours - theirs) <= 0.005, (ours, theirs)


def test_host_claiming_too_many_candidates_is_rejected():
    """The guest bounds a host's candidates by 2 * max_bin per declared feature (two virtual columns
    per feature with missing values): a histogram message claiming more is rejected, training goes on."""
    from test_secureboost_vertical import _CorruptFirstHistogram
    from secureflhv.tree.vertical import TAG_HIST

    def too_many(msg):
        msg.nodes[0].n_candidates = 2 * 12 * 5 + 1     # host-1 declares 5 features, max_bin 12
        return msg

    _, X, y, _ = _data()
    cols = [np.arange(0, 10), np.arange(10, 15), np.arange(15, 30)]
    params = _params(n_trees=1, max_depth=2)
    run = vertical_run(X, y, cols, params, keypair=KEY,
                       host_wrappers={"host-1": lambda tr, net: _CorruptFirstHistogram(tr, net, too_many)})
    assert not run["errors"], run["errors"]
    rejected = run["net"].mailbox("guest").rejected
    assert any(m.sender == "host-1" and m.tag == TAG_HIST and "more candidates" in why for m, why in rejected)
    assert_vertical_twin(run, X, y, cols, params)


# ------------------------------------------------------------------------------------------ horizontal
@pytest.mark.parametrize("scheme", ["iid", "label_dirichlet"])
def test_horizontal_with_missing_values_equals_numpy_twin(scheme):
    """Horizontal SecureBoost (secure aggregation) on NaN-bearing shards: the missing counts join the
    sketch aggregation, the clients' histograms carry the missing bucket; the model equals the twin on
    the pooled rows (its cuts of the present values on the nanmin / nanmax grid, default directions
    included) and exports to xgboost."""
    from sb_harness import horizontal_run
    from test_secureboost_horizontal import _assert_twin as assert_horizontal_twin
    from secureflhv.data import partition

    ds = load_dataset("breast_cancer_missing")
    X_all = ds.X.copy()
    X_all[:, 3] = load_dataset("breast_cancer").X[:, 3]                    # one complete column
    part = partition(scheme, ds.y, 3, seed=2, **({"beta": 0.5} if scheme == "label_dirichlet" else {}))
    shards = [(X_all[idx], ds.y[idx]) for idx in part.indices]
    shards[0][0][:, 5] = np.nan                                            # a client with a column all missing
    params = SecureBoostParams(n_trees=3, max_depth=3, max_bin=16, sketch_bins=256)
    run = horizontal_run(shards, params, kind="secagg")
    ref = assert_horizontal_twin(run, shards, params)
    assert any(n[4] for t in ref.trees for n in t.nodes.values() if n[0] == "split")
    model = run["server_model"]
    X = np.concatenate([s[0] for s in shards])
    X_pred = X[:100].copy()
    X_pred[::7, 3] = np.nan                                                # complete in training
    np.testing.assert_allclose(_booster(model, X.shape[1]).predict(xgb.DMatrix(X_pred)), model.predict(X_pred),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict_margin(X_pred), ref.predict_margin(X_pred), rtol=0, atol=1e-5)


def test_missingness_split_survives_strict_json_and_xgboost():
    """A label carried by missingness alone: the root splits "every present value left, missing right"
    (threshold +inf). The model goes through strict JSON (no Infinity) and back, and through xgboost
    (+inf written as FLT_MAX), predicting the same."""
    import json

    from secureflhv.tree.model import model_from_dict, model_to_dict

    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 3))
    y = (rng.random(300) < 0.4).astype(int)
    X[y == 1, 0] = np.nan
    params = _params(n_trees=2, max_depth=2)
    model = fit_reference(X, y, fit_cuts(X, params.max_bin), params)
    root = model.trees[0].nodes[0]
    assert (root.feature, root.threshold, root.default_left) == (0, np.inf, False)
    doc = json.loads(json.dumps(model_to_dict(model), allow_nan=False))
    again = model_from_dict(doc)
    np.testing.assert_array_equal(again.predict(X), model.predict(X))
    np.testing.assert_allclose(_booster(model, 3).predict(xgb.DMatrix(X)), model.predict(X), rtol=1e-5, atol=1e-6)
