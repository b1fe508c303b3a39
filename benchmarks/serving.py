#!/usr/bin/env python3
"""Online serving of vertical models (`secureflhv serve`): latency of requests of 1 and 64 ids and requests/s at
saturation, beside the batch prediction job's cost per row and the plaintext floor, all in the same run.

What runs, per family (vertical LR in arbiter mode, SecureBoost, split NN): a synthetic table
(sklearn ``make_classification``, ``--rows`` x 30 columns, seeded) split over a guest (10 columns and the
label) and TWO hosts (10 columns each), every party holding every id. The model is trained with
``secureflhv run`` (real party processes, gRPC + mutual TLS), its prediction job is written with
``secureflhv predict``'s function, and then:

* the batch prediction job (``secureflhv run`` on it: fresh processes, mutual TLS, PSI over all the rows,
  scoring) is timed from the outside: its **wall time divided by the rows scored** (start-up, meeting and
  PSI included; the job logs no separate scoring time) and, from a second run over 64 rows, the
  **marginal cost per row** ``(T(rows) - T(64)) / (rows - 64)``;
* every party starts ``secureflhv serve`` (one process each: guest, host-1, host-2 and, for LR, the server;
  mutual TLS between them; the hosts' SQLite feature stores built at start) and this process calls the
  guest's HTTP/JSON front (``POST /v1/score``, one keep-alive connection per client thread):

  - latency: one client, requests one after the other, of 1 id and of 64 ids (ids drawn at random, the
    guest's raw feature values sent with them), timed at the client (JSON both ways included): p50, p95,
    p99 over ``--requests`` requests (or as many as fit in ``--window`` seconds), after a few warm-up ones;
  - saturation: ``--threads`` client threads send requests back to back for ``--window`` seconds;
    requests/s (and ids/s) completed. The guest's worker joins concurrent requests into one federated step
    of up to 64 ids, so 1-id requests from 8 threads share round trips;
  - the served scores of the 64-id requests are checked against the batch job's scores for the same ids
    (exactly for LR and SecureBoost, within 1e-9 for split NN, as docs/serving.md promises): a mismatch
    exits with status 1.
* the plaintext floor: the same model, every party's bundle loaded into this one process, scoring the same
  raw rows with numpy (LR: the saved preprocessing, then sigmoid(x.w + b)), the trees routed locally
  (guest splits and the hosts' split tables), and the split NN's forward pass in torch
  (:class:`secureflhv.vertical.split_nn.CentralisedSplitNN` with V_h + E_h); per request of 1 and 64 rows,
  median and p99. Its scores are compared with the served ones (max |difference| printed).

Keys: the measured runs use real keys. LR trains with ``key_bits: 2048`` and the arbiter's serving key is a
fresh 2048-bit Paillier key pair (the bundle's ``key_bits``); the split NN's hosts make fresh 2048-bit key
pairs when their services start. SecureBoost serving involves no encryption (left/right bits per split);
its training uses 2048-bit Okamoto-Uchiyama keys (``--sb-he-scheme``; Paillier takes ~3x longer to train),
which changes no message of serving. ``--quick`` uses 1024-bit
INSECURE test keys and smaller models, is labelled so, and records nothing.

The latency goal (set before the run; see ``GOAL_MS``): a credit decision engine calls its scores
synchronously while the applicant waits, and the field quotes tens of milliseconds for the whole decision;
the federated score must fit inside that: **p99 <= 50 ms for one applicant (1 id)**, every family, with
every party on this one 2-core machine (which shares the cores that three organisations' servers would
each have to themselves). A 64-id batch is a back-office call: no goal, its latency is reported.

    .venv/bin/python benchmarks/serving.py              # 2,000 rows; LR 2048-bit, SecureBoost 100 trees x depth 5,
                                                        # split NN 2048-bit; ~8 min on 2 cores; recorded
    .venv/bin/python benchmarks/serving.py --quick      # 300 rows, small models, 1024-bit test keys; nothing recorded
    .venv/bin/python benchmarks/serving.py --only lr --no-record

A full run (not ``--quick``, not ``--no-record``) records the rows ``serving_lr``, ``serving_secureboost`` and
``serving_split_nn`` in docs/benchmarks.json / docs/benchmarks.md (``benchmarks/_report.py``); then run
``benchmarks/update_readme.py`` to refresh the README's table.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's secureflhv, not an installed one
sys.path.insert(0, str(ROOT / "benchmarks"))

FAMILIES = ("lr", "secureboost", "split_nn")
ALGORITHM = {"lr": "vertical_lr", "secureboost": "secureboost_vertical", "split_nn": "vertical_nn"}
TITLE = {"lr": "vertical LR (arbiter mode)", "secureboost": "SecureBoost", "split_nn": "split NN"}
EXACT = {"lr", "secureboost"}   # served == batch job bit for bit; split NN within SPLIT_NN_TOL
SPLIT_NN_TOL = 1e-9
GOAL_MS = 50.0                  # p99 of a 1-id request, every family (module docstring)
SIZES = (1, 64)
WARMUP = 5


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """What one run measures (defaults, or ``--quick``'s smaller ones)."""

    quick: bool
    rows: int
    key_bits: int
    sb_trees: int
    sb_depth: int
    sb_he_scheme: str
    lr_epochs: int
    nn_epochs: int
    requests: int          # latency: requests per size (at most)
    window_s: float        # latency (at most) and saturation (exactly) seconds per size
    threads: int
    floor_reps: int
    families: tuple[str, ...] = FAMILIES
    seed: int = 0

    def params(self, family: str) -> dict:
        """The training job's ``params`` of ``family``."""
        if family == "lr":
            return {"mode": "arbiter", "epochs": self.lr_epochs, "batch_size": 256, "learning_rate": 0.15,
                    "key_bits": self.key_bits, "seed": 7}
        if family == "secureboost":
            return {"n_trees": self.sb_trees, "max_depth": self.sb_depth, "key_bits": self.key_bits,
                    "he_scheme": self.sb_he_scheme}
        return {"epochs": self.nn_epochs, "batch_size": 256, "host_bottom": [16, 4], "guest_bottom": [16, 4],
                "interactive_units": 4, "key_bits": self.key_bits, "learning_rate": 0.02, "seed": 1}

    def model(self, family: str) -> str:
        """The model in words, for the output and the record."""
        keys = f"{self.key_bits}-bit Paillier" + (" (INSECURE test key)" if self.key_bits < 2048 else "")
        if family == "lr":
            return f"vertical LR, arbiter mode, {keys}, {self.lr_epochs} epoch(s)"
        if family == "secureboost":
            scheme = "Okamoto-Uchiyama" if self.sb_he_scheme == "ou" else "Paillier"
            return (f"SecureBoost {self.sb_trees} trees x depth {self.sb_depth} (trained with {self.key_bits}-bit "
                    f"{scheme}; serving encrypts nothing)")
        return f"split NN, bottoms [16, 4], interactive width 4, {keys}, {self.nn_epochs} epoch(s)"


def settings(args) -> Settings:
    """:class:`Settings` from the parsed arguments (``--quick`` changes the defaults, flags still win)."""
    q = args.quick
    return Settings(
        quick=q, rows=args.rows or (300 if q else 2000), key_bits=args.key_bits or (1024 if q else 2048),
        sb_trees=args.sb_trees or (10 if q else 100), sb_depth=args.sb_depth or (3 if q else 5),
        sb_he_scheme=args.sb_he_scheme, lr_epochs=1 if q else 3, nn_epochs=1,
        requests=args.requests or (15 if q else 300), window_s=args.window or (1.0 if q else 10.0),
        threads=args.threads, floor_reps=30 if q else 300, families=tuple(args.only or FAMILIES), seed=args.seed)


# ------------------------------------------------------------------------------------------------- data
def make_tables(out: Path, rows: int, seed: int) -> tuple[Path, list[Path]]:
    """Guest and two host CSVs of a synthetic binary table (``make_classification``, rows x 30, 12
    informative; 10 columns per party), every party holding every id. Returns (guest csv, [host csvs])."""
    from sklearn.datasets import make_classification

    from secureflhv.data import Dataset
    from secureflhv.runtime.job.demo import vertical_tables

    X, y = make_classification(n_samples=rows, n_features=30, n_informative=12, random_state=seed)
    ds = Dataset(X.astype(np.float64), y.astype(np.int64), [f"f{j:02d}" for j in range(30)],
                 ids=np.array([f"c-{i:06d}" for i in range(rows)]), name="synthetic credit")
    return vertical_tables(ds, out, 2, seed, host_overlap=1.0, guest_missing=0.0)


def read_party(path: Path, columns: list[str]) -> tuple[list[str], dict[str, int], np.ndarray]:
    """(ids, id -> row, raw values (n, len(columns)) float64) of a party's CSV."""
    import pandas as pd

    df = pd.read_csv(path, dtype={"id": str})
    ids = list(df["id"])
    return ids, {i: k for k, i in enumerate(ids)}, df[columns].to_numpy(dtype=np.float64)


# ------------------------------------------------------------------------------------- the CLI, timed
def cli(args: list[str], log: Path, timeout: float) -> float:
    """Run ``secureflhv ARGS`` (output to ``log``); returns its wall seconds. RuntimeError on failure."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "secureflhv", *args], stdout=fh, stderr=subprocess.STDOUT,
                              timeout=timeout, cwd=ROOT)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"secureflhv {' '.join(args)} failed ({proc.returncode}):\n" + log.read_text()[-3000:])
    return took


# ------------------------------------------------------------------------------------------ services
class Services:
    """``secureflhv serve`` at every party of the prediction job ``job`` (own processes, mutual TLS)."""

    def __init__(self, job: Path, logs: Path, *extra: str, start_timeout: float = 300.0):
        import yaml

        self.logs = logs
        self.parties = [p["id"] for p in yaml.safe_load(job.read_text())["parties"]]
        ports = logs / "ports.json"
        ports.unlink(missing_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        t0 = time.perf_counter()
        for pid in self.parties:
            args = [sys.executable, "-m", "secureflhv", "serve", str(job), "--party", pid, *extra]
            if pid == "guest":
                args += ["--http-port", "0", "--ports-file", str(ports)]
            with open(logs / f"serve-{pid}.log", "w") as fh:
                self.procs[pid] = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.monotonic() + start_timeout
        while not ports.exists():
            dead = {p: c.returncode for p, c in self.procs.items() if c.poll() is not None}
            if dead or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"the services did not come up ({dead or 'timeout'}):\n{self.tail()}")
            time.sleep(0.1)
        self.port = json.loads(ports.read_text())["http"]
        self.start_s = time.perf_counter() - t0

    def tail(self) -> str:
        """The end of every party's log."""
        return "\n".join(f"--- {p}\n" + (self.logs / f"serve-{p}.log").read_text()[-2000:] for p in self.parties)

    def stop(self, grace_s: float = 30.0) -> dict[str, int | None]:
        """SIGTERM the guest (it releases the others), give everyone ``grace_s`` to leave, then SIGTERM
        (and at last SIGKILL) whoever is left; their exit codes."""
        guest = self.procs.get("guest")
        if guest is not None and guest.poll() is None:
            guest.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(c.poll() is None for c in self.procs.values()):
            time.sleep(0.1)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return {p: c.returncode for p, c in self.procs.items()}


class Client:
    """One keep-alive HTTP/1.1 connection to the guest's front end."""

    def __init__(self, port: int, caller: str = "bench"):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Content-Type": "application/json", "X-Caller": caller}

    def score(self, ids: list[str], features: np.ndarray) -> tuple[int, dict]:
        """(HTTP status, answer) of POST /v1/score."""
        body = json.dumps({"ids": ids, "features": features.tolist()}).encode()
        self.conn.request("POST", "/v1/score", body, self.headers)
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())

    def get(self, path: str) -> dict:
        """The JSON answer of GET ``path``."""
        self.conn.request("GET", path)
        return json.loads(self.conn.getresponse().read())

    def close(self) -> None:
        self.conn.close()


