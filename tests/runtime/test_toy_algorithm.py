"""Adding an algorithm is one job module and one spec registration (docs/architecture.md, "Adding an
algorithm"): a toy algorithm registered here, and nowhere else, is validated by ``secureflhv validate``,
trained, loaded by ``secureflhv.load_model``, scored by a prediction job and listed in the registry
table; and the table in docs/architecture.md is the one the registry renders for the built-ins.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

import secureflhv
from secureflhv.cli import main as cli_main
from secureflhv.runtime.algorithms import predict
from secureflhv.runtime.job.data_prep import load_party_table
from secureflhv.runtime.job.load import JobConfigError, load_job, parse_job
from secureflhv.runtime.job.registry import (BUILTINS, JOBS, JobSpec, job_params, register_job,
                                             registry_table, unregister_job)
from secureflhv.runtime.store.model_bundle import save_job_bundle
from secureflhv.transport.certs import generate_certificates

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
IDS = ["server", "client-1", "client-2"]


# ------------------------------------------------------------------------- the toy: one module's worth
class ToyParams(BaseModel):
    """``params`` of the toy: a ridge-regularised least-squares fit of each client's own rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ridge: float = Field(default=1.0, gt=0)


def toy_run(cfg, party, transport, params: ToyParams, *, resume: bool = False) -> dict:
    """Each client fits w = (X'X + ridge I)^-1 X'y on its own rows (no messages) and saves it as a bundle."""
    if party.role == "server":
        return {}
    table = load_party_table(cfg, party, require_label=True)
    X, y = np.asarray(table.X, dtype=np.float64), np.asarray(table.y, dtype=np.float64)
    w = np.linalg.solve(X.T @ X + params.ridge * np.eye(X.shape[1]), X.T @ y)
    save_job_bundle(cfg, party, files={"weights.npy": w}, feature_names=list(table.feature_names),
                    config=params.model_dump(mode="json"), extra={"n_features": X.shape[1]}, task="regression")
    return {"n": len(y)}


def toy_scorer(bundle, task: str):
    w = np.asarray(bundle.file("weights.npy"), dtype=np.float64)
    return lambda X: X @ w


TOY = JobSpec("toy_ridge", "horizontal", "ridge regression of each client's own rows (a test's toy)", ToyParams,
              toy_run, local_model=toy_scorer)


@pytest.fixture
def toy():
    """The toy registered for one test, and removed after it (whatever the test did)."""
    register_job(TOY)
    try:
        yield TOY
    finally:
        unregister_job(TOY.name)


