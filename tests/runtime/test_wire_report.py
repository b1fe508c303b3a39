"""Bytes on the wire in a party's reports: metrics.json["wire"], the closing log line, the launcher's table."""
import io
import json

from rich.console import Console

from job_harness import make_job
from secureflhv.runtime.job.load import load_job
from secureflhv.runtime.process.launcher import Launcher, _Child
from secureflhv.runtime.process.progress import WIRE_PREFIX
from secureflhv.runtime.observe.reports import human_bytes, save_wire_report, wire_line
from secureflhv.transport.wire import WireCounter

STATS = {"host-1": {"sent": 2_500_000, "received": 1234, "sent_framing": 3000, "received_framing": 40,
                    "messages_sent": 3, "messages_received": 2,
                    "by_tag": {"vlr.d": {"sent": 2_500_000, "received": 0, "sent_framing": 3000,
                                         "received_framing": 0, "messages_sent": 3, "messages_received": 0}}}}


def test_wire_key_added_to_an_existing_metrics_file_and_created_where_none(tmp_path):
    (tmp_path / "guest").mkdir()
    (tmp_path / "guest" / "metrics.json").write_text(json.dumps({"job_id": "j", "metrics": {"auc": 0.9}}))
    save_wire_report(tmp_path / "guest", "j", "guest", STATS)
    doc = json.loads((tmp_path / "guest" / "metrics.json").read_text())
    assert doc["metrics"] == {"auc": 0.9}  # kept
    assert doc["wire"]["peers"] == STATS and doc["wire"]["total"]["sent"] == 2_500_000
    save_wire_report(tmp_path / "host-1", "j", "host-1", {})  # a host writes no metrics of its own
    doc = json.loads((tmp_path / "host-1" / "metrics.json").read_text())
    assert doc["party_id"] == "host-1" and doc["wire"]["total"]["sent"] == 0


def test_wire_line_and_units():
    assert [human_bytes(n) for n in (0, 999, 1500, 2_500_000, 3.2e9)] == ["0 B", "999 B", "1.5 kB", "2.50 MB",
                                                                          "3.20 GB"]
    assert wire_line(STATS) == "sent 2.50 MB (+3.0 kB framing), received 1.2 kB (+40 B framing), 1 peer"
    c = WireCounter()
    c.record_sent("a", "t", 10, 1)
    c.record_sent("b", "t", 10, 1)
    assert wire_line(c.stats()).endswith("2 peers")


def test_launcher_reads_wire_events_and_prints_the_table(tmp_path):
    job = make_job(tmp_path)
    buf = io.StringIO()
    launcher = Launcher(job, load_job(job), console=Console(file=buf, width=200))
    guest, host = _Child("guest", None, "cyan"), _Child("host-1", None, "green")
    launcher.children = [guest, host]
    launcher._print(guest, WIRE_PREFIX + json.dumps(STATS))
    launcher._print(host, WIRE_PREFIX + "{not json")  # shown as text, not a crash
    assert guest.wire == STATS and host.wire is None
    launcher.print_wire_table()
    out = buf.getvalue()
    assert "bytes on the wire" in out and "{not json" in out
    row = next(line for line in out.splitlines() if "guest" in line and "host-1" in line)
    assert "2.500" in row and "0.001" in row and "3 / 2" in row


def test_live_events_follow_the_counts_without_per_tag_detail(capsys, monkeypatch):
    import threading
    import time

    from secureflhv.runtime.process import party
    from secureflhv.transport import InProcessNetwork

    monkeypatch.setattr(party, "WIRE_EVERY_S", 0.02)
    net = InProcessNetwork("j", ["guest", "host-1"])
    guest, stop = net.transport("guest"), threading.Event()
    live = party._live_wire(guest, stop)
    guest.send("host-1", "t", b"x" * 100)
    time.sleep(0.3)
    stop.set()
    live.join(1.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(WIRE_PREFIX)]
    assert len(lines) == 1  # only when the counts changed
    event = json.loads(lines[0][len(WIRE_PREFIX):])
    assert event["host-1"]["sent"] == 100 and "by_tag" not in event["host-1"]
    assert not live.is_alive()
