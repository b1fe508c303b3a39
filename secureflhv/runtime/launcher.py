"""``secureflhv run JOB``: every party of a job as a separate process on this machine.

Each party runs exactly what a real deployment runs on its organisation's machine
(``secureflhv party JOB --party ID``); this launcher only starts them, prefixes their log lines
with the party id, turns their progress events into a progress bar, and cleans up: when one
party fails, the others are stopped, the launcher exits non-zero naming the party, and no
process (nor a worker pool of one) is left behind. In a horizontal job a failing client is a dropout:
the others go on (secure aggregation survives it), and the exit code is still non-zero.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .job_file import JobConfig
from .progress import PROGRESS_PREFIX
from .registry import job_spec

_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


@dataclass
class _Child:
    party_id: str
    proc: subprocess.Popen
    colour: str
    lines: list[str] = field(default_factory=list)


class Launcher:
    """Start, watch and stop the party processes of one job.

    Args:
        job_path: the job file every party reads.
        cfg: the validated job (for party ids).
        console: where prefixed logs go.
        grace_s: seconds a party gets after SIGTERM before SIGKILL.
        extra_args: extra arguments for every ``secureflhv party`` command (e.g. ``["--log-level", "DEBUG"]``).
    """

    def __init__(self, job_path: Path, cfg: JobConfig, console: Console | None = None, grace_s: float = 10.0,
                 extra_args: list[str] | None = None):
        self.job_path = Path(job_path)
        self.cfg = cfg
        self.console = console or Console(highlight=False)
        self.grace_s = grace_s
        self.extra_args = extra_args or []
        self.children: list[_Child] = []
        # parties whose failure does not stop the job: the clients of a horizontal job (dropouts)
        self.tolerated = {p.id for p in cfg.clients} if job_spec(cfg.job.algorithm).family == "horizontal" else set()
        self._progress: Progress | None = None
        self._tasks: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ output
    def _print(self, child: _Child, line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            try:
                ev = json.loads(line[len(PROGRESS_PREFIX):])
                self._on_progress(child, ev)
                return
            except (ValueError, KeyError, TypeError):
                pass  # not a well-formed event: show it as text
        child.lines.append(line)
        self.console.print(Text.assemble((f"[{child.party_id}] ", child.colour), line), soft_wrap=True)

    def _on_progress(self, child: _Child, ev: dict) -> None:
        key = (child.party_id, ev["task"])
        with self._lock:
            if self._progress is None or not self.console.is_terminal:
                if ev["done"] == ev["total"] or ev["done"] % max(1, ev["total"] // 10) == 0:
                    self.console.print(f"[{child.party_id}] {ev['task']} {ev['done']}/{ev['total']} {ev['info']}",
                                       markup=False, highlight=False)
                return
            if key not in self._tasks:
                self._tasks[key] = self._progress.add_task(f"{child.party_id}: {ev['task']}", total=ev["total"])
            self._progress.update(self._tasks[key], completed=ev["done"], total=ev["total"],
                                  description=f"{child.party_id}: {ev['task']} {ev['info']}")

    def _pump(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        for raw in child.proc.stdout:
            self._print(child, raw.rstrip("\n"))

    # ------------------------------------------------------------------ processes
    def start(self) -> None:
        for i, p in enumerate(self.cfg.parties):
            cmd = [sys.executable, "-m", "secureflhv", "party", str(self.job_path), "--party", p.id, *self.extra_args]
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC's own handshake chatter; our logs say what failed
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    env=env, start_new_session=True)  # own process group: we can stop its pools too
            child = _Child(p.id, proc, _COLOURS[i % len(_COLOURS)])
            self.children.append(child)
            threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"log-{p.id}").start()

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """Stop every party still running (its whole process group), SIGKILL after the grace period."""
        for c in self.children:
            if c.proc.poll() is None:
                _signal_group(c.proc, sig)
        deadline = time.monotonic() + self.grace_s
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait()
        for c in self.children:  # worker processes a party left in its group
            _signal_group(c.proc, signal.SIGKILL)

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for every party; return 0 when all succeeded, else 1 after stopping the rest."""
        start = time.monotonic()
        failed: list[str] = []
        while True:
            running = [c for c in self.children if c.proc.poll() is None]
            for c in self.children:
                rc = c.proc.returncode
                if rc not in (None, 0) and c.party_id not in failed:
                    failed.append(c.party_id)
                    tolerated = c.party_id in self.tolerated
                    self.console.print(f"party {c.party_id!r} exited with code {rc}"
                                       + ("; the job goes on without it (client dropout)" if tolerated else ""),
                                       style="bold red")
            if any(p not in self.tolerated for p in failed) or not running:
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                self.console.print(f"job did not finish within {timeout_s:.0f}s; stopping every party",
                                   style="bold red")
                failed.append("(timeout)")
                break
            time.sleep(0.2)
        if failed and not running:  # only tolerated dropouts failed; everyone else finished
            self.console.print(f"job {self.cfg.job.id!r} finished without: {', '.join(failed)}", style="bold red")
            return 1
        if failed:
            # let the others notice the failure themselves first (their messages name the culprit)
            end = time.monotonic() + min(self.grace_s, 5.0)
            while time.monotonic() < end and any(c.proc.poll() is None for c in self.children):
                time.sleep(0.2)
            self.stop_all()
            for c in self.children:
                if c.proc.returncode not in (0, None) and c.party_id not in failed:
                    failed.append(c.party_id)
            self.console.print(f"job {self.cfg.job.id!r} failed; failing parties: {', '.join(failed)}",
                               style="bold red")
            return 1
        return 0

    def run(self, timeout_s: float | None = None) -> int:
        """Start all parties, show their output, and return the job's exit code."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def interrupted(signum, _frame):
            self.console.print(f"launcher got signal {signum}; stopping every party", style="bold red")
            self.stop_all()
            raise SystemExit(128 + signum)

        for s in previous:
            signal.signal(s, interrupted)
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=self.console, transient=False, disable=not self.console.is_terminal) as progress:
                self._progress = progress
                self.start()
                rc = self.wait(timeout_s)
            for c in self.children:
                c.proc.wait()
            return rc
        finally:
            if any(c.proc.poll() is None for c in self.children):
                self.stop_all(signal.SIGKILL)
            for s, h in previous.items():
                signal.signal(s, h)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