def percentiles(latencies_s: list[float]) -> dict:
    """p50 / p95 / p99 / max in milliseconds and the count (numpy's linear interpolation)."""
    a = np.asarray(latencies_s, dtype=np.float64) * 1e3
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max()), "mean": float(a.mean())}


def latency_run(port: int, ids: list[str], Xg: np.ndarray, size: int, n_max: int, window_s: float,
                rng: np.random.Generator) -> tuple[dict, dict[str, float]]:
    """Requests of ``size`` random ids one after the other (after WARMUP ones), at most ``n_max`` or
    ``window_s`` seconds (at least 20 requests, or ``n_max`` if fewer); returns (:func:`percentiles` at the client, with
    ``guest_p50``: the guest's own p50 from the answers' latency_ms, id -> served score)."""
    client, lat, served, inside = Client(port), [], {}, []
    try:
        for k in range(WARMUP + n_max):
            pick = rng.choice(len(ids), size=size, replace=False)
            batch = [ids[i] for i in pick]
            t0 = time.perf_counter()
            status, ans = client.score(batch, Xg[pick])
            took = time.perf_counter() - t0
            if status != 200:
                raise RuntimeError(f"POST /v1/score ({size} ids): {status} {ans}")
            if k == WARMUP:
                start = time.perf_counter()
            if k >= WARMUP:
                lat.append(took)
                inside.append(ans["latency_ms"])
                served.update(zip(batch, ans["scores"]))
                if len(lat) >= min(20, n_max) and time.perf_counter() - start > window_s:
                    break
    finally:
        client.close()
    return {**percentiles(lat), "guest_p50": float(np.median(inside))}, served


