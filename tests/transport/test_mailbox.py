"""Wire rules of the Mailbox and the in-process transport (secureflhv.transport.base / inprocess)."""
import hashlib
import logging
import threading
import time

import pytest

from secureflhv.proto import messages_pb2
from secureflhv.transport import (ABORT_TAG, InProcessNetwork, JobAborted, Mailbox, Message, MessageRejected,
                                  PeerTimeout, PeerUnavailable, ProtocolError, Rejected, TransportError,
                                  parse_message)

PARTIES = ["guest", "host-1", "server"]


def msg(round=1, sender="host-1", tag="t", payload=b"x", job="job-1", receiver="guest"):
    return Message(job, round, sender, receiver, tag, payload)


@pytest.fixture
def box():
    return Mailbox("guest", "job-1", PARTIES)


def test_accepts_and_returns_payload(box):
    box.deliver(msg(payload=b"hello"))
    assert box.take("host-1", "t", 1, timeout=1.0) == b"hello"
    assert box.rejected == []


@pytest.mark.parametrize("bad, needle", [
    (msg(job="job-2"), "job"),
    (msg(receiver="host-1"), "addressed to"),
    (msg(sender="mallory"), "not a party"),
    (msg(sender="mallory", tag=ABORT_TAG), "not a party"),
])
def test_refuses_wrong_job_receiver_or_sender(box, caplog, bad, needle):
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        with pytest.raises(MessageRejected, match=needle):
            box.deliver(bad)
    rec, reason = box.rejected[0]
    assert len(box.rejected) == 1 and rec == Rejected.of(bad, reason) and needle in reason
    assert needle in caplog.text
    with pytest.raises(PeerTimeout):  # nothing was queued
        box.take(bad.sender, bad.tag, bad.round, timeout=0.05)


def test_stale_replayed_and_duplicate_rounds(box):
    box.deliver(msg(round=5))
    with pytest.raises(MessageRejected, match="duplicate"):
        box.deliver(msg(round=5))  # same round already queued
    assert box.take("host-1", "t", 5, timeout=1.0) == b"x"
    with pytest.raises(MessageRejected, match="stale or replayed"):
        box.deliver(msg(round=5))  # replay of the consumed round
    with pytest.raises(MessageRejected, match="stale or replayed"):
        box.deliver(msg(round=4))  # older round
    box.deliver(msg(round=6))  # newer round of the same tag is fine
    box.deliver(msg(round=1, tag="other"))  # rounds are per (sender, tag)
    box.deliver(msg(round=1, sender="server"))  # ... and per sender
    assert box.take("host-1", "t", 6, timeout=1.0) == b"x"
    assert len(box.rejected) == 3


def test_out_of_order_take_keeps_the_highest_round(box):
    box.deliver(msg(round=1, payload=b"one"))
    box.deliver(msg(round=2, payload=b"two"))
    assert box.take("host-1", "t", 2, timeout=1.0) == b"two"
    assert box.take("host-1", "t", 1, timeout=1.0) == b"one"  # queued before round 2 was taken
    with pytest.raises(MessageRejected, match="stale or replayed"):
        box.deliver(msg(round=2))  # taking round 1 must not re-open round 2


def test_bad_payload_is_rejected_and_wait_continues(box, caplog):
    def parse(payload):
        if payload != b"good":
            raise ProtocolError("wrong shape (3,) expected (2,)")
        return "parsed"

    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("v", box.take("host-1", "t", 1, 5.0, parse)))
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        waiter.start()
        box.deliver(msg(payload=b"bad"))
        time.sleep(0.1)
        box.deliver(msg(payload=b"good"))  # same round again: the bad one was not consumed
        waiter.join(5.0)
    assert result == {"v": "parsed"}
    assert len(box.rejected) == 1 and "wrong shape" in box.rejected[0][1]
    assert "wrong shape" in caplog.text


