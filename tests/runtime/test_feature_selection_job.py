"""``feature_selection`` over real party processes (gRPC + mutual TLS): from a vertical SecureBoost model,
the kept columns are the top-k by total split gain, computed here from the bundles' JSON (the guest's
trees and the host's split table); a vertical LR job chained by ``params.select_from`` reads only those
columns, and a prediction job on the full raw tables gives the in-job scores."""
from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

from secureflhv.runtime.algorithms.predict import write_predict_job
from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job
from secureflhv.runtime.store.model_bundle import read_bundle

from job_harness import assert_prediction_job_reproduces, run_cli

pytestmark = pytest.mark.slow
TOP_K = 4


secureflhv = run_cli


def _derived(job, tmp, name, algorithm, params, data):
    """A job file of ``algorithm`` over the parties and certificates of ``job`` (the same CA)."""
    path = write_predict_job(job, tmp / name / "job.yaml", data=data, new_ports=True, output_dir="out")
    doc = yaml.safe_load(path.read_text())
    doc["job"]["algorithm"] = algorithm
    doc["params"] = {**doc["params"], **params} if algorithm in ("feature_selection", "predict") else params
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_top_k_by_gain_then_a_chained_lr_reads_only_those_columns(tmp_path):
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", 1, seed=4, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    sb = write_job(tmp_path / "sb", "sb", "secureboost_vertical", parties,
                   {"n_trees": 2, "max_depth": 3, "key_bits": 1024, "test_fraction": 0.3}, deadline_s=60,
                   insecure_test_keys=True)
    code, out = secureflhv("run", str(sb), "--timeout", "200")
    assert code == 0, out[-3000:]
    data = {"guest": guest_csv, "host-1": host_csvs[0]}
    sel = _derived(sb, tmp_path, "sel", "feature_selection", {"top_k": TOP_K, "seed": 3}, data)
    code, out = secureflhv("run", str(sel), "--timeout", "120")
    assert code == 0, out[-3000:]

    # the twin: total gain per (party, column) from the bundles' JSON
    ca = sb.parent / "certs" / "ca.pem"
    guest_model = read_bundle(sb.parent / "out" / "guest", ca=ca)
    host_model = read_bundle(sb.parent / "out" / "host-1", ca=ca)
    table = host_model.files["split_table.json"]
    gain: dict = {}
    for tree in guest_model.files["model.json"]["trees"]:
        for node in tree["nodes"]:
            if node.get("leaf", True):
                continue
            owner = node["owner"]
            if owner == "guest":
                key = ("guest", guest_model.feature_names[node["feature"]])
            else:
                key = (owner, host_model.feature_names[int(table[node["record"]][0])])
            gain[key] = gain.get(key, 0.0) + node["gain"]
    top = sorted(gain, key=lambda k: -gain[k])[:TOP_K]
    assert len(gain) > TOP_K
    for party in ("guest", "host-1"):
        got = pd.read_csv(sel.parent / "out" / party / "selection.csv")
        assert sorted(got[got.kept].column) == sorted(c for p, c in top if p == party), party

    lr = _derived(sb, tmp_path, "lr", "vertical_lr", {"mode": "two_party", "epochs": 1, "key_bits": 1024,
                                                      "select_from": str(sel.parent / "out"), "seed": 1}, data)
    shutil.rmtree(lr.parent / "out", ignore_errors=True)
    code, out = secureflhv("run", str(lr), "--timeout", "200")
    assert code == 0, out[-3000:]
    for party in ("guest", "host-1"):
        model = read_bundle(lr.parent / "out" / party, ca=ca)
        assert sorted(model.feature_names) == sorted(c for p, c in top if p == party), party
    assert_prediction_job_reproduces(lr, tmp_path / "predict", data)
