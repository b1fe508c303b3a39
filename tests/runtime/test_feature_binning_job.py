"""``feature_binning`` end to end over real party processes (gRPC + mutual TLS): the IV table equals a
pandas computation on the joined table with the same bins; a vertical LR job chained by
``params.woe_from`` trains on the selected columns, WOE-encoded; a prediction job applies the same
selection and encoding, and its scores equal the in-job ones."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from secureflhv.runtime.algorithms.predict import write_predict_job
from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job
from secureflhv.runtime.store.model_bundle import read_bundle

from job_harness import assert_prediction_job_reproduces, run_cli

pytestmark = pytest.mark.slow
BINNING = {"method": "quantile", "max_bins": 6, "iv_threshold": 2.0, "send_woe": True, "test_fraction": 0.0,
           "key_bits": 1024}


secureflhv = run_cli


@pytest.fixture(scope="module")
def binned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("binning")
    guest_csv, host_csvs = breast_cancer_tables(tmp / "data", 1, seed=3, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    job = write_job(tmp / "bin", "binning", "feature_binning", parties, BINNING, deadline_s=60,
                    insecure_test_keys=True)
    code, out = secureflhv("run", str(job), "--timeout", "200")
    assert code == 0, out[-3000:]
    return tmp, job, parties, guest_csv, host_csvs[0]


def _joined(guest_csv, host_csv) -> pd.DataFrame:
    g = pd.read_csv(guest_csv, dtype={"id": str})
    h = pd.read_csv(host_csv, dtype={"id": str})
    return g.merge(h, on="id", suffixes=("", "_host"))


def _twin_iv(x: np.ndarray, edges: list[float], y: np.ndarray) -> float:
    """IV of one column with the given left-closed cuts, NaN in its own bin; written here with pandas."""
    b = pd.cut(pd.Series(x), [-np.inf, *edges, np.inf], right=False, labels=False).fillna(len(edges) + 1)
    t = pd.crosstab(b, pd.Series(y)).reindex(columns=[0, 1], fill_value=0)
    ev, ne = t[1].astype(float), t[0].astype(float)
    adj = ((ev == 0) | (ne == 0)).astype(float) * 0.5
    pe, pn = (ev + adj) / y.sum(), (ne + adj) / (len(y) - y.sum())
    return float(((pe - pn) * np.log(pe / pn)).sum())


def test_iv_of_every_column_equals_pandas_on_the_joined_table(binned):
    tmp, job, _, guest_csv, host_csv = binned
    out = job.parent / "out"
    iv = pd.read_csv(out / "guest" / "iv.csv")
    joined = _joined(guest_csv, host_csv)
    y = joined["label"].to_numpy().astype(int)
    ca = job.parent / "certs" / "ca.pem"
    for party in ("guest", "host-1"):
        bundle = read_bundle(out / party, ca=ca, expect_party=party)
        bins = bundle.extra["bins"]
        assert bins["names"] == list(iv[iv.party == party].column)
        for name, edges in zip(bins["names"], bins["edges"]):
            got = float(iv[(iv.party == party) & (iv.column == name)].iv.iloc[0])
            assert got == pytest.approx(_twin_iv(joined[name].to_numpy(float), edges, y), rel=1e-12, abs=1e-15), name
        selected = [n for n, s in zip(iv[iv.party == party].column, iv[iv.party == party].selected) if s]
        assert bundle.extra["selected"] == selected
        assert selected == [n for n in bins["names"] if float(iv[(iv.party == party) & (iv.column == n)].iv.iloc[0])
                            >= BINNING["iv_threshold"]]
    assert 0 < iv.selected.sum() < len(iv)  # the threshold keeps some columns and drops others
    assert (out / "guest" / "iv.png").stat().st_size > 0


@pytest.fixture(scope="module")
def chained_lr(binned):
    tmp, bjob, parties, guest_csv, host_csv = binned
    lr = {"mode": "two_party", "epochs": 2, "batch_size": 128, "learning_rate": 0.15, "key_bits": 1024, "seed": 7,
          "test_fraction": 0.3, "split_seed": 5, "woe_from": str(bjob.parent / "out")}
    job = write_job(tmp / "lr", "lr-woe", "vertical_lr", parties, lr, deadline_s=60, insecure_test_keys=True)
    shutil.copytree(bjob.parent / "certs", job.parent / "certs", dirs_exist_ok=True)  # the binning job's CA
    code, out = secureflhv("run", str(job), "--timeout", "200")
    assert code == 0, out[-3000:]
    return job


def test_a_chained_lr_job_trains_on_the_selection_and_prediction_applies_it(binned, chained_lr):
    tmp, bjob, _, guest_csv, host_csv = binned
    job = chained_lr
    iv = pd.read_csv(bjob.parent / "out" / "guest" / "iv.csv")
    ca = job.parent / "certs" / "ca.pem"
    for party in ("guest", "host-1"):
        model = read_bundle(job.parent / "out" / party, ca=ca, expect_party=party)
        kept = list(iv[(iv.party == party) & iv.selected].column)
        assert model.feature_names == [f"woe({n})" for n in kept], party
    # the full raw tables: the bundles select and encode, so the scores are the in-job ones exactly
    assert_prediction_job_reproduces(job, tmp / "predict", {"guest": guest_csv, "host-1": host_csv})


def test_scorecard_points_add_up_to_the_models_score_and_stay_at_their_party(binned, chained_lr):
    tmp, _, _, guest_csv, host_csv = binned
    scaling = {"pdo": 20.0, "base_score": 600.0, "base_odds": 50.0}
    sjob = write_predict_job(chained_lr, tmp / "score" / "job.yaml", data={"guest": guest_csv, "host-1": host_csv},
                             new_ports=True, output_dir="out")
    doc = yaml.safe_load(sjob.read_text())
    doc["job"]["algorithm"] = "scorecard"
    doc["params"].update(scaling)
    sjob.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, log = secureflhv("run", str(sjob), "--timeout", "120")
    assert code == 0, log[-3000:]
    out = sjob.parent / "out"
    guest_card = pd.read_csv(out / "guest" / "scorecard.csv")
    host_card = pd.read_csv(out / "host-1" / "scorecard.csv")
    iv = pd.read_csv(tmp / "bin" / "out" / "guest" / "iv.csv")
    host_kept = set(iv[(iv.party == "host-1") & iv.selected].column)
    assert set(host_card.feature) == host_kept and not host_kept & set(guest_card.feature)
    # the model's own probability (the in-job predictions) gives the same score: offset - factor * logit
    factor = scaling["pdo"] / np.log(2)
    offset = scaling["base_score"] - factor * np.log(scaling["base_odds"])
    scores = pd.read_csv(out / "guest" / "scores.csv", dtype={"id": str})
    pred = pd.read_csv(chained_lr.parent / "out" / "guest" / "predictions.csv", dtype={"id": str})
    both = scores.merge(pred, on="id")
    assert len(both) == len(pred) > 0
    p = both["probability"].to_numpy()
    np.testing.assert_allclose(both["score"].to_numpy(), offset - factor * np.log(p / (1 - p)), rtol=0, atol=1e-6)
    metrics = json.loads((out / "guest" / "metrics.json").read_text())["metrics"]
    assert metrics["ks"] > 0.5 and metrics["auc"] > 0.9  # breast cancer with its best columns
    assert (out / "guest" / "lift_gain.csv").exists() and not (out / "host-1" / "scores.csv").exists()


def test_multiclass_iv_is_one_vs_rest_and_monotonic_merging_makes_rates_monotone():
    """The guest's per-column step (no processes): one-vs-rest IV per class against a numpy twin, and
    monotonic merging of fine bins whose event rates zig-zag."""
    from secureflhv.data.woe import ColumnBins
    from secureflhv.runtime.algorithms.feature_binning import FeatureBinningJobParams, _Column

    counts = np.array([[30, 5, 5], [10, 20, 10], [5, 10, 25], [0, 0, 0], [2, 1, 1]])  # 3 value bins + 1 + missing
    col = _Column("host-1", ColumnBins("x", np.array([1.0, 2.0, 3.0])), counts)
    col.finish(FeatureBinningJobParams(method="quantile"), min_rows=1)
    for k, iv in enumerate(col.iv_per_class):
        ev, ne = counts[:, k].astype(float), (counts.sum(1) - counts[:, k]).astype(float)
        used = counts.sum(1) > 0
        adj = 0.5 * (((ev == 0) | (ne == 0)) & used)
        pe, pn = (ev + adj) / ev.sum(), (ne + adj) / ne.sum()
        ratio = np.divide(pe, pn, out=np.ones_like(pe), where=used)
        assert iv == pytest.approx(float(((pe - pn) * np.log(ratio))[used].sum()), rel=1e-12)
    assert col.iv == max(col.iv_per_class) and col.woe is None  # multiclass: no WOE encoding

    fine = np.array([[40, 10], [35, 15], [30, 10], [20, 30], [25, 25], [10, 40], [0, 0]])  # [non-event, event]
    col = _Column("guest", ColumnBins("z", np.arange(1.0, 6.0)), fine)
    col.finish(FeatureBinningJobParams(method="monotonic"), min_rows=60)
    rate = col.counts[:-1, 1] / col.counts[:-1].sum(1)
    assert np.all(np.diff(rate) >= 0) and len(rate) < 6 and np.all(col.counts[:-1].sum(1) >= 60)
    assert col.counts.sum() == fine.sum() and len(col.bins.edges) == len(rate) - 1
