"""What a party leaves behind after a job besides its model: metrics and pictures, and the JSON and file
helpers the model bundle and checkpoints share.

Files, under ``<output_dir>/<party id>/`` (the model itself is the signed bundle ``model/``,
:mod:`secureflhv.runtime.store.model_bundle`, the one model format):

* ``metrics.json`` — per-epoch history and final metrics (guest); at every party that finished, ``wire``:
  bytes sent to and received from each peer, per message tag, and totals (:mod:`secureflhv.transport.wire`).
* ``loss.png`` — the training-loss curve (guest).
* ``status.json`` — the live state, progress, curves and last log lines the job page shows (:mod:`secureflhv.runtime.observe.status`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def plain_json(obj: Any, *, nan_as_none: bool = False) -> Any:
    """JSON-ready copy: arrays to lists, numpy scalars to Python, bytes to hex, paths to str; with
    ``nan_as_none`` non-finite floats become None (strict JSON, e.g. a model bundle's manifest)."""
    if isinstance(obj, dict):
        return {str(k): plain_json(v, nan_as_none=nan_as_none) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v, nan_as_none=nan_as_none) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain_json(obj.tolist(), nan_as_none=nan_as_none)
    if isinstance(obj, np.generic):
        return plain_json(obj.item(), nan_as_none=nan_as_none)
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj).hex()
    if isinstance(obj, Path):
        return str(obj)
    if nan_as_none and isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` as 64 hex digits (content hashes of bundles and checkpoints)."""
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries to disk, so that a rename into it survives a crash (POSIX)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` (:func:`plain_json`) to ``path`` as indented JSON, creating its folder; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plain_json(obj), indent=2) + "\n", encoding="utf-8")
    return path


def plot_curves(path: Path, curves: dict[str, Sequence[float]], *, title: str, xlabel: str = "epoch",
                ylabel: str = "loss") -> Path:
    """Save a line plot of one or more curves (e.g. training and validation loss) as PNG.

    Point k (1-based) is plotted at x = k, with whole-number ticks only (epochs and rounds are counts).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), list(ys), marker="o", markersize=3, label=name)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
