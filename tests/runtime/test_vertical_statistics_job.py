"""``job.algorithm: vertical_statistics`` (issue 40, cross-party statistics): the job over real party processes
(gRPC, mutual TLS), and its ``run`` in process for the other settings.

Each party's column report equals pandas' ``describe`` / ``nunique`` / ``isna`` on that party's aligned rows;
the learner's ``correlation.csv`` equals numpy's ``corrcoef`` of the joined table (an independent pandas join on
the ids, missing cells mean-imputed) to 1e-9; the other party writes no matrix.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secureflhv.runtime.algorithms import vertical_statistics
from secureflhv.runtime.job.demo import vertical_parties, write_job
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import load_job_params
from secureflhv.transport.inprocess import InProcessNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tree"))
from sb_harness import run_threads  # noqa: E402

QS = [0.01, 0.25, 0.5, 0.75, 0.99]


def _tables(tmp: Path, n: int = 60, seed: int = 0) -> tuple[Path, Path]:
    """Guest (id, label, g_a with missing cells, g_b, g_const) and host (id, h_x, h_y, h_z): each side has ids
    the other lacks, and the rows are in different orders (PSI must align them)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 2))
    ids = np.array([f"c{i:04d}" for i in range(n)])
    guest = pd.DataFrame({"id": ids, "label": (base[:, 0] > 0).astype(int), "g_a": base[:, 0] * 2 + 5,
                          "g_b": base[:, 1] + rng.normal(size=n) * 0.3, "g_const": 1.5})
    guest.loc[rng.random(n) < 0.1, "g_a"] = np.nan
    host = pd.DataFrame({"id": ids, "h_x": base[:, 0] - base[:, 1], "h_y": rng.exponential(size=n) * 10,
                         "h_z": np.round(base[:, 1] * 3)})
    guest, host = guest.iloc[:-4], host.iloc[5:]  # 51 common ids
    guest = guest.sample(frac=1.0, random_state=1)
    tmp.mkdir(parents=True, exist_ok=True)
    guest.to_csv(tmp / "guest.csv", index=False, float_format="%.17g")
    host.to_csv(tmp / "host.csv", index=False, float_format="%.17g")
    return tmp / "guest.csv", tmp / "host.csv"


def _job(tmp: Path, params: dict, **kw) -> tuple[Path, Path, Path]:
    guest_csv, host_csv = _tables(tmp / "data", **kw)
    parties = vertical_parties(guest_csv, [host_csv], server=False, id_column="id", label_column="label")
    job = write_job(tmp / "job", "stats-test", "vertical_statistics", parties,
                    {"key_bits": 512, **params}, deadline_s=30, insecure_test_keys=True)
    return job, guest_csv, host_csv


def _joined(guest_csv: Path, host_csv: Path, rows: list[str] | None = None):
    g = pd.read_csv(guest_csv, dtype={"id": str})
    h = pd.read_csv(host_csv, dtype={"id": str})
    joined = g.merge(h, on="id", how="inner").set_index("id").sort_index()
    return joined if rows is None else joined.loc[rows]


def _expected_r(joined: pd.DataFrame, guest_cols: list[str], host_cols: list[str]) -> np.ndarray:
    imputed = joined[guest_cols + host_cols].astype(float)
    imputed = imputed.fillna(imputed.mean())
    with np.errstate(invalid="ignore", divide="ignore"):
        full = np.corrcoef(imputed.to_numpy(), rowvar=False)
    return full[:len(guest_cols), len(guest_cols):]


def _check_report(report: pd.DataFrame, frame: pd.DataFrame) -> None:
    desc = frame.describe(percentiles=QS)
    np.testing.assert_array_equal(report["missing"].to_numpy(), frame.isna().sum().to_numpy())
    np.testing.assert_array_equal(report["unique"].to_numpy(), frame.nunique().to_numpy())
    assert (report["rows"] == len(frame)).all()
    for col in frame.columns:
        for stat in ("mean", "std", "min", "max"):
            assert report.loc[col, stat] == pytest.approx(desc.loc[stat, col], rel=1e-12, abs=1e-15), (col, stat)
        for q in QS:
            assert report.loc[col, f"q{q:g}"] == pytest.approx(desc.loc[f"{q * 100:g}%", col], rel=1e-12), (col, q)


