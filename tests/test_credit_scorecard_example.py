"""examples/credit_scorecard.py end to end (issue 40): binning, WOE vertical LR and scorecard jobs between a
bank and a bureau as real party processes over gRPC with mutual TLS (1024-bit test keys, 5 LR epochs).

Checks: the federated IV of every column equals a pandas IV on the joined table's training rows with the
SAME cuts (read from the signed bundles); the kept columns are those with IV >= the threshold, and the
LR model of each party holds exactly its kept columns, WOE-encoded; the held-out AUC of the federated
scorecard is within 0.02 of the example's centralised twin (scikit-learn on the joined table)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from secureflhv.runtime.store.model_bundle import read_bundle

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
THRESHOLD = 0.02


def _iv(x: np.ndarray, edges: list[float], y: np.ndarray) -> float:
    """IV of one column with left-closed cuts ``edges`` (NaN in its own bin), 0.5 added to both counts of
    a non-empty bin lacking bads or goods; written here with pandas."""
    b = pd.cut(pd.Series(x), [-np.inf, *edges, np.inf], right=False, labels=False).fillna(len(edges) + 1)
    t = pd.crosstab(b, pd.Series(y)).reindex(columns=[0, 1], fill_value=0).astype(float)
    bad, good = t[1], t[0]
    adj = ((bad == 0) | (good == 0)).astype(float) * 0.5
    pb, pg = (bad + adj) / y.sum(), (good + adj) / (len(y) - y.sum())
    return float(((pb - pg) * np.log(pb / pg)).sum())


def test_credit_scorecard_example(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import credit_scorecard as ex
    finally:
        sys.path.remove(str(EXAMPLES))
    work = tmp_path / "run"
    assert ex.main(["--work-dir", str(work), "--key-bits", "1024", "--epochs", "5", "--timeout", "600",
                    "--iv-threshold", str(THRESHOLD)]) == 0

    bank = pd.read_csv(work / "data" / "bank.csv", dtype={"id": str}).set_index("id")
    bureau = pd.read_csv(work / "data" / "bureau.csv", dtype={"id": str}).set_index("id")
    assert len(bank) < 1000 and len(bureau) < 1000 and "y" in bank and "y" not in bureau
    joined = bank.join(bureau, how="inner")
    split = json.loads((work / "lr" / "guest" / "split.json").read_text())
    train, test = [str(i) for i in split["train"]], [str(i) for i in split["test"]]
    assert len(joined) == len(train) + len(test) < len(bank)  # PSI dropped ids of either side
    y_train = joined.loc[train, "y"].to_numpy().astype(int)

    iv = pd.read_csv(work / "binning" / "guest" / "iv.csv")
    assert sorted(iv.column) == sorted(c for c in joined.columns if c != "y")
    ca = work / "certs" / "ca.pem"
    for party, table in (("guest", bank), ("host-1", bureau)):
        mine = iv[iv.party == party]
        assert sorted(mine.column) == sorted(c for c in table.columns if c != "y")
        bins = read_bundle(work / "binning" / party, ca=ca, expect_party=party).extra["bins"]
        for name, edges in zip(bins["names"], bins["edges"]):
            got = float(mine[mine.column == name].iv.iloc[0])
            want = _iv(joined.loc[train, name].to_numpy(float), edges, y_train)
            assert got == pytest.approx(want, rel=0, abs=1e-9), (party, name)
        kept = [n for n in mine.column if float(mine[mine.column == n].iv.iloc[0]) >= THRESHOLD]
        assert list(mine[mine.selected].column) == kept and kept
        model = read_bundle(work / "lr" / party, ca=ca, expect_party=party)
        assert model.feature_names == [f"woe({n})" for n in kept], party
    assert 0 < iv.selected.sum() < len(iv)  # the threshold keeps some columns and drops others

    scores = pd.read_csv(work / "scorecard" / "guest" / "scores.csv", dtype={"id": str}).set_index("id")
    assert len(scores) == len(joined)  # the scorecard job scores every PSI-aligned row
    held = scores.loc[test]
    fed_auc = roc_auc_score(held["label"].to_numpy().astype(int), held["p_bad"].to_numpy())
    args = argparse.Namespace(max_bins=10, method="quantile", iv_threshold=THRESHOLD, standardize=False)
    twin = ex.central_twin(work / "data" / "bank.csv", work / "data" / "bureau.csv", {"train": train, "test": test},
                           args, {})
    assert sorted(twin["kept"]) == sorted(iv[iv.selected].column)
    assert abs(fed_auc - twin["auc"]) < 0.02 and fed_auc > 0.7, (fed_auc, twin["auc"])
    assert (work / "scorecard" / "host-1" / "scorecard.csv").exists()  # the bureau's points stay at the bureau
    assert not (work / "scorecard" / "host-1" / "scores.csv").exists()
