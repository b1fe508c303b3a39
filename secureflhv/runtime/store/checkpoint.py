"""Per-party training checkpoints: atomic, hashed, safe formats only, the last few steps kept.

A store lives at ``<output_dir>/<party id>/checkpoints/``. Each completed step (an epoch, a round,
a tree) is a folder ``step-<NNNNNNNN>/`` holding:

* ``state.json`` — plain JSON (counters, loss history, RNG state, configuration echoes);
* ``<name>.npy`` — one numpy array each, read back with ``np.load(..., allow_pickle=False)``;
* ``manifest.json`` — format and version, job id, party id, step, and the SHA-256 of every file.

Nothing is ever pickled or evaluated. Writing is atomic: the files go to a temporary folder in the
same directory, each is fsynced, the folder is fsynced, renamed to ``step-N`` and the parent is
fsynced, so a crash at any point leaves either the previous steps only or the new step complete.
After a save only the newest ``keep`` steps (default 2) remain; keeping two means the step before
the newest survives if the newest is later found damaged.

:meth:`CheckpointStore.load` checks the manifest (format, version, job, party, step) and every
file's hash; a mismatch raises :class:`CheckpointError` naming the file or field.
:meth:`CheckpointStore.last_complete_step` returns the newest step that loads cleanly, or ``None``.

Secrets that outlive a step (e.g. a Paillier private key the party generated) are written with
:meth:`CheckpointStore.write_secret`: same atomic write, file mode 0600, in the party's own store.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import fsync_dir, plain_json, sha256_hex

FORMAT = "secureflhv.checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE = "state.json"
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d{8})$")
_ARRAY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_STEP = 10**8 - 1


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, tampered with, or belongs to another job or party."""


def _write_synced(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _npy_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr)
    if arr.dtype == object:
        raise CheckpointError("object arrays cannot be checkpointed (they would need pickle)")
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


