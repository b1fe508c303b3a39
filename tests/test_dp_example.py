"""examples/dp_horizontal.py --quick end to end (issue 38): FedAvg with distributed Skellam noise inside secure
aggregation, as real party processes over gRPC with mutual TLS.

Checks: the script prints the final ε and δ beside the accuracy and the bundle's path; the server's bundle verifies
against the job's CA and its manifest's privacy record is the last round's record of metrics.json, at most the
target ε, for the Skellam mechanism in the ring of bits asked for; the accuracy the script reports equals the saved
global model scored here with numpy on the held-out rows it wrote, and beats chance."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "dp_horizontal.py"


def _run(work: Path, *extra: str):
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--work-dir", str(work), "--timeout", "240", *extra],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run, json.loads((work / "summary.json").read_text())


def _saved_model_accuracy(work: Path) -> float:
    """The accuracy of the server's saved global model on the held-out rows the script wrote, with numpy:
    softmax regression's logits x W^T + b."""
    with np.load(work / "out" / "server" / "global_model.npz") as g, np.load(work / "test_rows.npz") as t:
        w = next(g[k] for k in g.files if g[k].ndim == 2)
        b = next(g[k] for k in g.files if g[k].ndim == 1)
        return float(np.mean(np.argmax(t["X"] @ w.T + b, axis=1) == t["y"]))


def test_dp_horizontal_quick(tmp_path):
    work = tmp_path / "dp"
    run, summary = _run(work)
    priv = summary["privacy"]
    assert priv["placement"] == "distributed" and priv["mechanism"] == "skellam" and priv["bits"] == 16
    assert priv["epsilon"] <= summary["target_epsilon"] + 1e-9 and priv["delta"] == pytest.approx(1e-5)
    assert priv["rounds"] == summary["rounds"] == 2
    assert f"ε = {priv['epsilon']:.3f}, δ = 1e-05" in run.stdout
    assert f"test accuracy {summary['accuracy']:.4f}" in run.stdout
    assert str(work / "out" / "server" / "model") in run.stdout

    from secureflhv.runtime.store.model_bundle import read_bundle

    bundle = read_bundle(work / "out" / "server", ca=work / "certs" / "ca.pem", expect_party="server")
    assert bundle.manifest["extra"]["privacy"] == priv
    rounds = json.loads((work / "out" / "server" / "metrics.json").read_text())["rounds"]
    assert len(rounds) == 2 and all(r["aggregation"]["model"]["k_bits"] == 16 for r in rounds)
    assert priv["epsilon"] == pytest.approx(rounds[-1]["privacy"]["epsilon"], abs=1e-9)
    assert summary["client_privacy"]["epsilon"] >= priv["epsilon"] - 1e-9  # a client counts at least as much

    # the reported accuracy, recomputed from the saved global model
    acc = _saved_model_accuracy(work)
    assert acc == pytest.approx(summary["accuracy"], abs=1e-9)
    assert acc > 0.5  # breast cancer: two classes, chance is 1/2


def test_dp_horizontal_record_level_quick(tmp_path):
    """--level record: distributed DP-GD over processes; every round's ε is per record, the noised record count
    is near the real one, and the model learns (two DP-GD steps at lr 2 on standardised breast cancer)."""
    work = tmp_path / "dp"
    run, summary = _run(work, "--level", "record")
    priv = summary["privacy"]
    assert priv["unit"] == "record" and priv["level"] == "record" and priv["bits"] == 32
    assert priv["epsilon"] <= summary["target_epsilon"] + 1e-9 and priv["rounds"] == 2
    assert "one record protected" in run.stdout
    rounds = json.loads((work / "out" / "server" / "metrics.json").read_text())["rounds"]
    n_train = sum(json.loads((work / "out" / f"client-{i}" / "metrics.json").read_text())["n_train"]
                  for i in range(1, 6))
    for r in rounds:
        assert r["aggregation"]["model"]["k_bits"] == 32
        assert abs(r["privacy"]["records_noised"] - n_train) < 10 * r["privacy"]["count_std"] * 2
    acc = _saved_model_accuracy(work)
    assert acc == pytest.approx(summary["accuracy"], abs=1e-9) and acc > 0.8
