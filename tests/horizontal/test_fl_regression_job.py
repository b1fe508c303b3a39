"""A horizontal FL regression job end to end: a server and 3 client processes over gRPC with mutual TLS
train an MLP regression head on scikit-learn's diabetes set through secure aggregation; the pooled R²
is clearly above predicting the mean, every client's metrics.json equals scikit-learn's metrics of its
predictions.csv, the plots are drawn, and the saved bundle's predictions equal the in-job ones."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

import secureflhv
from secureflhv.data import load_dataset
from secureflhv.runtime.job.load import JobConfigError, load_job
from secureflhv.runtime.job.demo import write_job
from secureflhv.runtime.job.registry import job_params

CLIENTS = ["client-1", "client-2", "client-3"]
FEATURES = [f"f{j}" for j in range(10)]
PARAMS = {"strategy": "fedavg", "model": {"name": "mlp", "task": "regression", "n_features": 10, "hidden": [8],
                                          "target_mean": 150.0, "target_std": 75.0},
          "rounds": 6, "local_epochs": 2, "batch_size": 16, "learning_rate": 0.05, "momentum": 0.5, "seed": 4,
          "test_fraction": 0.25, "label_column": "y",
          "aggregation": {"kind": "secagg", "clip": 4.0, "stage_timeout_s": 30}}


def client_tables(tmp):
    ds = load_dataset("diabetes")
    X = ds.X * np.sqrt(len(ds.X))  # sklearn scales each column to unit norm: back to unit variance
    order = np.random.default_rng(0).permutation(len(X))
    paths = {}
    for c, rows in zip(CLIENTS, np.array_split(order, 3)):
        df = pd.DataFrame(X[rows], columns=FEATURES)
        df.insert(0, "id", [f"{c}-{k}" for k in range(len(rows))])
        df["y"] = ds.y[rows]
        paths[c] = tmp / f"{c}.csv"
        df.to_csv(paths[c], index=False, float_format="%.17g")
    return paths


def parties(data):
    return [{"id": "server", "role": "server"}] + [
        {"id": c, "role": "guest" if i == 0 else "host", "data": {"path": str(data[c]), "label_column": "y"}}
        for i, c in enumerate(CLIENTS)]


def test_regression_params_name_the_field(tmp_path):
    data = client_tables(tmp_path)
    bad = {**PARAMS, "model": {**PARAMS["model"], "n_classes": 2}}
    job = write_job(tmp_path / "job", "h-reg", "horizontal", parties(data), bad, tls=False)
    with pytest.raises(JobConfigError, match=r"params\.model.*n_classes: task 'regression' has one output"):
        job_params(load_job(job))


@pytest.mark.slow
def test_regression_job_over_grpc_tls(tmp_path):
    data = client_tables(tmp_path)
    job = write_job(tmp_path / "job", "h-reg", "horizontal", parties(data), PARAMS, deadline_s=120)
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "300"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = job.parent / "out"
    server = json.loads((out / "server" / "metrics.json").read_text())
    final = server["final"]["test_metrics"]
    assert final["r2"] > 0.25, final  # predicting the mean scores 0
    assert all(r["aggregation"]["model"]["k_bits"] > 0 and r["aggregation"]["model"]["n_clipped"] == 0
               for r in server["rounds"])  # quantised secure aggregation, nothing clipped
    assert (out / "server" / "r2.png").stat().st_size > 1000
    n_test = 0
    for c in CLIENTS:
        metrics = json.loads((out / c / "metrics.json").read_text())["final"]
        assert metrics["task"] == "regression"
        pred = pd.read_csv(out / c / "predictions.csv")
        y, value = pred["label"].to_numpy(), pred["value"].to_numpy()
        assert metrics["test"]["rmse"] == pytest.approx(np.sqrt(mean_squared_error(y, value)), rel=1e-12)
        assert metrics["test"]["mae"] == pytest.approx(mean_absolute_error(y, value), rel=1e-12)
        assert metrics["test"]["r2"] == pytest.approx(r2_score(y, value), rel=1e-12)
        assert (out / c / "predicted_vs_true.png").stat().st_size > 1000
        # the bundle carries the task: load_model returns the values, unchanged, equal to the in-job ones
        model = secureflhv.load_model(out / c, ca=job.parent / "certs" / "ca.pem", expect_party=c, expect_job="h-reg")
        assert model.task == "regression" and model.describe()["task"] == "regression"
        table = pd.read_csv(data[c])
        got = model.predict(table[FEATURES].to_numpy()[pred["row"].to_numpy()])
        assert got.dtype == np.float64 and got.shape == value.shape
        np.testing.assert_allclose(got, value, rtol=1e-6)
        np.testing.assert_array_equal(model.predict_proba(table[FEATURES].to_numpy()), model.predict(table[FEATURES]))
        n_test += len(y)
    assert final["n"] == n_test
