"""A party killed with SIGKILL leaves no process behind (issue 42; :mod:`secureflhv.compute.lifeline`).

A real party (``secureflhv party job.yaml --party guest``) starts its Paillier pool while it waits for its
peers: the multiprocessing resource tracker, the forkserver and the workers. Killed with SIGKILL, it used to
leave all of them running, re-parented, for good (4 processes with 2 workers). Here every process the party
started must be gone within a few seconds; likewise for a script holding the PSI pool and a Paillier pool
started from a thread that ended before the kill (``PR_SET_PDEATHSIG`` follows the forking thread: the
pool must outlive that thread and still die with the process), and for a Ray driver (slow: starts a cluster).
Processes are found in ``/proc``: each party runs in its own session, so everything it started carries
its session id even once re-parented.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from job_harness import make_job

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GONE_WITHIN_S = 5.0  # lifeline polls every 0.5 s; the rest is slack for a loaded 2-core machine


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, ...); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _session(sid: int) -> dict[int, str]:
    """Live (not zombie) processes of session ``sid``: pid -> command line."""
    found = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st and st[0] != "Z" and int(st[3]) == sid:
                try:
                    found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
                except OSError:
                    continue
    return found


def _start(cmd: list[str], log: Path, **env) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **env}, start_new_session=True)


def _wait_for(cond, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"{what} not seen within {timeout}s" + (f"; log:\n{log.read_text()[-3000:]}" if log else ""))


def _kill_and_expect_none_left(proc: subprocess.Popen) -> float:
    """SIGKILL ``proc``; assert that its whole session ends within GONE_WITHIN_S; returns the seconds it took."""
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    left = _session(proc.pid)
    while left and time.monotonic() - t0 < GONE_WITHIN_S:
        time.sleep(0.1)
        left = _session(proc.pid)
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"orphans {GONE_WITHIN_S}s after the party's SIGKILL: {left}"
    return time.monotonic() - t0


def _pool_processes(sid: int) -> dict[str, list[int]]:
    procs = _session(sid)
    return {"tracker": [p for p, c in procs.items() if "resource_tracker" in c],
            "forked": [p for p, c in procs.items() if "multiprocessing.forkserver" in c],  # forkserver + workers
            "spawned": [p for p, c in procs.items() if "multiprocessing.spawn" in c]}


def test_a_killed_party_takes_its_worker_pool_with_it(tmp_path):
    job = make_job(tmp_path)  # vertical LR: the guest starts its pool while it waits for its peers
    log = tmp_path / "guest.log"
    party = _start([str(BIN / "secureflhv"), "party", str(job), "--party", "guest"], log, SECUREFLHV_WORKERS="2")
    try:
        # resource tracker, forkserver and its 2 workers (the peers never come: the guest waits)
        found = _wait_for(lambda: (lambda p: p if p["tracker"] and len(p["forked"]) >= 3 else None)(
            _pool_processes(party.pid)), 30, "the guest's worker pool", log)
        assert party.poll() is None, log.read_text()[-3000:]
        assert len(found["forked"]) == 3, found
    finally:
        took = _kill_and_expect_none_left(party)
    print(f"all {1 + len(found['forked'])} pool processes gone {took:.1f}s after the kill")


SCRIPT = """
import sys, threading, time
from secureflhv.compute import pool as par
from secureflhv.crypto.ecdh_psi import PsiEngine

par.set_workers(2)
t = threading.Thread(target=par.start, kwargs={"wait": True})  # the forkserver's launching thread ends
t.start(); t.join()
time.sleep(1.0)  # the pool outlives that thread: same workers, still answering
pids = sorted(pid for pid, _ in par.on_each_worker(par._started))
psi = PsiEngine(2).start()
assert psi._pool.map(abs, [-1, -2]) == [1, 2]  # the spawned PSI workers are up
print("ready", pids, flush=True)
time.sleep(120)
"""


def test_pools_started_from_a_finished_thread_work_and_die_with_the_process(tmp_path):
    log = tmp_path / "script.log"
    proc = _start([sys.executable, "-c", SCRIPT], log)
    try:
        _wait_for(lambda: "ready" in log.read_text(), 30, "the pools", log)
        found = _pool_processes(proc.pid)
        assert len(found["forked"]) == 3 and len(found["spawned"]) == 2 and found["tracker"], found
    finally:
        _kill_and_expect_none_left(proc)


# ---------------------------------------------------------------------------------------------- Ray
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_processes() -> dict[int, tuple[int, str]]:
    """Live processes: pid -> (ppid, command line)."""
    found = {}
    for d in Path("/proc").iterdir():
        st = _stat(int(d.name)) if d.name.isdigit() else None
        if st and st[0] != "Z":
            try:
                found[int(d.name)] = (int(st[1]), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160])
            except OSError:
                continue
    return found


RAY_DRIVER = """
import sys, time
import numpy as np
from secureflhv.compute import executor as ex
from secureflhv.runtime.process.party_compute import party_executor
from secureflhv.runtime.job.job_file import ComputeSpec

spec = ComputeSpec(engine="ray", address=sys.argv[1], min_batch=1, ship_code=False)
with party_executor(spec, "guest", start=True):  # as a party does (runtime/process/party.py)
    print(ex.run(np.atleast_1d, (), [(np.arange(3),), (np.arange(2),)]), flush=True)
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.mark.slow
def test_a_killed_ray_driver_leaves_nothing_behind(tmp_path):
    """A party on Ray is a driver of its organisation's running cluster (an address is required: it never
    starts a local one, see runtime.compute.make_executor). It starts no process of its own, and the
    cluster ends the workers it leased for the party's job once the driver is gone."""
    pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="sfpd", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    # its own session: every daemon of this test's cluster (and no other Ray here) carries its id
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--port", str(port), "--ray-client-server-port",
                             str(_free_port()), "--include-dashboard=false", "--temp-dir", temp, "--node-ip-address",
                             "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = head.communicate(timeout=120)
        assert head.returncode == 0, out[-3000:]
        before = set(_all_processes())
        log = tmp_path / "driver.log"
        driver = _start([sys.executable, "-c", RAY_DRIVER, f"127.0.0.1:{port}"], log)
        try:
            _wait_for(lambda: "ready" in log.read_text(), 60, "the Ray driver's first step", log)
            now = _all_processes()
            raylets = {p for p, (_, c) in now.items() if "raylet" in c.split(" ")[0] and temp in c}
            leased = [p for p, (pp, c) in now.items() if p not in before and pp in raylets and c.startswith("ray::")]
            assert leased, now  # the job's task worker(s), started by the cluster for this driver
            assert set(_session(driver.pid)) == {driver.pid}  # the driver itself started nothing
        finally:
            _kill_and_expect_none_left(driver)
        _wait_for(lambda: not set(leased) & set(_all_processes()), GONE_WITHIN_S,
                  f"the end of the killed driver's Ray workers {leased}")
    finally:
        _stop_session(head.pid)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_session(sid: int, grace_s: float = 2.0) -> None:
    """SIGTERM the processes of session ``sid`` (a raylet ends its workers); SIGKILL what is left after ``grace_s``.
    Ray's daemons (gcs_server, raylet, monitor) outlive SIGTERM for 20 s and more here, so a longer grace only
    waits; SIGKILL reaches every process of the session, workers and agents included."""
    deadline, sig = time.monotonic() + grace_s, signal.SIGTERM
    while left := _session(sid):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        sig = signal.SIGKILL if time.monotonic() > deadline else sig
        time.sleep(0.5)
