"""Start every party of a prediction job as ``secureflhv serve`` processes (gRPC + mutual TLS) and talk to the
guest's HTTP front end (not a test module)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml


class Served:
    """The serve processes of the prediction job ``job`` (every party in it); the guest's HTTP port once up."""

    def __init__(self, job: Path, tmp: Path, *extra: str):
        self.job, self.tmp = Path(job), Path(tmp)
        doc = yaml.safe_load(self.job.read_text())
        self.parties = [p["id"] for p in doc["parties"]]
        self.ports_file = self.tmp / "ports.json"
        self.procs: dict[str, subprocess.Popen] = {}
        for pid in self.parties:
            args = [sys.executable, "-m", "secureflhv", "serve", str(self.job), "--party", pid, *extra]
            if pid == "guest":
                args += ["--http-port", "0", "--ports-file", str(self.ports_file)]
            log = open(self.tmp / f"{pid}.log", "w")
            self.procs[pid] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.port = self._wait_ports(120.0)["http"]

    def _wait_ports(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ports_file.exists():
                return json.loads(self.ports_file.read_text())
            dead = {p: c.poll() for p, c in self.procs.items() if c.poll() is not None}
            if dead:
                raise AssertionError(f"serve exited early {dead}:\n" + self.logs())
            time.sleep(0.2)
        raise AssertionError("the guest's service did not come up:\n" + self.logs())

    def logs(self) -> str:
        """Every party's log so far (for assertion messages)."""
        return "\n".join(f"--- {p}\n" + (self.tmp / f"{p}.log").read_text()[-3000:] for p in self.parties)

    def call(self, method: str, path: str, body=None, *, raw: bytes | None = None, timeout: float = 60.0):
        """(HTTP status, decoded JSON answer) of one request to the guest's front end."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def score(self, ids, features):
        """POST /v1/score; returns (status, answer)."""
        return self.call("POST", "/v1/score", {"ids": list(ids), "features": [list(map(float, r)) for r in features]})

    def stop(self, timeout: float = 30.0) -> dict[str, int]:
        """SIGTERM the guest first (it releases the others), then anyone left; returns the exit codes."""
        order = ["guest"] + [p for p in self.parties if p != "guest"]
        for pid in order:
            proc = self.procs[pid]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return {p: c.returncode for p, c in self.procs.items()}


class StubScoring:
    """A stand-in for a family's prediction roles (runtime/serve/scoring.py), to test the serving exchange alone:
    the score is the sum of the guest's columns; a host answers nothing (the families' own exchanges are the
    prediction job's, tested elsewhere)."""

    def __init__(self, bundle=None):
        from types import SimpleNamespace

        self.bundle, self.role = bundle or SimpleNamespace(algorithm="vertical_lr"), None

    def score(self, X):
        """Sum of each row of X (m, d) -> (m,)."""
        import numpy as np

        return np.asarray(X).sum(axis=1)

    def answer(self, X):
        """Nothing to answer: 0 requests."""
        return 0

    def close(self):
        """Nothing to release."""
        return None


def stub_loader(me: str, refuse: dict):
    """model_dir -> a stand-in bundle of party ``me`` (``model_dir`` kept), JobConfigError for the model_dirs
    ``refuse[me]`` names (a party without that bundle)."""
    from types import SimpleNamespace

    from secureflhv.runtime.job.job_file import JobConfigError

    def load(model_dir):
        if model_dir in refuse.get(me, ()):
            raise JobConfigError(f"no bundle of {me} in {model_dir}")
        return SimpleNamespace(algorithm="vertical_lr", model_dir=model_dir)
    return load


def stub_scoring_patches():
    """Patches of runtime/serve/federation.py that build :class:`StubScoring` and read the stand-in bundles'
    fingerprint (``fp-<model_dir>``) and columns (``["x"]``); start() them, stop() after."""
    from unittest import mock

    from secureflhv.runtime.serve import federation as fed

    return [mock.patch.object(fed, "build_scoring", lambda cfg, party, t, bundle, **k: StubScoring(bundle)),
            mock.patch.object(fed, "fingerprint", lambda b: f"fp-{b.model_dir}"),
            mock.patch.object(fed, "input_columns", lambda b: ["x"])]
