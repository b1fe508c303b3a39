"""Client-level DP of FedAvg with central noise (issue 38, first slice): clipping at the client, the server's check
of the clipped sum, the seeded noise leaving secure aggregation exact, ε per round equal to dp-accounting's
Gaussian composition built here, the budget stop, calibration to a target ε, and the bundle's record."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fl_harness import job_dict, partitioned_blobs, run_in_process

from secureflhv.horizontal.dp_fedavg import CentralDP
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job

DP = {"clip_norm": 0.5, "noise_multiplier": 1.2, "delta": 1e-3, "noise_seed": 7}


def _job(tmp_path: Path, kind="secagg", rounds=3, **dp) -> dict:
    shards = partitioned_blobs(tmp_path / "data", "iid", {}, n_clients=4, n_rows=320)
    return job_dict(shards, {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 4,
                                                             "hidden": [8]},
                             "rounds": rounds, "learning_rate": 0.1, "seed": 1,
                             "aggregation": {"kind": kind, "clip": 1.0, "seed": 3}, "dp": {**DP, **dp}}, tls=True)


def _run(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run_in_process(parse_job(copy.deepcopy(doc), out))
    return out / "out"


def _gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    acc = RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), rounds))
    return acc.get_epsilon(delta)


def test_clipping_at_the_client_bounds_the_l2_norm():
    dp = CentralDP(clip_norm=0.5, noise_multiplier=1.0)
    big = np.full(100, 1.0)
    assert np.linalg.norm(dp.clip(big)) == pytest.approx(0.5, rel=1e-12)
    small = np.full(4, 0.1)
    assert np.array_equal(dp.clip(small), small)


def test_the_server_refuses_a_sum_that_was_not_clipped():
    dp = CentralDP(clip_norm=0.5, noise_multiplier=1.0)
    ok = np.full(16, 0.5 / 4) * 3           # three clients at the clip, aligned
    assert dp.sum_refusal(ok, 3, 1e-6) == ""
    assert "did not clip" in dp.sum_refusal(ok * 1.5, 3, 1e-6)


def test_secagg_with_seeded_noise_equals_plain_quantised_and_epsilon_is_dp_accountings(tmp_path):
    """With the noise seeded, secure aggregation ends where plaintext aggregation of the same quantised, clipped
    updates ends (the noise is added to the same sum); each round's ε is the RDP composition of that many Gaussian
    mechanisms with z = 1.2, computed here with dp-accounting; the bundle records the final (ε, δ)."""
    doc = _job(tmp_path / "a")
    secure = _run(doc, tmp_path / "a")
    doc["params"]["aggregation"]["kind"] = "plain_quantised"
    plain = _run(doc, tmp_path / "b")
    with np.load(secure / "server" / "global_model.npz") as a, np.load(plain / "server" / "global_model.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    rounds = json.loads((secure / "server" / "metrics.json").read_text())["rounds"]
    for r, rec in enumerate(rounds, 1):
        assert rec["privacy"]["epsilon"] == pytest.approx(_gaussian_epsilon(1.2, r, 1e-3), abs=1e-6)
        assert rec["privacy"]["unit"] == "client" and rec["privacy"]["rounds"] == r
    manifest = json.loads((secure / "server" / "model" / "manifest.json").read_text())
    assert manifest["extra"]["privacy"]["epsilon"] == pytest.approx(_gaussian_epsilon(1.2, 3, 1e-3), abs=1e-6)
    client = json.loads((secure / "client-1" / "model" / "manifest.json").read_text())
    assert client["extra"]["privacy"]["epsilon"] >= manifest["extra"]["privacy"]["epsilon"] - 1e-9


def test_the_noise_changes_the_model_and_a_different_seed_another_way(tmp_path):
    base = _run(_job(tmp_path / "a", kind="plain"), tmp_path / "a")
    other = _run(_job(tmp_path / "b", kind="plain", noise_seed=8), tmp_path / "b")
    with np.load(base / "server" / "global_model.npz") as a, np.load(other / "server" / "global_model.npz") as b:
        assert any(not np.array_equal(a[k], b[k]) for k in a.files)


def test_the_job_stops_before_it_would_exceed_the_budget(tmp_path):
    """A budget between ε(2 rounds) and ε(3 rounds): the server releases exactly two rounds of five and stops."""
    budget = (_gaussian_epsilon(1.2, 2, 1e-3) + _gaussian_epsilon(1.2, 3, 1e-3)) / 2
    out = _run(_job(tmp_path, kind="plain", rounds=5, epsilon_budget=budget), tmp_path)
    rounds = json.loads((out / "server" / "metrics.json").read_text())["rounds"]
    assert len(rounds) == 2 and rounds[-1]["privacy"]["epsilon"] <= budget


def test_a_target_epsilon_is_met_by_the_calibrated_noise(tmp_path):
    out = _run(_job(tmp_path, kind="plain", noise_multiplier=None, target_epsilon=3.0), tmp_path)
    final = json.loads((out / "server" / "metrics.json").read_text())["rounds"][-1]["privacy"]
    assert final["epsilon"] <= 3.0 and final["epsilon"] == pytest.approx(3.0, abs=0.01)
    assert final["epsilon"] == pytest.approx(_gaussian_epsilon(final["noise_multiplier"], 3, 1e-3), abs=1e-6)


@pytest.mark.parametrize("change,words", [
    ({"strategy": "scaffold"}, "params.dp: client-level DP clips and noises the model delta"),
    ({"contribution_temperature": 1.0}, "params.dp: contribution normalisation"),
    ({"dp": {"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 0.3}}, "params.dp.delta"),
    ({"dp": {"clip_norm": 1.0}}, "noise_multiplier / target_epsilon"),
])
def test_what_client_level_dp_cannot_take_is_refused(tmp_path, change, words):
    doc = _job(tmp_path)
    doc["params"].update(change)
    with pytest.raises(JobConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_job(doc, tmp_path)
