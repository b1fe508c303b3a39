"""Events from a party to the launcher: one JSON line on stdout, prefixed so it is not a log line.

``@progress``: a task's progress (a progress bar); ``@wire``: the party's bytes on the wire at the end of
the job (``transport.wire_stats()``; the launcher's end-of-job table). In-process listeners
(:func:`add_listener`) get the progress events too: the party's status file for the job page
(:mod:`.status`) is written from them.
"""
from __future__ import annotations

import json
from typing import Callable

PROGRESS_PREFIX = "@progress "
WIRE_PREFIX = "@wire "

_listeners: list[Callable[[dict], None]] = []


def add_listener(fn: Callable[[dict], None]) -> None:
    _listeners.append(fn)


def remove_listener(fn: Callable[[dict], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def emit_progress(task: str, done: int, total: int, info: str = "", metrics: dict[str, float] | None = None) -> None:
    """Print one progress event on stdout for the launcher (harmless when a party runs standalone).

    ``metrics`` (e.g. ``{"loss": 0.31}``): numbers at step ``done``, drawn as curves on the job page.
    """
    ev = {"task": task, "done": done, "total": total, "info": info}
    if metrics:
        ev["metrics"] = {k: float(v) for k, v in metrics.items()}
    print(PROGRESS_PREFIX + json.dumps(ev), flush=True)
    for fn in list(_listeners):
        fn(ev)


def emit_wire(stats: dict) -> None:
    """Print the party's ``wire_stats()`` (bytes per peer and tag) on stdout for the launcher's summary."""
    print(WIRE_PREFIX + json.dumps(stats), flush=True)
