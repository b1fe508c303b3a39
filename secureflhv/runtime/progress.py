"""Progress events from a party to the launcher: one JSON line on stdout, prefixed so it is not a log line."""
from __future__ import annotations

import json

PROGRESS_PREFIX = "@progress "


def emit_progress(task: str, done: int, total: int, info: str = "") -> None:
    """Print one progress event on stdout for the launcher (harmless when a party runs standalone)."""
    print(PROGRESS_PREFIX + json.dumps({"task": task, "done": done, "total": total, "info": info}), flush=True)
