"""Record-level DP-SGD in a horizontal job (``params.record_dp``): each client's ε after every round equals Opacus's
RDP accountant for the steps it took (computed here), the bundle carries it, the withheld training loss does not
cost a client its place, a resumed client continues its ε, and what DP-SGD cannot cover is refused."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant

from fl_harness import job_dict, partitioned_blobs, run_in_process

from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job

RECORD_DP = {"clip_norm": 1.0, "noise_multiplier": 1.1, "delta": 1e-4, "noise_seed": 3}
BATCH, EPOCHS, ROUNDS = 32, 1, 2


def _job(tmp_path: Path, **change) -> dict:
    shards = partitioned_blobs(tmp_path / "data", "iid", {}, n_clients=3, n_rows=360)
    params = {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 4, "hidden": [8]},
              "rounds": ROUNDS, "learning_rate": 0.1, "batch_size": BATCH, "local_epochs": EPOCHS, "seed": 1,
              "aggregation": {"kind": "secagg", "seed": 3}, "record_dp": dict(RECORD_DP)}
    params.update(change)
    return job_dict(shards, params, tls=True)


def _opacus_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    acc = RDPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta)


def test_each_client_reports_the_epsilon_of_its_own_steps(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    run_in_process(parse_job(copy.deepcopy(_job(tmp_path)), out))
    events = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("@progress ")]
    record_eps = [e["metrics"]["record ε"] for e in events if "record ε" in e.get("metrics", {})]
    assert len(record_eps) == 3 * ROUNDS  # every client, every round: its ε is a curve on the job page
    server = json.loads((out / "out" / "server" / "metrics.json").read_text())
    assert all(len(r["survivors"]) == 3 for r in server["rounds"])  # the withheld (NaN) loss drops nobody
    assert all(r["train_loss"] is None for r in server["rounds"])  # withheld: null in the JSON
    for c in ("client-1", "client-2", "client-3"):
        m = json.loads((out / "out" / c / "metrics.json").read_text())
        q = min(1.0, BATCH / m["n_train"])
        per_round = EPOCHS * math.floor(1 / q)
        for r, rec in enumerate(m["rounds"], 1):
            assert rec["record_epsilon"] == pytest.approx(_opacus_epsilon(1.1, q, r * per_round, 1e-4), abs=1e-6)
            assert rec["record_epsilon"] in record_eps
        bundle = json.loads((out / "out" / c / "model" / "manifest.json").read_text())["extra"]["privacy"]
        assert bundle["mechanism"] == "DP-SGD (Opacus)" and bundle["steps"] == ROUNDS * per_round
        assert bundle["epsilon"] == pytest.approx(m["rounds"][-1]["record_epsilon"], abs=1e-9)


@pytest.mark.parametrize("change,words", [
    ({"strategy": "ifca"}, "params.record_dp: DP-SGD covers"),
    ({"contribution_temperature": 1.0}, "params.record_dp: contribution normalisation"),
    ({"record_dp": {**RECORD_DP, "accountant": "gdp"}}, "record_dp.accountant"),
    ({"record_dp": {"clip_norm": 1.0}}, "noise_multiplier"),
])
def test_what_dp_sgd_cannot_cover_is_refused(tmp_path, change, words):
    doc = _job(tmp_path, **change)
    with pytest.raises((JobConfigError, ValueError), match=words):
        parse_job(doc, tmp_path)


def test_a_resumed_client_continues_its_epsilon():
    """Roles rebuilt from round 1's checkpoints end with the uninterrupted run's steps and ε (the accountant is in
    the client's checkpoint; without it the ε would restart from 0)."""
    from fl_harness import blobs, run_fl
    from lifecycle_helpers import recorder

    from secureflhv.horizontal.models import ModelSpec
    from secureflhv.horizontal.strategies import LocalTrainConfig
    from secureflhv.params.record_privacy import RecordDPParams

    local = LocalTrainConfig(epochs=1, batch_size=16, lr=0.1, dp_sgd=RecordDPParams(**RECORD_DP), dp_sgd_rounds=3)
    spec = ModelSpec(name="mlp", n_features=6, n_classes=3, hidden=(8,))

    def fl(resume=None):
        shards, test = blobs(40, 3, seed=1)
        saved = {p: {} for p in ["server", "c0", "c1", "c2"]}
        _, clients, errors = run_fl(shards, test, spec, "fedavg", "plain_quantised", rounds=3, seed=2, local=local,
                                    callbacks={p: [recorder(s)] for p, s in saved.items()}, resume=resume)
        assert not errors, errors
        return clients, saved

    clients, saved = fl()
    again, _ = fl(resume={p: steps[1] for p, steps in saved.items()})
    for a, b in zip(again, clients):
        assert a.record_privacy["steps"] == b.record_privacy["steps"] > 0
        assert a.record_privacy["epsilon"] == pytest.approx(b.record_privacy["epsilon"], abs=1e-12)
        assert [h["record_epsilon"] for h in a.history] == pytest.approx([h["record_epsilon"] for h in b.history])
