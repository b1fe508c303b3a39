"""Root-cause blame: the first failure of a job, with its party and reason, is what every party's last
line and the launcher's exit message name; abort texts from peers are untrusted."""
from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest
import yaml
from rich.console import Console

from secureflhv.runtime.process.blame import Blame, Failure, Stopped, clean, parse_reported, root_cause
from secureflhv.runtime.job.load import load_job
from secureflhv.runtime.process.launcher import Launcher
from secureflhv.transport import InProcessNetwork, JobAborted, PeerLost, PeerTimeout, PeerUnavailable
from secureflhv.transport.role import ProtocolRole

from job_harness import make_job

PARTIES = {"server", "guest", "host-1"}


@pytest.mark.parametrize("text, sender, expected", [
    ("host-1 failed: certificate expired", "host-1", Failure("host-1", "certificate expired")),
    # the role guard's own phrasing: the silent peer it names is the root, not the sender
    ("guest: PeerTimeout: guest: no valid message 'grad' (round 3) from 'host-1' within 10s: is 'host-1' still "
     "running?", "guest", Failure("host-1", "sent nothing for 10s (stopped or crashed?)")),
    ("guest: PeerUnavailable: guest: could not deliver 'x' (round 0, 5 bytes) to 'host-1' at 10.0.0.6:50553 within "
     "9.0s (4 attempts)", "guest", Failure("host-1", "could not be reached at 10.0.0.6:50553 (stopped or crashed?)")),
    # relayed: an abort that quotes an earlier abort keeps the earlier root
    ("guest: JobAborted: party 'host-1' aborted the job: host-1 failed: bad data", "guest",
     Failure("host-1", "bad data")),
    ("guest: Stopped: stopped because server failed: out of memory", "guest", Failure("server", "out of memory")),
    # a party that is not in the job is not believed: the sender is blamed
    ("mallory failed: everything", "guest", Failure("guest", "mallory failed: everything")),
    ("something broke", "server", Failure("server", "something broke")),
])
def test_abort_texts_are_traced_to_their_root(text, sender, expected):
    assert parse_reported(text, sender, PARTIES) == expected


def test_untrusted_text_is_cleaned_and_bounded():
    hostile = "host-1 failed: \x1b[2J\x1b[31mred\r\nFAKE LOG LINE\u202e" + "x" * 5000
    failure = parse_reported(hostile, "host-1", PARTIES)
    assert failure.party == "host-1"
    assert not any(ch in failure.reason for ch in "\x1b\r\n\u202e") and len(failure.reason) <= 400
    assert clean("a\x00b\tc") == "a b c"


def test_root_cause_of_a_partys_own_exceptions():
    assert root_cause(PeerTimeout("guest: no valid message 'w' (round 1) from 'server' within 5s"), "guest",
                      PARTIES) == Failure("server", "sent nothing for 5s (stopped or crashed?)")
    aborted = JobAborted("party 'server' aborted the job: server failed: disk full")
    assert root_cause(aborted, "guest", PARTIES) == Failure("server", "disk full")
    tls = PeerUnavailable("guest: TLS handshake with 'host-1' at 1.2.3.4:5 failed: bad certificate")
    assert root_cause(tls, "guest", PARTIES).party == "guest"  # a certificate problem is not the peer's silence
    assert root_cause(FileNotFoundError(2, "x", "/d/g.csv"), "guest", PARTIES) == Failure("guest",
                                                                                         "file not found: /d/g.csv")
    assert root_cause(Stopped(15, None), "guest", PARTIES) == Failure("guest", "terminated by signal 15 (SIGTERM)")
    first = Failure("host-1", "killed")
    assert str(Stopped(15, first)) == "stopped because host-1 failed: killed"
    assert first.line_for("guest") == "guest stopped because host-1 failed: killed"
    assert first.line_for("host-1") == "host-1 failed: killed"


def _raised_from(cause: BaseException, text: str) -> RuntimeError:
    try:
        try:
            raise cause
        except type(cause) as exc:
            raise RuntimeError(text) from exc
    except RuntimeError as wrapped:
        return wrapped


def test_root_cause_behind_an_algorithms_error_raised_from_a_transport_error():
    unreachable = PeerUnavailable("guest: could not deliver 'sb.start' (round 2, 9 bytes) to 'host-1' at "
                                  "host-1.wan.test:50051 within 6.0s (2 attempts; last error DEADLINE_EXCEEDED)")
    wrapped = _raised_from(unreachable, "host 'host-1' unreachable (tree 1, sending 'sb.start')")
    assert root_cause(wrapped, "guest", PARTIES) == Failure(
        "host-1", "could not be reached at host-1.wan.test:50051 (stopped or crashed?)")
    aborted = _raised_from(JobAborted("party 'server' aborted the job: server failed: disk full"), "stopped")
    assert root_cause(aborted, "guest", PARTIES) == Failure("server", "disk full")
    # a certificate problem stays this party's own failure, told in the algorithm's words
    tls = _raised_from(PeerUnavailable("guest: TLS handshake with 'host-1' at 1.2.3.4:5 failed"), "host unreachable")
    assert root_cause(tls, "guest", PARTIES) == Failure("guest", "host unreachable")
    assert root_cause(_raised_from(ValueError("x"), "bad data"), "guest", PARTIES).party == "guest"


