"""The job page: status files written from progress events, and what the page serves (and refuses)."""
from __future__ import annotations

import http.client
import json
import logging
import os
import time
from pathlib import Path

import pytest

from secureflhv.cli import build_parser
from secureflhv.runtime.process import progress
from secureflhv.runtime.observe.dashboard import DashboardServer, JobPage, PartyEntry
from secureflhv.runtime.observe.status import STATUS_FILE, PartyStatus, read_status

SECRET = "TOP-SECRET-ROW-4242"


class _WireTransport:
    def wire_stats(self):
        return {"host-1": {"sent": 1200, "received": 3400, "note": "dropped: not a number"}}


def test_status_file_follows_progress_logs_and_end(tmp_path):
    path = tmp_path / "out" / "guest" / STATUS_FILE
    status = PartyStatus(path, "job-1", "guest", "guest").start()
    try:
        assert read_status(path)["state"] == "starting"
        status.attach(_WireTransport())
        status.set_state("running")
        progress.emit_progress("epochs", 1, 4, "loss 0.7", {"loss": 0.7})
        time.sleep(0.05)
        progress.emit_progress("epochs", 2, 4, "loss 0.5", {"loss": 0.5, "broken": float("nan")})
        logging.getLogger("secureflhv.test").warning("hello from the party")
        status.finish({"test": {"auc": 0.91, "n": 10}, "name": "not a number", "flag": True})
    finally:
        status.close()
    doc = read_status(path)
    assert doc["state"] == "done" and doc["job_id"] == "job-1" and doc["role"] == "guest"
    assert doc["curves"] == {"loss": [[1, 0.7], [2, 0.5]]}  # NaN left out: JSON has none
    assert doc["curve_steps"] == {"loss": "epochs"}
    task = doc["tasks"]["epochs"]
    assert (task["done"], task["total"], task["info"]) == (2, 4, "loss 0.5")
    assert task["eta_s"] is not None and 0 < task["eta_s"] < 5  # two steps to go at the measured rate
    assert doc["wire"] == {"host-1": {"sent": 1200, "received": 3400}}
    assert doc["final"] == {"test.auc": 0.91, "test.n": 10.0}
    assert any("hello from the party" in line for line in doc["log"])
    assert [p.name for p in path.parent.iterdir()] == [STATUS_FILE]  # no temporary file left behind
    # the listener is gone after close: later events do not touch the file
    progress.emit_progress("epochs", 3, 4, "", {"loss": 0.1})
    assert read_status(path)["curves"]["loss"][-1] == [2, 0.5]


def test_status_without_wire_counters_and_failure(tmp_path):
    status = PartyStatus(tmp_path / STATUS_FILE, "j", "host-1", "host").start()
    status.attach(object())  # a transport that counts nothing yet
    status.fail("host-1 failed: boom")
    status.close()
    doc = read_status(tmp_path / STATUS_FILE)
    assert doc["state"] == "failed" and doc["error"] == "host-1 failed: boom" and doc["wire"] == {}


# ---------------------------------------------------------------------------------------------- the page
def _write_status(out: Path, party: str, **fields) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"format": "secureflhv.status/1", "job_id": "j", "party_id": party, "role": "guest", "state": "running",
           "started": time.time(), "updated": time.time(), "tasks": {}, "curves": {}, "log": [], "wire": {},
           "final": {}, "error": None, **fields}
    (out / STATUS_FILE).write_text(json.dumps(doc))


