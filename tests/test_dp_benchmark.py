"""benchmarks/dp_accuracy.py --quick (issue 38): client-level DP at central and distributed placement on
Fashion-MNIST, in-process. Checks: the JSON has every cell of the grid and every secagg cost run; each recorded ε
is at most its target (and the no-DP cell has none); the distributed cells ran the ring bits configured and record
the Skellam mechanism; the no-DP model beats chance (1/10) with a margin; the gap table is distributed − central
recomputed here; the Markdown and the plot exist; ``--help`` explains itself."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "dp_accuracy.py"
FMNIST = Path(os.environ.get("SECUREFLHV_FMNIST_DIR") or "/usr/share/datasets/fashion-mnist")


def test_help_explains_the_benchmark():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for words in ("central vs distributed", "--quick", "--epsilons", "--bits", "--cost-clients", "--threshold", "bytes per client per round"):
        assert words in text, words


@pytest.mark.slow  # 12 s alone on 2 cores, 33 s beside another job
@pytest.mark.skipif(not FMNIST.is_dir(), reason="Fashion-MNIST IDX files (dataset-fashion-mnist) not installed")
def test_quick_run_records_every_cell_honestly(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out-dir", str(tmp_path / "out"),
                          "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "dp_accuracy.json").read_text())
    s, cells = doc["settings"], doc["cells"]
    assert s["quick"] and s["epsilons"] == [4.0, math.inf] and s["bits"] == [16] and s["clients"] == 10
    assert sorted(cells) == sorted(["none|inf|-", "central|4|-", "distributed|4|16"])
    assert sorted(doc["cost"]) == sorted(["none|inf|-", "central|4|-", "distributed|4|16"])
    assert cells["none|inf|-"]["privacy"] == {}  # no DP: no record
    assert cells["none|inf|-"]["accuracy_mean"] > 0.3  # chance is 0.1
    for key in ("central|4|-", "distributed|4|16"):
        for where in (cells[key], doc["cost"][key]):
            p = where["privacy"]
            assert p["epsilon"] <= 4.0 + 1e-9 and p["delta"] == pytest.approx(1e-5)
            assert p["placement"] == key.split("|")[0]
        assert 0.0 <= cells[key]["accuracy_mean"] <= 1.0 and cells[key]["rounds_run"] == s["rounds"]
    dist = cells["distributed|4|16"]
    assert dist["privacy"]["bits"] == 16 and dist["k_bits"] == 16 and dist["privacy"]["mechanism"] == "skellam"
    # the Hadamard padding: 7,850 coordinates travel as 8,192 of 16 bits
    assert dist["privacy"]["bits_per_coordinate"] == pytest.approx(16 * 8192 / 7850)
    assert doc["cost"]["distributed|4|16"]["k_bits"] == 16
    assert doc["gaps"]["distributed|4|16"] == pytest.approx(
        100 * (dist["accuracy_mean"] - cells["central|4|-"]["accuracy_mean"]))
    for c in doc["cost"].values():
        assert c["median_round_s"] > 0 and c["bytes_per_client_per_round"] > 1e4  # 7,850 coordinates at least
    md = (tmp_path / "out" / "dp_accuracy.md").read_text()
    assert "![accuracy against ε](img/dp_accuracy.png)" in md and "--quick" in md and "| distributed | 16 |" in md
    assert (tmp_path / "out" / "img" / "dp_accuracy.png").stat().st_size > 5000