def saturation_run(port: int, ids: list[str], Xg: np.ndarray, size: int, threads: int, window_s: float,
                   seed: int) -> dict:
    """``threads`` clients send requests of ``size`` ids back to back for ``window_s`` seconds; requests/s,
    ids/s and the latencies the clients saw (errors counted, not raised)."""
    stop, lock = threading.Event(), threading.Lock()
    lat: list[float] = []
    errors: list[str] = []

    ready, go = threading.Barrier(threads + 1), threading.Event()

    def run(k: int) -> None:
        rng, client = np.random.default_rng([seed, k]), Client(port, f"bench-{k}")
        mine = []
        try:
            pick = rng.choice(len(ids), size=size, replace=False)
            client.score([ids[i] for i in pick], Xg[pick])   # connected and warm before the window
            ready.wait(300)
            go.wait()
            while not stop.is_set():
                pick = rng.choice(len(ids), size=size, replace=False)
                t0 = time.perf_counter()
                status, ans = client.score([ids[i] for i in pick], Xg[pick])
                if status == 200:
                    mine.append((t0, time.perf_counter() - t0))
                else:
                    errors.append(f"{status} {ans.get('error')}")
        except Exception as exc:  # noqa: BLE001 - counted and printed
            errors.append(repr(exc))
            ready.abort()
        finally:
            client.close()
            with lock:
                lat.extend(mine)

    pool = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for th in pool:
        th.start()
    try:
        ready.wait(300)
    except threading.BrokenBarrierError:
        pass   # a client failed before the window: counted in errors
    t0 = time.perf_counter()
    go.set()
    time.sleep(window_s)
    stop.set()
    for th in pool:
        th.join(180)
    elapsed = time.perf_counter() - t0
    done = [d for s, d in lat if s + d <= t0 + window_s]  # completed inside the window
    out = {"threads": threads, "seconds": window_s, "requests": len(done), "rps": len(done) / window_s,
           "ids_per_s": len(done) * size / window_s, "errors": len(errors), "elapsed": elapsed}
    if errors:
        out["first_error"] = errors[0]
    if done:
        out["latency"] = percentiles(done)
    return out


