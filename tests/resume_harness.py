"""Crash-then-resume scaffolding shared by the process-level resume tests (real parties over gRPC + mTLS).

* :func:`party_procs` starts ``secureflhv party JOB --party P`` for every party (one process group each).
* :func:`kill_after` waits for a marker line, SIGKILLs one party and returns the survivors' outputs once they
  stopped by themselves (each must fail) and how long that took; nothing is left running whatever happens.
* :func:`run_job` runs ``secureflhv run JOB`` (``--resume`` ...) and returns its output (it must succeed).
* :func:`resumed_steps` is the set of checkpoint steps the parties announced resuming after.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def secureflhv(*args: str, **kw) -> subprocess.Popen:
    """``python -m secureflhv ARGS`` with stdout+stderr in one text pipe, in its own process group."""
    return subprocess.Popen([sys.executable, "-m", "secureflhv", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def party_procs(job: Path, parties) -> dict[str, subprocess.Popen]:
    """One ``secureflhv party`` process per id in ``parties`` (in that order)."""
    return {pid: secureflhv("party", str(job), "--party", pid) for pid in parties}


@dataclass
class Killed:
    outputs: dict[str, str]  # survivor -> its whole output
    waited_s: float  # from the kill until the last survivor stopped

    def last_lines(self) -> dict[str, str]:
        """Each survivor's last log line (the job's first failure)."""
        return {pid: out.strip().splitlines()[-1] for pid, out in self.outputs.items()}


def kill_after(job: Path, parties, victim: str, marker: str, *, watch: str | None = None,
               wait_s: float = 60) -> Killed:
    """Run the job's ``parties`` as processes; when ``watch``'s output (default: the victim's) has a line
    containing ``marker``, SIGKILL ``victim``; return the survivors' outputs after each stopped (within
    ``wait_s`` seconds) with a non-zero exit code. Leftover processes are killed."""
    procs = party_procs(job, parties)
    try:
        for line in procs[watch or victim].stdout:
            if marker in line:
                break
        else:
            pytest.fail(f"{watch or victim} never printed {marker!r}, the moment to kill {victim}")
        os.killpg(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        killed_at, outputs = time.monotonic(), {}
        for pid, proc in procs.items():
            if pid == victim:
                continue
            outputs[pid], _ = proc.communicate(timeout=wait_s)
            assert proc.returncode not in (0, None), f"{pid} did not fail:\n{outputs[pid][-2000:]}"
        return Killed(outputs, time.monotonic() - killed_at)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_job(job: Path, *extra: str, timeout_s: int = 200) -> str:
    """``secureflhv run JOB --timeout timeout_s EXTRA``: its output; it must exit 0."""
    proc = secureflhv("run", str(job), "--timeout", str(timeout_s), *extra)
    out, _ = proc.communicate(timeout=timeout_s + 60)
    assert proc.returncode == 0, out[-3000:]
    return out


def resumed_steps(out: str) -> set[int]:
    """The checkpoint steps that ``run --resume``'s parties said they resume after."""
    return {int(s) for s in re.findall(r"resuming after checkpoint step (\d+)", out)}
