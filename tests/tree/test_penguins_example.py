"""examples/penguins_secureboost.py end to end: three real party processes over gRPC with mutual TLS,
multi-class vertical SecureBoost on Palmer Penguins with missing values and categorical columns; its
federated held-out accuracy equals the centralised twin's on the same rows (small test key, 3 rounds)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from secureflhv.runtime.job.data_prep import split_rows
from secureflhv.tree.binning import fit_cuts
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.reference import fit_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_penguins_example_equals_twin(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import penguins_secureboost as ex
    finally:
        sys.path.remove(str(EXAMPLES))
    work = tmp_path / "run"
    assert ex.main(["--work-dir", str(work), "--key-bits", "1024", "--trees", "3", "--timeout", "600"]) == 0
    got = json.loads((work / "out" / "guest" / "metrics.json").read_text())["metrics"]["test"]
    X, y, names = ex.joined_table({p: work / "data" / f"{p}.csv" for p in ex.COLUMNS})
    assert np.isnan(X).any() and names[:2] == ["island", "sex"]
    split = split_rows(len(y), 0.3, 0)
    params = SecureBoostParams(objective="multiclass", n_classes=3, n_trees=3, max_depth=3, max_bin=32)
    twin = fit_reference(X[split.train], y[split.train], fit_cuts(X[split.train], 32), params)
    acc = float(np.mean(np.argmax(twin.predict(X[split.test]), axis=1) == y[split.test]))
    assert got["n"] == len(split.test) and got["accuracy"] == acc and acc > 0.85