class CheckpointStore:
    """The checkpoints of one party in one job.

    ``root`` is ``<output_dir>/<party id>/checkpoints`` (see :func:`store_for`). Steps are ints in
    ``[0, MAX_STEP]``. Not safe for two writers at once (each party has its own store).
    """

    def __init__(self, root: Path | str, *, job_id: str, party_id: str, keep: int = 2):
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.root = Path(root)
        self.job_id = str(job_id)
        self.party_id = str(party_id)
        self.keep = int(keep)

    # -- writing -------------------------------------------------------------------------------
    def save(self, step: int, *, arrays: dict[str, np.ndarray] | None = None,
             state: dict[str, Any] | None = None) -> Path:
        """Write step ``step`` atomically and prune to the newest ``keep`` steps; returns its folder.

        ``arrays``: name → numpy array (any numeric dtype/shape; not object). ``state``: JSON-able.
        Raises :class:`CheckpointError` for a bad step, name or object array.
        """
        step = self._check_step(step)
        arrays = dict(arrays or {})
        files: dict[str, bytes] = {STATE: json.dumps(plain_json(state or {}), sort_keys=True).encode()}
        for name, arr in arrays.items():
            if not _ARRAY_NAME.match(name) or name in (STATE, MANIFEST):
                raise CheckpointError(f"bad array name {name!r}")
            files[f"{name}.npy"] = _npy_bytes(arr)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "job_id": self.job_id,
                    "party_id": self.party_id, "step": step,
                    "files": {n: sha256_hex(b) for n, b in sorted(files.items())}}
        files[MANIFEST] = json.dumps(manifest, sort_keys=True, indent=1).encode()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:08d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:08d}-", dir=self.root))
        try:
            for name, data in files.items():
                _write_synced(tmp / name, data)
            fsync_dir(tmp)
            if final.exists():  # re-running a step after a resume: replace it whole
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def write_secret(self, name: str, data: bytes) -> Path:
        """Atomically write ``data`` to ``root/name`` with mode 0600 (for this party's eyes only)."""
        if not _ARRAY_NAME.match(name):
            raise CheckpointError(f"bad file name {name!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        _write_synced(tmp, data, mode=0o600)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.root / name)
        fsync_dir(self.root)
        return self.root / name

    def read_secret(self, name: str) -> bytes | None:
        """The bytes written by :meth:`write_secret`, or ``None`` if absent."""
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def _prune(self) -> None:
        for step in self.steps()[:-self.keep]:
            shutil.rmtree(self.root / f"step-{step:08d}", ignore_errors=True)
        for leftover in self.root.glob(".tmp-step-*"):  # from a crash mid-write
            shutil.rmtree(leftover, ignore_errors=True)

    # -- reading -------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Step numbers present on disk (complete renames only), ascending; not yet verified."""
        if not self.root.is_dir():
            return []
        found = [int(m.group(1)) for p in self.root.iterdir() if p.is_dir()
                 and (m := _STEP_DIR.match(p.name))]
        return sorted(found)

    def last_complete_step(self) -> int | None:
        """The newest step that passes :meth:`load`'s checks, or ``None`` if there is none."""
        for step in reversed(self.steps()):
            try:
                self.load(step)
                return step
            except CheckpointError:
                continue
        return None

    def load(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Read and verify step ``step``; returns ``(arrays, state)``.

        Raises :class:`CheckpointError` if the step is missing, a file is missing, extra or its hash
        differs, or the manifest names another format, version, job, party or step.
        """
        step = self._check_step(step)
        folder = self.root / f"step-{step:08d}"
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint step {step} of {self.party_id}: no readable manifest ({exc})") from None
        if not isinstance(manifest, dict):
            raise CheckpointError(f"checkpoint step {step}: manifest is not an object")
        expect = {"format": FORMAT, "format_version": FORMAT_VERSION, "job_id": self.job_id,
                  "party_id": self.party_id, "step": step}
        for key, want in expect.items():
            if manifest.get(key) != want:
                raise CheckpointError(f"checkpoint step {step}: manifest {key} is {manifest.get(key)!r}, "
                                      f"expected {want!r}")
        hashes = manifest.get("files")
        if not isinstance(hashes, dict) or STATE not in hashes:
            raise CheckpointError(f"checkpoint step {step}: manifest lists no files")
        present = {p.name for p in folder.iterdir()} - {MANIFEST}
        if present != set(hashes):
            raise CheckpointError(f"checkpoint step {step}: files {sorted(present ^ set(hashes))} "
                                  "differ from the manifest")
        arrays: dict[str, np.ndarray] = {}
        state: dict[str, Any] = {}
        for name, want in hashes.items():
            data = (folder / name).read_bytes()
            if sha256_hex(data) != want:
                raise CheckpointError(f"checkpoint step {step}: {name} does not match its SHA-256 "
                                      "(damaged or tampered)")
            if name == STATE:
                try:
                    state = json.loads(data)
                except ValueError:
                    state = None
                if not isinstance(state, dict):
                    raise CheckpointError(f"checkpoint step {step}: {STATE} is not a JSON object")
            elif name.endswith(".npy"):
                try:
                    arrays[name[:-4]] = np.load(io.BytesIO(data), allow_pickle=False)
                except ValueError as exc:  # e.g. an object array, which would need pickle
                    raise CheckpointError(f"checkpoint step {step}: {name} is not a plain array ({exc})") from None
            else:
                raise CheckpointError(f"checkpoint step {step}: unexpected file {name!r}")
        return arrays, state

    def clear(self) -> None:
        """Remove every step (a fresh start); secrets stay."""
        for step in self.steps():
            shutil.rmtree(self.root / f"step-{step:08d}", ignore_errors=True)

    @staticmethod
    def _check_step(step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= int(step) <= MAX_STEP:
            raise CheckpointError(f"bad checkpoint step {step!r}")
        return int(step)


def store_for(output_dir: Path | str, *, job_id: str, party_id: str, keep: int = 2) -> CheckpointStore:
    """The store of ``party_id`` under ``<output_dir>/<party_id>/checkpoints``."""
    return CheckpointStore(Path(output_dir) / party_id / CHECKPOINT_DIR, job_id=job_id,
                           party_id=party_id, keep=keep)
