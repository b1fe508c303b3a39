"""Events from a party to the launcher: one JSON line on stdout, prefixed so it is not a log line.

``@progress``: a task's progress (a progress bar); ``@wire``: the party's bytes on the wire at the end of
the job (``transport.wire_stats()``; the launcher's end-of-job table).
"""
from __future__ import annotations

import json

PROGRESS_PREFIX = "@progress "
WIRE_PREFIX = "@wire "


def emit_progress(task: str, done: int, total: int, info: str = "") -> None:
    """Print one progress event on stdout for the launcher (harmless when a party runs standalone)."""
    print(PROGRESS_PREFIX + json.dumps({"task": task, "done": done, "total": total, "info": info}), flush=True)


def emit_wire(stats: dict) -> None:
    """Print the party's ``wire_stats()`` (bytes per peer and tag) on stdout for the launcher's summary."""
    print(WIRE_PREFIX + json.dumps(stats), flush=True)
