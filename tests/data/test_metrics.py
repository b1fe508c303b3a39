"""Metrics per task equal scikit-learn's on the same predictions, and each task draws its plots."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as M

from secureflhv.data.metrics import task_metrics, task_of, task_plots


def _png_shape(path):
    import matplotlib.image

    return matplotlib.image.imread(path).shape


def test_binary_metrics_equal_sklearn():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)
    p = np.clip(0.35 * y + 0.65 * rng.random(200), 0, 1)
    m = task_metrics(y, p, "binary")
    pred = (p >= 0.5).astype(int)
    fpr, tpr, _ = M.roc_curve(y, p)
    assert m["auc"] == M.roc_auc_score(y, p) and m["ks"] == pytest.approx(np.max(tpr - fpr), abs=0)
    assert m["accuracy"] == M.accuracy_score(y, pred)
    assert m["precision"] == M.precision_score(y, pred) and m["recall"] == M.recall_score(y, pred)
    assert m["log_loss"] == pytest.approx(M.log_loss(y, p), rel=1e-12)
    assert m["confusion"] == M.confusion_matrix(y, pred).tolist() and m["n"] == 200
    one_class = task_metrics(np.zeros(5, int), np.full(5, 0.2), "binary")  # AUC / KS undefined: left out
    assert "auc" not in one_class and one_class["confusion"] == [[5, 0], [0, 0]]


def test_multiclass_metrics_equal_sklearn():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 4, 150)
    y[y == 3] = 2  # class 3 never occurs: macro-F1 still averages over all 4 classes of the model
    logits = rng.normal(size=(150, 4)) + 1.5 * np.eye(4)[y]
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    m = task_metrics(y, p, "multiclass")
    assert m["accuracy"] == M.accuracy_score(y, p.argmax(1))
    assert m["macro_f1"] == pytest.approx(M.f1_score(y, p.argmax(1), average="macro", labels=range(4),
                                                     zero_division=0), rel=1e-12)
    assert m["log_loss"] == pytest.approx(M.log_loss(y, p, labels=range(4)), rel=1e-9)


def test_regression_metrics_equal_sklearn():
    rng = np.random.default_rng(3)
    y = rng.normal(150, 70, 120)
    pred = y + rng.normal(0, 40, 120)
    m = task_metrics(y, pred, "regression")
    assert m["rmse"] == pytest.approx(np.sqrt(M.mean_squared_error(y, pred)), rel=1e-12)
    assert m["mae"] == M.mean_absolute_error(y, pred) and m["r2"] == M.r2_score(y, pred)
    assert task_metrics(y, np.full(120, y.mean()), "regression")["r2"] == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="shape"):
        task_metrics(y, np.c_[pred, pred], "regression")


def test_each_task_draws_its_plots(tmp_path):
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, 60)
    p = np.clip(0.4 * y + 0.6 * rng.random(60), 0, 1)
    paths = task_plots(y, p, "binary", tmp_path / "b", title="t")
    assert [q.name for q in paths] == ["roc_ks.png", "lift_gain.png", "confusion.png"]
    import pandas as pd

    gain = pd.read_csv(tmp_path / "b" / "lift_gain.csv")  # the deciles' gain ends with every event captured
    assert len(gain) == 10 and gain["gain"].iloc[-1] == 1.0
    y3 = rng.integers(0, 3, 60)
    paths = task_plots(y3, np.eye(3)[y3] * 0.5 + 0.5 / 3, "multiclass", tmp_path / "m")
    assert [q.name for q in paths] == ["confusion.png"]
    yr = rng.normal(size=60)
    paths = task_plots(yr, yr + 0.1, "regression", tmp_path / "r")
    assert [q.name for q in paths] == ["predicted_vs_true.png"]
    for q in tmp_path.rglob("*.png"):
        h, w, _ = _png_shape(q)
        assert h > 200 and w > 200, q
    assert task_plots(y[:0], p[:0], "binary", tmp_path / "none") == []
    assert task_of(p) == "binary" and task_of(np.c_[p, p]) == "multiclass" and task_of(p, True) == "regression"
    with pytest.raises(ValueError, match="task must be one of"):
        task_plots(y, p, "ranking", tmp_path)
