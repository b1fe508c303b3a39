"""Every horizontal role is a ProtocolRole; a failing server tells its clients, a failing client tells nobody."""
import time

import numpy as np
import pytest

from secureflhv.horizontal.fl import FLConfig, HorizontalClient, HorizontalServer
from secureflhv.horizontal.models import ModelSpec
from secureflhv.horizontal.strategies import make_strategy
from secureflhv.secagg import AggregationConfig, make_aggregation
from secureflhv.transport.base import JobAborted, PeerTimeout
from secureflhv.transport.inprocess import InProcessNetwork
from secureflhv.transport.role import ProtocolRole
from secureflhv.tree.horizontal import HorizontalSecureBoostClient, HorizontalSecureBoostServer

SPEC = ModelSpec(name="mlp", n_features=4, n_classes=2)


@pytest.mark.parametrize("kind", ["secagg", "plain", "plain_quantised"])
def test_aggregation_roles_are_protocol_roles_that_tell_nobody(kind):
    net = InProcessNetwork("roles", ["server", "c0"])
    client_cls, server_cls = make_aggregation(AggregationConfig(kind=kind))
    client = client_cls(net.transport("c0"), "server", AggregationConfig(kind=kind))
    server = server_cls(net.transport("server"), AggregationConfig(kind=kind))
    assert isinstance(client, ProtocolRole) and isinstance(server, ProtocolRole)
    assert client._peers() == [] and server._peers() == []


def test_horizontal_roles_are_protocol_roles():
    for cls in (HorizontalServer, HorizontalClient, HorizontalSecureBoostServer, HorizontalSecureBoostClient):
        assert issubclass(cls, ProtocolRole)


def _fl(net, ids, timeout=30.0):
    cfg = FLConfig(rounds=1, round_timeout_s=timeout)
    X, y = np.zeros((4, 4), np.float32), np.array([0, 1, 0, 1])
    server = HorizontalServer(net.transport("server"), ids, SPEC, make_strategy("fedavg"), cfg)
    clients = [HorizontalClient(net.transport(c), "server", X, y, X[:0], y[:0], SPEC, make_strategy("fedavg"), cfg)
               for c in ids]
    return server, clients


def test_failing_fl_server_tells_its_clients():
    ids = ["c0", "c1"]
    net = InProcessNetwork("roles", ["server", *ids], deadline=30)
    server, _ = _fl(net, ids)
    assert server._peers() == ids

    def broken(dim, initial=None):
        raise RuntimeError("server broke")
    server.strategy.server_init = broken
    with pytest.raises(RuntimeError, match="server broke"):
        server.run()
    start = time.monotonic()
    with pytest.raises(JobAborted, match="server broke"):
        net.transport("c0").recv("server", "fl.round", 1, timeout=10)
    assert time.monotonic() - start < 5


def test_failing_fl_client_tells_nobody():
    ids = ["c0", "c1"]
    net = InProcessNetwork("roles", ["server", *ids], deadline=1)
    _, clients = _fl(net, ids, timeout=0.5)
    assert clients[0]._peers() == []
    sent = []
    clients[0].t.abort = lambda reason, peers: sent.append(list(peers))
    with pytest.raises(PeerTimeout):
        clients[0].run()  # no server: the client's wait ends at its deadline
    assert sent == []
