"""Resume after a crash, end to end: real party processes over gRPC with mutual TLS (vertical LR, SecureBoost).

A host is SIGKILLed mid-training; ``secureflhv run JOB --resume`` continues from the last epoch every
party checkpointed, and the finished model equals an uninterrupted run's exactly (same seed).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import secureflhv

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import kill_after, resumed_steps, run_job  # noqa: E402
from test_e2e_vertical_lr import PARAMS, make_job  # noqa: E402

pytestmark = pytest.mark.slow

RESUME_PARAMS = {**PARAMS, "epochs": 6, "batch_size": 64, "momentum": 0.5, "lr_schedule": "cosine",
                 "early_stopping_rounds": 2, "min_delta": 1e-3}
KILL_AFTER = 3  # epochs the host finishes before it is killed


def _model(out_dir: Path) -> dict:
    guest, host = out_dir / "guest" / "model", out_dir / "host-1" / "model"
    return {"guest_w": np.load(guest / "weights.npy", allow_pickle=False),
            "intercept": np.load(guest / "intercept.npy", allow_pickle=False),
            "host_w": np.load(host / "weights.npy", allow_pickle=False),
            "loss": json.loads((out_dir / "guest" / "metrics.json").read_text())["history"]["loss"]}


def test_killed_host_then_resume_equals_uninterrupted_run(tmp_path):
    ref_job, _, _ = make_job(tmp_path / "ref", params=RESUME_PARAMS, deadline=10)
    secureflhv.simulate(secureflhv.Job.from_yaml(ref_job))  # uninterrupted, in one process: the same model exactly
    reference = _model(ref_job.parent / "out")
    assert len(reference["loss"]) >= KILL_AFTER + 2  # the kill lands mid-training

    job, _, _ = make_job(tmp_path / "crash", params=RESUME_PARAMS, deadline=10)
    kill_after(job, ("server", "guest", "host-1"), "host-1", f"epoch {KILL_AFTER}/")
    ckpt = job.parent / "out" / "host-1" / "checkpoints"
    held = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert held and len(held) <= 2  # keep=2

    out = run_job(job, "--resume", timeout_s=240)
    steps = resumed_steps(out)
    assert len(steps) == 1 and KILL_AFTER - 1 <= steps.pop() <= KILL_AFTER, out[-3000:]
    resumed = _model(job.parent / "out")
    for key in ("guest_w", "intercept", "host_w"):
        assert np.array_equal(resumed[key], reference[key]), key
    assert resumed["loss"] == reference["loss"]


def test_resume_without_checkpoints_starts_from_scratch(tmp_path):
    job, _, _ = make_job(tmp_path, params={**RESUME_PARAMS, "epochs": 2}, deadline=10)
    out = run_job(job, "--resume", timeout_s=240)
    assert out.count("starting from scratch") == 3, out[-3000:]
    assert (job.parent / "out" / "guest" / "checkpoints" / "step-00000002").is_dir()


SB_PARAMS = {"n_trees": 6, "max_depth": 3, "key_bits": 1024, "shuffle_seed": 3, "test_fraction": 0.3,
             "split_seed": 5}


def _sb_job(tmp: Path) -> Path:
    from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job

    guest_csv, host_csvs = breast_cancer_tables(tmp / "data", 1, seed=3, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    return write_job(tmp / "job", "sb-resume", "secureboost_vertical", parties, SB_PARAMS, deadline_s=10,
                     insecure_test_keys=True)


def _sb_model(out_dir: Path) -> tuple:
    return (json.loads((out_dir / "guest" / "model" / "model.json").read_text()),
            json.loads((out_dir / "host-1" / "model" / "split_table.json").read_text()))


def test_secureboost_killed_host_then_resume_equals_uninterrupted_run(tmp_path):
    ref_job = _sb_job(tmp_path / "ref")
    secureflhv.simulate(secureflhv.Job.from_yaml(ref_job))  # uninterrupted, in one process: the same trees
    reference = _sb_model(ref_job.parent / "out")
    assert len(reference[0]["trees"]) == SB_PARAMS["n_trees"]

    job = _sb_job(tmp_path / "crash")
    kill_after(job, ("guest", "host-1"), "host-1", "tree 3 (", watch="guest")

    out = run_job(job, "--resume", timeout_s=240)
    steps = resumed_steps(out)
    assert len(steps) == 1 and 2 <= steps.pop() <= 4, out[-3000:]
    assert _sb_model(job.parent / "out") == reference