# ------------------------------------------------------------------------------------------ a job file
def write_toy_job(work: Path, rng) -> tuple[Path, dict]:
    """Two clients' tables, certificates and ``job.yaml`` of a toy job; returns the path and the tables."""
    generate_certificates(work / "certs", IDS)
    tables = {}
    for cid in IDS[1:]:
        X = rng.normal(size=(40, 3))
        tables[cid] = pd.DataFrame({"id": [f"{cid}-{i}" for i in range(40)], "x0": X[:, 0], "x1": X[:, 1],
                                    "x2": X[:, 2], "y": X @ [1.0, -2.0, 0.5] + rng.normal(0, 0.1, 40)})
        tables[cid].to_csv(work / f"{cid}.csv", index=False)
    parties = [{"id": pid, "role": role, "address": f"127.0.0.1:{51900 + i}", "cert": f"certs/{pid}.pem",
                "key": f"certs/{pid}.key"} for i, (pid, role) in enumerate(zip(IDS, ("server", "guest", "host")))]
    for p in parties[1:]:
        p["data"] = {"path": f"{p['id']}.csv", "id_column": "id", "label_column": "y"}
    doc = {"job": {"id": "toy-train", "algorithm": "toy_ridge", "output_dir": "out"},
           "security": {"ca": "certs/ca.pem"}, "parties": parties, "params": {"ridge": 0.5}}
    (work / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return work / "job.yaml", tables


def run_parties(cfg, run) -> dict:
    """Every party of ``cfg`` in turn, without a network (the toy and local scoring send nothing)."""
    params = job_params(cfg)
    return {p.id: run(cfg, p, None, params) for p in cfg.parties}


# ------------------------------------------------------------------------------------------------ tests
def test_a_registered_toy_is_validated_trained_loaded_and_predicted(toy, tmp_path, capsys):
    job, tables = write_toy_job(tmp_path, np.random.default_rng(0))
    assert cli_main(["validate", str(job)]) == 0
    assert "algorithm toy_ridge (horizontal: ridge regression" in capsys.readouterr().out
    with pytest.raises(JobConfigError, match=r"params\.ridge"):  # its params model validates the job file
        parse_job({**yaml.safe_load(job.read_text()), "params": {"ridge": -1}}, tmp_path)

    cfg = load_job(job)
    assert run_parties(cfg, toy.run)["client-1"] == {"n": 40}
    ca = tmp_path / "certs" / "ca.pem"
    model = secureflhv.load_model(tmp_path / "out" / "client-1", ca=ca, expect_party="client-1")
    assert model.local and model.describe()["local"] and model.task == "regression"
    X = tables["client-1"][["x0", "x1", "x2"]].to_numpy()
    np.testing.assert_allclose(model.predict(X), X @ model.bundle.file("weights.npy"))

    # a prediction job over new rows: each client scores them with its own bundle, as load_model does
    new = tables["client-1"].iloc[:10]
    new.to_csv(tmp_path / "new.csv", index=False)
    pjob = predict.write_predict_job(job, tmp_path / "predict" / "job.yaml",
                                     data={"client-1": tmp_path / "new.csv", "client-2": tmp_path / "new.csv"})
    pcfg = load_job(pjob)
    results = run_parties(pcfg, predict.run)
    assert results["server"] == {} and results["client-1"]["rows_scored"] == 10
    scored = pd.read_csv(pcfg.output_dir("client-1") / "predictions.csv", dtype={"id": str})
    assert list(scored["id"]) == list(new["id"])
    np.testing.assert_allclose(scored["score"], model.predict(new[["x0", "x1", "x2"]].to_numpy()), rtol=1e-12)

    assert "| `toy_ridge` | horizontal | ridge regression" in registry_table()
    assert "local: `load_model`" in registry_table([toy])


def test_the_toy_is_gone_after_unregistering(tmp_path, capsys):
    job, _ = write_toy_job(tmp_path, np.random.default_rng(1))
    assert "toy_ridge" not in JOBS and "toy_ridge" not in registry_table()
    assert cli_main(["validate", str(job)]) != 0
    assert "job.algorithm: unknown algorithm 'toy_ridge'" in capsys.readouterr().err


def test_a_spec_is_one_description(toy):
    with pytest.raises(ValueError, match="already registered"):
        register_job(toy)
    with pytest.raises(ValueError, match="states its role rule"):
        JobSpec("toy_peer", "peer", "x", ToyParams, toy_run)
    with pytest.raises(ValueError, match="either scores locally or through a prediction protocol"):
        JobSpec("toy_both", "horizontal", "x", ToyParams, toy_run, predict=predict.vertical_lr, local_model=toy_scorer)


def test_every_builtin_bundle_has_a_prediction_and_the_local_ones_are_what_load_model_scores():
    """The drift this registry ends: an algorithm whose bundle scores locally is accepted by the prediction
    job too (multiconfederated once was not), and every trained algorithm's bundles can be scored."""
    trained = [s for s in BUILTINS if s.trains]
    assert {s.name for s in BUILTINS if not s.trains} == {"predict", "feature_binning", "feature_selection",
                                                          "vertical_statistics", "scorecard"}
    assert all(s.predictable for s in trained)
    assert {s.name for s in trained if s.scores_locally} == {"horizontal", "secureboost_horizontal",
                                                             "multiconfederated"}


def test_docs_table_is_the_registry_rendered():
    text = DOCS.read_text(encoding="utf-8")
    rendered = registry_table(BUILTINS)
    assert rendered in text, ("docs/architecture.md's job registry table is not what the registry renders; "
                              "paste registry_table() there:\n" + rendered)

