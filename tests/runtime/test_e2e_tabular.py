"""End to end, issue 13: vertical LR over real party processes (gRPC, mutual TLS) on a table with
missing cells at both parties and a categorical column declared in the guest's ``data.schema``.

Each party imputes, one-hot encodes and standardises its own columns (fitted on its training rows); the
trained weights equal an independent pandas/numpy twin on the joined table (1e-6); a prediction job on
the raw held-out rows applies the saved preprocessing and reproduces the in-job scores exactly; and a
job file whose schema the table breaks stops with an error naming the file, column and row.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from secureflhv.data import load_dataset
from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.runtime.job.demo import write_vertical_lr_job
from secureflhv.runtime.algorithms.predict import write_predict_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vertical"))
from vlr_harness import reference_taylor_lr  # noqa: E402  (independent numpy reference)

pytestmark = pytest.mark.slow

PARAMS = {"epochs": 2, "batch_size": 128, "learning_rate": 0.15, "lr_schedule": "constant", "momentum": 0.0,
          "l2": 0.01, "key_bits": 1024, "early_stopping_rounds": None, "test_fraction": 0.25, "split_seed": 2,
          "seed": 3, "missing_indicator": True}
BANDS = ["small", "medium", "large"]
SCHEMA = {"band": {"kind": "categorical", "categories": BANDS}}


def _tables(tmp_path: Path):
    ds = load_dataset("breast_cancer_missing")
    ids = np.array([f"b{i:03d}" for i in range(len(ds))])
    raw = load_dataset("breast_cancer").X[:, 0]
    band = pd.Series(pd.cut(raw, [0, 12, 16, 100], labels=BANDS).astype(str))
    band[np.random.default_rng(9).random(len(band)) < 0.1] = np.nan
    guest = pd.DataFrame(ds.X[:, 1:6], columns=[f"g{j}" for j in range(5)])
    guest.insert(0, "id", ids)
    guest["label"] = ds.y
    guest["band"] = band
    host = pd.DataFrame(ds.X[:, 6:12], columns=[f"h{j}" for j in range(6)])
    host.insert(0, "id", ids)
    data = tmp_path / "data"
    data.mkdir()
    guest.iloc[:540].to_csv(data / "guest.csv", index=False)     # PSI has work: each side lacks some ids
    host.iloc[20:].to_csv(data / "host_1.csv", index=False)
    return data / "guest.csv", data / "host_1.csv"


def _job(tmp_path: Path, schema: dict) -> Path:
    guest_csv, host_csv = _tables(tmp_path)
    job = write_vertical_lr_job(tmp_path / "job", guest_csv, [host_csv], PARAMS, mode="two_party",
                                deadline_s=60, insecure_test_keys=True)
    doc = yaml.safe_load(job.read_text())
    next(p for p in doc["parties"] if p["id"] == "guest")["data"]["schema"] = schema
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def _run(job: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "200"],
                          capture_output=True, text=True, timeout=260)


def _twin_features(frame: pd.DataFrame, train: np.ndarray) -> pd.DataFrame:
    """Independent preprocessing: mean-impute + standardise numerics (train statistics), a missing
    indicator where training had gaps, most-frequent-impute + one-hot the categorical column."""
    out = {}
    for c in frame.columns:
        col, tr = frame[c], frame[c].iloc[train]
        if c == "band":
            filled = col.fillna(tr.mode()[0])
            for b in BANDS:
                out[f"band={b}"] = (filled == b).astype(float)
        else:
            mu, sd = tr.mean(), tr.std(ddof=0)
            out[c] = (col.fillna(mu) - mu) / (sd if sd > 0 else 1.0)
        if tr.isna().any():
            out[f"{c}=missing"] = col.isna().astype(float)
    return pd.DataFrame(out, index=frame.index)


def test_vertical_lr_with_missing_and_categorical_matches_twin(tmp_path):
    job = _job(tmp_path, SCHEMA)
    proc = _run(job)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out_dir = job.parent / "out"
    split = json.loads((out_dir / "guest" / "split.json").read_text())
    guest = pd.read_csv(job.parent.parent / "data" / "guest.csv", dtype={"id": str}).set_index("id")
    host = pd.read_csv(job.parent.parent / "data" / "host_1.csv", dtype={"id": str}).set_index("id")
    common = sorted(set(guest.index) & set(host.index))
    assert sorted(split["train"] + split["test"]) == common
    train = np.searchsorted(common, split["train"])
    y = guest.loc[common].pop("label").to_numpy()
    g = _twin_features(guest.loc[common].drop(columns="label"), train)
    h = _twin_features(host.loc[common], train)
    X = pd.concat([g, h], axis=1)
    w_ref, b_ref, losses_ref = reference_taylor_lr(X.to_numpy()[train], y[train], **PARAMS)

    gm, hm = (read_bundle(out_dir / p, ca=job.parent / "certs" / "ca.pem") for p in ("guest", "host-1"))
    fed = {**dict(zip(gm.feature_names, gm.file("weights.npy"))), **dict(zip(hm.feature_names, hm.file("weights.npy")))}
    assert set(fed) == set(X.columns)
    assert {"band=small", "band=missing", "g0=missing", "h0=missing"} <= set(fed)
    names = list(X.columns)
    np.testing.assert_allclose([fed[k] for k in names], w_ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gm.file("intercept.npy"), b_ref, rtol=1e-6, atol=1e-9)
    pre = gm.manifest["preprocessing"]["preprocessor"]
    assert pre["categories"] == {"band": BANDS} and pre["feature_names"][-1] == "band"
    metrics = json.loads((out_dir / "guest" / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["history"]["loss"], losses_ref, rtol=1e-6)
    assert {"auc", "ks", "confusion", "precision", "recall"} <= set(metrics["metrics"]["test"])
    assert (out_dir / "guest" / "roc_ks.png").stat().st_size > 1000

    # scoring the raw held-out rows from the bundles: same preprocessing, same scores
    new = tmp_path / "new"
    new.mkdir()
    raw = {"guest": guest.loc[split["test"]].reset_index(), "host-1": host.loc[split["test"]].reset_index()}
    for name, frame in raw.items():
        frame.to_csv(new / f"{name}.csv", index=False, float_format="%.17g")
    pjob = write_predict_job(job, tmp_path / "predict" / "job.yaml",
                             data={k: new / f"{k}.csv" for k in raw}, new_ports=True)
    proc = _run(pjob)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    pred = pd.read_csv(tmp_path / "predict" / "predictions" / "guest" / "predictions.csv", dtype={"id": str})
    in_job = pd.read_csv(out_dir / "guest" / "predictions.csv", dtype={"id": str})
    merged = pred.merge(in_job, on="id")
    assert len(merged) == len(split["test"])
    np.testing.assert_array_equal(merged.score.to_numpy(), merged.probability.to_numpy())


def test_table_breaking_the_schema_stops_the_job_naming_file_column_row(tmp_path):
    job = _job(tmp_path, {"band": {"kind": "categorical", "categories": ["small", "medium"]}})
    proc = _run(job)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "guest.csv: column 'band' row" in text and "category 'large' is not among" in text, text[-3000:]
