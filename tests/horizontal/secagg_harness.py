"""Threads-over-InProcessNetwork harness for secure-aggregation tests (not a test module).

Certificates: ``conftest.py`` has a session-scoped, autouse fixture that generates one job CA and
certificates for ``server``, ``client0``..``client11``, ``silo0``..``silo5`` and ``mallory`` once per
test session (worker), about 20 ms of EC key generation, and stores the folder in :data:`CERT_DIR`.
:func:`run_round` builds its :class:`InProcessNetwork` with that ``cert_dir``, so every party has a
:class:`~secureflhv.transport.identity.PartyIdentity` and rounds run authenticated (certificate-signed
advertisements) as over mutual TLS; ``authenticated=False`` runs one without identities.
"""
from __future__ import annotations

import threading

import numpy as np

from secureflhv.crypto.quantise import EXTRA_COORDS, dequantise, quantise, rounding_rng
from secureflhv.secagg import AggregationConfig, make_aggregation
from secureflhv.secagg.bonawitz_client import SecAggClient, _Vanished
from secureflhv.transport.inprocess import InProcessNetwork, InProcessTransport

CERT_DIR = None  # set by conftest.py's session fixture
CERT_PARTIES = ["server", "mallory", *(f"client{i}" for i in range(12)), *(f"silo{i}" for i in range(6)),
                *(f"c{i}" for i in range(6))]  # c*: fl_harness.run_fl(cert_dir=...)


def network(ids, authenticated: bool = True, deadline: float = 10) -> InProcessNetwork:
    """An in-process network of ``server`` + ``ids``, with certificate identities when ``authenticated``."""
    parties = ["server", *ids]
    return InProcessNetwork("job-secagg", parties, deadline=deadline,
                            cert_dir=CERT_DIR if authenticated else None)


def config(**kw) -> AggregationConfig:
    base = dict(kind="secagg", seed=11, stage_timeout_s=1.0, input_timeout_s=1.5, clip=1.0)
    base.update(kw)
    return AggregationConfig(**base)


def make_inputs(n: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = [f"client{i}" for i in range(n)]
    xs = {c: rng.normal(0, 0.6, d) for c in ids}
    ws = {c: float(rng.integers(1, 100)) for c in ids}
    return ids, xs, ws


def expected_quantised(cfg, round_id, participants, survivors, xs, ws):
    """What plain_quantised computes over ``survivors`` (the same seeded rounding)."""
    d = next(iter(xs.values())).size
    qp = cfg.quant_params(len(participants), d)
    acc = np.zeros(d + EXTRA_COORDS, dtype=np.uint64)
    for c in survivors:
        acc += quantise(xs[c], ws[c], qp, rounding_rng(cfg.seed, round_id, c))[0]
    return dequantise(acc & qp.modulus_mask, qp)


class RecordingTransport(InProcessTransport):
    """Server transport that keeps every payload the server receives (its transcript)."""

    def __init__(self, network, party_id):
        super().__init__(network, party_id)
        self.received: list[tuple[str, str, bytes]] = []
        self.send_hook = None

    def recv(self, sender, tag, round=0, timeout=None, parse=None):
        def wrapped(payload):
            self.received.append((sender, tag, payload))
            return payload if parse is None else parse(payload)
        return super().recv(sender, tag, round, timeout, wrapped)

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if self.send_hook is not None:
            payload = self.send_hook(receiver, tag, payload, round)
        return super().send(receiver, tag, payload, round, timeout)


def vanishing_client(network, stage: int, base=SecAggClient):
    class Vanishing(base):
        def _on_stage(self, s):
            if s == stage:
                network.take_down(self.party_id)
                raise _Vanished(f"{self.party_id} vanished before stage {s}")
    return Vanishing


def run_round(cfg, ids, xs, ws, round_id=1, *, vanish=None, network=None, client_classes=None,
              server_transport=None, before_clients=None, participants=None, server_cls=None, server=None,
              authenticated=True, client_configs=None):
    """Run one round; return (result or exception, {client: error}, clients, server transport, network).

    ``server_cls`` replaces the server class (a malicious server), ``server`` reuses a server object
    (and its transport) across rounds, ``client_configs`` gives some clients their own config."""
    vanish = vanish or {}
    client_classes = dict(client_classes or {})
    client_configs = dict(client_configs or {})
    participants = participants or ids
    net = network or globals()["network"](ids, authenticated)
    client_cls, default_server_cls = make_aggregation(cfg)
    if server is None:
        st = server_transport or RecordingTransport(net, "server")
        server = (server_cls or default_server_cls)(st, cfg)
    st = server.t
    d = next(iter(xs.values())).size
    out, errors, clients = {}, {}, {}

    def serve():
        try:
            out["result"] = server.aggregate(round_id, participants, d)
        except Exception as exc:  # noqa: BLE001
            out["result"] = exc

    def client(c):
        cls = client_classes.get(c) or (vanishing_client(net, vanish[c]) if c in vanish else client_cls)
        clients[c] = cli = cls(net.transport(c), "server", client_configs.get(c, cfg))
        try:
            cli.submit(round_id, participants, xs[c], ws[c])
        except Exception as exc:  # noqa: BLE001
            errors[c] = exc

    ts = threading.Thread(target=serve)
    ts.start()
    if before_clients is not None:
        before_clients(net)
    threads = [threading.Thread(target=client, args=(c,)) for c in ids]
    for t in threads:
        t.start()
    ts.join(60)
    for t in threads:
        t.join(60)
    assert not ts.is_alive() and not any(t.is_alive() for t in threads), "round hung"
    return out["result"], errors, clients, st, net
