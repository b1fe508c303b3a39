"""benchmarks/dp_accuracy.py --quick (issue 38): client-level DP at central and distributed placement on
Fashion-MNIST, in-process. Checks: the JSON has every cell of the grid and every secagg cost run; each recorded ε
is at most its target (and the no-DP cell has none); the distributed cells ran the ring bits configured and record
the Skellam mechanism; the no-DP model beats chance (1/10) with a margin; the gap table is distributed − central
recomputed here; the Markdown and the plot exist; ``--help`` explains itself. Record-level (``--record``): every
silo's recorded ε is at most its target and equals its own metrics.json's last ``record_epsilon``, z, q and steps
agree with q = batch / n_local and rounds · ⌊1/q⌋, the text says the distributed variant is not implemented, and
``--record-only`` replaces only the record section of a saved report."""
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
    for words in ("central vs distributed", "--quick", "--epsilons", "--bits", "--cost-clients", "--threshold",
                  "bytes per client per round", "--record-only", "--record-epsilons", "--record-placements",
                  "--record-dgd-rounds"):
        assert words in text, words


@pytest.mark.slow  # 20 s alone on 2 cores (8 of them the record-level section and its --record-only merge)
@pytest.mark.skipif(not FMNIST.is_dir(), reason="Fashion-MNIST IDX files (dataset-fashion-mnist) not installed")
def test_quick_run_records_every_cell_honestly(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--record", "--out-dir", str(tmp_path / "out"),
                          "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
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
    check_record_section(doc, md, tmp_path / "work")
    check_record_only_merges(tmp_path, doc)


def check_record_section(doc: dict, md: str, work: Path) -> None:
    rec = doc["record"]
    s, cells = rec["settings"], rec["cells"]
    assert s["epsilons"] == [4.0, math.inf] and s["silos"] == 4 and s["kind"] == "secagg"
    assert sorted(cells) == ["4", "clip", "dgd-4", "dgd-clip", "inf"]
    assert cells["inf"]["epsilon_recorded_max"] is None and cells["inf"]["noise_multiplier"] is None
    # the clip-only reference: DP-SGD with z = 0.01, whose ε is recorded honestly (huge)
    assert cells["clip"]["noise_multiplier"] == [0.01, 0.01] and cells["clip"]["epsilon_recorded_max"] > 1e3
    assert cells["inf"]["accuracy_mean"] > 0.2  # chance is 0.1
    dp = cells["4"]
    silos = dp["silos_first_seed"]
    assert len(silos) == 4 and dp["epsilon_recorded_max"] == max(x["epsilon"] for x in silos.values())
    assert 3.5 < dp["epsilon_recorded_max"] <= 4.0  # calibrated to 0.01 below the target at worst
    for silo, x in silos.items():
        q = s["batch_size"] / x["n_train"]
        assert x["sample_rate"] == pytest.approx(q)
        assert x["steps"] == s["rounds"] * s["local_epochs"] * math.floor(1 / q)
        assert x["noise_multiplier"] > 0.5 and x["delta"] == pytest.approx(1e-5)
        # the silo's own metrics.json, read here independently of the benchmark
        own = json.loads((work / "record" / "seed0-iid-4" / "out" / "record-4-secagg" / silo / "metrics.json")
                         .read_text())
        assert x["epsilon"] == own["rounds"][-1]["record_epsilon"] == x["epsilon_per_round"][-1]
        assert x["epsilon_per_round"][0] < x["epsilon_per_round"][-1]  # ε grows with the rounds
    assert dp["median_round_s"] > 0 and cells["inf"]["median_round_s"] > 0
    # distributed DP-GD: the server's record (per record, at the honest survivors' variance) and each silo's own
    # bound (nominal variance, so the larger); the bound meets the target to the calibration's tolerance
    dgd = cells["dgd-4"]
    server = json.loads((work / "record" / "seed0-iid-4" / "out" / "record-dgd-4-secagg" / "server" / "metrics.json")
                        .read_text())["rounds"]
    assert len(server) == s["dgd_rounds"] == 3 and all(r["privacy"]["unit"] == "record" for r in server)
    assert server[-1]["privacy"]["epsilon"] <= dgd["epsilon_recorded_max"] <= 4.0 + 1e-6
    assert dgd["noise_std"][0] > 0 and dgd["count_std"][0] > 0
    assert cells["dgd-clip"]["epsilon_recorded_max"] > 1e3  # z = 0.01: recorded honestly, huge
    assert "## Record-level DP:" in md and "| 4 | " in md and "| clip only" in md
    assert "**Distributed placement (DP-GD)**" in md
    assert "![record-level accuracy against ε](img/dp_accuracy_record.png)" in md


def check_record_only_merges(tmp_path: Path, doc: dict) -> None:
    """--record-only on a copy: the client-level cells stay as saved, the record section is the new run's."""
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dp_accuracy.json").write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--record-only", str(saved / "dp_accuracy.json"),
                          "--record-epsilons", "inf", "--no-record-clip-only", "--record-rounds", "1",
                          "--work-dir", str(tmp_path / "w2")],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    merged = json.loads((saved / "dp_accuracy.json").read_text())
    assert merged["cells"] == doc["cells"] and merged["cost"] == doc["cost"]
    assert sorted(merged["record"]["cells"]) == ["inf"] and merged["record"]["settings"]["rounds"] == 1
    assert "--record-only" in merged["record"]["command"]
    assert (saved / "img" / "dp_accuracy_record.png").stat().st_size > 5000
