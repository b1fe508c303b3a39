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
