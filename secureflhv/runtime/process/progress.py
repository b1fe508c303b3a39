"""Events from a party to the launcher: one JSON line on stdout, prefixed so it is not a log line.

``@progress``: a task's progress (a progress bar); ``@wire``: the party's bytes on the wire
(``transport.wire_stats()``), every 2 s while it runs under the launcher and once at the end of the job
(the launcher's end-of-job table). In-process listeners (:func:`add_listener`) get the progress events
too: the party's status file for the job page (:mod:`..observe.status`) is written from them. Within
:func:`listeners_only` (an in-process simulation, :func:`secureflhv.simulate`) they go to the listeners alone.
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
from typing import Callable

PROGRESS_PREFIX = "@progress "
WIRE_PREFIX = "@wire "

_listeners: list[Callable[[dict], None]] = []
_quiet = [0]  # open listeners_only blocks: while > 0 no event line goes to stdout
_quiet_lock = threading.Lock()


def add_listener(fn: Callable[[dict], None]) -> None:
    """Also call ``fn(event)`` with every progress event of this process."""
    _listeners.append(fn)


def remove_listener(fn: Callable[[dict], None]) -> None:
    """Stop calling ``fn`` (no-op when it was not added)."""
    if fn in _listeners:
        _listeners.remove(fn)


@contextlib.contextmanager
def listeners_only():
    """Within the block, progress events reach the in-process listeners only, not stdout: every party runs
    in this process (a simulation), so no launcher reads its stdout and a notebook shows no raw lines."""
    with _quiet_lock:
        _quiet[0] += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet[0] -= 1


def emit_progress(task: str, done: int, total: int, info: str = "", metrics: dict[str, float] | None = None) -> None:
    """Print one progress event on stdout for the launcher (harmless when a party runs standalone).

    ``metrics`` (e.g. ``{"loss": 0.31}``): numbers at step ``done``, drawn as curves on the job page.
    """
    ev = {"task": task, "done": done, "total": total, "info": info}
    if metrics:
        ev["metrics"] = {k: float(v) for k, v in metrics.items()}
    if not _quiet[0]:
        print(PROGRESS_PREFIX + json.dumps(ev), flush=True)
    for fn in list(_listeners):
        fn(ev)


def emit_wire(stats: dict, by_tag: bool = True) -> None:
    """Print the party's ``wire_stats()`` (bytes per peer, and per tag unless ``by_tag`` is False: the live
    events leave it out to stay one short line) on stdout for the launcher, in one write so that no log
    line of another thread splits it."""
    if not by_tag:
        stats = {peer: {k: v for k, v in entry.items() if k != "by_tag"} for peer, entry in stats.items()}
    sys.stdout.write(WIRE_PREFIX + json.dumps(stats, separators=(",", ":")) + "\n")
    sys.stdout.flush()
