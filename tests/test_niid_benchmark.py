"""benchmarks/niid_accuracy.py: cells over seeds summarise to mean ± std, and the committed JSON still
renders the committed table (``--report-only``) after the grid gained seeds, remedies and worst parties; every
partition scheme of the library has a row (or a stated reason); the natural-id and year rows run on penguins."""
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import niid_accuracy as nb  # noqa: E402

import pytest  # noqa: E402

from secureflhv.data import available_schemes  # noqa: E402


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


def test_every_scheme_of_the_library_has_a_row_or_a_reason(monkeypatch):
    covered, na = nb.scheme_coverage()
    assert set(covered) | set(na) == set(available_schemes()) and not set(covered) & set(na)
    assert na == {} and covered["label_dirichlet+feature_noise"] == ["mixed Dir(0.5)+noise"]
    assert covered["feature_natural"] == ["natural ids"] and "temporal (year)" in covered["temporal"]
    # a scheme dropped from the grid without a reason is refused; with one, it is reported n/a
    monkeypatch.setattr(nb, "PARTITIONS", [p for p in nb.PARTITIONS if p[1] != "label_dirichlet+feature_noise"])
    with pytest.raises(ValueError, match=r"label_dirichlet\+feature_noise"):
        nb.scheme_coverage()
    monkeypatch.setattr(nb, "SCHEMES_NA", {"label_dirichlet+feature_noise": "some reason"})
    assert nb.scheme_coverage()[1] == {"label_dirichlet+feature_noise": "some reason"}


def test_natural_id_and_year_rows_split_the_penguins_by_island_and_year(tmp_path):
    """The tabular grid's natural-id row runs on Palmer Penguins with one party per island, its year row with
    one party per study year (3 parties each, not --parties); Fashion-MNIST reports both n/a with the reason."""
    import numpy as np

    args = ["--quick", "--grids", "fmnist,tabular", "--partitions", "natural ids,temporal (year)", "--parties", "5",
            "--strategies", "fedavg", "--out-dir", str(tmp_path)]
    assert nb.main(args) == 0
    cells = {c["partition"]: c for c in map(json.loads, (tmp_path / "niid_accuracy.cells.jsonl").read_text()
                                           .splitlines()) if not c.get("baseline")}
    assert {c["data"] for c in cells.values()} == {"penguins"} and "error" not in cells["natural ids"]
    train, _ = nb.load_grid_data("penguins", 3000, 1000, 0)
    _, per_island = np.unique(train.groups, return_counts=True)
    _, per_year = np.unique(train.times, return_counts=True)
    assert sorted(cells["natural ids"]["sizes"]) == sorted(per_island.tolist())
    assert len(cells["temporal (year)"]["sizes"]) == 3 and sum(cells["temporal (year)"]["sizes"]) == sum(per_year)
    assert np.isfinite(cells["natural ids"]["accuracy"]) and np.isfinite(cells["temporal (year)"]["accuracy"])
    md = (tmp_path / "niid_accuracy.md").read_text()
    assert "| natural ids | penguins (3 parties) |" in md and "| temporal (year) | penguins (3 parties) |" in md
    assert "| natural ids | – | n/a |" in md and "Fashion-MNIST has no natural id" in md
    # a planned row without any finished run is listed as "not run", not dropped from the table
    assert nb.main([*args[:4], "natural ids,temporal (year),iid", *args[5:], "--render-only"]) == 0
    md = (tmp_path / "niid_accuracy.md").read_text()
    assert "| iid | digits | not run |" in md and "| natural ids | penguins (3 parties) |" in md


def test_wall_time_is_the_union_of_the_runs_not_the_span_of_resumed_sessions():
    runs = [{"at": 10.0, "seconds": 5.0}, {"at": 12.0, "seconds": 4.0}, {"at": 100.0, "seconds": 10.0}]
    assert nb.busy_seconds(runs) == 17.0 and math.isnan(nb.busy_seconds([]))
