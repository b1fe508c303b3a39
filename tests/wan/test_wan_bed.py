"""The WAN test bed itself: names resolve per host, the relay adds its latency, tbf caps the rate,
a link taken down cuts the host off and heals when it comes back, a paused relay holds (not loses)
bytes, and teardown / sweep leave no namespace behind."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netbed  # noqa: E402
from netbed import NetBed  # noqa: E402

WHY = netbed.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

# host b: answers each connection's first line with "echo", then counts the bytes up to EOF and answers the count
SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 50051)); s.listen()
while True:
    c, _ = s.accept(); c.recv(1); c.sendall(b"e")
    n = 0
    while (x := c.recv(1 << 20)):
        n += len(x)
    c.sendall(str(n).encode()); c.close()
"""

# host a: connect to b by name, time a 1-byte round trip, send MB megabytes, print rtt, seconds and b's count
CLIENT = """
import socket, sys, time
c = socket.create_connection(("b.wan.test", 50051), timeout=float(sys.argv[2]))
t = time.monotonic(); c.sendall(b"x"); c.recv(1); rtt = time.monotonic() - t
data = b"0" * int(float(sys.argv[1]) * (1 << 20)); t = time.monotonic()
c.sendall(data); c.shutdown(socket.SHUT_WR); n = c.recv(100)
print(rtt, time.monotonic() - t, n.decode())
"""


def _client(bed: NetBed, mb: float, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(bed.command("a", [sys.executable, "-c", CLIENT, str(mb), str(timeout)]), capture_output=True,
                          text=True, timeout=timeout + 20)


@pytest.fixture
def bed():
    with NetBed(["a", "b"]) as b:
        server = b.popen("b", [sys.executable, "-c", SERVER])
        time.sleep(0.3)
        yield b
        server.kill()
        server.wait()


def test_names_latency_and_rate(bed):
    hosts = (netbed.NETNS_ETC / bed.ns("a") / "hosts").read_text()
    assert f"{bed.alias('b')} b.wan.test" in hosts and f"{bed.ip('a')} a.wan.test" in hosts
    r = _client(bed, 12)
    assert r.returncode == 0, r.stderr
    rtt, seconds, count = r.stdout.split()
    assert int(count) == 12 << 20  # every byte arrived, in one piece
    assert 2 * netbed.WAN_DELAY_S <= float(rtt) < 2 * netbed.WAN_DELAY_S + 0.1  # 40 ms each way
    mbit = 12 * 8 * 1.048576 / float(seconds)
    assert mbit < 1.1 * netbed.WAN_RATE_MBIT  # tbf holds the rate (measured ~80-95 Mbit/s here)


def test_link_down_cuts_the_host_off_and_up_heals(bed):
    bed.link("b", False)
    r = _client(bed, 0.001, timeout=4)
    assert r.returncode != 0  # the relay cannot reach b: a's connection is closed or times out
    bed.link("b", True)
    deadline = time.monotonic() + 15  # the veth comes back within a few seconds (carrier, neighbour discovery)
    while True:
        r = _client(bed, 0.001)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0 and r.stdout.split()[2] == str(int(0.001 * (1 << 20))), r.stderr


def test_pause_holds_bytes_until_resume(bed):
    bed.pause()
    proc = subprocess.Popen(bed.command("a", [sys.executable, "-c", CLIENT, "0.01", "20"]), stdout=subprocess.PIPE,
                            text=True)
    time.sleep(1.5)
    assert proc.poll() is None  # stalled, not failed
    bed.resume()
    out, _ = proc.communicate(timeout=20)
    rtt, _, count = out.split()
    assert float(rtt) > 1.0 and int(count) == int(0.01 * (1 << 20))


def test_teardown_and_sweep_leave_nothing():
    b = NetBed(["x"], rate_mbit=None).up()
    names = [b.router, b.ns("x")]
    b.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names) and not any((netbed.NETNS_ETC / n).exists() for n in names)
    # leftovers of a killed run (a process id that cannot exist: above pid_max) are swept
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    stale = f"{netbed.PREFIX}{dead}x0-r"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    (netbed.NETNS_ETC / stale).mkdir(parents=True, exist_ok=True)
    assert stale in netbed.sweep()
    assert stale not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not (netbed.NETNS_ETC / stale).exists()


def test_a_far_away_party_gets_its_own_delay(bed):
    bed.set_delay(0.2, "b")
    r = _client(bed, 0.001)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.split()[0]) >= 0.4  # 200 ms each way for b's connections
