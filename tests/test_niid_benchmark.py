"""benchmarks/niid_accuracy.py: cells over seeds summarise to mean ± std, and the committed JSON still
renders the committed table (``--report-only``) after the grid gained seeds, remedies and worst parties."""
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import niid_accuracy as nb  # noqa: E402


def test_summarise_means_and_stds_over_seeds():
    cells = [{"seed": 0, "accuracy": 0.5, "worst_client": 0.2, "seconds": 2.0, "n_clipped": 1, "sizes": [3, 4]},
             {"seed": 1, "accuracy": 0.7, "worst_client": 0.4, "seconds": 4.0, "n_clipped": 2, "sizes": [4, 3],
              "dropped": ["party-1"]},
             {"seed": 2, "accuracy": float("nan"), "worst_client": float("nan"), "seconds": 1.0,
              "error": "diverged", "sizes": [2, 5]}]
    s = nb.summarise(cells)
    assert math.isclose(s["accuracy"], 0.6) and math.isclose(s["accuracy_std"], 0.1)
    assert math.isclose(s["worst_client"], 0.3) and math.isclose(s["worst_client_std"], 0.1)
    assert s["n_clipped"] == 3 and s["dropped"] == ["party-1"] and s["seeds"] == [0, 1, 2]
    assert s["error"] == "diverged" and s["sizes"] == [3, 4]
    assert nb._pm(s, "accuracy_std") == " ± 10.0" and nb._pm({"accuracy_std": 0.1, "seeds": [0]}, "accuracy_std") == ""


def test_committed_json_renders_the_committed_tables(tmp_path):
    saved = json.loads((ROOT / "docs" / "niid_accuracy.json").read_text())
    nb.main(["--report-only", str(ROOT / "docs" / "niid_accuracy.json"), "--out-dir", str(tmp_path)])
    rendered = (tmp_path / "niid_accuracy.md").read_text().split("![accuracy")[0]
    committed = (ROOT / "docs" / "niid_accuracy.md").read_text()
    assert rendered in committed and rendered.count("| partition |") >= 2 * len(saved["grids"])
    for grid in saved["grids"].values():
        assert grid["results"] and all(f"| {p} " in rendered for p in [*grid["results"], *grid["na"]])


def test_settings_match_across_seeds_but_not_across_configs():
    """One process per seed shares finished runs (settings equal but for the seeds); another config does not."""
    a = {"rows": 1500, "rounds": 4, "seeds": [0]}
    assert nb._same_settings(dict(a, seeds=[1, 2]), a)
    assert not nb._same_settings(dict(a, rounds=5), a) and not nb._same_settings(None, a)


def test_multiconfederated_cell_on_tiny_data(tmp_path):
    """MC joins the grid: its peers run in-process on the partition, the cell's accuracy is the mean of the
    peers' personal models on the common test rows, its worst party is finite, and a row where the other
    strategies did not run renders them as "not run"."""
    args = ["--quick", "--grids", "tabular", "--partitions", "#C=2", "--parties", "3", "--tabular-rows", "240",
            "--test-rows", "60", "--out-dir", str(tmp_path)]
    assert nb.main([*args, "--strategies", "multiconfederated"]) == 0
    cells = [json.loads(line) for line in (tmp_path / "niid_accuracy.cells.jsonl").read_text().splitlines()]
    (mc,) = [c for c in cells if c.get("strategy") == "MC"]
    assert len(mc["personal_accuracy"]) == 3 and "error" not in mc
    assert math.isclose(mc["accuracy"], sum(mc["personal_accuracy"]) / 3)
    assert 0.0 <= mc["worst_client"] <= 1.0 and mc["n_clipped"] == 0
    assert nb.main([*args, "--render-only"]) == 0  # every strategy: only MC has a run in this row
    md = (tmp_path / "niid_accuracy.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| #C=2 | digits |"))
    assert row.count("not run") == len(nb.STRATEGIES) - 1 and f"{mc['accuracy'] * 100:.1f}" in row
    assert "no secure\naggregation" in md
