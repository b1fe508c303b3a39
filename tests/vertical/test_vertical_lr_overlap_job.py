"""Vertical LR as a job over real party processes (gRPC, mutual TLS), a fifth of the columns held by guest and host
under the same names, the host holding 90% of the ids: the trained model equals the independent centralised
Taylor-LR (:func:`vlr_harness.reference_taylor_lr`) on the joined table, where a shared column is two features
(one per party: each party's columns are its own, and bundles name them per party); and a prediction job that
reads both tables by those names reproduces the held-out probabilities exactly (slow)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secureflhv.data import load_sklearn, vertical_split, write_vertical_csvs
from secureflhv.runtime.job.demo import write_vertical_lr_job
from secureflhv.runtime.store.model_bundle import read_bundle
from vlr_harness import TAYLOR_TOL as TOL, reference_taylor_lr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from job_harness import assert_prediction_job_reproduces  # noqa: E402

PARAMS = {"epochs": 3, "batch_size": 64, "learning_rate": 0.3, "momentum": 0.5, "l2": 0.01, "key_bits": 512,
          "early_stopping_rounds": None, "test_fraction": 0.25, "split_seed": 2, "seed": 6}


@pytest.mark.slow
def test_same_named_columns_at_both_parties_job_and_prediction_equal_the_twin(tmp_path):
    ds = load_sklearn("breast_cancer")
    vp = vertical_split(ds, 1, "overlap", seed=5, shared_fraction=0.2, sample_overlap=0.9)
    csv = write_vertical_csvs(ds, vp, tmp_path / "data", label_column="label")
    shared = sorted(set(vp.column_names[0]) & set(vp.column_names[1]))
    assert len(shared) == 6
    job = write_vertical_lr_job(tmp_path / "job", csv["guest"], [csv["host_1"]], PARAMS, mode="two_party",
                                deadline_s=60, insecure_test_keys=True)
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "180"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = job.parent / "out"
    ca = job.parent / "certs" / "ca.pem"
    guest, host = (read_bundle(out / pid, ca=ca, expect_party=pid) for pid in ("guest", "host-1"))
    assert guest.feature_names == vp.column_names[0] and host.feature_names == vp.column_names[1]

    # the twin: each party's table on PSI's rows (the common ids, code-point order), its columns standardised on
    # the training rows, side by side (a shared column twice)
    tables = [pd.read_csv(csv[p], dtype={"id": str}).set_index("id") for p in ("guest", "host_1")]
    split = json.loads((out / "guest" / "split.json").read_text())
    train = split["train"]
    assert sorted(train + split["test"]) == sorted(set(tables[0].index) & set(tables[1].index))
    assert train == sorted(train)
    y = tables[0].pop("label").loc[train].to_numpy()
    blocks = []
    for t in tables:
        X = t.loc[train].to_numpy(np.float64)
        blocks.append((X - X.mean(0)) / X.std(0))
    w_ref, b_ref, losses_ref = reference_taylor_lr(np.column_stack(blocks), y, **PARAMS, mode="two_party")
    fed = np.concatenate([guest.file("weights.npy"), host.file("weights.npy")])
    assert np.max(np.abs(w_ref)) > 0.1  # the model moved
    np.testing.assert_allclose(fed, w_ref, rtol=0, atol=TOL)
    np.testing.assert_allclose(guest.file("intercept.npy"), b_ref, rtol=0, atol=TOL)
    metrics = json.loads((out / "guest" / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["history"]["loss"], losses_ref, rtol=0, atol=TOL)
    for name in shared:  # the same column at both parties: two features that share the weight
        assert guest.file("weights.npy")[vp.column_names[0].index(name)] == pytest.approx(
            host.file("weights.npy")[vp.column_names[1].index(name)], rel=1e-6)

    # a prediction job reads each party's columns by its own bundle's names: the same probabilities, bit for bit
    assert_prediction_job_reproduces(job, tmp_path / "predict", {"guest": csv["guest"], "host-1": csv["host_1"]})
