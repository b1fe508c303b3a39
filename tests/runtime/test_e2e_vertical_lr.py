"""End to end: real server / guest / host processes over gRPC with mutual TLS on loopback.

Checks the PSI result against the true id intersection, the trained weights against an independent
centralised Taylor-LR on the joined table (same rows, batches and seed), the artifacts, that a
killed host stops the others with a last line naming it, and that a broken party is found by preflight.
"""
from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from rich.console import Console

from secureflhv.runtime.store.model_bundle import read_bundle
from secureflhv.runtime.job.load import load_job
from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job
from secureflhv.runtime.process.launcher import Launcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vertical"))
from vlr_harness import reference_taylor_lr  # noqa: E402  (independent numpy reference)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from job_harness import assert_wire_consistent, wire_of  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resume_harness import kill_after, secureflhv  # noqa: E402  (secureflhv: other tests import it from here)

pytestmark = pytest.mark.slow

PARAMS = {"epochs": 3, "batch_size": 128, "learning_rate": 0.15, "lr_schedule": "constant", "momentum": 0.0,
          "l2": 0.01, "key_bits": 1024,
          "early_stopping_rounds": None, "test_fraction": 0.25, "split_seed": 5, "seed": 7}


def make_job(tmp_path, n_hosts=1, mode="arbiter", params=PARAMS, deadline=60, psi_protocol=None):
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", n_hosts, seed=3, scheme="random")
    job = write_vertical_lr_job(tmp_path / "job", guest_csv, host_csvs, params, mode=mode, deadline_s=deadline,
                                insecure_test_keys=True)
    if psi_protocol is not None:
        doc = yaml.safe_load(job.read_text())
        doc["job"]["psi_protocol"] = psi_protocol
        if psi_protocol == "kkrt":  # allowed only when the job declares its parties semi-honest
            doc["job"]["psi_security"] = "semi_honest"
        job.write_text(yaml.safe_dump(doc))
    return job, guest_csv, host_csvs


# the one-host run aligns its ids with the default ECDH-PSI, the two-host run with KKRT-PSI (job.psi_protocol,
# with job.psi_security: semi_honest)
@pytest.mark.parametrize("n_hosts, mode, psi", [(1, "arbiter", None), (2, "two_party", "kkrt")])
def test_trained_model_and_psi_match_centralised(tmp_path, n_hosts, mode, psi):
    job, guest_csv, host_csvs = make_job(tmp_path, n_hosts, mode, psi_protocol=psi)
    proc = secureflhv("run", str(job), "--timeout", "240")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "[guest]" in out and "[host-1]" in out  # prefixed party logs

    # PSI: exactly the ids every party holds, in code-point order
    tables = [pd.read_csv(p, dtype={"id": str}).set_index("id") for p in [guest_csv, *host_csvs]]
    common = sorted(set.intersection(*(set(t.index) for t in tables)))
    assert all(len(common) < len(t) for t in tables)  # every party had ids the others lack
    out_dir = job.parent / "out"
    split = json.loads((out_dir / "guest" / "split.json").read_text())
    assert sorted(split["train"] + split["test"]) == common
    ca = job.parent / "certs" / "ca.pem"
    guest_model = read_bundle(out_dir / "guest", ca=ca, expect_party="guest")
    assert json.loads((out_dir / "guest" / "metrics.json").read_text())["psi_common_ids"] == len(common)

    # centralised twin: join, same train rows (in PSI order), own-column standardisation, same batches
    joined = tables[0].join(tables[1:], how="inner").loc[common]
    y = joined.pop("label").to_numpy()
    train_idx = np.searchsorted(common, split["train"])
    X = joined.to_numpy(float)
    mu, sd = X[train_idx].mean(0), X[train_idx].std(0)
    sd[sd == 0] = 1
    Xs = (X - mu) / sd
    w_ref, b_ref, losses_ref = reference_taylor_lr(Xs[train_idx], y[train_idx], **PARAMS)
    ref = dict(zip(joined.columns, w_ref))

    fed = {}
    for bundle in [guest_model, *(read_bundle(out_dir / f"host-{h}", ca=ca) for h in range(1, n_hosts + 1))]:
        fed.update(zip(bundle.feature_names, bundle.file("weights.npy")))
    assert set(fed) == set(ref)
    names = sorted(ref)
    np.testing.assert_allclose([fed[k] for k in names], [ref[k] for k in names], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(guest_model.file("intercept.npy"), b_ref, rtol=1e-6, atol=1e-9)

    metrics = json.loads((out_dir / "guest" / "metrics.json").read_text())
    np.testing.assert_allclose(metrics["history"]["loss"], losses_ref, rtol=1e-6)
    assert metrics["metrics"]["test"]["auc"] > 0.97
    assert (out_dir / "guest" / "loss.png").stat().st_size > 1000
    if mode == "arbiter":
        assert read_bundle(out_dir / "server", ca=ca).role == "server"

    # bytes on the wire: every party wrote them, both ends of every link agree, and the guest sent at least
    # the Paillier ciphertexts [[d]] of every training row each epoch (1024-bit key: < 256 bytes each, ~256)
    parties = ["guest"] + [f"host-{h}" for h in range(1, n_hosts + 1)] + (["server"] if mode == "arbiter" else [])
    wire = wire_of(out_dir, parties)
    assert_wire_consistent(wire)
    for h in range(1, n_hosts + 1):
        d = wire["guest"]["peers"][f"host-{h}"]["by_tag"]["vlr.d"]
        assert d["sent"] >= PARAMS["epochs"] * len(split["train"]) * 250, d
        assert d["sent"] < PARAMS["epochs"] * len(split["train"]) * 300 + 10_000 * d["messages_sent"], d
        assert 0 < d["sent_framing"] < d["sent"]
    tags = set(wire["guest"]["peers"]["host-1"]["by_tag"])
    assert ("psi/kkrt/matrix" in tags) == (psi == "kkrt") and ("psi/points" in tags) == (psi is None), tags
    assert "bytes on the wire" in out and re.search(r"guest finished in [\d.]+s; sent [\d.]+ [kMG]?B \(\+", out)


def test_killed_host_stops_guest_and_server_within_deadline(tmp_path):
    deadline = 10
    job, _, _ = make_job(tmp_path, params={**PARAMS, "epochs": 200}, deadline=deadline)
    # killed once training is under way; whichever step each survivor is blocked in (the guest may be retrying
    # a delivery to the dead host while the server waits on the guest), both name host-1, never each other
    killed = kill_after(job, ("server", "guest", "host-1"), "host-1", "epoch 2/", wait_s=deadline + 30)
    assert killed.waited_s < deadline + 30
    for pid, last in killed.last_lines().items():
        assert f"{pid} stopped because host-1 failed:" in last, \
            f"{pid} did not name the dead host:\n{killed.outputs[pid][-3000:]}"


def test_launcher_preflight_names_the_party_and_starts_nothing(tmp_path):
    job, _, host_csvs = make_job(tmp_path, deadline=60)
    host_csvs[0].unlink()  # host-1 cannot read its data
    buffer = io.StringIO()
    launcher = Launcher(job, load_job(job), console=Console(file=buffer, width=300), grace_s=5)
    assert launcher.run(timeout_s=120) == 2
    assert launcher.children == []  # found before any party started
    out = buffer.getvalue()
    assert "parties[2].data.path (party 'host-1'): data file not found" in out and "host_1.csv" in out, out
