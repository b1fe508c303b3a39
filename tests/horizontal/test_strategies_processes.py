"""Every horizontal strategy over real processes: a server and 3 clients as ``secureflhv run`` processes over
gRPC + mutual TLS with secure aggregation end, bit for bit, where the same job ends in one process (threads)
with plaintext aggregation of the same quantised updates (``plain_quantised``, same ``aggregation.seed``),
after 2 rounds: every party's checkpointed state (the global model; SCAFFOLD's c and each c_i, IFCA's cluster
models, FedPer's personal heads), each round's record and every client's metrics (contribution
normalisation's factors Λ_r among them). Each job's clients hold a library partition of secureflhv.data
(label, quantity and feature skew across the module). FedProx over processes: test_fl_job.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fl_harness import compare_with_in_process, partitioned_blobs, write_grpc_job
from resume_harness import run_job  # tests/ is on the path through fl_harness

PARTIES = ["server", "client-1", "client-2", "client-3"]
MODEL = {"name": "mlp", "n_features": 6, "n_classes": 4, "hidden": [12, 8]}
BASE = {"model": MODEL, "rounds": 2, "local_epochs": 1, "batch_size": 16, "learning_rate": 0.1, "momentum": 0.5,
        "seed": 5, "test_fraction": 0.25,
        "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 20, "seed": 11}}
CASES = [  # (id, (partition scheme, its parameters), the job's strategy params)
    ("fedavg", ("label_quantity", {"k": 2}), {"strategy": "fedavg"}),
    ("scaffold", ("quantity_dirichlet", {"beta": 1.0}), {"strategy": "scaffold"}),
    ("fednova+contribution", ("feature_noise", {"sigma": 0.5}),
     {"strategy": "fednova", "contribution_temperature": 0.5}),
    ("ifca", ("label_dirichlet", {"beta": 0.3}), {"strategy": "ifca", "clusters": 2}),
    ("fedper", ("label_dirichlet+feature_noise", {"beta": 0.5, "sigma": 0.5}),
     {"strategy": "fedper", "personal_layers": 1}),
]


def _strategy_state(case: str, states: dict, out) -> None:
    """What each strategy keeps beyond the global model is there and not trivial (so its equality means
    something)."""
    server, clients = states["server"][0], [states[c][0] for c in PARTIES[1:]]
    if case == "scaffold":
        assert np.abs(server["strategy.c_global"]).max() > 0
        assert all(np.abs(c["strategy.c_local"]).max() > 0 for c in clients)
    if case == "ifca":
        assert not np.array_equal(server["strategy.cluster0"], server["strategy.cluster1"])
    if case == "fedper":
        heads = [c["strategy.head"] for c in clients]
        assert not np.array_equal(heads[0], heads[1]) and not np.array_equal(heads[1], heads[2])
    if "contribution" in case:  # each client's Λ_r; they sum to 1 over the round's clients and differ
        factors = np.array([[r["contribution_factor"] for r in json.loads((out / c / "metrics.json").read_text())
                             ["rounds"]] for c in PARTIES[1:]])
        np.testing.assert_allclose(factors.sum(0), 1.0, atol=1e-9)
        assert np.ptp(factors[:, 0]) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("case, scheme, params", [pytest.param(c, s, p, id=f"{c}-{s[0]}") for c, s, p in CASES])
def test_secagg_over_processes_equals_plain_quantised_in_process(tmp_path, case, scheme, params):
    paths = partitioned_blobs(tmp_path / "data", *scheme, n_clients=3)
    job, path = write_grpc_job(tmp_path / "processes", paths, {**BASE, **params})
    out = run_job(path, timeout_s=240)
    assert "aggregation secagg" in out and "(secagg): 3 survivors" in out and "round 2/2" in out
    states = compare_with_in_process(job, tmp_path / "processes", tmp_path / "threads", PARTIES)
    _strategy_state(case, states, tmp_path / "processes" / "out")
    metrics = json.loads((tmp_path / "processes" / "out" / "server" / "metrics.json").read_text())
    assert [len(r["survivors"]) for r in metrics["rounds"]] == [3, 3] and not any(r["refused"] for r in metrics["rounds"])
    assert not np.array_equal(states["server"][0]["global"], _initial(job))  # the model moved


def _initial(job: dict) -> np.ndarray:
    """The server's initial global model (seeded by params.seed)."""
    from secureflhv.horizontal.models import ModelSpec, build_model, get_flat

    return get_flat(build_model(ModelSpec(**job["params"]["model"]), seed=job["params"]["seed"]))
