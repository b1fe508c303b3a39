"""The main job (vertical LR: server, guest, host-1) with every party on its own network host under the
WAN profile (40 ms each way, 100 Mbit/s), real party processes over gRPC + mutual TLS, parties
reaching each other by host name with certificates issued for those names:

* the trained model equals the loopback run's (same seed), exactly;
* host-1's link down for 20 s in the middle of epoch 2 (of 2): the epoch resumes when the link is back and
  the model is still the loopback model;
* host-1's link down for good (longer than the job's deadline): every party stops, each naming a
  peer it could not reach (guest and server: host-1).
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography import x509

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netbed  # noqa: E402
from netbed import NetBed  # noqa: E402
from wan_harness import Loopback, failures, run_on_bed  # noqa: E402

from secureflhv.runtime.store.model_bundle import read_bundle  # noqa: E402
from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job  # noqa: E402

WHY = netbed.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=WHY or "")]

PARAMS = {"epochs": 2, "batch_size": 128, "learning_rate": 0.15, "key_bits": 1024, "early_stopping_rounds": None,
          "test_fraction": 0.25, "split_seed": 5, "seed": 7}
PARTIES = ["server", "guest", "host-1"]
OUTAGE_S = 20.0


@pytest.fixture(scope="module")
def vlr(tmp_path_factory):
    """The job's tables, its loopback job (running in the background from here on) and its result."""
    tmp = tmp_path_factory.mktemp("wan-vlr")
    guest_csv, host_csvs = breast_cancer_tables(tmp / "data", 1, seed=3, scheme="random")
    job = write_vertical_lr_job(tmp / "loopback", guest_csv, host_csvs, PARAMS, deadline_s=60,
                                insecure_test_keys=True)
    loop = Loopback(job)
    result = {}

    def reference():
        if not result:
            rc, out = loop.wait()
            assert rc == 0, out[-3000:]
            result.update(trained(job.parent / "out"))
        return result

    yield tmp, job, guest_csv, host_csvs, reference
    if loop.proc.poll() is None:
        loop.proc.kill()


def trained(out: Path) -> dict:
    """What the job learned: each party's parameter files (its bundle, signed under the job's CA next to
    ``out``) and the guest's loss history."""
    def files(party: str) -> dict:
        bundle = read_bundle(out / party, ca=out.parent / "certs" / "ca.pem")
        return {name: value.tolist() for name, value in bundle.files.items()}

    return {"guest": files("guest"), "host-1": files("host-1"),
            "loss": json.loads((out / "guest" / "metrics.json").read_text())["history"]["loss"]}


def test_main_job_over_wan_equals_loopback(vlr):
    tmp, job, _, _, reference = vlr
    with NetBed(PARTIES) as bed:
        wan_job = bed.adopt_job(job, tmp / "wan")
        runs = run_on_bed(bed, wan_job)
    assert all(r.code == 0 for r in runs.values()), failures(runs)
    # each party listened on its own host and was reached by name, with a certificate for that name
    for p in PARTIES:
        assert f"listening on {p}.wan.test:50051" in runs[p].text
        cert = x509.load_pem_x509_certificate((tmp / "wan" / "certs" / f"{p}.pem").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{p}.wan.test" in sans.get_values_for_type(x509.DNSName)
    assert trained(tmp / "wan" / "out") == reference()


def test_link_down_20s_mid_epoch_is_survived_with_the_same_model(vlr):
    tmp, job, _, _, reference = vlr
    events = {}
    with NetBed(PARTIES) as bed:
        def on_line(party, line):
            if party == "guest" and "epoch 1/2" in line and "down" not in events:
                events["down"] = time.monotonic()
                bed.link("host-1", False)
                back = lambda: (bed.link("host-1", True), events.update(up=time.monotonic()))  # noqa: E731
                threading.Timer(OUTAGE_S, back).start()

        wan_job = bed.adopt_job(job, tmp / "flap")
        runs = run_on_bed(bed, wan_job, on_line=on_line, log_level="DEBUG")
    assert all(r.code == 0 for r in runs.values()), failures(runs)
    assert events["up"] - events["down"] >= OUTAGE_S
    # the dead connection was noticed during the outage (keep-alive), and the message sent again
    assert any(events["down"] < t < events["up"] and "unreachable at" in line
               for r in runs.values() for t, line in r.lines), failures(runs)
    # epoch 2 was under way during the outage and finished only after the link came back
    assert runs["guest"].when("epoch 2/2") > events["up"]
    assert trained(tmp / "flap" / "out") == reference()


def test_link_down_for_good_stops_every_party_naming_the_unreachable_peer(vlr):
    tmp, _, guest_csv, host_csvs, _ = vlr
    deadline = 10
    job = write_vertical_lr_job(tmp / "dead", guest_csv, host_csvs, PARAMS, deadline_s=deadline,
                                insecure_test_keys=True)
    events = {}
    with NetBed(PARTIES) as bed:
        def on_line(party, line):
            if party == "guest" and "epoch 1/2" in line and "down" not in events:
                events["down"] = time.monotonic()
                bed.link("host-1", False)

        runs = run_on_bed(bed, bed.adopt_job(job, tmp / "dead-wan"), on_line=on_line, timeout=120)
    assert "down" in events, failures(runs)
    for p in PARTIES:
        assert runs[p].code == 1, runs[p].text[-3000:]
        # stopped within the deadline plus the abort and exit overheads, not hanging on the dead link
        assert runs[p].lines[-1][0] - events["down"] < 3 * deadline + 10, runs[p].text[-2000:]
    for p in ("guest", "server"):
        assert f"{p} stopped because host-1 failed:" in runs[p].last, runs[p].text[-3000:]
    # host-1 is the one cut off: it names a peer it could not reach or hear from
    assert re.search(r"host-1 stopped because (guest|server) failed: (sent nothing|could not be reached)",
                     runs["host-1"].last), runs["host-1"].text[-3000:]
