"""The horizontal job module: params validation (errors name ``params.<field>``), client data loading
(npz shards from ``write_shards`` and CSV via ``load_table``), artifacts; and (slow) a real run of a
server and 3 clients as processes over gRPC with mutual TLS through the runtime."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from secureflhv.data import Dataset, partition, write_shards
from secureflhv.horizontal.models import ModelSpec, build_model, evaluate, flatten_named, set_flat
from secureflhv.runtime.job.data_prep import local_split
from secureflhv.runtime.algorithms import horizontal_fl as hj
from secureflhv.runtime.job.job_file import parse_job_file
from secureflhv.runtime.job.registry import job_params
from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.runtime.job.load import JobConfigError, parse_job

import fl_harness
from fl_harness import compare_with_in_process, run_in_process, write_grpc_job

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import run_job  # noqa: E402

MODEL = {"name": "mlp", "n_features": 16, "n_classes": 10}
PARAMS = {"strategy": "fedprox", "mu": 0.01, "model": MODEL, "rounds": 2, "local_epochs": 4, "batch_size": 16,
          "learning_rate": 0.1, "momentum": 0.9, "seed": 3, "test_fraction": 0.25,
          "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 20}}


GRPC_JOB_PARTIES = ["server", "client-1", "client-2", "client-3"]


def run_grpc_job(tmp_path: Path, params: dict, data_paths=None, edit=None) -> tuple[dict, str]:
    """A server and 3 clients (data: ``data_paths``, default :func:`shards`) as real processes over gRPC +
    mutual TLS (``secureflhv run``); ``edit(job)`` may change the job document. The job must succeed.
    Returns the job document and the launcher's output."""
    job, path = write_grpc_job(tmp_path, data_paths or shards(tmp_path, 3)[0], params, edit=edit)
    return job, run_job(path, timeout_s=240)


def server_model(cfg, out: Path):
    """The server's verified bundle (``model.safetensors``: the global model) and the model rebuilt from it."""
    bundle = read_bundle(out / "server", ca=cfg.resolve(cfg.security.ca), expect_party="server")
    net = build_model(ModelSpec(**bundle.config["model"]))
    set_flat(net, flatten_named(net, bundle.file("model.safetensors")))
    return bundle, net


