"""A party's live status file, ``<output_dir>/<party id>/status.json``, for the job page.

The party process rewrites it (temporary file, then rename, so a reader never sees half a file) on
each progress event (:mod:`..process.progress`), on a state change, and at most once a second for new log
lines. The job page (:mod:`.dashboard`) only reads these files, so it works the same for the whole
job (``secureflhv run --dashboard``) and for one organisation's party (``party --dashboard``).

What it holds (``format: secureflhv.status/1``): job and party id, role, ``state`` (``starting``,
``running``, ``done``, ``failed``), wall-clock ``started``/``updated`` (Unix seconds), each progress
task's ``done``/``total``/``info``/``eta_s``, the curves the job reported (``{name: [[step, value],
...]}``; ``curve_steps``: the task whose step is each curve's x), the last log lines of the
``secureflhv`` loggers, bytes per peer (``wire``, where the transport counts them), the final metrics
the job returned, and the failure line. Never any data row, key, certificate or model parameter: only
what the party already prints on its console.

Progress listeners are per process: one party per process, as ``secureflhv party`` runs it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..process import progress

STATUS_FILE = "status.json"
FORMAT = "secureflhv.status/1"
LOG_LINES = 40  # recent log lines kept in the file
_LOG_WRITE_EVERY_S = 1.0


def _number(v: Any) -> float | None:
    """A finite float, else None (JSON has no NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _scalars(obj: Any, prefix: str = "", out: dict | None = None) -> dict[str, float]:
    """Flatten nested dicts of numbers (``{"test": {"auc": 0.9}}`` -> ``{"test.auc": 0.9}``); drop the rest."""
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            _scalars(v, f"{prefix}{k}.", out)
    elif not isinstance(obj, bool) and (v := _number(obj)) is not None and prefix:
        out[prefix[:-1]] = v
    return out


class _LogTail(logging.Handler):
    def __init__(self, status: "PartyStatus"):
        super().__init__(logging.INFO)
        self.status = status
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.status.add_log(self.format(record).splitlines()[0][:300])
        except Exception:  # noqa: BLE001 - the status page must never break the party
            self.handleError(record)


class PartyStatus:
    """Keeps one party's status and writes it to ``path``.

    Args:
        path: the status file (its folder is created).
        job_id, party_id, role: as in the job file.

    Use :meth:`start` once (installs the progress listener and the log tail), :meth:`attach` the
    transport when it exists (for ``wire_stats()``), then :meth:`finish` or :meth:`fail`; :meth:`close`
    removes the listener and the log handler. Writing errors are logged once and otherwise ignored:
    a full disk must not fail the job.
    """

    def __init__(self, path: Path, job_id: str, party_id: str, role: str):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._write_lock = threading.RLock()  # one writer at a time: an older snapshot never replaces a newer
        self._doc: dict[str, Any] = {
            "format": FORMAT, "job_id": job_id, "party_id": party_id, "role": role, "state": "starting",
            "pid": os.getpid(), "started": time.time(), "updated": time.time(), "tasks": {}, "curves": {},
            "curve_steps": {}, "log": [], "wire": {}, "final": {}, "error": None,
        }
        self._log: deque[str] = deque(maxlen=LOG_LINES)
        self._task_start: dict[str, tuple[float, int]] = {}
        self._transport = None
        self._last_write = 0.0
        self._warned = False
        self._handler = _LogTail(self)

    @classmethod
    def for_party(cls, cfg, spec) -> "PartyStatus":
        """The status of party ``spec`` of job ``cfg`` (a :class:`~secureflhv.runtime.job.job_file.JobConfig`)."""
        return cls(cfg.output_dir(spec.id) / STATUS_FILE, cfg.job.id, spec.id, spec.role)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "PartyStatus":
        """Follow the progress events and the ``secureflhv`` log, write the first status file; returns self."""
        progress.add_listener(self.on_progress)
        logging.getLogger("secureflhv").addHandler(self._handler)
        self.write()
        return self

    def attach(self, transport) -> None:
        """Report ``transport.wire_stats()`` (bytes per peer) from now on, where the transport has it."""
        self._transport = transport

    def set_state(self, state: str, **fields) -> None:
        """Set the party's state (and any other top-level fields) and write the file."""
        with self._lock:
            self._doc["state"] = state
            self._doc.update(fields)
        self.write()

    def finish(self, result: Any = None) -> None:
        """The job ended well; ``result`` is what the job returned (its numbers become ``final``)."""
        self.set_state("done", final=_scalars(result if isinstance(result, dict) else {}))

    def fail(self, line: str) -> None:
        """State ``failed`` with the one-line cause ``line``."""
        self.set_state("failed", error=line)

    def close(self) -> None:
        """Stop following progress and the log; write the last status."""
        progress.remove_listener(self.on_progress)
        logging.getLogger("secureflhv").removeHandler(self._handler)
        self.write()

    # ------------------------------------------------------------------ events
    def on_progress(self, ev: dict) -> None:
        """A progress event (``task``, ``done``, ``total``, ``info``): the task's count and its ETA in seconds,
        measured from the task's first event.
        """
        task, done, total = str(ev["task"]), int(ev["done"]), int(ev["total"])
        now = time.monotonic()
        with self._lock:
            t0, d0 = self._task_start.setdefault(task, (now, done))  # the rate is measured from the first event
            eta = (now - t0) / (done - d0) * (total - done) if d0 < done <= total else None
            self._doc["tasks"][task] = {"done": done, "total": total, "info": str(ev.get("info", "")),
                                        "eta_s": None if eta is None else round(eta, 1)}
            for name, value in (ev.get("metrics") or {}).items():
                if (v := _number(value)) is not None:
                    self._doc["curves"].setdefault(str(name), []).append([done, v])
                    self._doc["curve_steps"][str(name)] = task  # what the x axis counts
        self.write()

    def add_log(self, line: str) -> None:
        """Keep a log line (the last ``LOG_LINES``); the file is rewritten at most every few seconds for logs."""
        with self._lock:
            self._log.append(line)
        if time.monotonic() - self._last_write >= _LOG_WRITE_EVERY_S:
            self.write()

    # ------------------------------------------------------------------ file
    def snapshot(self) -> dict[str, Any]:
        """The status document as a JSON-able dict, with the transport's wire counters when it has them."""
        wire = getattr(self._transport, "wire_stats", None)
        stats = None
        if callable(wire):
            try:
                stats = wire()
            except Exception:  # noqa: BLE001 - counters are informative only
                stats = None
        with self._lock:
            if isinstance(stats, dict):
                self._doc["wire"] = {str(p): {k: v for k, v in s.items() if isinstance(v, (int, float))}
                                     for p, s in stats.items() if isinstance(s, dict)}
            self._doc["log"] = list(self._log)
            self._doc["updated"] = time.time()
            return json.loads(json.dumps(self._doc))

    def write(self) -> None:
        """Write the status file atomically (a temporary file, then ``os.replace``); a failure to write is
        logged once as a warning, never raised.
        """
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with self._write_lock:
            doc = self.snapshot()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(doc), encoding="utf-8")
                os.replace(tmp, self.path)  # atomic: the page reads the old file or the new one
                self._last_write = time.monotonic()
                return
            except OSError as exc:
                error = exc
        if not self._warned:  # outside the lock: the warning comes back here through the log tail
            self._warned = True
            logging.getLogger("secureflhv.party").warning("cannot write the status file %s: %s", self.path, error)


def read_status(path: Path) -> dict[str, Any] | None:
    """The status in ``path``, or None when it is missing or not a status file (e.g. mid-rename elsewhere)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None
