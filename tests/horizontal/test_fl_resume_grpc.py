"""Horizontal FL resume after a crash: a server and 3 clients as processes over gRPC with mutual TLS (slow).

The server is SIGKILLed after it checkpointed a round; the clients stop with an error naming it within
their deadline; ``secureflhv run JOB --resume`` continues after the last round every party checkpointed,
and the finished global model equals an uninterrupted run's bit for bit (secure aggregation with a seeded
rounding: the sums are exact).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import kill_after, resumed_steps, run_job  # noqa: E402
from fl_harness import run_in_process, write_grpc_job  # noqa: E402
from test_fl_job import shards  # noqa: E402

from secureflhv.runtime.job.load import load_job  # noqa: E402


PROC_PARAMS = {"strategy": "scaffold", "model": {"name": "mlp", "n_features": 16, "n_classes": 10, "hidden": [8]},
               "rounds": 4, "local_epochs": 1, "batch_size": 32, "learning_rate": 0.1, "momentum": 0.5, "seed": 3,
               "test_fraction": 0.25, "aggregation": {"kind": "secagg", "clip": 1.0, "seed": 7, "stage_timeout_s": 60}}
KILL_AFTER = 2  # rounds the server finishes before it is killed
# how long a client waits for the (dead) server: a silent slice, then a probe, each this long (as the other
# process resume tests: 10 s); the survivors' wait after the kill is two of them, so it sets the test's length
DEADLINE = 10


def _proc_job(tmp: Path) -> Path:
    return write_grpc_job(tmp, shards(tmp, 3)[0], PROC_PARAMS,
                          edit=lambda job: job["job"].update(deadline_s=DEADLINE))[1]


def _model(out: Path) -> dict:
    with np.load(out / "server" / "global_model.npz", allow_pickle=False) as z:
        model = {k: z[k] for k in z.files}
    for c in ("client-1", "client-2", "client-3"):
        model[c] = json.loads((out / c / "metrics.json").read_text())["rounds"]
    model["server"] = [{k: r[k] for k in ("round", "survivors", "test_accuracy", "train_loss", "aggregation")}
                       for r in json.loads((out / "server" / "metrics.json").read_text())["rounds"]]
    return model


@pytest.mark.slow
def test_killed_server_then_resume_equals_uninterrupted_run(tmp_path):
    # the uninterrupted run in one process: a process run of the same job ends there bit for bit
    # (fl_harness.compare_with_in_process, test_strategies_processes.py)
    ref_job = _proc_job(tmp_path / "ref")
    run_in_process(load_job(ref_job))
    reference = _model(ref_job.parent / "out")
    assert len(reference["server"]) == PROC_PARAMS["rounds"]

    job = _proc_job(tmp_path / "crash")
    ids = ["server", "client-1", "client-2", "client-3"]
    killed = kill_after(job, ids, "server", f"round {KILL_AFTER}/", wait_s=120)
    for c, last in killed.last_lines().items():
        assert "server" in last, killed.outputs[c][-2000:]  # the last line names the server
    # they stop by themselves within two deadlines (Transport.recv_while_reachable: a silent slice, then a probe)
    # plus a round's work on a loaded machine; never kill_after's 120 s
    assert killed.waited_s < 2 * DEADLINE + 60, f"clients took {killed.waited_s:.0f} s after the kill"

    out = run_job(job, "--resume")
    assert resumed_steps(out) == {KILL_AFTER}, out[-3000:]
    resumed = _model(job.parent / "out")
    assert resumed.keys() == reference.keys()
    for key, v in reference.items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(resumed[key], v), key  # secure aggregation sums are exact
        else:
            assert resumed[key] == v, key