def blobs() -> Dataset:
    """10 well-separated Gaussian classes in 16 dimensions (600 rows)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1.5, (10, 16))
    y = rng.integers(0, 10, 600)
    return Dataset((centres[y] + rng.normal(0, 0.7, (600, 16))).astype(np.float32), y, name="blobs")


def shards(tmp_path: Path, n_clients: int):
    ds = blobs()
    part = partition("label_dirichlet", ds, n_clients, seed=1, beta=0.5)
    npz = write_shards(ds, part, tmp_path / "npz", fmt="npz")
    csv = write_shards(ds, part, tmp_path / "csv", fmt="csv")
    return npz, csv


def job_dict(data_paths, params=PARAMS, **kw) -> dict:
    return fl_harness.job_dict(data_paths, params, **kw)


@pytest.mark.parametrize("change, field", [
    ({"rounds": 0}, "params.rounds"),
    ({"strategy": "fedsgd"}, "params.strategy"),
    ({"fraction": 1.5}, "params.fraction"),
    ({"momentum": 1.0}, "params.momentum"),
    ({"lr": 0.1}, "params.lr: renamed to learning_rate; give learning_rate only"),
    ({"learning_rte": 0.1}, "params.learning_rte: unknown parameter"),
    ({"model": {"name": "cnn", "n_features": 100, "n_classes": 10}}, "params.model"),
    ({"model": {"name": "mlp", "n_classes": 10}}, "params.model.n_features"),
    ({"aggregation": {"kind": "paillier"}}, "params.aggregation.kind"),
    ({"aggregation": {"clip": -1}}, "params.aggregation.clip"),
    ({"aggregation": {"threshold": 5}}, "params.aggregation.threshold"),
    ({"aggregation": {"threshold": 0.5}}, "params.aggregation.threshold: threshold fraction must be in (1/2, 1]"),
    ({"aggregation": {"threshold": 1}}, "params.aggregation.threshold: threshold must be >= 2"),
    ({"aggregation": {"min_clients": 1}}, "params.aggregation.min_clients"),
    ({"fraction": 0.3}, "params.fraction"),
    ({"part_clips": {"weights": 3.0}}, "params.part_clips"),
])
def test_bad_params_are_named(tmp_path, change, field):
    cfg = parse_job_file(job_dict([tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"],
                                  {**PARAMS, **change}), tmp_path)
    with pytest.raises(JobConfigError) as exc:
        job_params(cfg)
    assert field in str(exc.value)


def test_model_is_required(tmp_path):
    params = {k: v for k, v in PARAMS.items() if k != "model"}
    cfg = parse_job_file(job_dict([tmp_path / "a.npz", tmp_path / "b.npz"], params), tmp_path)
    with pytest.raises(JobConfigError, match=r"params\.model: Field required"):
        job_params(cfg)


def test_client_data_mismatch_names_the_party(tmp_path):
    npz, _ = shards(tmp_path, 3)
    bad = {**PARAMS, "model": {"name": "mlp", "n_features": 15, "n_classes": 10}}
    cfg = parse_job(job_dict(npz, bad), tmp_path)
    with pytest.raises(JobConfigError, match=r"parties\[1\]\.data \(party '\S+'\): .* 16 feature columns, params\.model\.n_features"):
        hj.load_client_data(cfg, cfg.parties[1], job_params(cfg))
    few = {**PARAMS, "model": {"name": "mlp", "n_features": 16, "n_classes": 5}}
    cfg = parse_job(job_dict(npz, few), tmp_path)
    with pytest.raises(JobConfigError, match=r"parties\[2\]\.data \(party '\S+'\): labels .* \(params\.model\.n_classes\)"):
        hj.load_client_data(cfg, cfg.parties[2], job_params(cfg))
    cfg = parse_job(job_dict([tmp_path / "missing.npz", npz[1], npz[2]]), tmp_path)
    with pytest.raises(JobConfigError, match=r"parties\[1\]\.data \(party '\S+'\): .*missing\.npz"):
        hj.load_client_data(cfg, cfg.parties[1], job_params(cfg))


def check_artifacts(cfg, out: Path, rounds: int, floor: float | None = 0.3):
    """The saved global model reproduces the final accuracy the clients reported (above ``floor``: clearly
    above chance, 0.1, after 2 short rounds; None: not checked)."""
    bundle, net = server_model(cfg, out)
    assert bundle.algorithm == "horizontal" and bundle.role == "server"
    arrays = bundle.file("model.safetensors")
    assert all(a.dtype == np.float32 for a in arrays.values())
    with np.load(out / "server" / "global_model.npz", allow_pickle=False) as z:  # the same arrays
        assert sorted(z.files) == sorted(arrays) and all(np.array_equal(z[k], arrays[k]) for k in z.files)
    metrics = json.loads((out / "server" / "metrics.json").read_text())
    assert [r["round"] for r in metrics["rounds"]] == list(range(1, rounds + 1))
    assert (out / "server" / "accuracy.png").stat().st_size > 0
    params = job_params(cfg)
    correct = n = 0
    for spec in cfg.clients:
        X, y = hj.load_client_data(cfg, spec, params)
        test = local_split(len(y), params.test_fraction, params.seed, spec.id).test
        ev = evaluate(net, X[test], y[test])
        correct, n = correct + ev["correct"], n + ev["n"]
        client = json.loads((out / spec.id / "metrics.json").read_text())
        assert len(client["rounds"]) == rounds and client["n_test"] == len(test)
    final = metrics["final"]
    assert final["test_n"] == n
    assert final["test_accuracy"] == pytest.approx(correct / n, abs=1e-12)
    assert floor is None or final["test_accuracy"] > floor
    return metrics


def test_run_job_in_process_npz_and_csv(tmp_path):
    npz, csv = shards(tmp_path, 3)
    paths = [npz[0], csv[1], npz[2]]  # one client reads CSV (id column excluded from the features)
    cfg = parse_job(job_dict(paths, tls=True), tmp_path)
    run_in_process(cfg)
    check_artifacts(cfg, tmp_path / "out", 2)
    # every client's final multi-class metrics equal scikit-learn's on its predictions.csv; confusion plot drawn
    import pandas as pd
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    for c in ("client-1", "client-2", "client-3"):
        final = json.loads((tmp_path / "out" / c / "metrics.json").read_text())["final"]
        pred = pd.read_csv(tmp_path / "out" / c / "predictions.csv")
        p = pred[[f"p{k}" for k in range(10)]].to_numpy()
        assert final["task"] == "multiclass" and final["test"]["n"] == len(pred) > 0
        assert final["test"]["accuracy"] == accuracy_score(pred["label"], p.argmax(1))
        assert final["test"]["macro_f1"] == pytest.approx(f1_score(pred["label"], p.argmax(1), average="macro",
                                                                   labels=range(10), zero_division=0))
        assert final["test"]["log_loss"] == pytest.approx(log_loss(pred["label"], p, labels=range(10)), rel=1e-6)
        assert (tmp_path / "out" / c / "confusion.png").stat().st_size > 1000


@pytest.mark.slow
def test_multiprocess_grpc_tls_run(tmp_path):
    """FedProx over label-Dirichlet shards as processes with secure aggregation: the artifacts, the wire, and
    (the learning check) every party's state and metrics equal to the bit those of the same job in one
    process with plaintext aggregation of the same quantised updates (test_run_job_in_process_npz_and_csv:
    that run learns)."""
    params = {**PARAMS, "local_epochs": 1,  # the same stochastic rounding in both runs:
              "aggregation": {**PARAMS["aggregation"], "seed": 7}}
    job, out = run_grpc_job(tmp_path, params)
    ids = GRPC_JOB_PARTIES
    assert "[server]" in out and "[client-3]" in out and "round 2/2" in out and "aggregation secagg" in out
    metrics = check_artifacts(parse_job(job, tmp_path), tmp_path / "out", 2, floor=None)
    compare_with_in_process(job, tmp_path, tmp_path / "threads", ids)
    assert all(r["survivors"] == ["client-1", "client-2", "client-3"] for r in metrics["rounds"])
    assert all(r["aggregation"]["model"]["k_bits"] > 0 for r in metrics["rounds"])  # quantised secure aggregation
    status = json.loads((tmp_path / "out" / "server" / "status.json").read_text())  # what the job page draws
    assert status["state"] == "done"
    assert status["curves"]["test accuracy"] == [[r["round"], r["test_accuracy"]] for r in metrics["rounds"]]
    assert [p[0] for p in status["curves"]["train loss"]] == [1, 2]

    # bytes on the wire: both ends of every link agree, and each round the server sent every client at least
    # the global model (float32) and got at least its k-bit masked update back
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from job_harness import assert_wire_consistent, wire_of

    wire = wire_of(tmp_path / "out", ids)
    assert_wire_consistent(wire)
    n_params = sum(a.size for a in server_model(parse_job(job, tmp_path), tmp_path / "out")[0]
                   .file("model.safetensors").values())
    k_bits = min(r["aggregation"]["model"]["k_bits"] for r in metrics["rounds"])
    for c in ids[1:]:
        link = wire["server"]["peers"][c]
        assert link["sent"] >= 2 * n_params * 4, (c, link["sent"], n_params)
        assert link["received"] >= 2 * n_params * k_bits // 8, (c, link["received"], n_params, k_bits)


@pytest.mark.slow
def test_killed_client_is_a_dropout_the_job_survives(tmp_path):
    """A client killed (SIGKILL) after round 1: the launcher keeps the others running, later rounds
    complete through secure aggregation with the 3 survivors, the server saves its model, and the
    launcher's exit code still reports the failure."""
    import os
    import signal
    import time

    from secureflhv.runtime.job.load import load_job
    from secureflhv.runtime.process.launcher import Launcher

    npz, _ = shards(tmp_path, 4)
    # input_timeout_s: how long round 2's aggregation waits for the dead client (the live ones train 1 epoch)
    params = {**PARAMS, "rounds": 3, "local_epochs": 1,
              "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 20, "input_timeout_s": 8}}
    # deadline_s: how long the server keeps trying to reach the dead client
    _, path = write_grpc_job(tmp_path, npz, params, edit=lambda job: job["job"].update(deadline_s=20))
    launcher = Launcher(path, load_job(path), grace_s=5)
    killed = threading.Event()

    def kill_after_round_1():
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not killed.is_set():
            victim = next((c for c in launcher.children if c.party_id == "client-4"), None)
            if victim is not None and any("round 1" in line for line in victim.lines):
                os.killpg(victim.proc.pid, signal.SIGKILL)
                killed.set()
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_after_round_1, daemon=True)
    watcher.start()
    rc = launcher.run(timeout_s=240)
    assert killed.is_set()
    assert rc == 1  # the dropout is reported ...
    server = next(c for c in launcher.children if c.party_id == "server")
    assert server.proc.returncode == 0, server.lines[-20:]  # ... but the job went on without it
    metrics = json.loads((tmp_path / "out" / "server" / "metrics.json").read_text())
    assert [r["round"] for r in metrics["rounds"]] == [1, 2, 3]
    assert metrics["rounds"][-1]["survivors"] == ["client-1", "client-2", "client-3"]
    assert all(c.proc.poll() is not None for c in launcher.children)