class _Waiter(ProtocolRole):
    """A role that waits on ``peer`` for a message that never comes."""

    protocol = "waiting"

    def _peers(self):
        return sorted(PARTIES - {self.party_id})

    def wait_on(self, peer: str):
        return self._guarded(self.t.recv, peer, "x", timeout=0.2)


def test_a_silent_peer_blocked_on_a_lost_one_is_not_blamed():
    net = InProcessNetwork("j", sorted(PARTIES), deadline=2.0)
    server, guest = net.transport("server"), net.transport("guest")
    net.take_down("host-1")  # the guest is alive but owes the server nothing until host-1 answers it
    with pytest.raises(PeerLost) as caught:
        _Waiter(server).wait_on("guest")
    assert caught.value.sender == "guest" and isinstance(caught.value.__cause__, PeerTimeout)
    failure = root_cause(caught.value, "server", PARTIES)
    assert failure.party == "host-1" and "'guest' is running" in failure.reason, failure
    # the abort the guest got from the server names host-1 too
    with pytest.raises(JobAborted) as told:
        guest.recv("server", "y", timeout=0.1)
    assert root_cause(told.value, "guest", PARTIES).party == "host-1"


def test_a_silent_peer_is_blamed_when_nobody_else_is_lost():
    net = InProcessNetwork("j", sorted(PARTIES), deadline=2.0)
    with pytest.raises(PeerTimeout) as caught:
        _Waiter(net.transport("server")).wait_on("guest")
    assert not isinstance(caught.value, PeerLost)
    assert root_cause(caught.value, "server", PARTIES) == Failure("guest", "sent nothing for 0s (stopped or crashed?)")
    net.take_down("guest")  # the silent peer is the one gone
    with pytest.raises(PeerTimeout) as caught:
        _Waiter(net.transport("server")).wait_on("guest")
    assert not isinstance(caught.value, PeerLost)


def test_an_abort_blaming_our_silence_names_the_peer_we_waited_on():
    net = InProcessNetwork("j", sorted(PARTIES), deadline=2.0)
    guest = net.transport("guest")
    net.transport("server").abort("server: PeerTimeout: server: no valid message 'c' (round 2) from 'guest' "
                                  "within 10s: is 'guest' still running?", ["guest"])
    with pytest.raises(JobAborted) as caught:
        guest.recv("host-1", "fwd", timeout=1.0)
    assert caught.value.waiting_for == "host-1"
    failure = root_cause(caught.value, "guest", PARTIES)
    assert failure.party == "host-1" and "while guest waited on it" in failure.reason, failure
    # waiting on the very party that blamed us (alive: it just wrote): nothing to shift
    with pytest.raises(JobAborted) as caught:
        guest.recv("server", "w", timeout=1.0)
    assert root_cause(caught.value, "guest", PARTIES) == Failure("guest", "sent nothing for 10s (stopped or crashed?)")


def test_first_failure_wins():
    blame = Blame()
    assert blame.record(Failure("host-1", "a")) == Failure("host-1", "a")
    assert blame.record(Failure("guest", "b")) == Failure("host-1", "a")
    assert blame.first == Failure("host-1", "a")


@pytest.mark.slow
def test_killed_party_is_named_by_every_other_party_and_the_launcher(tmp_path):
    job = make_job(tmp_path)
    doc = yaml.safe_load(job.read_text())
    doc["params"].update(epochs=400, early_stopping_rounds=None, batch_size=4)
    doc["job"]["deadline_s"] = 60  # the others must not learn it from their own deadline
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    buffer = io.StringIO()
    launcher = Launcher(job, load_job(job), console=Console(file=buffer, width=300), grace_s=10)
    killed = threading.Event()

    def kill_host_during_training():
        end = time.monotonic() + 120
        while time.monotonic() < end:
            host = next((c for c in launcher.children if c.party_id == "host-1"), None)
            if host is not None and any("epoch 2/" in line for line in host.lines):
                os.killpg(host.proc.pid, signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.05)

    threading.Thread(target=kill_host_during_training, daemon=True).start()
    started = time.monotonic()
    rc = launcher.run(timeout_s=150)
    assert killed.is_set() and rc == 1
    assert time.monotonic() - started < 60
    last = buffer.getvalue().strip().splitlines()[-1]
    assert "host-1 failed first: was killed by signal 9 (SIGKILL)" in last, last
    assert "server, guest stopped because of it" in last, last
    for child in launcher.children:
        if child.party_id != "host-1":
            assert child.proc.returncode not in (0, None)
            assert f"{child.party_id} stopped because host-1 failed: was killed by signal 9" in child.lines[-1], \
                child.lines[-5:]
    # the job page tells the same story: the killed party (no last status) failed, the others name it
    from secureflhv.runtime.observe.dashboard import JobPage, entries

    page = JobPage("j", entries(load_job(job)), since=started - 60,
                   exit_codes=lambda: {c.party_id: c.proc.returncode for c in launcher.children})
    view = {p["id"]: p for p in page.job()["parties"]}
    assert view["host-1"]["state"] == "failed" and view["host-1"]["error"] == "host-1 was killed by signal 9"
    assert view["guest"]["state"] == "failed"
    assert view["guest"]["error"].startswith("guest stopped because host-1 failed: was killed by signal 9")
