"""End to end, issue 13 (targets beyond binary): vertical LR jobs over real party processes (gRPC, mutual
TLS) on real data by name — Palmer Penguins (3 species, missing values left in) with ``task: multiclass``
in arbiter mode, scikit-learn's diabetes with ``task: regression`` in two-party mode.

Each job's weights equal the independent centralised numpy twin (vlr_harness) on the joined, imputed and
standardised table to 1e-6; metrics.json holds the task's metrics; a prediction job with the saved
bundles (its ``run`` at every data party, in-process) reproduces the in-job held-out predictions (class
probabilities / values).
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secureflhv.data import load_dataset
from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.runtime.job.demo import vertical_tables, write_vertical_lr_job
from secureflhv.runtime.job.load import load_job_params
from secureflhv.runtime.algorithms import predict
from secureflhv.transport.inprocess import InProcessNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vertical"))
from vlr_harness import reference_linear_regression, reference_taylor_softmax  # noqa: E402

pytestmark = pytest.mark.slow

COMMON = {"epochs": 2, "key_bits": 512, "early_stopping_rounds": None, "test_fraction": 0.25, "split_seed": 1, "seed": 2}
CASES = {
    "penguins": ("arbiter", {"task": "multiclass", "batch_size": 128, "learning_rate": 0.5, **COMMON}),
    "diabetes": ("two_party", {"task": "regression", "batch_size": 96, "learning_rate": 0.1, "momentum": 0.8,
                               **COMMON}),
}


def _secureflhv(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "secureflhv", *args], capture_output=True, text=True, timeout=260)


@pytest.fixture(scope="module", params=sorted(CASES))
def trained(request, tmp_path_factory):
    name = request.param
    mode, params = CASES[name]
    tmp = tmp_path_factory.mktemp(name)
    guest_csv, host_csvs = vertical_tables(load_dataset(name), tmp / "data", 1, seed=4)
    job = write_vertical_lr_job(tmp / "job", guest_csv, host_csvs, params, mode=mode, job_id=f"vlr-{name}",
                                deadline_s=60, insecure_test_keys=True)
    proc = _secureflhv("run", str(job), "--timeout", "200")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return name, params, job, guest_csv, host_csvs[0]


def _standardised(frame: pd.DataFrame, train: np.ndarray) -> pd.DataFrame:
    """Each column mean-imputed and standardised with its training rows' statistics (pandas, NaN-aware)."""
    tr = frame.iloc[train]
    mu, sd = tr.mean(), tr.std(ddof=0).replace(0.0, 1.0)
    return (frame.fillna(mu) - mu) / sd


def test_weights_equal_the_centralised_twin_and_metrics_fit_the_task(trained):
    name, params, job, guest_csv, host_csv = trained
    out = job.parent / "out"
    guest = pd.read_csv(guest_csv, dtype={"id": str}).set_index("id")
    host = pd.read_csv(host_csv, dtype={"id": str}).set_index("id")
    common = sorted(set(guest.index) & set(host.index))
    split = json.loads((out / "guest" / "split.json").read_text())
    train = np.searchsorted(common, split["train"])
    y = guest.loc[common].pop("label").to_numpy()
    X = pd.concat([_standardised(guest.loc[common].drop(columns="label"), train),
                   _standardised(host.loc[common], train)], axis=1)
    gm, hm = (read_bundle(out / p, ca=job.parent / "certs" / "ca.pem") for p in ("guest", "host-1"))
    weights = {**dict(zip(gm.feature_names, gm.file("weights.npy"))), **dict(zip(hm.feature_names, hm.file("weights.npy")))}
    fed = np.array([weights[c] for c in X.columns])
    if params["task"] == "multiclass":
        W_ref, b_ref, losses_ref = reference_taylor_softmax(X.to_numpy()[train], y[train], 3, **params)
    else:
        W_ref, b_ref, losses_ref = reference_linear_regression(X.to_numpy()[train], y[train], **params)
    assert fed.shape == W_ref.shape
    scale = np.max(np.abs(W_ref))
    np.testing.assert_allclose(fed, W_ref, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(gm.file("intercept.npy"), b_ref, rtol=1e-6, atol=1e-6 * scale)
    metrics = json.loads((out / "guest" / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["history"]["loss"], losses_ref, rtol=1e-6)
    test = metrics["metrics"]["test"]
    assert metrics["task"] == params["task"]
    if params["task"] == "multiclass":
        assert {"accuracy", "macro_f1", "log_loss"} <= set(test) and "auc" not in test
        assert test["accuracy"] > 0.9, test           # three well-separated species
    else:
        assert {"rmse", "mae", "r2"} <= set(test) and "accuracy" not in test
        assert test["r2"] > 0.2, test


def _predict_in_process(pjob: Path) -> None:
    """The prediction job's ``run`` for every party (the server decrypts the guest's masked scores of an
    arbiter-mode model), in threads over the in-process transport (the same job code as ``secureflhv run``,
    without starting processes again)."""
    cfg, params = load_job_params(pjob)
    parties = list(cfg.parties)
    net = InProcessNetwork(cfg.job.id, [p.id for p in parties], deadline=60)
    errors = {}

    def work(party):
        try:
            predict.run(cfg, party, net.transport(party.id), params)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors[party.id] = exc

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_prediction_job_equals_in_job_predictions(trained):
    name, params, job, guest_csv, host_csv = trained
    in_job = pd.read_csv(job.parent / "out" / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    pjob = predict.write_predict_job(job, job.parent.parent / "predict" / "job.yaml",
                                     data={"guest": guest_csv, "host-1": host_csv})
    _predict_in_process(pjob)
    pred = pd.read_csv(pjob.parent / "predictions" / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    pred = pred.loc[in_job.index]  # the prediction job scores every aligned row; compare the held-out ones
    cols = ["p0", "p1", "p2"] if params["task"] == "multiclass" else ["value"]
    got = pred[cols if params["task"] == "multiclass" else ["score"]].to_numpy()
    np.testing.assert_allclose(got, in_job[cols].to_numpy(), rtol=1e-9, atol=1e-12)
    if params["task"] == "multiclass":
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)
    scored = json.loads((pjob.parent / "predictions" / "guest" / "metrics.json").read_text())["metrics"]
    assert ("macro_f1" if params["task"] == "multiclass" else "r2") in scored
