"""A tiny vertical LR job with TLS certificates and two small CSV tables, for the runtime tests."""
from __future__ import annotations

from pathlib import Path

import yaml

from secureflhv.runtime.job.demo import write_vertical_lr_job

GUEST = "id,label,f1,f2\n" + "".join(f"u{i},{i % 2},{i * 0.5},{10 - i}\n" for i in range(8))
HOST = "id,h1,h2\n" + "".join(f"u{i},{i * 2},{i + 0.25}\n" for i in range(8))


def make_job(tmp_path: Path, guest: str = GUEST, host: str = HOST) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "guest.csv").write_text(guest)
    (data / "host_1.csv").write_text(host)
    return write_vertical_lr_job(tmp_path / "job", data / "guest.csv", [data / "host_1.csv"],
                                 {"epochs": 1, "key_bits": 1024}, insecure_test_keys=True)


def edit(job: Path, party: str, **changes) -> None:
    doc = yaml.safe_load(job.read_text())
    entry = next(p for p in doc["parties"] if p["id"] == party)
    for key, value in changes.items():
        if key.startswith("data_"):
            entry["data"][key[5:]] = value
        else:
            entry[key] = value
    job.write_text(yaml.safe_dump(doc, sort_keys=False))


def wire_of(out_dir: Path, parties) -> dict:
    """``{party: metrics.json["wire"]}`` of every party (the counts each wrote at the end of the job)."""
    import json

    return {p: json.loads((Path(out_dir) / p / "metrics.json").read_text())["wire"] for p in parties}


def assert_wire_consistent(wire: dict) -> None:
    """Every byte A says it sent to B, B says it received from A: per tag, payload and messages exactly
    (and framing too: both ends compute it from the same chunks); totals are the sums over peers."""
    for a, rep in wire.items():
        for b, sent in rep["peers"].items():
            got = wire[b]["peers"][a]
            for tag, s in sent["by_tag"].items():
                r = got["by_tag"].get(tag, {})
                pair = f"{a} -> {b}, tag {tag!r}"
                assert s["sent"] == r.get("received"), f"{pair}: sent {s['sent']}, received {r.get('received')}"
                assert s["messages_sent"] == r.get("messages_received"), pair
                assert s["sent_framing"] == r.get("received_framing"), pair
            assert sent["sent"] == got["received"] and sent["sent_framing"] == got["received_framing"], (a, b)
        for key in ("sent", "received", "sent_framing", "received_framing"):
            assert rep["total"][key] == sum(e[key] for e in rep["peers"].values()), (a, key)


def run_cli(*args, timeout: float = 300) -> tuple[int, str]:
    """``python -m secureflhv ARGS`` in a subprocess: (exit code, stdout and stderr together)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "secureflhv", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


def assert_prediction_job_reproduces(job: Path, work: Path, data: dict) -> None:
    """A prediction job derived from training ``job`` (in ``work``, on the tables ``data`` = {party: csv})
    gives exactly the in-job held-out probabilities of every row the training job held out."""
    import numpy as np
    import pandas as pd

    from secureflhv.runtime.algorithms.predict import write_predict_job

    in_job = pd.read_csv(job.parent / "out" / "guest" / "predictions.csv", dtype={"id": str})
    pjob = write_predict_job(job, work / "job.yaml", data=data, new_ports=True)
    code, log = run_cli("run", str(pjob), "--timeout", "120")
    assert code == 0, log[-3000:]
    pred = pd.read_csv(pjob.parent / "predictions" / "guest" / "predictions.csv", dtype={"id": str})
    both = in_job.merge(pred, on="id")
    assert len(both) == len(in_job) > 0
    assert np.array_equal(both["probability"].to_numpy(), both["score"].to_numpy())
