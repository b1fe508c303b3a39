"""Horizontal families end to end: train (server + 3 client processes, gRPC + mutual TLS), then
(a) ``secureflhv.load_model`` on a client's bundle reproduces that client's in-job held-out metrics
exactly, without the federation, and (b) a prediction job scores every client's rows locally with the
global model; a bundle of another party or job is refused."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

import secureflhv
from secureflhv.runtime.job.data_prep import local_split, split_rows
from secureflhv.runtime.job.demo import write_job
from secureflhv.runtime.algorithms.predict import write_predict_job
from secureflhv.runtime.observe.reports import objective_metrics

pytestmark = pytest.mark.slow
CLIENTS = ["client-1", "client-2", "client-3"]
FAMILIES = {
    "horizontal": {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 3, "hidden": [8]},
                   "rounds": 2, "local_epochs": 2, "batch_size": 16, "learning_rate": 0.1, "seed": 3, "test_fraction": 0.25,
                   "label_column": "y", "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 30}},
    "secureboost_horizontal": {"n_trees": 2, "max_depth": 3, "max_bin": 16, "sketch_bins": 256,
                               "test_fraction": 0.25, "split_seed": 2},
}


def secureflhv_cmd(*args) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "secureflhv", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=400)
    return proc.returncode, proc.stdout


def client_tables(tmp, algorithm):
    """Three clients' CSVs (id, 6 features, label y), 120 rows each, different class mixes."""
    rng = np.random.default_rng(4)
    centres = rng.normal(0, 2, (3, 6))
    paths = {}
    for i, c in enumerate(CLIENTS):
        y = rng.choice(3, size=120, p=np.roll([0.6, 0.3, 0.1], i))
        if algorithm == "secureboost_horizontal":
            y = (y > 0).astype(int)  # binary trees
        X = centres[y] + rng.normal(0, 1.0, (120, 6))
        df = pd.DataFrame(X, columns=[f"f{j}" for j in range(6)])
        df.insert(0, "id", [f"{c}-{k}" for k in range(120)])
        df["y"] = y
        paths[c] = tmp / f"{c}.csv"
        df.to_csv(paths[c], index=False, float_format="%.17g")
    return paths


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request, tmp_path_factory):
    algorithm = request.param
    tmp = tmp_path_factory.mktemp(algorithm)
    data = client_tables(tmp, algorithm)
    parties = [{"id": "server", "role": "server"}] + [
        {"id": c, "role": "guest" if i == 0 else "host", "data": {"path": str(data[c]), "label_column": "y"}}
        for i, c in enumerate(CLIENTS)]
    job = write_job(tmp / "job", "h-train", algorithm, parties, FAMILIES[algorithm], deadline_s=120)
    code, out = secureflhv_cmd("run", str(job), "--timeout", "300")
    assert code == 0, out[-4000:]
    return algorithm, tmp, job, data


def test_load_model_reproduces_in_job_metrics(trained):
    algorithm, _, job, data = trained
    out = job.parent / "out"
    params = FAMILIES[algorithm]
    server = secureflhv.load_model(out / "server", ca=job.parent / "certs" / "ca.pem", expect_job="h-train")
    assert server.describe()["role"] == "server" and server.describe()["algorithm"] == algorithm
    for c in CLIENTS:
        model = secureflhv.load_model(out / c, ca=job.parent / "certs" / "ca.pem", expect_party=c,
                                      expect_job="h-train")
        assert model.describe()["local"] and model.describe()["algorithm"] == algorithm
        df = pd.read_csv(data[c])
        X, y = df[[f"f{j}" for j in range(6)]].to_numpy(), df["y"].to_numpy()
        in_job = json.loads((out / c / "metrics.json").read_text())
        if algorithm == "horizontal":
            test = local_split(len(y), params["test_fraction"], params["seed"], c).test
            last = in_job["rounds"][-1]
            assert int((model.predict(X[test]) == y[test]).sum()) == last["test_correct"]
            p_test = model.predict_proba(X[test])  # the in-job cross-entropy sum of these rows, to float32
            np.testing.assert_allclose(-np.log(p_test[np.arange(len(test)), y[test]]).sum(), last["test_loss_sum"],
                                       rtol=1e-5)
            np.testing.assert_array_equal(model.predict_proba(X), server.predict_proba(X))  # one global model
        else:
            test = split_rows(len(y), params["test_fraction"], params["split_seed"]).test
            assert objective_metrics(y[test], model.predict_proba(df.iloc[test]), "binary") == in_job["metrics"]["test"]
            np.testing.assert_array_equal(model.predict(X), (model.predict_proba(X) >= 0.5).astype(np.int64))
            np.testing.assert_array_equal(model.predict_proba(X), server.predict_proba(X))


