"""A link down for good (longer than the job's deadline) under the WAN profile stops every party of the
other families too, each last line naming a peer it could not reach or hear from (the main job's case
is in test_wan_vertical_lr.py):

* vertical SecureBoost: host-1 cut off after the first tree: guest names host-1, host-1 names guest;
* horizontal FL: the server cut off after round 1: every client names the server (within its
  secure-aggregation wait, input_timeout_s + 5 x stage_timeout_s); the server names the clients it lost.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netbed  # noqa: E402
from netbed import NetBed  # noqa: E402
from test_wan_horizontal_tree import HFL, SB, blob_shards  # noqa: E402
from wan_harness import failures, run_on_bed  # noqa: E402

from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job  # noqa: E402

WHY = netbed.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=WHY or "")]
DEADLINE = 10  # each party waits out two of them after the cut (a silent wait, then a probe): the tests' length


def _cut_when(bed: NetBed, events: dict, who: str, text: str, victim: str):
    def on_line(party, line):
        if party == who and text in line and "down" not in events:
            events["down"] = time.monotonic()
            bed.link(victim, False)
    return on_line


def _stopped_in_time(runs, events, budget: float) -> None:
    """Every party exited with 1 within ``budget`` (its longest wait for a peer) plus abort/exit overheads."""
    assert "down" in events, failures(runs)
    for p, r in runs.items():
        assert r.code == 1, f"{p}:\n{r.text[-3000:]}"
        assert r.lines[-1][0] - events["down"] < budget + 20, r.text[-2000:]


def test_secureboost_host_cut_off_for_good(tmp_path):
    guest_csv, host_csvs = breast_cancer_tables(tmp_path / "data", 1, seed=3, scheme="random")
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    job = write_job(tmp_path / "src", "sb-cut", "secureboost_vertical", parties, {**SB, "n_trees": 4},
                    deadline_s=DEADLINE, insecure_test_keys=True)
    events = {}
    with NetBed(["guest", "host-1"]) as bed:
        runs = run_on_bed(bed, bed.adopt_job(job, tmp_path / "wan"), timeout=120,
                          on_line=_cut_when(bed, events, "guest", "tree 1 (", "host-1"))
    _stopped_in_time(runs, events, 2 * DEADLINE)
    assert "guest stopped because host-1 failed:" in runs["guest"].last, runs["guest"].text[-3000:]
    assert re.search(r"host-1 stopped because guest failed: (sent nothing|could not be reached)",
                     runs["host-1"].last), runs["host-1"].text[-3000:]


def test_horizontal_server_cut_off_for_good(tmp_path):
    shards = blob_shards(tmp_path / "shards", 3)
    parties = [{"id": "server", "role": "server"}]
    parties += [{"id": f"client-{i}", "role": "guest" if i == 1 else "host", "data": {"path": str(s)}}
                for i, s in enumerate(shards, 1)]
    # a client waits for the server up to input_timeout_s + 5 stage_timeout_s (it outwaits a slow round)
    stage, inputs = 4, 10
    params = {**HFL, "rounds": 3, "aggregation": {**HFL["aggregation"], "stage_timeout_s": stage,
                                                  "input_timeout_s": inputs}}
    job = write_job(tmp_path / "src", "hfl-cut", "horizontal", parties, params, deadline_s=DEADLINE)
    events = {}
    with NetBed([p["id"] for p in parties]) as bed:
        runs = run_on_bed(bed, bed.adopt_job(job, tmp_path / "wan"), timeout=120,
                          on_line=_cut_when(bed, events, "server", "round 1/3", "server"))
    _stopped_in_time(runs, events, max(DEADLINE, inputs + 5 * stage))
    for c in ("client-1", "client-2", "client-3"):
        assert re.search(rf"{c} stopped because server failed: (sent nothing|could not be reached)", runs[c].last), \
            runs[c].text[-3000:]
    assert "client-" in runs["server"].last, runs["server"].text[-3000:]
