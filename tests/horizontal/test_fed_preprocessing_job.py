"""Federated preprocessing in the horizontal jobs (runtime/job/fed_prep.py): Palmer Penguins with its missing
cells and categorical columns left in, split over 3 clients; the bundles carry the global preprocessor
and predict from raw rows exactly what the job measured. The FL run is real party processes over gRPC with
mutual TLS; horizontal SecureBoost (in-process) takes its ranges from the federated sketch (no client min/max)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import secureflhv
from secureflhv.data import load_table
from secureflhv.data.loaders import PENGUIN_SCHEMA
from secureflhv.runtime.job.load import parse_job
from secureflhv.runtime.job.data_prep import local_split, split_rows
from secureflhv.runtime.job.registry import job_params
from secureflhv.transport.certs import generate_certificates

from fl_harness import run_job_threads
from test_fl_job import job_dict, run_grpc_job, run_in_process

SCHEMA = {"id": "id", **PENGUIN_SCHEMA}


def penguin_csvs(tmp_path: Path, n: int = 3) -> list[Path]:
    """Raw penguin rows (strings, empty cells) split by island order over ``n`` clients: non-IID."""
    from palmerpenguins import load_penguins

    df = load_penguins()
    df = df[[c for c in PENGUIN_SCHEMA]].copy()
    df.insert(0, "id", [f"p{i:03d}" for i in range(len(df))])
    df = df.sort_values("island", kind="stable")
    out = []
    for i, part in enumerate(np.array_split(np.arange(len(df)), n)):
        p = tmp_path / f"penguins_{i}.csv"
        df.iloc[part].to_csv(p, index=False)
        out.append(p)
    return out


def fl_params(**kw) -> dict:
    base = {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 9, "n_classes": 3}, "rounds": 6,
            "local_epochs": 3, "batch_size": 16, "learning_rate": 0.05, "momentum": 0.9, "seed": 1, "test_fraction": 0.25,
            "label_column": "species", "preprocessing": {"standardize": True},
            "aggregation": {"kind": "secagg", "stage_timeout_s": 20}}
    base.update(kw)
    return base


def with_schema(job: dict) -> dict:
    for p in job["parties"]:
        if "data" in p:
            p["data"]["schema"] = SCHEMA
            p["data"]["label_column"] = "species"
    return job


def check_bundles_predict_as_in_job(out: Path, csvs: list[Path], params: dict) -> None:
    """Every client's bundle scores its raw held-out rows with the accuracy the job measured on them, and
    the server's bundle (same global model and preprocessor) gives the same predictions."""
    ca = out.parent / "certs" / "ca.pem"  # bundles are signed by their party's certificate under the job CA
    server = secureflhv.load_model(out / "server", ca=ca)
    pre = server.bundle.manifest["preprocessing"]
    assert pre["federated_statistics"]["n_rows"] < 344 and pre["preprocessor"]["categories"]["island"]
    for i, path in enumerate(csvs, start=1):
        cid = f"client-{i}"
        model = secureflhv.load_model(out / cid, ca=ca)
        assert model.bundle.manifest["preprocessing"]["preprocessor"] == pre["preprocessor"]
        table = load_table(path, label_column="species", schema=SCHEMA)
        test = local_split(table.n_rows, params["test_fraction"], params["seed"], cid).test
        assert np.isnan(table.X).any() or i != 3
        pred = model.predict(table.X[test])
        np.testing.assert_array_equal(pred, server.predict(table.X[test]))
        metrics = json.loads((out / cid / "metrics.json").read_text())
        in_job = metrics["rounds"][-1]["test_accuracy"]
        assert float(np.mean(pred == table.y[test])) == pytest.approx(in_job, abs=1e-12)


def test_wrong_model_width_names_the_expected_width(tmp_path):
    csvs = penguin_csvs(tmp_path)
    cfg = parse_job(with_schema(job_dict(csvs, fl_params(model={"name": "mlp", "n_features": 6, "n_classes": 3}))),
                    tmp_path)
    with pytest.raises(AssertionError, match=r"set params\.model\.n_features to 9"):
        run_in_process(cfg)


def test_bad_public_ranges_are_named(tmp_path):
    from secureflhv.runtime.job.load import JobConfigError

    job = with_schema(job_dict(penguin_csvs(tmp_path), fl_params(preprocessing={"ranges": [[1, 0]]})))
    with pytest.raises(JobConfigError, match=r"params\.preprocessing\.ranges.*finite lo < hi"):
        parse_job(job, tmp_path)


