"""Shared helpers of the MultiConfederated tests: small tabular data and peers run as threads in-process."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

from secureflhv.horizontal.mc_peer import MultiConfederatedPeer
from secureflhv.horizontal.models import ModelSpec
from secureflhv.horizontal.mc_rules import MCConfig
from secureflhv.horizontal.strategies import LocalTrainConfig
from secureflhv.transport.inprocess import InProcessNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: lifecycle_helpers
from lifecycle_helpers import lifecycle_kwargs  # noqa: E402

SPEC = ModelSpec(name="mlp", n_features=30, n_classes=2, hidden=(8,))
LOCAL = LocalTrainConfig(epochs=1, batch_size=32, lr=0.05)


def cancer_shards(n_peers: int, rows: int = 90, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """sklearn's breast-cancer table, standardised, ``rows`` random rows per peer (float32, int64)."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(y))
    return [(X[perm[i * rows:(i + 1) * rows]], y[perm[i * rows:(i + 1) * rows]].astype(np.int64))
            for i in range(n_peers)]


def config(**kw) -> MCConfig:
    base = dict(rounds=2, seed=5, local=LOCAL, round_timeout_s=30.0, send_timeout_s=10.0)
    return MCConfig(**{**base, **kw})


def run_peers(shards, cfg: MCConfig, *, ids=None, net=None, transport_of=None, test_rows: int = 20,
              spec: ModelSpec = SPEC, callbacks=None, resume=None):
    """Every peer in its own thread over one InProcessNetwork. ``transport_of(net, pid)`` may wrap a
    transport (an attacker); ``callbacks`` / ``resume``: {peer id: callbacks list / (arrays, state)}, each
    peer's lifecycle arguments at construction (:mod:`secureflhv.transport.lifecycle`; absent: none).
    The last ``test_rows`` rows of each shard are its local test split. Returns (peers, errors by party id, network)."""
    ids = ids or [f"p{i}" for i in range(len(shards))]
    net = net or InProcessNetwork("mc-test", ids, deadline=cfg.round_timeout_s)
    life = lifecycle_kwargs(callbacks, resume)
    peers = []
    for pid, (X, y) in zip(ids, shards):
        t = transport_of(net, pid) if transport_of else net.transport(pid)
        peers.append(MultiConfederatedPeer(t, ids, X[:-test_rows], y[:-test_rows], X[-test_rows:], y[-test_rows:],
                                           spec, cfg, **life(pid)))
    errors: dict[str, BaseException] = {}

    def run(p):
        try:
            p.run()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[p.party_id] = exc
            net.take_down(p.party_id)

    threads = [threading.Thread(target=run, args=(p,)) for p in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=cfg.round_timeout_s * (cfg.rounds + 2))
    assert not any(t.is_alive() for t in threads), "MultiConfederated peer threads hung"
    return peers, errors, net
