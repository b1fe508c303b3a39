"""``secureflhv run JOB``: every party of a job as a separate process on this machine.

Each party runs exactly what a real deployment runs on its organisation's machine
(``secureflhv party JOB --party ID``); this launcher only starts them, prefixes their log lines
with the party id, turns their progress events into a progress bar, and cleans up. Before
starting anything it runs every party's preflight (exit code 2 on a finding). When one party
fails, the others are told which party failed first and why (their last line names it), then
stopped; the launcher exits non-zero naming that party and its reason, and no process (nor a
worker pool of one) is left behind. In a horizontal job a failing client is a dropout:
the others go on (secure aggregation survives it), and the exit code is still non-zero.
When the job succeeded it ends with a table of the bytes each party sent to and received from each peer
(the parties' ``@wire`` events; :mod:`secureflhv.transport.wire` says what is counted).
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
from rich.table import Table
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .blame import NOTICE_ENV, Failure, clean, notice_line, parse_reported
from ..job.job_file import JobConfig
from ..job.preflight import preflight
from .progress import PROGRESS_PREFIX, WIRE_PREFIX
from ..job.registry import job_params, job_spec

_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


@dataclass
class _Child:
    party_id: str
    proc: subprocess.Popen
    colour: str
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None
    wire: dict | None = None  # the party's latest wire_stats() (@wire events: every 2 s while it runs, then final)


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
        if line.startswith(WIRE_PREFIX):
            try:
                child.wire = json.loads(line[len(WIRE_PREFIX):])
                return
            except ValueError:
                pass  # not a well-formed event: show it as text
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
                                       markup=False, highlight=False, soft_wrap=True)
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
        """Start one ``secureflhv party`` process per party of the job, each in its own process group, with a
        thread relaying its output.
        """
        for i, p in enumerate(self.cfg.parties):
            cmd = [sys.executable, "-m", "secureflhv", "party", str(self.job_path), "--party", p.id, *self.extra_args]
            env = dict(os.environ, PYTHONUNBUFFERED="1", **{NOTICE_ENV: "1"})
            env.setdefault("GRPC_VERBOSITY", "ERROR")  # gRPC's own handshake chatter; our logs say what failed
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1,
                                    env=env, start_new_session=True)  # own process group: we can stop its pools too
            child = _Child(p.id, proc, _COLOURS[i % len(_COLOURS)])
            self.children.append(child)
            child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"log-{p.id}")
            child.pump.start()

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
        """Wait for every party; return 0 when all succeeded, else 1 after stopping the rest.

        The first party to fail (a tolerated dropout aside) is the root cause: the others are told on
        their stdin (their last line names it), given ``grace_s`` to stop, then stopped; the exit
        message names the root party and its reason, and the others as stopped because of it.
        """
        start = time.monotonic()
        failed: list[str] = []
        root: Failure | None = None
        while root is None:
            running = [c for c in self.children if c.proc.poll() is None]
            for c in self.children:
                rc = c.proc.returncode
                if rc not in (None, 0) and c.party_id not in failed:
                    failed.append(c.party_id)
                    tolerated = c.party_id in self.tolerated
                    self.console.print(f"party {c.party_id!r} exited with code {rc}"
                                       + ("; the job goes on without it (client dropout)" if tolerated else ""),
                                       style="bold red")
                    if not tolerated and root is None:
                        root = self._failure_of(c)
                        self._notify(root)
            if root is not None or not running:
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                self.stop_all()
                self.console.print(f"job {self.cfg.job.id!r} failed: it did not finish within {timeout_s:.0f}s "
                                   f"(--timeout); every party was stopped", style="bold red")
                return 1
            time.sleep(0.2)
        if root is None:
            if failed:  # only tolerated dropouts failed; everyone else finished
                self.console.print(f"job {self.cfg.job.id!r} finished without: {', '.join(failed)}", style="bold red")
                return 1
            return 0
        end = time.monotonic() + self.grace_s  # they were told: let them stop and say why
        while time.monotonic() < end and any(c.proc.poll() is None for c in self.children):
            time.sleep(0.1)
        self.stop_all()
        others = [c.party_id for c in self.children if c.party_id != root.party and c.proc.returncode not in (0, None)]
        self.console.print(f"job {self.cfg.job.id!r} failed: {root.party} failed first: {root.reason}"
                           + (f"; {', '.join(others)} stopped because of it" if others else ""),
                           style="bold red", markup=False, highlight=False, soft_wrap=True)
        return 1

    def print_wire_table(self) -> None:
        """Print bytes sent / received per party and peer (MB = 10^6 bytes), for the parties that reported."""
        for c in self.children:
            if c.pump is not None:
                c.pump.join(timeout=2.0)  # the @wire event is among a party's last lines
        reported = [c for c in self.children if c.wire]
        if not reported:
            return
        table = Table(title="bytes on the wire (MB = 10^6 bytes; payload exact, framing partly estimated)")
        for col in ("party", "peer", "sent MB", "received MB", "framing sent / received MB",
                    "messages sent / received"):
            table.add_column(col, justify="left" if col in ("party", "peer") else "right")
        for c in reported:
            for peer, e in sorted(c.wire.items()):
                n = {k: int(e.get(k, 0)) for k in ("sent", "received", "sent_framing", "received_framing",
                                                    "messages_sent", "messages_received")}
                table.add_row(c.party_id, peer, f"{n['sent'] / 1e6:.3f}", f"{n['received'] / 1e6:.3f}",
                              f"{n['sent_framing'] / 1e6:.3f} / {n['received_framing'] / 1e6:.3f}",
                              f"{n['messages_sent']} / {n['messages_received']}")
        self.console.print(table)

    def _failure_of(self, child: _Child) -> Failure:
        """Why ``child`` exited: the root its last lines name, or how it died."""
        rc = child.proc.returncode
        if rc < 0:
            return Failure(child.party_id, f"was killed by signal {-rc} ({signal.Signals(-rc).name}) without a word")
        if child.pump is not None:
            child.pump.join(timeout=2.0)  # its last lines may still be in the pipe
        parties = {p.id for p in self.cfg.parties}
        for line in reversed(child.lines[-20:]):
            if " failed: " in line:
                return parse_reported(line, child.party_id, parties)
        last = next((clean(line) for line in reversed(child.lines) if line.strip()), "")
        return Failure(child.party_id, f"exited with code {rc}" + (f" ({last})" if last else ""))

    def _notify(self, root: Failure) -> None:
        """Tell every other running party (stdin notice, see :mod:`.blame`) which party failed first, and why."""
        for c in self.children:
            if c.party_id != root.party and c.proc.poll() is None and c.proc.stdin is not None:
                try:
                    c.proc.stdin.write(notice_line(root))
                    c.proc.stdin.flush()
                except (BrokenPipeError, OSError, ValueError):
                    pass  # it is exiting anyway

    def preflight(self) -> int:
        """Run every party's preflight (:mod:`..job.preflight`) on this machine; print findings; 0 or 2."""
        params = job_params(self.cfg)
        insecure = self.cfg.security.insecure or "--insecure" in self.extra_args
        findings = [f for p in self.cfg.parties
                    for f in preflight(self.cfg, p.id, params, insecure=insecure)]
        for f in findings:
            self.console.print(f"  - {f}", markup=False, highlight=False, soft_wrap=True)
        if findings:
            self.console.print(f"job {self.cfg.job.id!r} not started: preflight found {len(findings)} problem(s) "
                               f"(above); no party was started", style="bold red", markup=False, highlight=False,
                               soft_wrap=True)
            return 2
        return 0

    def run(self, timeout_s: float | None = None) -> int:
        """Preflight every party, start them all, show their output, and return the job's exit code
        (0 success, 1 a party failed, 2 preflight findings: nothing started)."""
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def interrupted(signum, _frame):
            self.console.print(f"launcher got signal {signum}; stopping every party", style="bold red")
            self.stop_all()
            raise SystemExit(128 + signum)

        for s in previous:
            signal.signal(s, interrupted)
        if self.preflight():
            return 2
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=self.console, transient=False, disable=not self.console.is_terminal) as progress:
                self._progress = progress
                self.start()
                rc = self.wait(timeout_s)
            for c in self.children:
                c.proc.wait()
            if rc == 0:  # after a failure, the line naming who failed stays the last one
                self.print_wire_table()
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