@pytest.fixture
def job_dir(tmp_path):
    root = tmp_path / "job"
    (root / "certs").mkdir(parents=True)
    (root / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nSECRETCERT\n")
    (root / "job.yaml").write_text("job: secret-job-file\n")
    guest, host = root / "out" / "guest", root / "out" / "host-1"
    _write_status(guest, "guest", state="done", curves={"loss": [[1, 0.7], [2, 0.5]]},
                  tasks={"epochs": {"done": 2, "total": 2, "info": "loss 0.5", "eta_s": 0}},
                  wire={"host-1": {"sent": 10, "received": 20}}, final={"test.auc": 0.9}, log=["guest: done"])
    (guest / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (guest / "guest.key").write_text("-----BEGIN PRIVATE KEY-----\nSECRETKEY\n")
    (guest / "predictions.csv").write_text(f"id,label\n{SECRET},1\n")
    (guest / "model.json").write_text(json.dumps({"weights": [SECRET]}))
    (guest / "evil.png").symlink_to(root / "certs" / "ca.pem")  # a link, even with a plot's name, is not served
    host.mkdir(parents=True)
    return root


@pytest.fixture
def served(job_dir):
    parties = [PartyEntry("guest", "guest", job_dir / "out" / "guest"),
               PartyEntry("host-1", "host", job_dir / "out" / "host-1")]
    page = JobPage("j", parties, since=time.time() - 5, exit_codes=lambda: {"guest": 0, "host-1": None})
    server = DashboardServer(page, port=0).start()
    yield server
    server.stop()


def _get(server: DashboardServer, path: str, host: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.putrequest("GET", path, skip_host=True)  # the path goes out exactly as written (no normalising)
    conn.putheader("Host", host or f"127.0.0.1:{server.port}")
    conn.endheaders()
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_page_serves_the_job_view(served):
    status, headers, body = _get(served, "/api/job")
    assert status == 200 and headers["content-type"].startswith("application/json")
    job = json.loads(body)
    assert job["job_id"] == "j" and job["state"] == "running"  # host-1 has not written its status yet
    guest, host = job["parties"]
    assert guest["state"] == "done" and guest["curves"]["loss"] == [[1, 0.7], [2, 0.5]]
    assert guest["wire"] == {"host-1": {"sent": 10, "received": 20}} and guest["final"] == {"test.auc": 0.9}
    assert guest["plots"] == ["loss.png"]  # not evil.png (a link), not the key, the CSV or the model
    assert host["state"] == "waiting" and host["plots"] == []
    assert _get(served, "/files/guest/loss.png")[2].startswith(b"\x89PNG")
    status, headers, html = _get(served, "/")
    assert status == 200 and b'<script src="app.js">' in html
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    assert b"http" not in _get(served, "/app.js")[2].replace(b"http://www.w3.org/2000/svg", b"")  # nothing remote


@pytest.mark.parametrize("path", [
    "/files/guest/../../job.yaml", "/files/guest/..%2f..%2fjob.yaml", "/files/guest/%2e%2e/%2e%2e/job.yaml",
    "/files/../certs/ca.pem", "/files/guest/..%2F..%2Fcerts%2Fca.pem", "/files/guest/guest.key",
    "/files/guest/predictions.csv", "/files/guest/model.json", "/files/guest/status.json", "/files/guest/evil.png",
    "/files/host-1/..%2fguest%2floss.png", "/files/nobody/loss.png", "/files/guest/loss.png%00.key",
    "/files/guest//etc/passwd", "/job.yaml", "/certs/ca.pem", "/api/../job.yaml",
])
def test_only_whitelisted_files_leave(served, path):
    status, _, body = _get(served, path)
    assert status in (400, 403, 404), (path, status)
    assert b"SECRET" not in body and b"secret-job-file" not in body


def test_nothing_secret_in_the_view(served):
    body = _get(served, "/api/job")[2]
    for text in (SECRET.encode(), b"SECRETKEY", b"SECRETCERT", b"PRIVATE KEY", b"secret-job-file"):
        assert text not in body


def test_foreign_host_header_is_refused(served):
    status, _, body = _get(served, "/api/job", host="attacker.example:80")  # DNS rebinding
    assert status == 403 and b"guest" not in body
    assert _get(served, "/api/job", host=f"localhost:{served.port}")[0] == 200


def test_stale_status_and_dead_party(job_dir):
    out = job_dir / "out"
    _write_status(out / "host-1", "host-1", started=time.time() - 3600, state="done")  # an earlier run's file
    page = JobPage("j", [PartyEntry("host-1", "host", out / "host-1")], since=time.time() - 5)
    assert page.party_view(page.parties["host-1"], None)["state"] == "waiting"
    _write_status(out / "host-1", "host-1", started="soon", state="done")  # malformed: ignored, no crash
    assert page.party_view(page.parties["host-1"], None)["state"] == "waiting"
    _write_status(out / "host-1", "host-1", state="running")
    killed = page.party_view(page.parties["host-1"], -9)
    assert killed["state"] == "failed" and killed["error"] == "host-1 was killed by signal 9"
    assert page.party_view(page.parties["host-1"], 1)["error"] == "host-1 exited with code 1"


def test_non_local_bind_warns(job_dir, caplog):
    page = JobPage("j", [], since=0)
    with caplog.at_level(logging.WARNING, logger="secureflhv.dashboard"):
        server = DashboardServer(page, host="0.0.0.0", port=0)
    server.httpd.server_close()
    assert "not only on this machine" in caplog.text
    assert page.allowed_hosts is None and server.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("command", [["run", "job.yaml"], ["party", "job.yaml", "--party", "guest"]])
def test_cli_options(command):
    parser = build_parser()
    assert parser.parse_args(command).dashboard is None  # off unless asked
    args = parser.parse_args([*command, "--dashboard"])
    assert (args.dashboard, args.dashboard_host, args.dashboard_wait) == (8765, "127.0.0.1", 0.0)
    args = parser.parse_args([*command, "--dashboard", "0", "--dashboard-wait", "30"])
    assert (args.dashboard, args.dashboard_wait) == (0, 30.0)


def test_status_dir_unwritable_does_not_fail(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    status = PartyStatus(blocker / STATUS_FILE, "j", "guest", "guest")  # its folder cannot be made
    with caplog.at_level(logging.WARNING):
        status.start()
        status.set_state("running")
        status.close()
    assert caplog.text.count("cannot write the status file") == 1
    assert not os.path.exists(blocker / STATUS_FILE)


@pytest.mark.slow
def test_party_dashboard_serves_its_own_party_only(tmp_path):
    """Three real ``secureflhv party`` processes; the guest's organisation opens its own job page."""
    import re
    import signal
    import subprocess
    import sys
    import threading
    import urllib.request

    import yaml
    from job_harness import make_job

    job = make_job(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["params"]["epochs"] = 3
    job.write_text(yaml.safe_dump(doc, sort_keys=False))

    def party(pid, *extra):
        return subprocess.Popen([sys.executable, "-m", "secureflhv", "party", str(job), "--party", pid, *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    guest = party("guest", "--dashboard", "0", "--dashboard-wait", "60")
    others = [party("server"), party("host-1")]
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(line.rstrip("\n") for line in guest.stdout), daemon=True).start()
    try:
        end, url, seen = time.monotonic() + 180, None, []
        while time.monotonic() < end:
            url = url or next((m.group(1) for line in list(out) if (m := re.match(r"job page: (\S+)$", line))), None)
            if url:
                job_view = json.loads(urllib.request.urlopen(url + "api/job", timeout=5).read())
                seen.append(job_view["state"])
                if job_view["state"] in ("done", "failed") and any("stays up" in line for line in out):
                    break
            time.sleep(0.3)
        assert url and seen and seen[-1] == "done", "\n".join(out[-30:])
        assert [p["id"] for p in job_view["parties"]] == ["guest"]  # one organisation's page: its own party
        mine = job_view["parties"][0]
        assert [pt[0] for pt in mine["curves"]["loss"]] == [1, 2, 3] and "loss.png" in mine["plots"]
        assert "train.accuracy" in mine["final"]
        assert urllib.request.urlopen(url + "files/guest/loss.png", timeout=5).read()[:4] == b"\x89PNG"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "files/host-1/loss.png", timeout=5)
        assert refused.value.code == 404
        guest.send_signal(signal.SIGINT)  # closes the page early; the party's exit code stays
        assert guest.wait(timeout=30) == 0
        assert all(p.wait(timeout=60) == 0 for p in others)
    finally:
        for p in (guest, *others):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_busy_port_is_a_clear_error_before_any_party_starts(tmp_path, capsys):
    import socket

    from job_harness import make_job

    from secureflhv.cli import main

    job = make_job(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        rc = main(["run", str(job), "--dashboard", str(busy.getsockname()[1])])
    assert rc == 2
    assert "cannot serve the job page on 127.0.0.1:" in capsys.readouterr().err
    assert not (job.parent / "out").exists()  # nothing ran
