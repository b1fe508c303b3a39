"""examples/bring_your_own_model.py end to end, ``--quick`` (issue 37): a consortium's ResNet-8 with batch norm
(``models:resnet8``), each hospital's own PNG folder through a dataset factory, FedAvg and FedBN as real party
processes over gRPC with mutual TLS and secure aggregation, a centralised twin, and ``secureflhv.simulate``.

Checks: the run prints its table and writes ``results.json`` with every figure; each accuracy beats chance (1/10)
with a margin; the hospitals' folders hold the label split the results report; the jobs name the consortium's
factory with FedAvg's and FedBN's ``buffers``; the FedAvg accuracy the example reports equals the accuracy of the
server's saved ``global_model.npz`` loaded here into the consortium's plain-torch ResNet-8 and scored on the test
PNGs read here with Pillow; the simulation's global model equals the processes' bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "bring_your_own_model.py"
BYOM = ROOT / "examples" / "byom"
FMNIST = Path(os.environ.get("SECUREFLHV_FMNIST_DIR") or "/usr/share/datasets/fashion-mnist")
CLASSES = ["t-shirt-top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]


def _test_images(root: Path) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    xs, ys = [], []
    for label, name in enumerate(CLASSES):
        for f in sorted((root / name).glob("*.png")):
            xs.append(np.asarray(Image.open(f).convert("L"), dtype=np.float32) / 255)
            ys.append(label)
    return np.stack(xs)[:, None], np.array(ys)


def _global_model_accuracy(npz: Path, X: np.ndarray, y: np.ndarray) -> float:
    import torch

    sys.path.insert(0, str(BYOM))
    try:
        import models
    finally:
        sys.path.remove(str(BYOM))
    net = models.resnet8(10, 1)
    with np.load(npz) as z:
        net.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files}, strict=True)
    net.train(False)
    with torch.no_grad():
        return float((net(torch.from_numpy(X)).argmax(1).numpy() == y).mean())


@pytest.mark.skipif(not FMNIST.is_dir(), reason="Fashion-MNIST IDX files (dataset-fashion-mnist) not installed")
def test_bring_your_own_model_quick(tmp_path):
    work = tmp_path / "byom"
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--work-dir", str(work), "--timeout", "240"],
                         capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = json.loads((work / "results.json").read_text())

    # every figure is there, printed as it is stored, and beats chance
    for name in ("centralised", "fedavg", "fedbn"):
        assert f"{res[name]['accuracy']:8.4f}" in run.stdout, name
        assert res[name]["accuracy"] > 0.2 > res["chance"], (name, res[name])
        assert res[name]["seconds"] > 0
    assert res["fedavg"]["rounds"] == res["fedbn"]["rounds"] == res["rounds"] == 3
    assert res["centralised"]["epochs"] == res["rounds"] * res["local_epochs"]
    per_hospital = res["fedbn"]["client_accuracy"]
    assert sorted(per_hospital) == ["hospital-01", "hospital-02", "hospital-03"]
    assert res["fedbn"]["accuracy"] == pytest.approx(np.mean(list(per_hospital.values())))
    assert all(a > res["chance"] for a in per_hospital.values()), per_hospital

    # each hospital's own folder holds the label counts reported, the split covers every training row once
    for hid, h in res["hospitals"].items():
        counts = [len(list((work / "clients" / hid / c).glob("*.png"))) for c in CLASSES]
        assert counts == h["labels"] and sum(counts) == h["rows"], hid
    assert sum(h["rows"] for h in res["hospitals"].values()) == res["rows"] == 1200
    assert any(0 in h["labels"] for h in res["hospitals"].values())  # Dir(0.3): some hospital lacks a class

    # the jobs: the consortium's factory, FedAvg aggregates the batch-norm statistics, FedBN keeps them local
    for name, buffers in (("fedavg", "aggregate"), ("fedbn", "local")):
        doc = yaml.safe_load((work / name / "job.yaml").read_text())
        model = doc["params"]["model"]
        assert model["factory"] == "models:resnet8" and model["n_classes"] == 10 and model["buffers"] == buffers
        assert Path(model["path"]) == BYOM and doc["params"]["aggregation"]["kind"] == "secagg"
        assert doc["security"]["ca"] == "certs/ca.pem" and len(doc["parties"]) == 4

    # the reported FedAvg accuracy is the saved global model's, scored here independently
    X, y = _test_images(work / "fmnist" / "test")
    assert len(y) == res["test_rows"] == 500
    npz = work / "fedavg" / "out" / "server" / "global_model.npz"
    assert _global_model_accuracy(npz, X, y) == pytest.approx(res["fedavg"]["accuracy"], abs=1e-12)

    import secureflhv

    if hasattr(secureflhv, "simulate"):
        assert res["simulate"]["equal"] is True and res["simulate"]["tensors"] > 40, res["simulate"]
        assert "bit for bit: True" in run.stdout
