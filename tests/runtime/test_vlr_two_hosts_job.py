"""Vertical LR in arbiter mode with two hosts as jobs (issue 36, the host masks): training over real party
processes (gRPC, mutual TLS; the hosts agree on their mask keys over their direct channel), then a
prediction job with the saved bundles, whose scores equal the in-job held-out predictions exactly (the
masks cancel in the guest's total, so both go through the same fixed-point encoding)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job
from secureflhv.runtime.algorithms import predict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_e2e_vertical_lr_tasks import _predict_in_process, _secureflhv  # noqa: E402

pytestmark = pytest.mark.slow


def test_two_host_arbiter_job_and_prediction_job_agree_exactly(tmp_path):
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", 2, seed=3, scheme="random")
    params = {"epochs": 1, "batch_size": 128, "key_bits": 512, "early_stopping_rounds": None, "test_fraction": 0.25,
              "split_seed": 5, "seed": 7}
    job = write_vertical_lr_job(tmp_path / "job", guest_csv, host_csvs, params, mode="arbiter", deadline_s=60,
                                insecure_test_keys=True)
    proc = _secureflhv("run", str(job), "--timeout", "200")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    in_job = pd.read_csv(job.parent / "out" / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    pjob = predict.write_predict_job(job, tmp_path / "predict" / "job.yaml",
                                     data={"guest": guest_csv, "host-1": host_csvs[0], "host-2": host_csvs[1]})
    _predict_in_process(pjob)
    pred = pd.read_csv(pjob.parent / "predictions" / "guest" / "predictions.csv", dtype={"id": str}).set_index("id")
    assert len(in_job) > 100
    assert (pred.loc[in_job.index, "score"].to_numpy() == in_job["probability"].to_numpy()).all()