@pytest.mark.slow
def test_statistics_job_over_party_processes(tmp_path):
    """Guest + one host as real processes with gRPC and mutual TLS; reveal_to guest (the default)."""
    job, guest_csv, host_csv = _job(tmp_path, {"quantiles": QS})
    t0 = time.monotonic()
    # one inline Paillier worker per party: a job this small would only wait for a process pool to start
    proc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", "60"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SECUREFLHV_WORKERS": "1"})
    took = time.monotonic() - t0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert took < 90, took  # ~15 s on an idle 2-core machine; a hang would hit the 60 s job timeout
    out = job.parent / "out"
    joined = _joined(guest_csv, host_csv)
    assert len(joined) == 51
    guest_cols, host_cols = ["g_a", "g_b", "g_const"], ["h_x", "h_y", "h_z"]

    corr = pd.read_csv(out / "guest" / "correlation.csv", index_col=0)
    assert list(corr.index) == guest_cols and list(corr.columns) == [f"host-1/{c}" for c in host_cols]
    expected = _expected_r(joined, guest_cols, host_cols)
    assert np.isnan(corr.loc["g_const"]).all() and np.isnan(expected[2]).all()
    np.testing.assert_allclose(corr.to_numpy()[:2], expected[:2], rtol=0, atol=1e-9)
    assert abs(corr.loc["g_a", "host-1/h_x"]) > 0.3
    assert (out / "guest" / "correlation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "host-1" / "correlation.csv").exists() and not (out / "host-1" / "correlation.png").exists()

    doc = json.loads((out / "guest" / "statistics.json").read_text())
    assert doc["n_rows"] == 51 and doc["correlation"]["learned"] is True
    r = np.array(doc["correlation"]["matrices"]["host-1"]["r"], dtype=float)  # null -> NaN
    np.testing.assert_allclose(r[:2], expected[:2], rtol=0, atol=1e-9)
    host_doc = json.loads((out / "host-1" / "statistics.json").read_text())
    assert host_doc["correlation"]["learned"] is False and host_doc["correlation"]["matrices"] == {}

    _check_report(pd.read_csv(out / "guest" / "columns.csv", index_col=0), joined[guest_cols])
    _check_report(pd.read_csv(out / "host-1" / "columns.csv", index_col=0), joined[host_cols])
    assert doc["columns"]["g_a"]["missing"] == int(joined["g_a"].isna().sum()) > 0


# --------------------------------------------------------------------------------------- in process
def _run_in_process(job: Path) -> tuple[dict, dict]:
    """Every party's ``vertical_statistics.run`` in a thread over one InProcessNetwork: (results, errors)."""
    cfg, params = load_job_params(job)
    net = InProcessNetwork(cfg.job.id, [p.id for p in cfg.parties], deadline=30)
    return run_threads({p.id: partial(vertical_statistics.run, cfg, p, net.transport(p.id), params)
                        for p in cfg.parties}, timeout=60)


def test_reveal_to_host_training_rows_with_label(tmp_path):
    job, guest_csv, host_csv = _job(tmp_path, {"reveal_to": "host", "rows": "train", "test_fraction": 0.2,
                                                "split_seed": 3, "include_label": True, "quantiles": QS})
    results, errors = _run_in_process(job)
    assert not errors, errors
    assert results["guest"]["learned"] == 0 and results["host-1"]["learned"] == 1
    out = job.parent / "out"
    assert not (out / "guest" / "correlation.csv").exists()
    guest_doc = json.loads((out / "guest" / "statistics.json").read_text())
    assert guest_doc["correlation"]["matrices"] == {} and guest_doc["rows"] == "train"
    # the training rows of the split, independently: PSI orders the common ids, then the seeded split
    joined = _joined(guest_csv, host_csv)
    perm = np.random.default_rng(3).permutation(len(joined))
    train = np.sort(perm[int(round(0.2 * len(joined))):])
    psi_ids = _psi_order(out)
    rows = [psi_ids[i] for i in train]
    part = _joined(guest_csv, host_csv, rows)
    guest_cols, host_cols = ["g_a", "g_b", "g_const", "label"], ["h_x", "h_y", "h_z"]
    corr = pd.read_csv(out / "host-1" / "correlation.csv", index_col=0)
    assert list(corr.index) == guest_cols
    expected = _expected_r(part, guest_cols, host_cols)
    ok = ~np.isnan(expected)
    assert (np.isnan(corr.to_numpy()) == ~ok).all()
    np.testing.assert_allclose(corr.to_numpy()[ok], expected[ok], rtol=0, atol=1e-9)
    _check_report(pd.read_csv(out / "host-1" / "columns.csv", index_col=0), part[host_cols])
    _check_report(pd.read_csv(out / "guest" / "columns.csv", index_col=0), part[guest_cols])
    assert (out / "host-1" / "correlation.png").exists()


def _psi_order(out: Path) -> list[str]:
    """The aligned row order: the ids both parties hold, as PSI returns them (sorted: checked here)."""
    doc = json.loads((out / "guest" / "statistics.json").read_text())
    assert doc["psi"]["common_ids"] == 51
    g = pd.read_csv(out.parent.parent / "data" / "guest.csv", dtype={"id": str})["id"]
    h = pd.read_csv(out.parent.parent / "data" / "host.csv", dtype={"id": str})["id"]
    return sorted(set(g) & set(h))


def test_job_checks(tmp_path):
    job, _, _ = _job(tmp_path, {"quantiles": [0.5, 1.5]})
    with pytest.raises(JobConfigError, match="quantiles"):
        load_job_params(job)
    job2, g, h = _job(tmp_path / "b", {"reveal_to": "nobody"})
    with pytest.raises(JobConfigError, match="reveal_to"):
        load_job_params(job2)
    parties = [{"id": "server", "role": "server"}] + vertical_parties(g, [h], server=False, id_column="id",
                                                                      label_column="label")
    job3 = write_job(tmp_path / "c", "stats-server", "vertical_statistics", parties, {"key_bits": 512},
                     insecure_test_keys=True)
    with pytest.raises(JobConfigError, match="server"):
        load_job_params(job3)
