"""Vertical families end to end: train (real processes, gRPC + mutual TLS), save bundles, then a prediction
job on new tables (some ids unknown to one party) whose scores equal the in-job held-out predictions on
the shared rows (exactly for LR and SecureBoost: LR in arbiter mode goes through the same fixed-point
encoding in both, lr_scores); in arbiter mode the guest receives the host's scores only encrypted
(wire report per tag); a damaged bundle, another party's bundle and another
job's bundle are each refused with a clear error."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job
from secureflhv.runtime.algorithms.predict import write_predict_job
from secureflhv import load_model
from secureflhv.runtime.store.model_bundle import ModelBundleError, read_bundle

pytestmark = pytest.mark.slow

SPLIT = {"test_fraction": 0.3, "split_seed": 5}
FAMILIES = {
    "vertical_lr": ({"mode": "arbiter", "epochs": 2, "batch_size": 128, "learning_rate": 0.15, "key_bits": 1024,
                     "seed": 7, **SPLIT}, True),
    "secureboost_vertical": ({"n_trees": 3, "max_depth": 3, "key_bits": 1024, **SPLIT}, False),
    "vertical_nn": ({"epochs": 1, "batch_size": 128, "host_bottom": [8, 4], "guest_bottom": [8],
                     "interactive_units": 4, "key_bits": 1024, "learning_rate": 0.02, "seed": 1, **SPLIT}, False),
}
EXACT = {"vertical_lr", "secureboost_vertical"}  # split NN: torch float64 matmuls of other batch shapes


def secureflhv(*args) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "secureflhv", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request, tmp_path_factory):
    algorithm = request.param
    params, server = FAMILIES[algorithm]
    tmp = tmp_path_factory.mktemp(algorithm)
    guest_csv, host_csvs = breast_cancer_tables(tmp / "data", 1, seed=3, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=server, id_column="id", label_column="label")
    job = write_job(tmp / "job", "model-train", algorithm, parties, params, deadline_s=60, insecure_test_keys=True)
    code, out = secureflhv("run", str(job), "--timeout", "240")
    assert code == 0, out[-3000:]
    return tmp, job, guest_csv, host_csvs[0]


def new_tables(tmp: Path, guest_csv: Path, host_csv: Path, test_ids: list[str]) -> dict[str, Path]:
    """The held-out rows, minus a few ids at the host, plus rows only the guest (or host) holds."""
    guest = pd.read_csv(guest_csv, dtype={"id": str})
    host = pd.read_csv(host_csv, dtype={"id": str})
    g = guest[guest.id.isin(test_ids)]
    dropped = set(test_ids[:5])
    h = host[host.id.isin(test_ids) & ~host.id.isin(dropped)]
    g = pd.concat([g, guest.assign(id=guest.id + "-new").head(4)])           # unknown to the host
    h = pd.concat([h, host.assign(id=host.id + "-hostonly").head(3)])        # unknown to the guest
    out = tmp / "new"
    out.mkdir(exist_ok=True)
    g.to_csv(out / "guest.csv", index=False, float_format="%.17g")
    h.to_csv(out / "host.csv", index=False, float_format="%.17g")
    return {"guest": out / "guest.csv", "host-1": out / "host.csv"}


def test_predict_job_equals_in_job_predictions(trained):
    tmp, job, guest_csv, host_csv = trained
    out = job.parent / "out"
    in_job = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str})
    test_ids = list(in_job.id)
    data = new_tables(tmp, guest_csv, host_csv, test_ids)
    pjob = write_predict_job(job, tmp / "predict" / "job.yaml", data=data, new_ports=True)
    code, log = secureflhv("run", str(pjob), "--timeout", "120")
    assert code == 0, log[-3000:]
    pred = pd.read_csv(tmp / "predict" / "predictions" / "guest" / "predictions.csv", dtype={"id": str})
    shared = sorted(set(test_ids) - set(test_ids[:5]))
    assert sorted(pred.id) == shared                       # PSI: only ids every party holds
    merged = pred.merge(in_job, on="id")
    assert len(merged) == len(shared)
    if read_bundle(job.parent / "out" / "guest", ca=job.parent / "certs" / "ca.pem").algorithm in EXACT:
        np.testing.assert_array_equal(merged.score.to_numpy(), merged.probability.to_numpy())
    else:
        np.testing.assert_allclose(merged.score.to_numpy(), merged.probability.to_numpy(), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(merged.label_x, merged.label_y)
    metrics = json.loads((tmp / "predict" / "predictions" / "guest" / "metrics.json").read_text())["metrics"]
    assert metrics["rows_scored"] == len(shared) and metrics["ids_without_partner"] == 4 + 5
    assert 0.5 < metrics["auc"] <= 1.0
    if read_bundle(out / "guest", ca=out.parent / "certs" / "ca.pem").algorithm == "vertical_lr":  # arbiter mode:
        for run in (out / "guest", tmp / "predict" / "predictions" / "guest"):
            wire = json.loads((run / "metrics.json").read_text())["wire"]["peers"]
            from_host = {tag for tag, c in wire["host-1"]["by_tag"].items() if c.get("messages_received")}
            assert "vlr.pred_enc" in from_host and "vlr.pred" not in from_host, from_host  # host scores: encrypted
            assert wire["server"]["by_tag"]["vlr.pred_total"]["messages_received"] >= 1  # totals via the arbiter


def test_bundle_manifest(trained):
    _, job, _, _ = trained
    ca = job.parent / "certs" / "ca.pem"  # bundles are signed: read under the training job's CA
    b = read_bundle(job.parent / "out" / "guest", ca=ca, expect_party="guest", expect_job="model-train")
    algorithm = b.algorithm
    assert algorithm in FAMILIES and b.role == "guest" and b.feature_names
    peers = {"host-1": "host", **({"server": "server"} if FAMILIES[algorithm][1] else {})}
    assert {p["id"]: p["role"] for p in b.peers} == peers
    assert all(p["cert_sha256"] and len(p["cert_sha256"]) == 64 for p in b.peers)
    host = read_bundle(job.parent / "out" / "host-1" / "model", ca=ca, expect_party="host-1")
    if algorithm != "vertical_nn":
        assert len(b.paillier_key_sha256) == 64
        assert host.paillier_key_sha256 == b.paillier_key_sha256  # the key every party used in training
    if algorithm == "vertical_nn":
        assert b.paillier_key_sha256 is None  # each host's own key; a prediction job makes fresh ones
        assert "interactive.V.host-1" in b.file("state.safetensors")
        assert "interactive.E" in host.file("state.safetensors")
    elif algorithm == "vertical_lr":
        assert len(b.file("weights.npy")) == len(b.feature_names)
        assert set(b.preprocessing["standardisation"]) == {"mean", "std"}
    else:  # the guest holds no host threshold: host splits are (owner, record) only
        nodes = [n for t in b.file("model.json")["trees"] for n in t["nodes"] if n.get("owner") == "host-1"]
        assert nodes and all("threshold" not in n and n["feature"] == -1 for n in nodes)
        assert all(len(r) == 4 for r in host.file("split_table.json"))  # feature, bin, threshold, default_left
    if algorithm == "vertical_lr":  # the arbiter's bundle: the config a prediction job needs, no key, no parameters
        server = read_bundle(job.parent / "out" / "server", ca=ca, expect_party="server", expect_role="server")
        assert server.config["mode"] == "arbiter" and server.config["key_bits"] == 1024 and not server.files
    for party in ["guest", "host-1"] + (["server"] if FAMILIES[algorithm][1] else []):  # the notebook API
        model = load_model(job.parent / "out" / party, ca=ca, expect_party=party, expect_job="model-train")
        d = model.describe()
        assert (d["algorithm"], d["party_id"], d["local"]) == (algorithm, party, False)
        assert d["feature_names"] == read_bundle(job.parent / "out" / party, ca=ca).feature_names
        assert party == "server" or d["feature_names"]
        with pytest.raises(ModelBundleError, match=r"job.algorithm: predict"):
            model.predict_proba(np.zeros((1, len(d["feature_names"]))))


@pytest.mark.parametrize("damage, expected", [
    ("tamper", ".sha256: the file does not match the manifest's hash"),
    ("other_party", "party_id: this bundle belongs to party 'host-1', not 'guest'"),
    ("other_job", "job_id: this bundle belongs to job 'model-train', not 'another-job'"),
])
def test_bad_bundle_is_refused(trained, tmp_path, capsys, damage, expected):
    tmp, job, guest_csv, host_csv = trained
    models = tmp_path / "models"
    shutil.copytree(job.parent / "out", models)
    model_job = "model-train"
    if damage == "tamper":
        files = sorted((models / "guest" / "model").glob("*.npy")) or \
            sorted((models / "guest" / "model").glob("*.safetensors")) or [models / "guest" / "model" / "model.json"]
        with open(files[-1], "ab") as fh:
            fh.write(b" ")
    elif damage == "other_party":
        shutil.rmtree(models / "guest" / "model")
        shutil.copytree(models / "host-1" / "model", models / "guest" / "model")
    else:
        model_job = "another-job"
    data = {"guest": guest_csv, "host-1": host_csv}
    pjob = write_predict_job(job, tmp_path / "p" / "job.yaml", data=data, model_dir=models, new_ports=True)
    if model_job != "model-train":
        text = pjob.read_text().replace("model_job_id: model-train", f"model_job_id: {model_job}")
        pjob.write_text(text)
    # `secureflhv run`'s own entry point in this process: the job file is refused before any party starts
    # (a subprocess would only add its start-up, ~5 s a case)
    from secureflhv.cli import main

    code = main(["run", str(pjob), "--timeout", "60"])
    log = "".join(capsys.readouterr())
    assert code == 2 and "invalid job file" in log, log[-3000:]
    assert expected in log, log[-3000:]
    assert "params.model_dir (party 'guest')" in log


def test_arbiter_model_is_never_scored_without_its_server(trained, tmp_path):
    """A model trained in arbiter mode needs its server in the prediction job (the hosts' scores travel only
    under its key); a model trained without one needs none. Checked before any process starts."""
    from secureflhv.runtime.job.load import load_job_params
    from secureflhv.runtime.job.job_file import JobConfigError

    tmp, job, guest_csv, host_csv = trained
    pjob = write_predict_job(job, tmp_path / "job.yaml", data={"guest": guest_csv, "host-1": host_csv})
    doc = yaml.safe_load(pjob.read_text())
    doc["parties"] = [p for p in doc["parties"] if p["role"] != "server"]
    pjob.write_text(yaml.safe_dump(doc, sort_keys=False))
    if FAMILIES[read_bundle(job.parent / "out" / "guest", ca=job.parent / "certs" / "ca.pem").algorithm][1]:
        with pytest.raises(JobConfigError, match=r"\(party 'guest'\).*arbiter mode with server 'server'.*needs that "
                                                 r"party \(role: server\)"):
            load_job_params(pjob)
    else:
        assert load_job_params(pjob)[0].server is None


def _serve_inputs(job: Path, guest_csv: Path):
    """(held-out ids, their in-job scores, the guest's raw feature rows for them, the guest's input columns)."""
    out = job.parent / "out"
    in_job = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str})
    bundle = read_bundle(out / "guest", ca=job.parent / "certs" / "ca.pem")
    columns = list((bundle.manifest.get("preprocessing") or {}).get("input_features") or bundle.feature_names)
    guest = pd.read_csv(guest_csv, dtype={"id": str}).set_index("id")
    ids = list(in_job.id)
    return ids, in_job.probability.to_numpy(), guest.loc[ids, columns].to_numpy(dtype=np.float64), bundle.algorithm


def test_served_scores_equal_the_jobs_and_the_service_outlives_bad_requests_a_swap_and_a_dead_host(trained, tmp_path):
    """``secureflhv serve`` at every party (processes, mutual TLS): single-id and 64-id requests score exactly as
    the job's held-out predictions (split NN within 1e-9); an unknown id takes the model's missing-value path and
    is named; a malformed body and an oversized batch get 400 / 413; a hot swap to a copy of the bundles while
    requests flow drops none; a killed host is named in a 503 and the guest keeps answering health checks."""
    import threading
    import time

    from serve_harness import Served

    tmp, job, guest_csv, host_csv = trained
    ids, expected, X, algorithm = _serve_inputs(job, guest_csv)
    pjob = write_predict_job(job, tmp_path / "serve" / "job.yaml", data={"guest": guest_csv, "host-1": host_csv},
                             new_ports=True)
    served = Served(pjob, tmp_path, "--timeout", "30", "--deadline", "5")
    try:
        status, one = served.score(ids[:1], X[:1])
        assert status == 200, (status, one, served.logs())
        got = []
        for s in range(0, len(ids), 64):
            status, ans = served.score(ids[s:s + 64], X[s:s + 64])
            assert status == 200, (status, ans, served.logs())
            assert ans["missing"] == {} and len(ans["scores"]) == len(ids[s:s + 64])
            got += ans["scores"]
        assert len(got) == len(ids)
        np.testing.assert_allclose(one["scores"], got[:1], rtol=0, atol=0 if algorithm in EXACT else 1e-9)
        if algorithm in EXACT:
            np.testing.assert_array_equal(np.asarray(got), expected)
        else:
            np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-9)

        status, ans = served.score(["nobody-" + ids[0]], X[:1])
        assert status == 200 and ans["missing"] == {"nobody-" + ids[0]: ["host-1"]}, ans
        assert np.all(np.isfinite(ans["scores"]))
        assert served.call("POST", "/v1/score", raw=b"{not json")[0] == 400
        assert served.score(ids[:1], X[:1, :-1])[0] == 400                          # a feature short
        status, ans = served.score((ids * 2)[:65], np.vstack([X, X])[:65])
        assert status == 413, ans

        models = tmp_path / "models-v2"
        shutil.copytree(job.parent / "out", models)
        answers, stop = [], threading.Event()

        def load():
            while not stop.is_set():
                answers.append(served.score(ids[:8], X[:8]))

        th = threading.Thread(target=load)
        th.start()
        status, ans = served.call("POST", "/v1/swap", {"model_dir": str(models)})
        stop.set()
        th.join()
        assert status == 200, (ans, served.logs())
        assert answers and all(s == 200 for s, _ in answers), answers[-3:]
        assert all(a["scores"] == answers[0][1]["scores"] for _, a in answers)

        page, doc = tmp_path / "serve" / "predictions" / "guest" / "status.json", {}  # what the job page draws
        for _ in range(40):
            doc = json.loads(page.read_text()) if page.exists() else {}
            if doc.get("curves", {}).get("p99 ms"):
                break
            time.sleep(0.25)
        assert doc["state"] == "serving" and doc["serving"]["p50_ms"] > 0 and doc["curves"]["requests/s"], doc

        served.procs["host-1"].kill()
        served.procs["host-1"].wait()
        status, ans = served.score(ids[:1], X[:1])
        assert status in (503, 504) and "host-1" in json.dumps(ans), ans
        assert served.call("GET", "/healthz")[0] == 200
        status, ans = served.call("GET", "/readyz")
        assert status == 503 and "host-1" in json.dumps(ans), ans
    finally:
        codes = served.stop()
    assert codes["guest"] == 0, served.logs()
