"""A process exits at once when its Paillier pool's background start went wrong (:mod:`secureflhv.compute.pool`).

CI saw a party of a 2-second prediction job log "finished" and then not exit until the launcher's 120 s
timeout. A party starts its pool in the background when a vertical job starts (``party_executor``), and at exit
concurrent.futures joins the pool's manager thread, which waits for every submitted task. The background start
used ``on_each_worker``, whose tasks hold each worker at a barrier until all have arrived: when a worker's
spawn failed (``OSError`` from the forkserver: EAGAIN / ENOMEM under load), the worker that came waited out
``BARRIER_TIMEOUT_S`` (120 s), and so did the exit. Here the spawn failure is simulated.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from secureflhv.compute import pool as par

SCRIPT = r"""
import sys, time
from concurrent.futures import ProcessPoolExecutor
from secureflhv.compute import pool

def main():
    pool.set_workers(2)
    real, spawned = ProcessPoolExecutor._spawn_process, []

    def spawn(self):  # the second worker cannot be spawned
        spawned.append(1)
        if len(spawned) == 2:
            raise OSError(11, "Resource temporarily unavailable")
        real(self)

    ProcessPoolExecutor._spawn_process = spawn
    pool.start()  # as party_executor(start=True) does
    deadline = time.monotonic() + 30
    while len(spawned) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the first worker has taken its task
    print("done", flush=True)

if __name__ == "__main__":
    main()
"""


def test_a_process_whose_background_pool_start_failed_exits_at_once(tmp_path):
    """The job is done while a worker of the background start failed to spawn: the process exits within
    seconds (before: 120 s, the first worker waiting at the barrier for the second)."""
    script = tmp_path / "start_then_exit.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=40,
                             env={**os.environ, "SECUREFLHV_WORKERS": "2"})
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit within 40 s of its last line")
    assert "done" in out.stdout, out.stderr[-2000:]
    assert "Resource temporarily unavailable" in out.stderr  # the failed start is logged, once
    assert time.monotonic() - t0 < 25 < par.BARRIER_TIMEOUT_S


def test_a_call_whose_worker_cannot_be_spawned_frees_the_others(monkeypatch):
    """``on_each_worker`` itself, when submitting fails part-way with an error other than RuntimeError (a
    failed spawn): it raises at once and breaks its barrier, so the worker that took a call is free; the next
    call gets one task per worker."""
    import threading

    try:
        par.set_workers(2)
        pool = par._get_pool()
        real, calls = pool.submit, []

        def submit_then_fail(*a, **kw):
            calls.append(1)
            if len(calls) == 2:
                raise OSError(11, "Resource temporarily unavailable")
            return real(*a, **kw)

        monkeypatch.setattr(pool, "submit", submit_then_fail)
        t0 = time.monotonic()
        with pytest.raises(OSError):
            par.on_each_worker(os.getpid)
        assert time.monotonic() - t0 < 20
        out = []
        t = threading.Thread(target=lambda: out.append(par.on_each_worker(os.getpid)), daemon=True)
        t.start()
        t.join(20)
        assert out and len(set(out[0])) == 2, "the next call waited on a stale barrier"
    finally:
        par.set_workers(None)