# ----------------------------------------------------------------------------------- one message hop
def transport_rtt(certs: Path, n: int) -> dict:
    """:func:`percentiles` of ``n`` round trips of a small message between two parties' gRPC transports (mutual
    TLS, loopback; both in this process, the echo in a thread): what one federated message hop costs here. A
    served request takes several hops in sequence (its step, the family's own exchange, the hosts' replies)."""
    from secureflhv.proto import messages_pb2
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport

    a = GrpcTransport("guest", "rtt", "127.0.0.1:0", {"host-1": "127.0.0.1:1"},
                      tls=load_party_credentials(certs, "guest"), deadline=60)
    b = GrpcTransport("host-1", "rtt", "127.0.0.1:0", {"guest": "127.0.0.1:1"},
                      tls=load_party_credentials(certs, "host-1"), deadline=60)
    a.set_peer_address("host-1", b.address)
    b.set_peer_address("guest", a.address)

    def echo():
        for k in range(1, WARMUP + n + 1):
            b.send("guest", "pong", b.recv("guest", "ping", round=k), round=k)
    th = threading.Thread(target=echo, daemon=True)
    th.start()
    msg, lat = messages_pb2.Bundle(text={"op": "ping"}), []
    try:
        for k in range(1, WARMUP + n + 1):
            t0 = time.perf_counter()
            a.send("host-1", "ping", msg, round=k)
            a.recv("host-1", "pong", round=k)
            if k > WARMUP:
                lat.append(time.perf_counter() - t0)
        th.join(30)
    finally:
        a.close(grace=0)
        b.close(grace=0)
    return percentiles(lat)