def test_predict_job_scores_every_client_locally(trained):
    algorithm, tmp, job, data = trained
    new = {}
    for c in CLIENTS:  # new rows: the first 30 of each client, no labels
        df = pd.read_csv(data[c]).head(30).drop(columns=["y"])
        new[c] = tmp / f"new-{c}.csv"
        df.to_csv(new[c], index=False, float_format="%.17g")
    pjob = write_predict_job(job, tmp / "predict" / "job.yaml", data=new, new_ports=True)
    doc = yaml.safe_load(pjob.read_text())
    for p in doc["parties"]:
        if p.get("data"):
            p["data"].pop("label_column")  # the new rows have no labels
    pjob.write_text(yaml.safe_dump(doc))
    code, log = secureflhv_cmd("run", str(pjob), "--timeout", "200")
    assert code == 0, log[-4000:]
    for c in CLIENTS:
        pred = pd.read_csv(tmp / "predict" / "predictions" / c / "predictions.csv")
        model = secureflhv.load_model(job.parent / "out" / c, ca=job.parent / "certs" / "ca.pem")
        want = model.predict_proba(pd.read_csv(new[c])[[f"f{j}" for j in range(6)]].to_numpy())
        got = pred["score"].to_numpy() if want.ndim == 1 else pred[[f"p{k}" for k in range(want.shape[1])]].to_numpy()
        if algorithm == "horizontal":  # float32 torch: kernels may sum in another order in another process
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)
        assert list(pred["id"]) == [f"{c}-{k}" for k in range(30)] and "label" not in pred


def test_bundle_of_another_party_is_refused(trained):
    algorithm, tmp, job, data = trained
    models = tmp / f"swapped-{algorithm}"
    shutil.copytree(job.parent / "out", models)
    shutil.rmtree(models / "client-2" / "model")
    shutil.copytree(models / "client-3" / "model", models / "client-2" / "model")
    pjob = write_predict_job(job, tmp / "p2" / "job.yaml", data=data, model_dir=models, new_ports=True)
    code, log = secureflhv_cmd("run", str(pjob), "--timeout", "120")
    assert code != 0
    assert "params.model_dir (party 'client-2')" in log and "belongs to party 'client-3', not 'client-2'" in log, \
        log[-3000:]


@pytest.mark.parametrize("damage, expected", [
    ("tamper", ".sha256: the file does not match the manifest's hash"),
    ("other_job", "job_id: this bundle belongs to job 'h-train', not 'another-job'"),
    ("rehashed", "signature: signature of 'client-2' does not verify"),  # file edited, its hash recomputed
    ("no_ca", "ca_sha256 missing"),
])
def test_tampered_or_foreign_job_bundle_is_refused(trained, tmp_path, damage, expected):
    """Checked when the prediction job is loaded (``secureflhv validate`` / ``run``), before anyone starts."""
    from secureflhv.runtime.job.load import load_job_params
    from secureflhv.runtime.job.job_file import JobConfigError

    algorithm, tmp, job, data = trained
    models = tmp_path / "models"
    shutil.copytree(job.parent / "out", models)
    pjob = write_predict_job(job, tmp_path / "p" / "job.yaml", data=data, model_dir=models)
    bundle = models / "client-2" / "model"
    if damage in ("tamper", "rehashed"):
        target = next(f for f in sorted(bundle.iterdir()) if f.name != "manifest.json")
        target.write_bytes(target.read_bytes() + b" ")
    if damage in ("rehashed", "no_ca"):  # what someone without client-2's key can do to its manifest
        doc = json.loads((bundle / "manifest.json").read_text())
        if damage == "no_ca":
            del doc["ca_sha256"]
        else:
            doc["files"][target.name]["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
            doc["files"][target.name]["bytes"] = target.stat().st_size
        (bundle / "manifest.json").write_text(json.dumps(doc))
    elif damage == "other_job":
        pjob.write_text(pjob.read_text().replace("model_job_id: h-train", "model_job_id: another-job"))
    with pytest.raises(JobConfigError) as err:
        load_job_params(pjob)
    who = "client-1" if damage == "other_job" else "client-2"
    assert f"params.model_dir (party '{who}')" in str(err.value) and expected in str(err.value), str(err.value)
