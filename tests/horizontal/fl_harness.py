"""Shared helpers of the horizontal FL tests: run a server and clients as threads over InProcessNetwork."""
from __future__ import annotations

import threading

import numpy as np

from secureflhv.secagg import AggregationConfig
from secureflhv.horizontal.fl import FLConfig, HorizontalClient, HorizontalServer
from secureflhv.horizontal.models import ModelSpec
from secureflhv.horizontal.registry import make_strategy
from secureflhv.horizontal.strategies import LocalTrainConfig
from secureflhv.transport.inprocess import InProcessNetwork


def run_fl(shards, test, spec: ModelSpec, strategy="fedavg", kind="plain", rounds=2, fraction=1.0, seed=0,
           local=None, agg_kw=None, fail=None, mu=0.01, deadline=60.0, on_round=None, fl_kw=None,
           cert_dir=None, strategy_kw=None, server_transport_cls=None, prepare=None):
    """Run FL over threads; ``shards`` = [(X, y)] per client, ``test`` = (X, y) local test rows for each.

    ``fl_kw``: extra :class:`FLConfig` fields (e.g. ``contribution_temperature``); ``cert_dir``: run the
    in-process network with certificate identities (secagg's actively secure mode); ``strategy_kw``: extra
    :func:`make_strategy` arguments (``clusters``, ``personal_layers``); ``server_transport_cls``: the
    server's transport class (e.g. a recording one), built as ``cls(network, "server")``;
    ``prepare(server, clients)`` runs before they start (e.g. to set checkpoint hooks).
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
    server = HorizontalServer(server_t, ids, spec, make_strategy(strategy, **skw), cfg, on_round=on_round)
    clients = []
    for i, (X, y) in enumerate(shards):
        Xt, yt = test if test is not None else (X[:0], y[:0])
        c = HorizontalClient(net.transport(ids[i]), "server", X, y, Xt, yt, spec, make_strategy(strategy, **skw), cfg)
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