def test_timeout_names_sender_and_tag(box):
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout, match=r"'vlr\.residual'.*'host-1'"):
        box.take("host-1", "vlr.residual", 3, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2.0


def test_abort_wakes_waiter_with_reason(box):
    errors = []

    def wait():
        try:
            box.take("host-1", "t", 1, timeout=10.0)
        except JobAborted as exc:
            errors.append(str(exc))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    box.deliver(msg(round=0, tag=ABORT_TAG, payload=b"out of memory"))
    waiter.join(5.0)
    assert not waiter.is_alive()
    assert errors and "out of memory" in errors[0] and "host-1" in errors[0]


def test_close_wakes_waiter(box):
    errors = []
    waiter = threading.Thread(target=lambda: errors.append(_catch(lambda: box.take("host-1", "t", 1, 10.0))))
    waiter.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    box.close()
    waiter.join(5.0)
    assert time.monotonic() - t0 < 2.0
    assert isinstance(errors[0], TransportError) and "closed" in str(errors[0])


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def test_mailbox_without_peer_list_accepts_any_sender():
    box = Mailbox("guest", "job-1", None)
    box.deliver(msg(sender="anyone"))
    assert box.take("anyone", "t", 1, 1.0) == b"x"


def test_reject_records_transport_level_refusals(box):
    box.reject(msg(), "certificate mismatch")
    assert box.rejected == [(Rejected("job-1", 1, "host-1", "guest", "t", 1, hashlib.sha256(b"x").hexdigest()[:16],
                                      "certificate mismatch"), "certificate mismatch")]


# ------------------------------------------------------------------ in-process network
def test_inprocess_round_trip_between_threads_with_protobuf():
    net = InProcessNetwork("job-1", PARTIES, deadline=5.0)
    guest, host = net.transport("guest"), net.transport("host-1")

    def host_role():
        got = host.recv("guest", "ask", round=1, parse=parse_message(messages_pb2.Strings))
        host.send("guest", "answer", messages_pb2.Strings(values=[v.upper() for v in got.values]), round=1)

    th = threading.Thread(target=host_role)
    th.start()
    guest.send("host-1", "ask", messages_pb2.Strings(values=["a", "b"]), round=1)
    reply = guest.recv("host-1", "answer", round=1, parse=parse_message(messages_pb2.Strings))
    th.join(5.0)
    assert list(reply.values) == ["A", "B"]
    expected = len(messages_pb2.Strings(values=["a", "b"]).SerializeToString()) * 2
    assert net.sent_bytes == expected


def test_parse_message_validate_converts_or_rejects():
    net = InProcessNetwork("job-1", PARTIES, deadline=2.0)
    guest, host = net.transport("guest"), net.transport("host-1")

    def validate(m):
        if len(m.values) != 2:
            raise ProtocolError(f"expected 2 values, got {len(m.values)}")
        return tuple(m.values)

    host.send("guest", "pair", messages_pb2.Strings(values=["only-one"]), round=1)
    with pytest.raises(PeerTimeout):
        guest.recv("host-1", "pair", round=1, timeout=0.2, parse=parse_message(messages_pb2.Strings, validate))
    assert "expected 2 values" in guest.rejected[0][1]
    host.send("guest", "pair", messages_pb2.Strings(values=["a", "b"]), round=1)
    assert guest.recv("host-1", "pair", 1, parse=parse_message(messages_pb2.Strings, validate)) == ("a", "b")


def test_inprocess_take_down_and_unknown_party():
    net = InProcessNetwork("job-1", PARTIES, deadline=2.0)
    guest = net.transport("guest")
    net.take_down("host-1")
    with pytest.raises(PeerUnavailable, match="host-1"):
        guest.send("host-1", "t", b"x", round=1)
    with pytest.raises(PeerUnavailable, match="mallory"):
        guest.send("mallory", "t", b"x", round=1)
    with pytest.raises(TransportError, match="closed"):
        net.transport("host-1").recv("guest", "t", 1, timeout=1.0)
    with pytest.raises(KeyError, match="mallory"):
        net.transport("mallory")
    with pytest.raises(TypeError, match="payload must be bytes"):
        guest.send("server", "t", 12345, round=1)


def test_inprocess_abort_reaches_every_peer():
    net = InProcessNetwork("job-1", PARTIES, deadline=5.0)
    net.transport("host-1").abort("host-1 lost its data file", ["guest", "server"])
    for pid in ("guest", "server"):
        with pytest.raises(JobAborted, match="lost its data file"):
            net.transport(pid).recv("host-1", "anything", 1, timeout=1.0)


def test_inprocess_inject_checks_wire_rules():
    net = InProcessNetwork("job-1", PARTIES)
    with pytest.raises(MessageRejected, match="job"):
        net.inject(msg(job="job-9"))
    assert net.mailbox("guest").rejected[0][0].job_id == "job-9"


def test_a_wait_longer_than_the_deadline_goes_on_while_the_sender_answers_and_ends_when_it_is_gone():
    """recv_while_reachable: a live sender may take several deadlines (it waits on others); a sender that can
    no longer be reached is named after one silent deadline, not at the end of the long timeout."""
    net = InProcessNetwork("job-1", PARTIES, deadline=0.3)
    guest, server = net.transport("guest"), net.transport("server")
    threading.Timer(1.0, lambda: server.send("guest", "t", b"late", round=1)).start()
    assert guest.recv_while_reachable("server", "t", round=1, timeout=30.0) == b"late"  # 3 deadlines late
    net.take_down("server")
    start = time.monotonic()
    with pytest.raises(PeerTimeout, match=r"from 'server' for 0.3s, and it could not be reached") as exc:
        guest.recv_while_reachable("server", "t", round=2, timeout=30.0)
    assert exc.value.sender == "server" and time.monotonic() - start < 2.0
    with pytest.raises(PeerTimeout, match="from 'host-1' within 1s:"):  # the whole timeout runs out on a live, silent sender
        guest.recv_while_reachable("host-1", "t", round=1, timeout=1.0)
