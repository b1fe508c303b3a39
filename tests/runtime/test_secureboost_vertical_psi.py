"""``secureboost_vertical`` with a sample overlap: each host holds only part of the guest's ids, so PSI
decides the rows. The job runs as real party processes (``secureflhv run``: guest + 2 hosts over gRPC with
mutual TLS); its model (the guest's ``model.json`` with the hosts' private ``split_table.json``) equals the
independent numpy twin (tests/tree/numpy_gbdt.py: its own quantile cuts and base margin) trained on the
joined intersection's training rows, and its held-out predictions equal the twin's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tree"))   # the numpy twin and its comparison
import numpy_gbdt as twin  # noqa: E402
from job_harness import run_cli  # noqa: E402
from sb_harness import assert_trees_equal_twin, vertical_nodes  # noqa: E402
from secureflhv.data import load_sklearn  # noqa: E402
from secureflhv.runtime.job.demo import vertical_parties, vertical_tables, write_job  # noqa: E402
from secureflhv.tree.model import model_from_dict  # noqa: E402

pytestmark = pytest.mark.slow

PARAMS = {"n_trees": 3, "max_depth": 3, "max_bin": 16, "learning_rate": 0.3, "key_bits": 512,
          "test_fraction": 0.25, "split_seed": 5}
HOSTS = ["host-1", "host-2"]


def _features(csv: Path) -> pd.DataFrame:
    return pd.read_csv(csv, dtype={"id": str}).set_index("id")


def test_model_after_psi_equals_the_twin_on_the_joined_intersection(tmp_path):
    # each host holds 70% of the ids (drawn independently); the guest then loses 5% of its rows
    guest_csv, host_csvs = vertical_tables(load_sklearn("breast_cancer"), tmp_path / "data", 2, seed=11,
                                           host_overlap=0.7, guest_missing=0.05, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    job = write_job(tmp_path / "job", "sb-psi", "secureboost_vertical", parties, PARAMS, deadline_s=60,
                    insecure_test_keys=True)
    code, log = run_cli("run", str(job), "--timeout", "240")
    assert code == 0, log[-3000:]
    out = job.parent / "out"

    guest, hosts = _features(guest_csv), [_features(c) for c in host_csvs]
    common = guest.index.intersection(hosts[0].index).intersection(hosts[1].index)
    assert len(common) < 0.6 * len(guest), "PSI had nothing to drop: the test would not exercise it"
    held_out = pd.read_csv(out / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    assert set(held_out.index) <= set(common)
    assert len(held_out) == round(PARAMS["test_fraction"] * len(common))
    train = common.difference(held_out.index)

    y_col = guest["label"]
    tables = [guest.drop(columns="label"), *hosts]
    joined = lambda ids: np.hstack([t.loc[ids].to_numpy(dtype=np.float64) for t in tables])  # noqa: E731
    X, y = joined(train), y_col.loc[train].to_numpy(dtype=np.float64)
    params = twin.Config(n_trees=PARAMS["n_trees"], max_depth=PARAMS["max_depth"],
                         learning_rate=PARAMS["learning_rate"])
    ref = twin.fit(X, y, [twin.quantile_cuts(X[:, j], PARAMS["max_bin"]) for j in range(X.shape[1])], params)

    model = model_from_dict(json.loads((out / "guest" / "model" / "model.json").read_text()))
    np.testing.assert_allclose(model.base_margin, ref.base, rtol=1e-12, atol=0)
    split_tables = [(h, t.shape[1], [(j, b, float(thr), dl) for j, b, thr, dl in
                                     json.loads((out / h / "model" / "split_table.json").read_text())])
                    for h, t in zip(HOSTS, hosts)]
    fed = [(t.output, vertical_nodes(t, tables[0].shape[1], split_tables)) for t in model.trees]
    assert_trees_equal_twin(fed, ref)
    assert any(n[0] == "split" and n[1] >= tables[0].shape[1] for _, nodes in fed for n in nodes.values()), \
        "no host split: the encrypted path was not exercised"

    margin = ref.predict_margin(joined(held_out.index))[:, 0]
    np.testing.assert_allclose(held_out["probability"].to_numpy(), 1 / (1 + np.exp(-margin)), rtol=0, atol=1e-6)
    assert np.mean((margin > 0) == held_out["label"].to_numpy()) > 0.85
