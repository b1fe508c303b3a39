"""Shared helpers of the horizontal FL tests: run a server and clients as threads over InProcessNetwork; write
and run horizontal jobs (a server and clients, or multiconfederated peers) in process or over gRPC + mTLS;
shards of a library partition; and the check that a job run as processes ended, bit for bit, where the same
job run in one process ends (:func:`compare_with_in_process`)."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import yaml

from secureflhv.secagg import AggregationConfig
from secureflhv.horizontal.fl import FLConfig, HorizontalClient, HorizontalServer
from secureflhv.horizontal.models import ModelSpec
from secureflhv.horizontal.strategy_registry import make_strategy
from secureflhv.horizontal.strategies import LocalTrainConfig
from secureflhv.transport.inprocess import InProcessNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: lifecycle_helpers
from lifecycle_helpers import lifecycle_kwargs  # noqa: E402


def run_fl(shards, test, spec: ModelSpec, strategy="fedavg", kind="plain", rounds=2, fraction=1.0, seed=0,
           local=None, agg_kw=None, fail=None, mu=0.01, deadline=60.0, on_round=None, fl_kw=None,
           cert_dir=None, strategy_kw=None, server_transport_cls=None, prepare=None, callbacks=None, resume=None):
    """Run FL over threads; ``shards`` = [(X, y)] per client, ``test`` = (X, y) local test rows for each.

    ``fl_kw``: extra :class:`FLConfig` fields (e.g. ``contribution_temperature``); ``cert_dir``: run the
    in-process network with certificate identities (secagg's actively secure mode); ``strategy_kw``: extra
    :func:`make_strategy` arguments (``clusters``, ``personal_layers``); ``server_transport_cls``: the
    server's transport class (e.g. a recording one), built as ``cls(network, "server")``;
    ``prepare(server, clients)`` runs before they start (e.g. to swap a client's aggregation class);
    ``callbacks`` / ``resume``: {party id ("server", "c0", ...): callbacks list / (arrays, state)}, each
    role's lifecycle arguments at construction (:mod:`secureflhv.transport.lifecycle`; absent: none).
    ``fail``: {client index: round} makes that client raise inside local training of that round (and
    its party goes down), to simulate a client dropping mid-training.
    Returns (server, clients, errors by party id).
    """
    ids = [f"c{i}" for i in range(len(shards))]
    net = InProcessNetwork("fl-test", ["server", *ids], deadline=deadline,
                           **({"cert_dir": cert_dir} if cert_dir is not None else {}))
    agg = AggregationConfig(kind=kind, seed=seed, **(agg_kw or {}))
    cfg = FLConfig(rounds=rounds, fraction=fraction, seed=seed, local=local or LocalTrainConfig(batch_size=16, lr=0.05),
                   aggregation=agg, round_timeout_s=deadline, **(fl_kw or {}))
    skw = {"mu": mu, **(strategy_kw or {})}
    server_t = net.transport("server") if server_transport_cls is None else server_transport_cls(net, "server")
    life = lifecycle_kwargs(callbacks, resume)
    server = HorizontalServer(server_t, ids, spec, make_strategy(strategy, **skw), cfg, on_round=on_round,
                              **life("server"))
    clients = []
    for i, (X, y) in enumerate(shards):
        Xt, yt = test if test is not None else (X[:0], y[:0])
        c = HorizontalClient(net.transport(ids[i]), "server", X, y, Xt, yt, spec, make_strategy(strategy, **skw), cfg,
                             **life(ids[i]))
        if fail and i in fail:
            _inject_failure(c, fail[i])
        clients.append(c)
    if prepare is not None:
        prepare(server, clients)
    errors: dict[str, BaseException] = {}

    def run(pid, fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[pid] = exc
            if pid != "server":
                net.take_down(pid)

    threads = [threading.Thread(target=run, args=(ids[i], c.run)) for i, c in enumerate(clients)]
    threads.append(threading.Thread(target=run, args=("server", server.run)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline * 4)
    assert not any(t.is_alive() for t in threads), "FL threads hung"
    return server, clients, errors


def _inject_failure(client, at_round):
    original = client.strategy.client_update
    state = {"round": 0}

    def failing(*a, **kw):
        state["round"] += 1
        if state["round"] >= at_round:
            raise RuntimeError(f"{client.party_id}: simulated crash during local training")
        return original(*a, **kw)

    client.strategy.client_update = failing


def blobs(n_per_client, n_clients, n_features=6, n_classes=3, seed=0, skew=False):
    """Separable Gaussian blobs split among clients (label-skewed when ``skew``)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.0, (n_classes, n_features))
    shards = []
    for i in range(n_clients):
        if skew:
            p = np.full(n_classes, 0.1)
            p[i % n_classes] = 1.0
            y = rng.choice(n_classes, n_per_client, p=p / p.sum())
        else:
            y = rng.integers(0, n_classes, n_per_client)
        X = (centres[y] + rng.normal(0, 1.0, (n_per_client, n_features))).astype(np.float32)
        shards.append((X, y))
    y = rng.integers(0, n_classes, 200)
    test = ((centres[y] + rng.normal(0, 1.0, (200, n_features))).astype(np.float32), y)
    return shards, test


# ------------------------------------------------------------------ horizontal jobs (runtime): job files and runs
def job_dict(data_paths, params: dict, *, algorithm: str = "horizontal", job_id: str = "hfl-test", server: bool = True,
             clients=None, tls: bool = False, ports=None, certs: str = "certs", label_column: str = "y") -> dict:
    """A horizontal job document: a server (``server=False``: none, e.g. multiconfederated peers) and one
    client per data file (ids ``clients``, default client-1, client-2, ...; the first is the guest) on
    loopback ``ports`` (server first); ``tls``: each party's certificate under ``certs``/."""
    clients = list(clients or [f"client-{i}" for i in range(1, len(data_paths) + 1)])[:len(data_paths)]
    parties = [{"id": "server", "role": "server"}] if server else []
    parties += [{"id": cid, "role": "guest" if i == 0 else "host",
                 "data": {"path": str(path), "label_column": label_column}}
                for i, (cid, path) in enumerate(zip(clients, data_paths))]
    for party, port in zip(parties, ports or range(50700, 50700 + len(parties))):
        party["address"] = f"127.0.0.1:{port}"
        if tls:
            party.update(cert=f"{certs}/{party['id']}.pem", key=f"{certs}/{party['id']}.key")
    return {"job": {"id": job_id, "algorithm": algorithm, "output_dir": "out", "deadline_s": 60},
            "security": {"ca": f"{certs}/ca.pem"} if tls else {"insecure": True},
            "parties": parties, "params": params}


def write_grpc_job(tmp_path: Path, data_paths, params: dict, *, edit=None, **job_kw) -> tuple[dict, Path]:
    """:func:`job_dict` over gRPC with mutual TLS: free loopback ports, certificates for every party under
    ``tmp_path/certs``; ``edit(job)`` may change the document in place before it is written to
    ``tmp_path/job.yaml``. Returns (document, path)."""
    from secureflhv.runtime.job.demo import free_ports
    from secureflhv.transport.certs import generate_certificates

    n_parties = len(data_paths) + (1 if job_kw.get("server", True) else 0)
    job = job_dict(data_paths, params, tls=True, ports=free_ports(n_parties), certs="certs", **job_kw)
    generate_certificates(tmp_path / "certs", [p["id"] for p in job["parties"]], overwrite=True)
    if edit is not None:
        edit(job)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return job, path


def run_job_threads(cfg, run, *, transport=None, deadline: float = 60.0, join_s: float = 240.0) -> dict:
    """Every party of job ``cfg`` runs ``run(cfg, spec, transport, params)`` (a job module's ``run``) in its
    own thread over one InProcessNetwork; ``transport(net, spec)`` may build a party's transport (default
    ``net.transport(spec.id)``). No party may fail (AssertionError listing the errors). Returns each
    party's result."""
    from secureflhv.runtime.job.registry import job_params

    net = InProcessNetwork(cfg.job.id, [p.id for p in cfg.parties], deadline=deadline)
    params = job_params(cfg)
    errors, results = {}, {}

    def one(spec):
        t = net.transport(spec.id) if transport is None else transport(net, spec)
        try:
            results[spec.id] = run(cfg, spec, t, params)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[spec.id] = exc

    threads = [threading.Thread(target=one, args=(p,)) for p in cfg.parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not errors, errors
    return results


# ------------------------------------------------------------------ processes against the in-process run
def run_in_process(cfg) -> None:
    """Every party of the horizontal job ``cfg`` in its own thread over one InProcessNetwork; no party may fail.
    A job with certificates (``job_dict(..., tls=True)``) gets them generated first when its CA is missing:
    each party signs its model bundle with its own."""
    from secureflhv.runtime.algorithms import horizontal_fl as hj
    from secureflhv.transport.certs import generate_certificates

    if cfg.security.ca is not None and not cfg.resolve(cfg.security.ca).exists():
        generate_certificates(cfg.resolve(cfg.security.ca).parent, [p.id for p in cfg.parties])
    run_job_threads(cfg, hj.run)


def partitioned_blobs(out_dir: Path, scheme: str, scheme_params: dict, *, n_clients: int = 3, n_rows: int = 240,
                      n_features: int = 6, n_classes: int = 4, seed: int = 0) -> list[Path]:
    """Gaussian blobs (``n_classes`` classes, overlapping a little) split among ``n_clients`` by the library's
    partition ``scheme`` (:func:`secureflhv.data.partition`, its noise or label flips applied) and written as
    npz shards (:func:`secureflhv.data.write_shards`); every shard holds at least 8 rows."""
    from secureflhv.data import Dataset, partition, write_shards

    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.5, (n_classes, n_features))
    y = rng.integers(0, n_classes, n_rows)
    ds = Dataset((centres[y] + rng.normal(0, 1.0, (n_rows, n_features))).astype(np.float32), y, name="blobs")
    part = partition(scheme, ds, n_clients, seed=seed + 1, **scheme_params)
    assert min(len(ix) for ix in part.indices) >= 8, [len(ix) for ix in part.indices]
    return write_shards(ds, part, out_dir, fmt="npz")


def last_checkpoint(out: Path, job_id: str, party: str) -> tuple[dict, dict]:
    """(arrays, state) of ``party``'s newest checkpoint under the job output ``out``."""
    from secureflhv.runtime.store.checkpoint import CHECKPOINT_DIR, CheckpointStore

    store = CheckpointStore(out / party / CHECKPOINT_DIR, job_id=job_id, party_id=party)
    step = store.last_complete_step()
    assert step is not None, f"{party}: no checkpoint under {out / party}"
    return store.load(step)


def _without_timing(obj):
    """``obj`` (a metrics / state document) without what differs between two equal runs: wall-clock seconds
    the job digest (the aggregation kind is part of the job description) and the gRPC
    transport's byte counts (``wire``)."""
    if isinstance(obj, dict):
        return {k: _without_timing(v) for k, v in obj.items() if k not in ("seconds", "job_digest", "wire")}
    if isinstance(obj, list):
        return [_without_timing(v) for v in obj]
    return obj


def compare_with_in_process(job: dict, proc_dir: Path, thread_dir: Path, parties) -> dict:
    """Run the horizontal job ``job`` (already run as processes under ``proc_dir``, secure aggregation) again in
    one process (threads) under ``thread_dir`` with ``plain_quantised`` aggregation and assert both runs end
    bit for bit alike at every party: each checkpointed array (global model, strategy state: SCAFFOLD's
    c / c_i, IFCA's clusters, FedPer's head), the checkpoint's state, every ``metrics.json`` (round records,
    aggregation statistics, each client's metrics and contribution factors; seconds aside), the server's
    ``global_model.npz`` (and IFCA's ``cluster_models.npz``). Returns {party: (arrays, state)} of the
    process run."""
    import copy
    import json

    from secureflhv.runtime.job.load import parse_job

    doc = copy.deepcopy(job)
    doc["params"]["aggregation"]["kind"] = "plain_quantised"
    thread_dir.mkdir(parents=True, exist_ok=True)
    run_in_process(parse_job(doc, thread_dir))
    a_out, b_out, job_id = proc_dir / "out", thread_dir / "out", job["job"]["id"]
    states = {}
    for pid in parties:
        (a, a_state), (b, b_state) = last_checkpoint(a_out, job_id, pid), last_checkpoint(b_out, job_id, pid)
        assert sorted(a) == sorted(b), (pid, sorted(a), sorted(b))
        for name in a:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), (pid, name)
        assert _without_timing(a_state) == _without_timing(b_state), pid
        ma, mb = (json.loads((o / pid / "metrics.json").read_text()) for o in (a_out, b_out))
        assert _without_timing(ma) == _without_timing(mb), pid
        states[pid] = (a, a_state)
    for name in ("global_model.npz", "cluster_models.npz"):
        if (a_out / "server" / name).exists():
            with np.load(a_out / "server" / name) as za, np.load(b_out / "server" / name) as zb:
                assert sorted(za.files) == sorted(zb.files)
                assert all(np.array_equal(za[k], zb[k]) for k in za.files), name
    return states
