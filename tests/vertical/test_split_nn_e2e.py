"""Split NN end to end: guest and host as separate processes over gRPC with mutual TLS (slow), columns split at
random and hosts holding a sample of the ids (PSI aligns them); the model and the held-out predictions equal an
independent centralised torch twin's (:mod:`snn_twin`) trained on the joined table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from secureflhv.data import load_sklearn
from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.runtime.job.load import JobConfigError, load_job
from secureflhv.runtime.job.demo import write_vertical_nn_job
from secureflhv.runtime.job.registry import job_params
from secureflhv.runtime.store.checkpoint import CheckpointStore
from secureflhv.vertical.split_nn import SplitNNConfig
from snn_twin import ADAM_TOL as TOL, federated_state, job_twin

PARAMS = {"epochs": 1, "batch_size": 128, "host_bottom": [8, 4], "guest_bottom": [8], "interactive_units": 4,
          "key_bits": 1024, "learning_rate": 0.02, "test_fraction": 0.25, "split_seed": 3, "seed": 1}


def test_job_params_name_the_field(tmp_path):
    job = write_vertical_nn_job(tmp_path, None, None, {**PARAMS, "interactive_units": 0},
                                dataset=load_sklearn("breast_cancer"), n_hosts=1, tls=False, insecure_test_keys=True)
    with pytest.raises(JobConfigError, match=r"params\.interactive_units"):
        job_params(load_job(job))
    job = write_vertical_nn_job(tmp_path, None, None, {**PARAMS, "optimiser": "sgd"},
                                dataset=load_sklearn("breast_cancer"), n_hosts=1, tls=False, insecure_test_keys=True)
    with pytest.raises(JobConfigError, match=r"params\.optimiser: unknown parameter"):
        job_params(load_job(job))
    job = write_vertical_nn_job(tmp_path, None, None, PARAMS, dataset=load_sklearn("breast_cancer"), n_hosts=1,
                                tls=False, insecure_test_keys=False)
    with pytest.raises(JobConfigError, match=r"params\.key_bits"):
        job_params(load_job(job))


@pytest.mark.slow
def test_guest_and_host_processes_over_grpc_tls(tmp_path):
    job = write_vertical_nn_job(tmp_path, None, None, PARAMS, dataset=load_sklearn("breast_cancer"), n_hosts=1,
                                scheme="random", seed=2, deadline_s=120, insecure_test_keys=True)
    cfg = load_job(job)
    assert cfg.security.ca is not None and all(p.cert for p in cfg.parties)  # mutual TLS
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "240"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    out_dir = job.parent / "out"
    metrics = json.loads((out_dir / "guest" / "metrics.json").read_text())
    test = metrics["metrics"]["test"]
    assert test["n"] > 100
    assert len(metrics["history"]["loss"]) == 1
    for pid, role in (("guest", "guest"), ("host-1", "host")):
        model = read_bundle(out_dir / pid, ca=job.parent / "certs" / "ca.pem", expect_party=pid)
        assert model.algorithm == "vertical_nn" and model.role == role
        store = CheckpointStore(out_dir / pid / "checkpoints", job_id=cfg.job.id, party_id=pid)
        assert store.steps() == [1]  # one epoch, checkpointed (atomic store, no pickle)
        arrays, _ = store.load(1)
        key = "interactive.E" if role == "host" else "interactive.W_g"
        np.testing.assert_allclose(arrays[key], model.file("state.safetensors")[key])
    assert (out_dir / "guest" / "loss.png").is_file()
    _assert_equals_twin(job, out_dir, test)
    # the host's accumulated noise share is nonzero: the guest alone does not hold the interactive weights
    host_E = read_bundle(out_dir / "host-1", ca=job.parent / "certs" / "ca.pem").file("state.safetensors")["interactive.E"]
    assert np.abs(host_E).max() > 0.1

    # bytes on the wire: both ends agree; the host sent at least one ciphertext per training row (its bottom
    # outputs travel encrypted each batch; 1024-bit key: ~256 bytes per ciphertext)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from job_harness import assert_wire_consistent, wire_of

    wire = wire_of(out_dir, ["guest", "host-1"])
    assert_wire_consistent(wire)
    assert wire["host-1"]["peers"]["guest"]["sent"] > test["n"] * 250, wire["host-1"]["total"]


def _assert_equals_twin(job, out_dir, test):
    """The bundles' model and the held-out predictions are the twin's, up to ``snn_twin.ADAM_TOL`` (the job trains
    with Adam; 256 quantisation steps of the interactive layer's encoding); the job's test AUC is the twin's."""
    import pandas as pd

    twin, held_out, host_ids = job_twin(job, PARAMS, SplitNNConfig)
    ca = job.parent / "certs" / "ca.pem"
    arrays = [read_bundle(out_dir / pid, ca=ca).file("state.safetensors") for pid in ["guest", *host_ids]]
    fed, ref = federated_state(arrays[0], arrays[1:], host_ids), twin.state()
    assert fed.keys() == ref.keys()
    worst = max(float(np.max(np.abs(fed[k] - ref[k]))) for k in ref)
    pred = pd.read_csv(out_dir / "guest" / "predictions.csv", dtype={"id": str})
    assert pred["id"].tolist() == held_out["ids"] and len(pred) == test["n"]
    p_twin = twin.predict(held_out["Xg"], held_out["Xhs"])
    print(f"federated - twin: parameters {worst:.3g}, probabilities {np.max(np.abs(pred['probability'] - p_twin)):.3g}")
    for k in ref:
        np.testing.assert_allclose(fed[k], ref[k], rtol=0, atol=TOL, err_msg=k)
    np.testing.assert_allclose(pred["probability"], p_twin, rtol=0, atol=TOL)
    assert test["auc"] == pytest.approx(roc_auc_score(held_out["y"], p_twin), abs=1e-6)
