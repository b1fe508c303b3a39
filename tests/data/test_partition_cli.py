"""The ``partition`` sub-command, driven through its own parser."""
import json

import numpy as np

from secureflhv.data import load_sklearn, load_table
from secureflhv.data.partition.command import build_parser, main


def test_help_lists_schemes():
    text = build_parser().format_help()
    for word in ("label_dirichlet", "feature_synthetic", "--beta", "--niid-bench-compat", "--vertical"):
        assert word in text


def test_horizontal_shards_roundtrip(tmp_path, capsys):
    rc = main(["--dataset", "wine", "--scheme", "label_dirichlet", "--beta", "0.5", "--parties", "3",
               "--min-size", "5", "--out", str(tmp_path), "--seed", "7"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "EMD" in out and "wrote 3 shards" in out
    manifest = json.loads((tmp_path / "partition.json").read_text())
    assert manifest["scheme"] == "label_dirichlet" and manifest["params"] == {"beta": 0.5, "min_size": 5}
    wine = load_sklearn("wine")
    rows = []
    for f in manifest["files"]:
        shard = load_table(tmp_path / f, label_column="y")
        z = np.load(tmp_path / f)
        np.testing.assert_array_equal(shard.X, wine.X[z["row_index"]])
        np.testing.assert_array_equal(shard.y, wine.y[z["row_index"]])
        rows.append(z["row_index"])
    assert sorted(np.concatenate(rows).tolist()) == list(range(len(wine)))
    assert (tmp_path / "label_distribution.png").stat().st_size > 0
    assert json.loads((tmp_path / "stats.json").read_text())["sizes"] == manifest["sizes"]


def test_csv_shards_with_noise(tmp_path):
    rc = main(["--dataset", "breast_cancer", "--scheme", "feature_noise", "--sigma", "1.0", "--parties", "3",
               "--out", str(tmp_path), "--format", "csv", "--no-plot"])
    assert rc == 0
    bc = load_sklearn("breast_cancer")
    s0 = load_table(tmp_path / "party_00.csv", label_column="y", id_column="id")
    s2 = load_table(tmp_path / "party_02.csv", label_column="y", id_column="id")
    np.testing.assert_array_equal(s0.X, bc.X[s0.ids.astype(int)])  # party 0: no noise
    assert np.abs(s2.X - bc.X[s2.ids.astype(int)]).std() > 0.5  # party 2: std 1.0 noise


def test_vertical_mode(tmp_path):
    rc = main(["--dataset", "breast_cancer", "--vertical", "random", "--hosts", "2", "--sample-overlap", "0.5",
               "--out", str(tmp_path)])
    assert rc == 0
    guest = load_table(tmp_path / "guest.csv", id_column="id", label_column="y")
    host = load_table(tmp_path / "host_1.csv", id_column="id")
    assert len(guest) == 569 and len(host) == round(0.5 * 569)
    assert guest.n_features + host.n_features + load_table(tmp_path / "host_2.csv", id_column="id").n_features == 30


def test_errors_exit_2(tmp_path, capsys):
    assert main(["--dataset", "wine", "--scheme", "label_dirichlet", "--beta", "0", "--out", str(tmp_path)]) == 2
    assert "beta must be" in capsys.readouterr().err
    assert main(["--data", str(tmp_path / "none.csv"), "--out", str(tmp_path)]) == 2
    assert "none.csv" in capsys.readouterr().err
    assert main(["--dataset", "wine", "--scheme", "label_quantity", "--k", "4", "--parties", "3",
                 "--out", str(tmp_path)]) == 2
    assert "k=4" in capsys.readouterr().err
