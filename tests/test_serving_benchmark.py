"""benchmarks/serving.py: the record's rows (one per family, the goal and its reason, the baselines), the
percentiles, and (slow) a tiny --quick run of vertical LR through real `secureflhv serve` processes whose served
scores equal the batch job's and the plaintext floor's, recording nothing."""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import serving as sv  # noqa: E402


def fake_result(s: "sv.Settings", family: str, p99_1: float) -> "sv.FamilyResult":
    pct = lambda p50, p99: {"n": 300, "p50": p50, "p95": (p50 + p99) / 2, "p99": p99, "max": p99,  # noqa: E731
                            "mean": p50, "guest_p50": p50 - 1}
    sat = lambda rps, size: {"threads": 8, "seconds": 10.0, "requests": int(rps * 10), "rps": rps,  # noqa: E731
                             "ids_per_s": rps * size, "errors": 0, "elapsed": 10.0}
    return sv.FamilyResult(
        family, s.model(family), train_s=10.0,
        batch={"rows": 2000, "seconds": 20.0, "per_row_ms": 10.0, "small_rows": 64, "small_s": 12.0,
               "marginal_ms": 4.13},
        latency={1: pct(20.0, p99_1), 64: pct(180.0, 210.0)}, saturation={1: sat(110.0, 1), 64: sat(5.0, 64)},
        floor={1: {**pct(0.2, 0.3), "guest_p50": 0.0}, 64: {**pct(0.25, 0.4), "guest_p50": 0.0}},
        served_vs_batch=0.0, served_vs_floor=1e-13, ids_checked=1800)


def test_record_writes_one_row_per_family_with_the_goal_and_the_baselines(tmp_path):
    s = sv.settings(argparse.Namespace(
        quick=False, rows=None, key_bits=None, sb_trees=None, sb_depth=None, sb_he_scheme="ou", requests=None,
        window=None, threads=8, only=None, seed=0))
    assert (s.rows, s.key_bits, s.sb_trees, s.sb_depth, s.threads) == (2000, 2048, 100, 5, 8)
    results = [fake_result(s, "lr", 31.0), fake_result(s, "secureboost", 74.0), fake_result(s, "split_nn", 75.0)]
    results[1].batch.update(small_s=21.0, marginal_ms=-0.5)  # the 64-row job took longer: noise
    sv.record(results, s, (0.8, 2.9), {"p50": 3.9, "p99": 10.0}, tmp_path)
    rows = json.loads((tmp_path / "benchmarks.json").read_text())["rows"]
    assert set(rows) == {"serving_lr", "serving_secureboost", "serving_split_nn"}
    lr, sb = rows["serving_lr"], rows["serving_secureboost"]
    assert "2048-bit Paillier" in lr["what"] and "+ server" in lr["what"] and "`serving.py`" in lr["what"]
    assert "1 id 20.0 / 25.5 / 31.0 ms" in lr["ours"] and "goal 1-id p99 <= 50 ms: met" in lr["ours"]
    assert "110 requests/s of 1 id" in lr["ours"] and "320 ids/s" in lr["ours"] and "exactly" in lr["ours"]
    assert "NOT met (the trees are routed level by level: per request the guest sends 14 messages" in sb["ours"]
    assert "3.9 ms" in sb["ours"]
    assert "10.00 ms/row" in lr["baseline"] and "over 64 rows 12.0 s, so marginal 4.13 ms/row" in lr["baseline"]
    assert "the marginal cost is below the run-to-run noise" in sb["baseline"]
    assert "plaintext floor" in lr["baseline"] and "torch" in rows["serving_split_nn"]["baseline"]
    assert "100× the floor" in lr["ratio"] and "3.6× less than the batch job's wall per row" in lr["ratio"]
    assert "serving_lr" in (tmp_path / "benchmarks.md").read_text()


def test_percentiles_in_milliseconds():
    p = sv.percentiles([0.001 * k for k in range(1, 101)])
    assert p["n"] == 100 and p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01)
    assert p["max"] == pytest.approx(100.0)


def test_help_names_the_modes(capsys):
    with pytest.raises(SystemExit) as exc:
        sv.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "INSECURE" in out and "--only" in out


@pytest.mark.slow
def test_quick_lr_run_serves_the_batch_jobs_scores_and_records_nothing(tmp_path, capsys):
    docs = ROOT / "docs" / "benchmarks.json"
    before = docs.read_text() if docs.exists() else None
    res = sv.main(["--quick", "--only", "lr", "--rows", "200", "--requests", "8", "--window", "0.5",
                   "--threads", "2", "--keep", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert (docs.read_text() if docs.exists() else None) == before  # --quick records nothing
    s, (r,) = res["settings"], res["results"]
    assert s.quick and s.key_bits == 1024 and r.family == "lr" and "INSECURE" in r.model
    assert r.served_vs_batch == 0.0 and r.served_vs_floor < 1e-9 and r.ids_checked > 8
    for size in sv.SIZES:
        assert r.latency[size]["n"] == 8 and 0 < r.latency[size]["p50"] <= r.latency[size]["p99"]
        assert r.saturation[size]["requests"] > 0 and r.saturation[size]["errors"] == 0
        assert 0 < r.floor[size]["p50"] < r.latency[size]["p50"]
    assert r.batch["rows"] == 200 and r.batch["per_row_ms"] > 0 and "marginal_ms" not in r.batch
    assert res["rtt"]["p50"] > 0 and np.isfinite(r.latency[1]["guest_p50"])
    assert "[quick: INSECURE 1024-bit test keys]" in out and "goal: 1-id p99 <= 50 ms" in out
