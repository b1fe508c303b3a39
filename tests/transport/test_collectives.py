"""broadcast / gather over the in-process transport: delivery, the two dropout policies, deadlines, parse."""
import time

import pytest

from secureflhv.transport import ProtocolError
from secureflhv.transport.base import JobAborted, PeerTimeout, PeerUnavailable
from secureflhv.transport.collectives import Collected, broadcast, gather
from secureflhv.transport.inprocess import InProcessNetwork

PEERS = ["a", "b", "c"]


@pytest.fixture
def net():
    return InProcessNetwork("job", ["s", *PEERS], deadline=5.0)


@pytest.mark.parametrize("concurrent", [False, True])
def test_broadcast_then_gather_all_arrive(net, concurrent):
    s = net.transport("s")
    sent = broadcast(s, PEERS, "t", lambda p: f"to {p}".encode(), 7, 1.0, "raise", concurrent=concurrent)
    assert sent.ok == PEERS and sent.dropped == {}
    assert [net.transport(p).recv("s", "t", 7, timeout=1.0) for p in PEERS] == [b"to a", b"to b", b"to c"]
    for p in reversed(PEERS):
        net.transport(p).send("s", "r", p.encode(), round=3)
    got = gather(s, PEERS, "r", 3, 1.0, "raise", lambda b: b.decode().upper())
    assert isinstance(got, Collected)
    assert list(got.values.items()) == [("a", "A"), ("b", "B"), ("c", "C")]  # in peers order


def test_gather_silent_peer_raise_names_it(net):
    for p in ("a", "c"):
        net.transport(p).send("s", "r", b"x", round=1)
    with pytest.raises(PeerTimeout, match="'b'") as err:
        gather(net.transport("s"), PEERS, "r", 1, 0.3, "raise")
    assert err.value.sender == "b"


def test_gather_silent_peer_drop_lists_it(net):
    for p in ("a", "c"):
        net.transport(p).send("s", "r", b"x", round=1)
    got = gather(net.transport("s"), PEERS, "r", 1, 0.3, "drop")
    assert got.ok == ["a", "c"]
    assert list(got.dropped) == ["b"]
    assert got.dropped["b"].peer == "b" and "PeerTimeout" in got.dropped["b"].reason
    assert isinstance(got.dropped["b"].error, PeerTimeout)


def test_gather_shared_deadline_is_respected(net):
    t0 = time.monotonic()
    got = gather(net.transport("s"), PEERS, "r", 1, 0.4, "drop")  # nobody sends
    took = time.monotonic() - t0
    assert list(got.dropped) == PEERS
    assert took < 0.4 + 3 * 0.2  # one budget for all three, not 0.4 each


def test_gather_per_peer_deadline(net):
    t0 = time.monotonic()
    got = gather(net.transport("s"), ["a", "b"], "r", 1, 0.3, "drop", shared=False)
    assert list(got.dropped) == ["a", "b"]
    assert time.monotonic() - t0 >= 0.55  # each peer waited its own 0.3 s


def test_gather_parse_failure_is_rejected_then_valid_one_taken(net):
    def parse(b):
        if b == b"bad":
            raise ProtocolError("bad payload")
        return b

    net.transport("a").send("s", "r", b"bad", round=1)
    got = gather(net.transport("s"), ["a"], "r", 1, 0.3, "drop", parse)
    assert list(got.dropped) == ["a"]  # the only message failed parse: a counts as silent
    assert any("bad payload" in why for _, why in net.transport("s").rejected)
    net.transport("a").send("s", "r", b"good", round=2)
    assert gather(net.transport("s"), ["a"], "r", 2, 1.0, "raise", {"a": parse}).values == {"a": b"good"}


def test_broadcast_unreachable_peer(net):
    net.take_down("b")
    s = net.transport("s")
    sent = broadcast(s, PEERS, "t", b"m", 1, 0.5, "drop")
    assert sent.ok == ["a", "c"] and list(sent.dropped) == ["b"]
    assert isinstance(sent.dropped["b"].error, PeerUnavailable)
    with pytest.raises(PeerUnavailable, match=r"s: cannot deliver 't' \(round 2\) to 'b'"):
        broadcast(s, PEERS, "t", b"m", 2, 0.5, "raise", concurrent=True)
    # sequential "raise" stops at the first failure: c is not sent round 3
    with pytest.raises(PeerUnavailable):
        broadcast(s, PEERS, "t", b"m", 3, 0.5, "raise")
    with pytest.raises(PeerTimeout):
        net.transport("c").recv("s", "t", 3, timeout=0.1)


def test_broadcast_per_peer_deadline_callable(net):
    seen = {}

    class Spy:
        party_id = "s"

        def send(self, p, tag, msg, round, timeout):
            seen[p] = timeout

    broadcast(Spy(), PEERS, "t", b"m", 1, lambda p: 2.0 if p == "b" else 9.0, "drop")
    assert seen == {"a": 9.0, "b": 2.0, "c": 9.0}


def test_abort_is_never_a_dropout(net):
    net.transport("a").abort("boom", ["s"])
    with pytest.raises(JobAborted, match="boom"):
        gather(net.transport("s"), PEERS, "r", 1, 0.3, "drop")


def test_unknown_policy(net):
    with pytest.raises(ValueError, match="on_failure"):
        gather(net.transport("s"), PEERS, "r", 1, 0.1, "ignore")