@pytest.mark.slow
def test_fl_job_over_grpc_tls_with_federated_preprocessing(tmp_path):
    csvs = penguin_csvs(tmp_path)
    params = fl_params()
    run_grpc_job(tmp_path, params, data_paths=csvs, edit=with_schema)
    check_bundles_predict_as_in_job(tmp_path / "out", csvs, params)
    final = json.loads((tmp_path / "out" / "server" / "metrics.json").read_text())["final"]
    assert final["test_accuracy"] > 0.8     # standardised + one-hot: learnable in a few rounds
    check_predict_job(tmp_path, csvs)


def check_predict_job(tmp_path: Path, csvs: list[Path]) -> None:
    """The prediction job (each client scores locally with its bundle) reads the raw table with the training
    schema and applies the saved preprocessor: the same scores as load_model."""
    from secureflhv.runtime.algorithms import predict

    import pandas as pd

    pjob = predict.write_predict_job(tmp_path / "job.yaml", tmp_path / "predict" / "job.yaml",
                                     data={f"client-{i}": p for i, p in enumerate(csvs, start=1)})
    cfg = parse_job(yaml.safe_load(pjob.read_text()), pjob.parent)
    for party in cfg.clients:
        predict.run(cfg, party, None, job_params(cfg))
        got = pd.read_csv(pjob.parent / "predictions" / party.id / "predictions.csv")
        table = load_table(csvs[int(party.id[-1]) - 1], label_column="species", schema=SCHEMA)
        model = secureflhv.load_model(tmp_path / "out" / party.id, ca=tmp_path / "certs" / "ca.pem")
        want = model.predict_proba(table.X)
        np.testing.assert_allclose(got[[f"p{k}" for k in range(3)]].to_numpy(), want, rtol=0, atol=1e-6)


def test_secureboost_job_bins_on_the_federated_range_sketch(tmp_path):
    """No client sends its min/max (no hsb.ranges reaches the server); the trees' ranges are the range
    sketch's, which contain every training value; the bundle predicts raw rows (NaN, codes) as in the job."""
    from secureflhv.runtime.algorithms import secureboost_horizontal as sbj
    from secureflhv.transport.inprocess import InProcessTransport

    csvs = penguin_csvs(tmp_path)
    params = {"n_trees": 3, "max_depth": 3, "max_bin": 16, "sketch_bins": 256, "test_fraction": 0.25,
              "split_seed": 2, "objective": "multiclass", "n_classes": 3}
    # certificates: every party signs its model bundle with its certificate key
    generate_certificates(tmp_path / "certs", ["server", "client-1", "client-2", "client-3"])
    cfg = parse_job(with_schema(job_dict(csvs, params, algorithm="secureboost_horizontal", tls=True)), tmp_path)
    seen = []

    class Recording(InProcessTransport):
        def recv(self, sender, tag, round=0, timeout=None, parse=None):
            seen.append(tag)
            return super().recv(sender, tag, round, timeout, parse)

    results = run_job_threads(cfg, sbj.run, transport=lambda net, spec: Recording(net, spec.id)
                              if spec.role == "server" else net.transport(spec.id))
    assert "fpp.hello" in seen and "hsb.ranges" not in seen
    out = tmp_path / "out"
    server = secureflhv.load_model(out / "server", ca=tmp_path / "certs" / "ca.pem")
    stats = server.bundle.manifest["preprocessing"]["federated_statistics"]
    assert stats["range_source"].startswith("log-magnitude")
    for i, path in enumerate(csvs, start=1):
        table = load_table(path, label_column="species", schema=SCHEMA)
        model = secureflhv.load_model(out / f"client-{i}", ca=tmp_path / "certs" / "ca.pem")
        for j, name in enumerate(table.feature_names):
            lo, hi = stats["ranges"][name]
            assert lo <= np.nanmin(table.X[:, j]) and np.nanmax(table.X[:, j]) <= hi
        pred = model.predict(table.X)
        np.testing.assert_array_equal(pred, server.predict(table.X))
        test = split_rows(table.n_rows, 0.25, 2).test
        in_job = results[f"client-{i}"]["test"]["accuracy"]
        assert float(np.mean(pred[test] == table.y[test])) == pytest.approx(in_job, abs=1e-12)
    assert np.mean([results[f"client-{i}"]["test"]["accuracy"] for i in (1, 2, 3)]) > 0.8
