"""Prediction from saved models against a lying host (in-process, no keys): a malformed answer is
rejected and logged, the honest answer that follows gives the exact scores; a host that only lies
makes the guest stop at its deadline with an error naming it, never crash."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from secureflhv.proto import tree_pb2
from secureflhv.transport import TransportError
from secureflhv.transport.base import Message
from secureflhv.transport.codec import tensor_to_proto
from secureflhv.transport.inprocess import InProcessNetwork, InProcessTransport
from secureflhv.tree.model import BoostedModel, Node, Tree
from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost
from secureflhv.vertical.lr import VerticalLRConfig, VerticalLRGuest, VerticalLRHost


class Liar(InProcessTransport):
    """Sends ``lie(payload)`` before each message with ``tag`` and waits until it is rejected;
    ``only_lies``: the honest message never follows."""

    def __init__(self, net, pid, tag, lie, only_lies=False):
        super().__init__(net, pid)
        self.tag, self.lie, self.only_lies, self.reasons = tag, lie, only_lies, []

    def send(self, receiver, tag, payload, round=0, timeout=None):
        if tag == self.tag:
            box = self.network.mailbox(receiver)
            start = len(box.rejected)
            self.network.inject(Message(self.job_id, round, self.party_id, receiver, tag, self.lie(payload)))
            deadline = time.monotonic() + 10
            while len(box.rejected) == start and time.monotonic() < deadline:
                time.sleep(0.002)
            self.reasons += [reason for _, reason in box.rejected[start:]]
            if self.only_lies:
                return
        super().send(receiver, tag, payload, round, timeout)


def _run(host_fn, guest_fn):
    errors = {}

    def host():
        try:
            host_fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors["host"] = exc

    t = threading.Thread(target=host, daemon=True)
    t.start()
    out = guest_fn()
    t.join(20)
    return out, errors


@pytest.mark.parametrize("lie", [
    lambda p: tensor_to_proto(np.zeros(3)).SerializeToString(),                      # wrong row count
    lambda p: tensor_to_proto(np.zeros(7, dtype=np.float32)).SerializeToString(),    # wrong dtype
    lambda p: b"\x08\xff\xff",                                                       # not a Tensor
])
def test_vertical_lr_guest_rejects_a_lying_host(lie):
    rng = np.random.default_rng(0)
    Xg, Xh, wg, wh = rng.normal(size=(7, 3)), rng.normal(size=(7, 2)), rng.normal(size=3), rng.normal(size=2)
    cfg = VerticalLRConfig(mode="arbiter")
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    liar = Liar(net, "host-1", "vlr.pred", lie)
    host = VerticalLRHost.from_model(liar, "guest", ["host-1"], wh, cfg)
    guest = VerticalLRGuest.from_model(net.transport("guest"), ["host-1"], wg, 0.25, cfg)

    def score():
        p = guest.predict_proba(Xg)
        guest.end_prediction()
        return p

    p, errors = _run(lambda: host.serve_predictions(Xh), score)
    assert not errors
    np.testing.assert_array_equal(p, 1.0 / (1.0 + np.exp(-(Xg @ wg + 0.25 + Xh @ wh))))
    assert liar.reasons and all("vlr.pred" in r or "invalid payload" in r for r in liar.reasons), liar.reasons


def test_vertical_lr_host_that_only_lies_is_named_at_the_deadline():
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=1.5)
    liar = Liar(net, "host-1", "vlr.pred", lambda p: tensor_to_proto(np.zeros(1)).SerializeToString(),
                only_lies=True)
    host = VerticalLRHost.from_model(liar, "guest", ["host-1"], np.ones(2), VerticalLRConfig())
    guest = VerticalLRGuest.from_model(net.transport("guest"), ["host-1"], np.ones(3), None, VerticalLRConfig())

    def score():
        with pytest.raises(TransportError, match="host-1"):
            guest.predict_proba(np.ones((4, 3)))

    _run(lambda: host.serve_predictions(np.ones((4, 2)), max_requests=1), score)


def _one_split_model(prm) -> BoostedModel:
    """Root: host-1's record 0; left leaf -1, right leaf +1 (the guest knows no threshold)."""
    tree = Tree({0: Node(0, leaf=False, owner="host-1", record=0), 1: Node(1, value=-1.0), 2: Node(2, value=1.0)})
    return BoostedModel(prm, np.zeros(1), [tree])


@pytest.mark.parametrize("masks", [[b"\x00" * 9], [], [b"\x00", b"\x00"], [b"\xff\xff"]])
def test_secureboost_guest_rejects_a_lying_host(masks):
    prm = SecureBoostParams(n_trees=1, max_depth=2)
    Xh = np.array([[0.1], [0.9], [0.2], [0.7], [0.4]])
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    liar = Liar(net, "host-1", "sb.routed", lambda p: tree_pb2.SbRouteReply(left_masks=masks).SerializeToString())
    host = SecureBoostHost.from_records(liar, "guest", [[0, 3, 0.5]], prm)
    guest = SecureBoostGuest.from_model(net.transport("guest"), ["host-1"], _one_split_model(prm))

    def score():
        m = guest.predict_margin(np.zeros((5, 0)))
        guest.end_prediction()
        return m

    margin, errors = _run(lambda: host.serve_predictions(Xh), score)
    assert not errors
    np.testing.assert_array_equal(margin[:, 0], np.where(Xh[:, 0] < 0.5, -1.0, 1.0))
    assert liar.reasons and all("route reply from host-1" in r for r in liar.reasons), liar.reasons


def test_secureboost_host_refuses_unknown_records_and_rows():
    """A curious guest asking about a record or rows the host does not have gets nothing."""
    prm = SecureBoostParams(n_trees=1, max_depth=2)
    net = InProcessNetwork("p", ["guest", "host-1"], deadline=10)
    host = SecureBoostHost.from_records(net.transport("host-1"), "guest", [[0, 3, 0.5]], prm)
    t = threading.Thread(target=host.serve_predictions, args=(np.ones((5, 1)),), daemon=True)
    t.start()
    query = tree_pb2.SbRouteQuery
    for bad in (tree_pb2.SbRouteRequest(dataset="predict", n_rows=5, queries=[query(record=1, rows=[0])]),  # no record
                tree_pb2.SbRouteRequest(dataset="predict", n_rows=5, queries=[query(record=0, rows=[5])]),  # no row
                tree_pb2.SbRouteRequest(dataset="train", n_rows=5)):                                        # no data
        reason = net.inject_until_rejected(Message("p", 1, "guest", "host-1", "sb.route", bad.SerializeToString()))
        assert "route request" in reason
    net.inject(Message("p", 1, "guest", "host-1", "sb.route", tree_pb2.SbRouteRequest(stop=True).SerializeToString()))
    t.join(10)
    assert not t.is_alive()
