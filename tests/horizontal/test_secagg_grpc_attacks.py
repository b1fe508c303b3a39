"""Attacks on secure aggregation over real gRPC with mutual TLS (GrpcTransports in threads, loopback):
the identity each party signs its advertisement with is its TLS certificate (TlsConfig -> identity)."""
import threading

import numpy as np

from secureflhv.crypto.secagg_primitives import KeyPair
from secureflhv.proto import secagg_pb2 as pb
from secureflhv.secagg import STAGES, AggregationError, SecAggClient, SecAggServer
from secureflhv.transport.certs import load_party_credentials
from secureflhv.transport.grpc_transport import GrpcTransport

from secagg_harness import config, expected_quantised, make_inputs
from test_secagg_malicious_clients import shifting_client

IDS_N, D = 4, 64  # t = 3


class HookedGrpc(GrpcTransport):
    """The server's transport: outgoing payloads pass through ``hook`` (a malicious server)."""

    hook = None

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if self.hook is not None:
            payload = self.hook(receiver, tag, payload, round)
        return super().send(receiver, tag, payload, round, timeout)


def grpc_round(cert_dir, cfg, ids, xs, ws, client_classes=None, hook=None):
    """One round over mutual TLS; returns (result or exception, {client: error})."""
    parties = ["server", *ids]
    placeholder = {p: "127.0.0.1:1" for p in parties}
    trs = {p: (HookedGrpc if p == "server" else GrpcTransport)(
        p, "job-secagg-grpc", "127.0.0.1:0", placeholder, tls=load_party_credentials(cert_dir, p), deadline=20,
        close_grace=0.2) for p in parties}
    trs["server"].hook = hook
    for p, tr in trs.items():
        for q, other in trs.items():
            if q != p:
                tr.set_peer_address(q, other.address)
    out, errors = {}, {}

    def serve():
        try:
            out["res"] = SecAggServer(trs["server"], cfg).aggregate(1, ids, D)
        except Exception as exc:  # noqa: BLE001
            out["res"] = exc

    def client(c):
        try:
            (client_classes or {}).get(c, SecAggClient)(trs[c], "server", cfg).submit(1, ids, xs[c], ws[c])
        except Exception as exc:  # noqa: BLE001
            errors[c] = exc

    threads = [threading.Thread(target=serve)] + [threading.Thread(target=client, args=(c,)) for c in ids]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "round hung"
    finally:
        for tr in trs.values():
            tr.close()
    assert all(tr.identity is not None and tr.identity.party_id == p for p, tr in trs.items())
    return out["res"], errors


def test_grpc_mtls_share_shifted_by_one_is_dropped_and_the_sum_is_exact(secagg_cert_dir):
    ids, xs, ws = make_inputs(IDS_N, D, seed=11)
    cfg = config(stage_timeout_s=3.0, input_timeout_s=5.0)
    liar = ids[2]
    res, errors = grpc_round(secagg_cert_dir, cfg, ids, xs, ws, client_classes={liar: shifting_client("b")})
    assert not isinstance(res, Exception), res
    total, weight, _ = expected_quantised(cfg, 1, ids, ids, xs, ws)
    assert np.array_equal(res.total, total) and res.weight == weight
    assert list(res.offenders) == [liar] and not errors


def test_grpc_mtls_server_substituting_a_key_is_caught_by_every_client(secagg_cert_dir):
    ids, xs, ws = make_inputs(IDS_N, D, seed=12)
    cfg = config(stage_timeout_s=1.0, input_timeout_s=5.0)
    victim, rogue = ids[1], KeyPair().public

    def hook(receiver, tag, payload, round):
        if round % STAGES != 1:
            return payload
        msg = pb.ServerMessage.FromString(payload.SerializeToString())
        for k in msg.keys.keys:
            if k.client_id == victim:
                k.advert.c_pk = rogue  # the server could then decrypt the shares sent to the victim
        return msg

    res, errors = grpc_round(secagg_cert_dir, cfg, ids, xs, ws, hook=hook)
    assert isinstance(res, AggregationError)
    assert set(errors) == set(ids)
    assert all(f"invalid advertisement of {victim!r}" in str(e) and "signature" in str(e) for e in errors.values())
