"""Horizontal secure aggregation and vertical SecureBoost with every party on its own network host under
the WAN profile (40 ms each way, 100 Mbit/s), real party processes over gRPC + mutual TLS.

Horizontal FL (server + 3 clients, Bonawitz secure aggregation, t = 2; client-3 250 ms each way from the
others, a far-away silo): client-3's link is cut for good
in round 1 right after the server has its key shares (stage 1), i.e. after its pairwise masks are in
the other clients' inputs: the server must recover those masks from the survivors' shares. What is
compared: the WAN run's round records (round 1 selected all three, survived client-1 and client-2,
dropped client-3; round 2 selected the two survivors) and its global model, which must equal, array
for array and exactly, the global model of the same job on loopback with client-3 left out (secure
aggregation yields exactly the sum of the survivors' quantised updates, and each client's training and
rounding depend only on its own data, seed and id).

Vertical SecureBoost (guest + host-1, 1024-bit test Paillier key): the guest's model (trees, host splits
as record ids) and the host's split table equal the loopback run's.
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netbed  # noqa: E402
from netbed import NetBed  # noqa: E402
from wan_harness import Loopback, failures, run_on_bed  # noqa: E402

from secureflhv.data import Dataset, partition, write_shards  # noqa: E402
from secureflhv.runtime.store.model_bundle import read_bundle  # noqa: E402
from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job  # noqa: E402

WHY = netbed.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=WHY or "")]

HFL = {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 16, "n_classes": 10}, "rounds": 2,
       "local_epochs": 2, "batch_size": 32, "learning_rate": 0.1, "momentum": 0.9, "seed": 3, "test_fraction": 0.2,
       # t = 2 of 3 so that a client may be cut off (no colluder tolerated); the loopback reference run has two
       # clients: the explicit two-client opt-in
       "aggregation": {"kind": "secagg", "clip": 1.0, "stage_timeout_s": 6, "seed": 11, "max_colluders": 0,
                       "min_clients": 2}}
FAR_S = 0.25
SB = {"n_trees": 2, "max_depth": 3, "learning_rate": 0.3, "max_bin": 16, "key_bits": 1024, "shuffle_seed": 1,
      "test_fraction": 0.3, "split_seed": 5}


def blob_shards(tmp: Path, n_clients: int) -> list[Path]:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1.5, (10, 16))
    y = rng.integers(0, 10, 600)
    ds = Dataset((centres[y] + rng.normal(0, 0.7, (600, 16))).astype(np.float32), y, name="blobs")
    return write_shards(ds, partition("label_dirichlet", ds, n_clients, seed=1, beta=0.5), tmp, fmt="npz")


def hfl_job(work: Path, shards: list[Path]) -> Path:
    parties = [{"id": "server", "role": "server"}]
    parties += [{"id": f"client-{i}", "role": "guest" if i == 1 else "host", "data": {"path": str(s)}}
                for i, s in enumerate(shards, 1)]
    return write_job(work, "hfl-wan", "horizontal", parties, HFL, deadline_s=30)


def test_secure_aggregation_recovers_a_client_cut_off_mid_round(tmp_path):
    shards = blob_shards(tmp_path / "shards", 3)
    job = hfl_job(tmp_path / "wan-src", shards)
    loop = Loopback(hfl_job(tmp_path / "loopback", shards[:2]))  # the same job without client-3
    cut = threading.Event()
    try:
        with NetBed(["server", "client-1", "client-2", "client-3"]) as bed:
            # client-3 is far away (250 ms each way): its masked input needs >= 2 x 250 ms after the
            # trigger below, which leaves the cut ample time even on a loaded machine
            bed.set_delay(FAR_S, "client-3")
            def on_line(party, line):
                # the server holds client-3's key shares (stage 1 of round 1): cut it off before its masked input
                if (party == "server" and "received 'agg.share'" in line and "from client-3" in line
                        and not cut.is_set()):
                    cut.set()
                    bed.cut("client-3")

            runs = run_on_bed(bed, bed.adopt_job(job, tmp_path / "wan"), on_line=on_line, log_level="DEBUG",
                              give_up={"client-3"})
        rc, out = loop.wait()
    finally:
        if loop.proc.poll() is None:
            loop.proc.kill()
    assert cut.is_set(), failures(runs)
    assert all(runs[p].code == 0 for p in ("server", "client-1", "client-2")), failures(runs)
    assert rc == 0, out[-3000:]
    server_log = runs["server"].text
    assert "received 'agg.share' round" in server_log  # (the cut's trigger) client-3 is in U2 ...
    assert not any("received 'agg.masked'" in line and "from client-3" in line for line in server_log.splitlines())
    # ... but not in U3: its pairwise masks had to be recovered from the survivors' shares
    rounds = json.loads((tmp_path / "wan" / "out" / "server" / "metrics.json").read_text())["rounds"]
    assert rounds[0]["selected"] == ["client-1", "client-2", "client-3"]
    assert rounds[0]["survivors"] == ["client-1", "client-2"] and rounds[0]["dropped"] == ["client-3"]
    assert rounds[1]["selected"] == ["client-1", "client-2"]
    wan = np.load(tmp_path / "wan" / "out" / "server" / "global_model.npz")
    ref = np.load(tmp_path / "loopback" / "out" / "server" / "global_model.npz")
    assert sorted(wan.files) == sorted(ref.files)
    for name in ref.files:
        assert np.array_equal(wan[name], ref[name]), name


def test_vertical_secureboost_over_wan_equals_loopback(tmp_path):
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", 1, seed=3, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    job = write_job(tmp_path / "loopback", "sb-wan", "secureboost_vertical", parties, SB, deadline_s=60,
                    insecure_test_keys=True)
    loop = Loopback(job)
    try:
        with NetBed(["guest", "host-1"]) as bed:
            runs = run_on_bed(bed, bed.adopt_job(job, tmp_path / "wan"))
        rc, out = loop.wait()
    finally:
        if loop.proc.poll() is None:
            loop.proc.kill()
    assert all(r.code == 0 for r in runs.values()), failures(runs)
    assert rc == 0, out[-3000:]
    def model(run: str, party: str):  # the guest's trees, a host's split table
        bundle = read_bundle(tmp_path / run / "out" / party, ca=tmp_path / run / "certs" / "ca.pem")
        return bundle.file("model.json" if party == "guest" else "split_table.json")

    for p in ("guest", "host-1"):
        assert model("wan", p) == model("loopback", p), p
    assert len(model("wan", "guest")["trees"]) == SB["n_trees"]
