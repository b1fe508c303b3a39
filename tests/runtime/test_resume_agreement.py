"""Step agreement at start-up (runtime/store/resume.py): honest parties, malformed and lying peers."""
from __future__ import annotations

import threading

import pytest

from secureflhv.proto import messages_pb2
from secureflhv.runtime.store.resume import TAG_STEPS, agree_step, parse_steps
from secureflhv.transport import ProtocolError
from secureflhv.transport.base import PeerTimeout
from secureflhv.transport.inprocess import InProcessNetwork


def _run(held: dict, liar=None, deadline=3.0):
    """Every party in ``held`` agrees (``liar(transport)`` replaces the party named ``"liar"``)."""
    net = InProcessNetwork("resume-test", list(held), deadline=deadline)
    results, errors = {}, {}

    def party(me):
        try:
            t = net.transport(me)
            if me == "liar":
                results[me] = liar(t)
            else:
                results[me] = agree_step(t, [p for p in held if p != me], held[me])
        except Exception as exc:  # noqa: BLE001 - collected for the asserts
            errors[me] = exc

    threads = [threading.Thread(target=party, args=(p,), daemon=True) for p in held]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert not any(th.is_alive() for th in threads)
    return results, errors, net


def _say(t, peers, steps, rnd):
    for p in peers:
        t.send(p, TAG_STEPS, messages_pb2.Bundle(text={"steps": steps}), round=rnd)


def test_newest_common_step():
    results, errors, _ = _run({"guest": [3, 4], "host-1": [4, 5], "server": [2, 4]})
    assert not errors and results == {"guest": 4, "host-1": 4, "server": 4}


def test_any_party_without_steps_means_scratch():
    results, errors, _ = _run({"guest": [3, 4], "host-1": [], "server": [3, 4]})
    assert not errors and set(results.values()) == {None}


def test_parse_rejects_malformed():
    for bad in ("-1", "1,1", "a", "1," * 16 + "1", "123456789", " 1"):
        with pytest.raises(ProtocolError):
            parse_steps(messages_pb2.Bundle(text={"steps": bad}).SerializeToString())
    with pytest.raises(ProtocolError):
        parse_steps(messages_pb2.Bundle().SerializeToString())
    assert parse_steps(messages_pb2.Bundle(text={"steps": "5,2"}).SerializeToString()) == [2, 5]
    assert parse_steps(messages_pb2.Bundle(text={"steps": ""}).SerializeToString()) == []


def test_malformed_announcement_is_rejected_and_named():
    """Only a malformed announcement: it is rejected and logged; the others stop naming the liar."""
    def liar(t):
        _say(t, ["guest", "host-1"], "999999999", 0)
        return "lied"

    results, errors, net = _run({"guest": [3, 4], "host-1": [3, 4], "liar": None}, liar, deadline=1.5)
    assert set(errors) == {"guest", "host-1"}
    assert all(isinstance(e, PeerTimeout) and "liar" in str(e) for e in errors.values())
    assert any("resume.steps" in reason for _, reason in net.transport("guest").rejected)


def test_lying_low_only_moves_everyone_back():
    results, errors, _ = _run({"guest": [3, 4], "host-1": [3, 4], "liar": None},
                              lambda t: agree_step(t, ["guest", "host-1"], [3]))
    assert not errors and results == {"guest": 3, "host-1": 3, "liar": 3}


def test_two_faced_peer_fails_clearly():
    def liar(t):
        t.send("guest", TAG_STEPS, messages_pb2.Bundle(text={"steps": "3,4"}), round=0)
        t.send("host-1", TAG_STEPS, messages_pb2.Bundle(text={"steps": "3"}), round=0)
        t.recv("guest", TAG_STEPS, round=0)
        t.recv("host-1", TAG_STEPS, round=0)
        _say(t, ["guest", "host-1"], "4", 1)
        return "lied"

    _, errors, _ = _run({"guest": [3, 4], "host-1": [3, 4], "liar": None}, liar)
    # guest picked 4, host-1 picked 3: each sees the other's choice differ and stops with a clear error
    assert set(errors) == {"guest", "host-1"}
    assert all(isinstance(e, ProtocolError) and "resumes from step" in str(e) for e in errors.values())

