"""Vertical LR with its default parameters reaches centralised quality on breast cancer (issue 17).

Same held-out rows for both models: the job's own split (:func:`secureflhv.runtime.job.data_prep.split_rows`
with the job defaults test_fraction 0.3, split_seed 0) and per-column standardisation with the training
rows' statistics (what every party does to its own columns). The federation runs in-process (threads over
InProcessNetwork, real Paillier with the smallest key the explicit test-only setting allows, 256 bits) under four feature splits; the
baseline is scikit-learn's default ``LogisticRegression()`` (L2, C=1) on the joined table. The federated model
itself equals the independent centralised Taylor-LR (:func:`vlr_harness.reference_taylor_lr`) on the same rows.
"""
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from secureflhv.runtime.job.data_prep import split_rows, standardise
from secureflhv.vertical.lr import VerticalLRConfig
from vlr_harness import reference_taylor_lr, run_vertical_lr

KEY = {"key_bits": 256, "insecure_test_key": True}  # the smallest key the test-only setting allows
DEFAULTS = VerticalLRConfig(**KEY)

# (guest columns, [host columns...]) of the 30 features
SPLITS = {
    "even 15/15": (range(0, 15), [range(15, 30)]),
    "guest 10 / host 20": (range(0, 10), [range(10, 30)]),
    "guest 20 / host 10": (range(0, 20), [range(20, 30)]),
    "3 hosts, interleaved": (range(0, 30, 4), [range(1, 30, 4), range(2, 30, 4), range(3, 30, 4)]),
}


@pytest.fixture(scope="module")
def data():
    X, y = load_breast_cancer(return_X_y=True)
    split = split_rows(len(y), test_fraction=0.3, seed=0)
    Xs, _ = standardise(X, split.train)
    auc_sk = roc_auc_score(y[split.test],
                           LogisticRegression().fit(Xs[split.train], y[split.train]).predict_proba(Xs[split.test])[:, 1])
    return Xs[split.train], y[split.train], Xs[split.test], y[split.test], auc_sk


@pytest.mark.parametrize("name", list(SPLITS))
def test_default_vertical_lr_within_0005_auc_of_sklearn(data, name):
    Xtr, ytr, Xte, yte, auc_sk = data
    guest_cols = list(SPLITS[name][0])
    host_cols = [list(c) for c in SPLITS[name][1]]
    results, errors, _, _ = run_vertical_lr(
        Xtr[:, guest_cols], ytr, [Xtr[:, c] for c in host_cols], dict(KEY), deadline=60,
        predict_sets=(Xte[:, guest_cols], [Xte[:, c] for c in host_cols]))
    assert not errors, errors
    auc_fed = roc_auc_score(yte, results["proba"])
    assert auc_fed >= auc_sk - 0.005, f"{name}: federated AUC {auc_fed:.4f}, scikit-learn {auc_sk:.4f}"
    guest = results["guest"]
    # the model is the independent centralised Taylor-LR's on the joined table (default configuration: mini-
    # batches, momentum, early stopping, the kept epoch), so the AUC gap is the Taylor loss's, not the federation's
    w_ref, b_ref, losses_ref = reference_taylor_lr(Xtr[:, guest_cols + sum(host_cols, [])], ytr, **KEY)
    fed = np.concatenate([guest.weights] + [results[f"host-{i + 1}"].weights for i in range(len(host_cols))])
    # tolerance: the fixed-point rounding of X (2**-32) and of the residuals (2**-40) over up to 20 epochs of
    # momentum 0.8; it is the same in every run (the masks cancel exactly): measured 2.4e-10
    np.testing.assert_allclose(fed, w_ref, rtol=0, atol=1e-9)
    assert guest.intercept == pytest.approx(b_ref, abs=1e-9)
    np.testing.assert_allclose(guest.losses, losses_ref, rtol=0, atol=1e-9)
    # the kept model is the one with the lowest training loss, and every party kept the same epoch
    assert guest.best_epoch == int(np.argmin(guest.losses))
    assert all(results[f"host-{i + 1}"].best_epoch == guest.best_epoch for i in range(len(host_cols)))
    assert guest.losses[guest.best_epoch] < guest.losses[0]
    assert guest.epochs <= DEFAULTS.epochs
