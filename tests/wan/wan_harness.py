"""Run one job twice: every party on its own host of a WAN bed, and all on loopback (``secureflhv run``).

The loopback run goes in a background process while the WAN run proceeds (the WAN run waits on the
network, not on the CPU), so a test pays about one run's time for both.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from netbed import NetBed


@dataclass
class PartyRun:
    """One party process: exit code and output lines, each with its ``time.monotonic()`` stamp."""

    code: int | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def when(self, text: str) -> float | None:
        """The stamp of the first line containing ``text``."""
        return next((t for t, line in self.lines if text in line), None)

    @property
    def last(self) -> str:
        return next((line.strip() for _, line in reversed(self.lines) if line.strip()), "")


class Loopback:
    """``secureflhv run JOB`` in the background; :meth:`wait` returns (exit code, output)."""

    def __init__(self, job: Path, timeout: float = 240):
        self.proc = subprocess.Popen([sys.executable, "-m", "secureflhv", "run", str(job), "--timeout", str(timeout)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.timeout = timeout

    def wait(self) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=self.timeout + 60)
        return self.proc.returncode, out


def run_on_bed(bed: NetBed, job: Path, *, on_line: Callable[[str, str], None] | None = None,
               timeout: float = 180, log_level: str = "INFO", give_up: set[str] = frozenset()) -> dict[str, PartyRun]:
    """Start every party of ``job`` (a job adopted by ``bed``) on its host; return when all have exited.

    ``on_line(party, line)`` sees each output line as it comes (to stage faults at a given point).
    Parties in ``give_up`` are killed once all the others have exited (e.g. a client cut off for good).
    """
    procs = {p: bed.start_party(job, p, log_level=log_level) for p in bed.parties}
    return _collect(procs, on_line, timeout, give_up)


def run_local(job: Path, *, timeout: float = 180, log_level: str = "INFO") -> dict[str, PartyRun]:
    """Every party of ``job`` as ``secureflhv party`` on this host (loopback), watched as :func:`run_on_bed`
    does (no launcher in between, so both settings pay the same process and logging overheads)."""
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path,
               GRPC_VERBOSITY=os.environ.get("GRPC_VERBOSITY", "ERROR"))
    ids = [p["id"] for p in yaml.safe_load(Path(job).read_text())["parties"]]
    procs = {p: subprocess.Popen([sys.executable, "-m", "secureflhv", "party", str(job), "--party", p, "--log-level",
                                  log_level], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 env=env, start_new_session=True) for p in ids}
    return _collect(procs, None, timeout, frozenset())


def _collect(procs: dict[str, subprocess.Popen], on_line, timeout: float, give_up) -> dict[str, PartyRun]:
    start = time.monotonic()
    runs = {p: PartyRun() for p in procs}

    def pump(party: str) -> None:
        for line in procs[party].stdout:
            runs[party].lines.append((time.monotonic(), line))
            if on_line is not None:
                on_line(party, line)

    threads = [threading.Thread(target=pump, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    try:
        for party, proc in procs.items():
            if party not in give_up:
                proc.wait(timeout=max(1.0, start + timeout - time.monotonic()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for t in threads:
            t.join(5)
    for party, proc in procs.items():
        runs[party].code = proc.returncode
    return runs


def failures(runs: dict[str, PartyRun]) -> str:
    """The tail of every party that did not exit with 0 (for assertion messages)."""
    return "\n".join(f"--- {p} (exit {r.code}):\n{r.text[-2500:]}" for p, r in runs.items() if r.code != 0)
