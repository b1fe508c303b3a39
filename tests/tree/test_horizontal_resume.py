"""Horizontal SecureBoost resume: in process from every round's checkpoint, and after a crash with a server
and 2 clients as processes over gRPC with mutual TLS (slow).

In process, every role records its checkpoint states; new roles built with ``resume=`` the
states of round k (all parties the same k) run binning again and grow exactly the uninterrupted run's
trees (binary with validation and early stopping, and multiclass with several trees per round).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from sb_harness import horizontal_run  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lifecycle_helpers import recorder  # noqa: E402
from resume_harness import kill_after, resumed_steps, run_job  # noqa: E402

from secureflhv.transport.inprocess import InProcessNetwork  # noqa: E402
from secureflhv.tree.horizontal import HorizontalSecureBoostClient, tree_aggregation_config  # noqa: E402
from secureflhv.tree.model import model_to_dict  # noqa: E402

IDS = ["client-0", "client-1", "client-2"]


def _data(n_classes: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(150, 4))
    score = X @ np.array([1.0, -1.0, 0.5, 0.8])
    y = (score > 0).astype(int) if n_classes == 2 else np.digitize(score, [-0.7, 0.7])
    X[rng.random(X.shape) < 0.05] = np.nan  # missing values too
    return X, y


def _train(params: dict, resume: dict | None = None):
    """Server + 3 clients in threads; returns ({party: its model as a dict}, {party: {rounds done: (arrays, state)}})."""
    X, y = _data(params.get("n_classes", 2))
    rows = [slice(i * 50, i * 50 + 40) for i in range(len(IDS))]
    val = [slice(i * 50 + 40, i * 50 + 50) for i in range(len(IDS))]
    saved = {p: {} for p in ["server", *IDS]}
    out = horizontal_run([(X[r], y[r]) for r in rows], params, deadline=30, stage_timeout=20,
                         val_parts=[(X[v], y[v]) for v in val],
                         callbacks={p: [recorder(s)] for p, s in saved.items()}, resume=resume)
    assert not out["errors"], out["errors"]
    results = {"server": out["server_model"], **dict(zip(IDS, out["client_models"]))}
    structure = [t.structure() for t in results["server"].trees]
    assert all([t.structure() for t in results[c].trees] == structure for c in IDS)
    return {p: model_to_dict(m) for p, m in results.items()}, saved


@pytest.mark.parametrize("params", [
    dict(n_trees=5, max_depth=2, early_stopping_rounds=2, learning_rate=0.5),
    dict(objective="multiclass", n_classes=3, n_trees=3, max_depth=2),
], ids=["binary-validation", "multiclass"])
def test_resume_from_every_round_equals_uninterrupted(params):
    full, saved = _train(params)
    rounds = sorted(saved["server"])
    assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) >= 2
    for k in rounds[:-1]:
        assert k in saved["client-2"] and "margin" in saved["client-2"][k][0]
        resumed, _ = _train(params, resume={p: s[k] for p, s in saved.items()})
        assert resumed == full, k  # every party's trees (splits, thresholds, leaf values) and the server's record


def test_foreign_checkpoint_is_rejected():
    params = dict(n_trees=3, max_depth=2)
    _, saved = _train(params)
    arrays, state = saved["client-1"][2]
    other_cuts = json.loads(json.dumps(state))
    other_cuts["model"]["cuts"][0] = [c + 0.5 for c in other_cuts["model"]["cuts"][0]]
    cases = {"not a horizontal SecureBoost checkpoint": (arrays, {"epochs_done": 2}),
             "does not continue this job": (arrays, other_cuts),
             "margins of another shape": ({**arrays, "margin": arrays["margin"][:5]}, state)}
    X, y = _data(2)
    for match, bad in cases.items():
        net = InProcessNetwork("hsb-bad", ["server", "client-1"], deadline=5)
        client = HorizontalSecureBoostClient(net.transport("client-1"), "server", ["client-1", "client-2"],
                                             X[50:90], y[50:90], params, X_val=X[90:100], y_val=y[90:100],
                                             aggregation=tree_aggregation_config(min_clients=2, max_colluders=0),
                                             resume=bad)
        client.binning = lambda c=client: _binning_of(saved, c)  # skip the server: the binning it would send
        client.hello = lambda: None
        with pytest.raises(ValueError, match=match):
            client._fit()


def _binning_of(saved, client):
    from secureflhv.tree.horizontal import Binning
    from secureflhv.tree.model import model_from_dict

    model = model_from_dict(saved["server"][1][1]["model"])
    return Binning(model.cuts, model.base_margin, 150, np.isnan(client.X).any(axis=0) | True)


# two clients: the explicit opt-in (each learns the other's histograms; docs/security.md)
PROC_PARAMS = {"n_trees": 5, "max_depth": 2, "learning_rate": 0.5, "test_fraction": 0.2, "split_seed": 3,
               "min_clients": 2, "max_colluders": 0}


def _proc_job(tmp: Path) -> Path:
    from secureflhv.runtime.job.demo import write_job

    X, y = _data(2)
    parties = [{"id": "server", "role": "server"}]
    for i, rows in enumerate((slice(0, 75), slice(75, 150)), start=1):
        df = pd.DataFrame(X[rows], columns=[f"x{j}" for j in range(X.shape[1])])
        df.insert(0, "id", [f"r{i}-{k}" for k in range(len(df))])
        df["label"] = y[rows]
        (tmp / "data").mkdir(parents=True, exist_ok=True)
        df.to_csv(tmp / "data" / f"client-{i}.csv", index=False)
        parties.append({"id": f"client-{i}", "role": "guest" if i == 1 else "host",
                        "data": {"path": str(tmp / "data" / f"client-{i}.csv"), "label_column": "label"}})
    return write_job(tmp / "job", "hsb-resume", "secureboost_horizontal", parties, PROC_PARAMS, deadline_s=10)


def _proc_model(out: Path) -> dict:
    return {p: json.loads((out / p / "model" / "model.json").read_text()) for p in ("server", "client-1", "client-2")}


@pytest.mark.slow
def test_killed_client_then_resume_equals_uninterrupted_run(tmp_path):
    """Two clients (t = 2): client-2 SIGKILLed after the server grew tree 3; the others stop with an error
    naming it; ``run --resume`` continues after the last round all three checkpointed; same trees."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "horizontal"))
    from fl_harness import run_job_threads

    from secureflhv.runtime.algorithms import secureboost_horizontal
    from secureflhv.runtime.job.load import load_job

    ref_job = _proc_job(tmp_path / "ref")  # the uninterrupted run in one process (its sums are exact: same trees)
    run_job_threads(load_job(ref_job), secureboost_horizontal.run)
    reference = _proc_model(ref_job.parent / "out")
    assert len(reference["server"]["trees"]) == PROC_PARAMS["n_trees"]

    job = _proc_job(tmp_path / "crash")
    killed = kill_after(job, ["server", "client-1", "client-2"], "client-2", "tree 3 in", watch="server",
                        wait_s=120)
    for pid, out in killed.outputs.items():
        assert "client-2" in out, out[-2000:]  # the error names the dead client

    out = run_job(job, "--resume")
    steps = resumed_steps(out)
    assert len(steps) == 1 and 2 <= steps.pop() <= 3, out[-3000:]
    assert _proc_model(job.parent / "out") == reference