# ----------------------------------------------------------------------------------- plaintext floor
class Floor:
    """Every party's bundle of one trained model in this process: ``score(rows)`` scores rows (indices into the
    parties' tables, which hold the same ids in the same order here) in plaintext."""

    def __init__(self, family: str, out: Path, ca: Path, tables: dict[str, tuple]):
        from secureflhv.runtime.algorithms.predict import model_inputs
        from secureflhv.runtime.serve.scoring import input_columns
        from secureflhv.runtime.store.model_bundle import read_bundle

        self.family, self.model_inputs = family, model_inputs
        self.bundles = {p: read_bundle(out / p, ca=ca) for p in ("guest", "host-1", "host-2")}
        self.raw, order = {}, None
        for p, b in self.bundles.items():   # the guest first: its row order at every party
            ids, index, X = read_party(tables[p], input_columns(b))
            order = ids if order is None else order
            self.raw[p] = X[[index[i] for i in order]]
        self.ids = order
        getattr(self, f"_load_{family}")()

    def _load_lr(self) -> None:
        g = self.bundles["guest"]
        self.w = {p: np.asarray(b.file("weights.npy"), dtype=np.float64) for p, b in self.bundles.items()}
        b0 = g.files.get("intercept.npy")
        self.b = 0.0 if b0 is None else float(np.asarray(g.file("intercept.npy")).ravel()[0])

    def _load_secureboost(self) -> None:
        from secureflhv.tree.model import model_from_dict

        self.model = model_from_dict(self.bundles["guest"].file("model.json"))
        self.records = {p: b.file("split_table.json") for p, b in self.bundles.items() if p != "guest"}

    def _load_split_nn(self) -> None:
        from secureflhv.vertical.split_nn import (CentralisedSplitNN, SplitNNConfig, _load_module, build_mlp)

        g = self.bundles["guest"]
        cfg = SplitNNConfig(**g.config)
        ga = {k: np.asarray(v, dtype=np.float64) for k, v in g.file("state.safetensors").items()}
        gb = build_mlp(self.raw["guest"].shape[1], cfg.guest_bottom, cfg.activation, 0) if cfg.guest_bottom else None
        if gb is not None:
            _load_module("bottom", gb, ga)
        hbs, Ws = [], []
        for h in ("host-1", "host-2"):
            ha = {k: np.asarray(v, dtype=np.float64) for k, v in self.bundles[h].file("state.safetensors").items()}
            hb = build_mlp(self.raw[h].shape[1], cfg.host_bottom, cfg.activation, 0)
            _load_module("bottom", hb, ha)
            hbs.append(hb)
            Ws.append(ga[f"interactive.V.{h}"] + ha["interactive.E"])
        n_classes = g.extra.get("n_classes")
        out_dim = 1 if n_classes in (None, 2) else int(n_classes)
        top = build_mlp(cfg.interactive_units, cfg.top_hidden, cfg.activation, 0, out_dim=out_dim)
        _load_module("top", top, ga)
        target = tuple(ga["target"]) if "target" in ga else None
        self.net = CentralisedSplitNN(cfg, gb, hbs, ga["interactive.W_g"], Ws, ga["interactive.bias"], top,
                                      None if n_classes is None else int(n_classes), target)

    def inputs(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each party's rows after its bundle's saved preprocessing."""
        return {p: self.model_inputs(self.raw[p][rows], b) for p, b in self.bundles.items()}

    def score(self, rows: np.ndarray) -> np.ndarray:
        """Plaintext scores (m,) of the rows ``rows`` (raw values in, preprocessing included)."""
        X = self.inputs(rows)
        if self.family == "lr":
            z = self.b + sum(X[p] @ self.w[p] for p in X)
            return 1.0 / (1.0 + np.exp(-z))
        if self.family == "secureboost":
            return self._route(X)
        return self.net.predict_proba(X["guest"], [X["host-1"], X["host-2"]])

    def _route(self, X: dict[str, np.ndarray]) -> np.ndarray:
        from secureflhv.tree.params import transform
        from secureflhv.tree.routing import goes_left

        m = len(X["guest"])
        margin = np.tile(self.model.base_margin, (m, 1)).astype(np.float64)
        for tree in self.model.trees:
            pos = np.zeros(m, dtype=np.int64)
            while True:
                moved = False
                for nid in np.unique(pos).tolist():
                    node = tree.nodes[nid]
                    if node.leaf:
                        continue
                    moved, at = True, np.flatnonzero(pos == nid)
                    if node.owner == "guest":
                        left = goes_left(X["guest"][at, node.feature], node.threshold, node.default_left)
                    else:
                        feat, _, thr, dl = self.records[node.owner][node.record]
                        left = goes_left(X[node.owner][at, int(feat)], float(thr), bool(dl))
                    pos[at] = np.where(left, node.left, node.right)
                if not moved:
                    break
            vals = np.zeros(m)
            for nid in np.unique(pos).tolist():
                vals[pos == nid] = tree.nodes[nid].value
            margin[:, tree.output] += vals
        return transform(margin, self.model.params)


def floor_run(floor: Floor, size: int, reps: int, rng: np.random.Generator) -> dict:
    """:func:`percentiles` of ``reps`` plaintext scorings of ``size`` random rows (after WARMUP)."""
    lat = []
    for k in range(WARMUP + reps):
        rows = rng.choice(len(floor.ids), size=size, replace=False)
        t0 = time.perf_counter()
        floor.score(rows)
        if k >= WARMUP:
            lat.append(time.perf_counter() - t0)
    return percentiles(lat)


# ------------------------------------------------------------------------------------------- one family
@dataclass
class FamilyResult:
    family: str
    model: str
    train_s: float = 0.0
    batch: dict = field(default_factory=dict)       # rows, seconds, per_row_ms, small_s, marginal_ms
    start_s: float = 0.0
    latency: dict = field(default_factory=dict)     # size -> percentiles
    saturation: dict = field(default_factory=dict)  # size -> saturation_run
    floor: dict = field(default_factory=dict)       # size -> percentiles
    served_vs_batch: float = 0.0                    # max |served - batch job| over the ids served
    served_vs_floor: float = 0.0                    # max |served - plaintext| over the ids served
    ids_checked: int = 0
    stats: dict = field(default_factory=dict)       # the guest's GET /v1/stats at the end


def write_subset(src: Path, dst: Path, ids: list[str]) -> Path:
    """The rows of ``ids`` of the CSV ``src``, written to ``dst``."""
    import pandas as pd

    df = pd.read_csv(src, dtype={"id": str})
    dst.parent.mkdir(parents=True, exist_ok=True)
    df[df["id"].isin(set(ids))].to_csv(dst, index=False, float_format="%.17g")
    return dst


def run_family(family: str, s: Settings, work: Path, guest_csv: Path, host_csvs: list[Path]) -> FamilyResult:
    """Train, batch-score, serve and measure one family (see the module docstring)."""
    import pandas as pd

    from secureflhv.runtime.algorithms.predict import write_predict_job
    from secureflhv.runtime.job.demo import vertical_parties, write_job

    res = FamilyResult(family, s.model(family))
    base = work / family
    tables = {"guest": guest_csv, "host-1": host_csvs[0], "host-2": host_csvs[1]}
    parties = vertical_parties(guest_csv, host_csvs, server=family == "lr", id_column="id", label_column="label")
    job = write_job(base / "train", f"serve-bench-{family}", ALGORITHM[family], parties, s.params(family),
                    deadline_s=300, insecure_test_keys=s.key_bits < 2048)
    print(f"\n== {TITLE[family]}: {res.model}", flush=True)
    res.train_s = cli(["run", str(job), "--timeout", "1800"], base / "train.log", 1900)
    print(f"  trained in {res.train_s:.1f} s (secureflhv run, {len(parties)} processes)", flush=True)

    # the batch prediction job over every row, and over 64 rows (its fixed costs)
    pjob = write_predict_job(job, base / "predict" / "job.yaml", data=tables, new_ports=True)
    t_all = cli(["run", str(pjob), "--timeout", "1800"], base / "batch.log", 1900)
    pred = pd.read_csv(base / "predict" / "predictions" / "guest" / "predictions.csv", dtype={"id": str})
    batch_scores = dict(zip(pred["id"], pred["score"]))
    n = len(pred)
    res.batch = {"rows": n, "seconds": t_all, "per_row_ms": t_all / n * 1e3}
    if not s.quick:   # the fixed costs: the same job over 64 rows
        small_ids = sorted(batch_scores)[:64]
        small = {p: write_subset(t, base / "small" / f"{p}.csv", small_ids) for p, t in tables.items()}
        sjob = write_predict_job(job, base / "small" / "job.yaml", data=small, new_ports=True)
        t_small = cli(["run", str(sjob), "--timeout", "600"], base / "batch-small.log", 700)
        res.batch.update(small_rows=64, small_s=t_small, marginal_ms=(t_all - t_small) / (n - 64) * 1e3)
    print(f"  batch job: {n:,} rows in {t_all:.1f} s wall ({res.batch['per_row_ms']:.2f} ms/row, start-up and PSI "
          f"included)" + (f"; 64 rows in {res.batch['small_s']:.1f} s; marginal {res.batch['marginal_ms']:.2f} ms/row"
                          if "small_s" in res.batch else ""), flush=True)

    floor = Floor(family, job.parent / "out", job.parent / "certs" / "ca.pem", tables)
    ids, Xg = floor.ids, floor.raw["guest"]
    services = Services(pjob, base, "--rate", "1000000", "--burst", "1000000", "--timeout", "120",
                        "--deadline", "60")
    res.start_s = services.start_s
    print(f"  serve: {len(services.parties)} processes up in {res.start_s:.1f} s; HTTP port {services.port}",
          flush=True)
    served: dict[str, float] = {}
    try:
        rng = np.random.default_rng([s.seed, 41])
        for size in SIZES:
            res.latency[size], got = latency_run(services.port, ids, Xg, size, s.requests, s.window_s, rng)
            served.update(got)
            p = res.latency[size]
            print(f"  {size:>2} id(s), one client: p50 {p['p50']:.1f} ms, p95 {p['p95']:.1f} ms, p99 {p['p99']:.1f} ms "
                  f"({p['n']} requests; the guest's own p50 {p['guest_p50']:.1f} ms)", flush=True)
        for size in SIZES:
            sat = res.saturation[size] = saturation_run(services.port, ids, Xg, size, s.threads, s.window_s, s.seed)
            lat = sat.get("latency", {})
            print(f"  {size:>2} id(s), {s.threads} clients for {s.window_s:g} s: {sat['rps']:.1f} requests/s "
                  f"({sat['ids_per_s']:.0f} ids/s; p50 {lat.get('p50', float('nan')):.1f} ms, p99 "
                  f"{lat.get('p99', float('nan')):.1f} ms; {sat['errors']} errors"
                  + (f", first: {sat['first_error']}" if sat["errors"] else "") + ")", flush=True)
        client = Client(services.port)
        res.stats = client.get("/v1/stats")
        client.close()
    finally:
        codes = services.stop()
    if codes.get("guest") != 0:
        print(f"  WARNING: serve exit codes {codes}:\n{services.tail()}", file=sys.stderr)

    for size in SIZES:
        res.floor[size] = floor_run(floor, size, s.floor_reps, np.random.default_rng([s.seed, 7, size]))
    row = {i: k for k, i in enumerate(ids)}
    keys = sorted(served)
    got = np.array([served[i] for i in keys])
    res.ids_checked = len(keys)
    res.served_vs_batch = float(np.max(np.abs(got - np.array([batch_scores[i] for i in keys]))))
    res.served_vs_floor = float(np.max(np.abs(got - floor.score(np.array([row[i] for i in keys])))))
    f1, f64 = res.floor[1], res.floor[64]
    print(f"  plaintext floor (one process): 1 row p50 {f1['p50'] * 1e3:.0f} us, p99 {f1['p99'] * 1e3:.0f} us; "
          f"64 rows p50 {f64['p50'] * 1e3:.0f} us, p99 {f64['p99'] * 1e3:.0f} us", flush=True)
    print(f"  served scores of {len(keys):,} ids: max |served - batch job| {res.served_vs_batch:.3g}, "
          f"max |served - plaintext| {res.served_vs_floor:.3g}", flush=True)
    return res


# ------------------------------------------------------------------------------------------------ report
def ok_equal(r: FamilyResult) -> bool:
    """Whether the served scores equal the batch job's (exactly, or within SPLIT_NN_TOL for split NN)."""
    return r.served_vs_batch == 0.0 if r.family in EXACT else r.served_vs_batch <= SPLIT_NN_TOL


def goal_met(r: FamilyResult) -> bool:
    return r.latency[1]["p99"] <= GOAL_MS


def why(r: FamilyResult, s: Settings, rtt: dict) -> str:
    """Where a family's 1-id latency goes (the explanation beside a goal not met). Every send between parties
    waits for the receiver's acknowledgement (about half of a message round trip)."""
    hop = f"one message round trip between two parties' gRPC transports takes {rtt['p50']:.1f} ms here (p50)"
    if r.family == "secureboost":
        return (f"the trees are routed level by level: per request the guest sends {2 * (s.sb_depth + 2)} messages one "
                f"after the other (to each of the 2 hosts: the step, one routing request per level of depth "
                f"{s.sb_depth}, the end of routing), each waiting for its acknowledgement, and waits for {s.sb_depth} "
                f"rounds of replies; {hop}")
    if r.family == "split_nn":
        return (f"per row each host encrypts its 4 bottom outputs and decrypts 4 masked products ({s.key_bits}-bit "
                "Paillier), the guest multiplies each host's ciphertexts by its share of the interactive layer; the "
                "guest's 6 sends (to each host: the step, the row request, the masked products) go one after the "
                f"other, each waiting for its acknowledgement; {hop}")
    return ("the guest sends the step and the row request to each host one after the other, the hosts' encrypted "
            f"parts come back, the masked total goes to the arbiter and back; {hop}")


def summary(results: list[FamilyResult], s: Settings, load: tuple[float, float], rtt: dict) -> None:
    """The table of every family's figures, the ratios and the goal."""
    print(f"\n== serving, {s.rows:,} rows, guest + 2 hosts{' + server (LR)' if 'lr' in s.families else ''} as "
          f"`secureflhv serve` processes on {os.cpu_count()} cores (mutual TLS); load average {load[0]:.1f} / "
          f"{load[1]:.1f} (start / end){' [quick: INSECURE 1024-bit test keys]' if s.quick else ''}")
    print(f"  {'family':<12} {'ids':>3} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'req/s @' + str(s.threads):>10} "
          f"{'ids/s':>7} {'batch ms/row':>13} {'floor p50 ms':>13} {'served/floor':>13}")
    for r in results:
        for size in SIZES:
            p, sat, f = r.latency[size], r.saturation[size], r.floor[size]
            print(f"  {r.family:<12} {size:>3} {p['p50']:>8.1f} {p['p95']:>8.1f} {p['p99']:>8.1f} {sat['rps']:>10.1f} "
                  f"{sat['ids_per_s']:>7.0f} {r.batch['per_row_ms']:>13.2f} {f['p50']:>13.3f} "
                  f"{p['p50'] / f['p50']:>12,.0f}x")
    print("  latency: at one client, one request at a time; req/s and ids/s: completed in the window by "
          f"{s.threads} clients; batch ms/row: the prediction job's wall time / rows (start-up, mutual TLS, PSI "
          "included); floor: the whole model in this process, raw rows in")
    for r in results:
        per_id = r.latency[64]["p50"] / 64
        marginal = f", marginal {r.batch['marginal_ms']:.2f} ms/row" if "marginal_ms" in r.batch else ""
        print(f"  {r.family}: 64 ids p50 = {per_id:.2f} ms/id (batch job {r.batch['per_row_ms']:.2f} ms/row"
              f"{marginal}); scores equal the batch job's: {ok_equal(r)} (max diff {r.served_vs_batch:.3g}; "
              f"the plaintext floor's max diff {r.served_vs_floor:.3g})")
    print(f"  goal: 1-id p99 <= {GOAL_MS:.0f} ms (credit decisions take tens of ms end to end):")
    for r in results:
        p = r.latency[1]
        print(f"    {r.family}: p99 {p['p99']:.1f} ms, " + ("met" if goal_met(r) else
              f"NOT met: {why(r, s, rtt)}") + f" (the guest's own p50 {p['guest_p50']:.1f} ms of "
              f"{p['p50']:.1f} ms at the client)")


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def record(results: list[FamilyResult], s: Settings, load: tuple[float, float], rtt: dict,
           docs: Path | None = None) -> None:
    """One row per family: ``serving_lr``, ``serving_secureboost``, ``serving_split_nn``."""
    import _report

    for r in results:
        lat, sat, f, b = r.latency, r.saturation, r.floor, r.batch
        goal = f"goal 1-id p99 <= {GOAL_MS:.0f} ms: " + ("met" if goal_met(r) else f"NOT met ({why(r, s, rtt)})")
        equal = "exactly" if r.served_vs_batch == 0 else f"within {r.served_vs_batch:.1g}"
        per_row = lat[64]["p50"] / 64
        _report.record(f"serving_{r.family}", {
            "what": (f"online serving (`secureflhv serve`), {r.model}; {s.rows:,} rows; guest + 2 hosts"
                     f"{' + server' if r.family == 'lr' else ''} as processes on this machine, mutual TLS; HTTP/JSON "
                     "client (`serving.py`)"),
            "ours": ("p50 / p95 / p99: 1 id " + " / ".join(_ms(lat[1][k]) for k in ("p50", "p95", "p99"))
                     + " ms, 64 ids " + " / ".join(_ms(lat[64][k]) for k in ("p50", "p95", "p99"))
                     + f" ms (one client, {lat[1]['n']} / {lat[64]['n']} requests); saturation, {s.threads} clients: "
                     f"{sat[1]['rps']:.0f} requests/s of 1 id, {sat[64]['rps']:.1f} requests/s of 64 ids "
                     f"({sat[64]['ids_per_s']:.0f} ids/s); {goal}; scores equal the batch job's ({equal}, "
                     f"{r.ids_checked:,} ids). Load average {load[0]:.1f} / {load[1]:.1f} (start / end) on "
                     f"{os.cpu_count()} cores"),
            "baseline": (f"batch prediction job (`secureflhv run`, {b['rows']:,} rows): {b['seconds']:.1f} s wall = "
                         f"{b['per_row_ms']:.2f} ms/row (start-up, mutual TLS, PSI included)"
                         + (f"; the same job over 64 rows {b['small_s']:.1f} s, so "
                            + (f"marginal {b['marginal_ms']:.2f} ms/row" if b["marginal_ms"] > 0 else
                               "the marginal cost is below the run-to-run noise") if "marginal_ms" in b else "")
                         + f"; plaintext floor (the whole model in one process, "
                         f"{'torch' if r.family == 'split_nn' else 'numpy'}) p50 {f[1]['p50'] * 1e3:.0f} µs per row, "
                         f"{f[64]['p50'] * 1e3:.0f} µs per 64 rows"),
            "ratio": (f"1 id {lat[1]['p50'] / f[1]['p50']:,.0f}× the floor, 64 ids "
                      f"{lat[64]['p50'] / f[64]['p50']:,.0f}× (p50); per row at 64 ids {per_row:.2f} ms, "
                      f"{b['per_row_ms'] / per_row:.1f}× less than the batch job's wall per row"),
        }, *([docs] if docs is not None else []))


# -------------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    """Run the benchmark; returns {"settings", "results", "load"} for tests."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("What runs"):])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 300 rows, SecureBoost 10 trees x depth 3, 1024-bit INSECURE test keys, short "
                         "windows; nothing recorded")
    ap.add_argument("--only", nargs="+", choices=FAMILIES, help="only these families (default: all three)")
    ap.add_argument("--rows", type=int, help="rows of the table (default 2,000; --quick 300)")
    ap.add_argument("--key-bits", type=int, help="Paillier key size (default 2048; --quick 1024, a test key)")
    ap.add_argument("--sb-trees", type=int, help="SecureBoost trees (default 100; --quick 10)")
    ap.add_argument("--sb-depth", type=int, help="SecureBoost depth (default 5; --quick 3)")
    ap.add_argument("--sb-he-scheme", choices=["paillier", "ou"], default="ou",
                    help="SecureBoost's training scheme, 2048-bit keys (serving encrypts nothing: left/right bits "
                         "only; default ou, ~3x faster to train than paillier)")
    ap.add_argument("--requests", type=int, help="latency: most requests per size (default 300, at least 20 "
                                                 "unless fewer; --quick 15)")
    ap.add_argument("--window", type=float, help="seconds per latency run (at most) and per saturation run "
                                                 "(default 10; --quick 1)")
    ap.add_argument("--threads", type=int, default=8, help="client threads at saturation (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="data seed")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--no-record", action="store_true", help="leave docs/benchmarks.json alone")
    args = ap.parse_args(argv)
    s = settings(args)
    if s.rows < 128 or s.threads < 1:
        ap.error("need --rows >= 128 and --threads >= 1")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    load0 = os.getloadavg()[0]
    print(f"serving benchmark: {', '.join(s.families)}; {s.rows:,} rows; {s.key_bits}-bit keys"
          f"{' (INSECURE test keys)' if s.key_bits < 2048 else ''}; {os.cpu_count()} CPUs, load average before: "
          f"{load0:.2f}", flush=True)
    t0 = time.perf_counter()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sf-serving-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        from secureflhv.transport.certs import generate_certificates

        generate_certificates(work / "rtt-certs", ["guest", "host-1"], overwrite=True)
        rtt = transport_rtt(work / "rtt-certs", 50 if s.quick else 300)
        print(f"one message round trip between two parties' gRPC transports (mutual TLS, loopback, one process): "
              f"p50 {rtt['p50']:.2f} ms, p99 {rtt['p99']:.2f} ms ({rtt['n']} round trips)", flush=True)
        guest_csv, host_csvs = make_tables(work / "data", s.rows, s.seed)
        for family in s.families:
            results.append(run_family(family, s, work, guest_csv, host_csvs))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    load = (load0, os.getloadavg()[0])
    summary(results, s, load, rtt)
    print(f"  total {time.perf_counter() - t0:.0f} s")
    bad = [r.family for r in results if not ok_equal(r)]
    if bad:
        print(f"ERROR: served scores differ from the batch job's: {bad}", file=sys.stderr)
        raise SystemExit(1)
    if not s.quick and not args.no_record:
        record(results, s, load, rtt)
    return {"settings": s, "results": results, "load": load, "rtt": rtt}


if __name__ == "__main__":
    main()
