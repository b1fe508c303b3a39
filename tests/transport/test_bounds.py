"""Bounded inputs at the transport: per-sender queue caps, payload limits, no payloads kept on refusal,
and a server-side deadline on every incoming gRPC stream (a stalled sender is cut)."""
import hashlib
import logging
import threading
import time

import grpc
import numpy as np
import pytest

from secureflhv.proto import transport_pb2 as pb
from secureflhv.proto import transport_pb2_grpc as pb_grpc
from secureflhv.transport import (InProcessNetwork, JobAborted, Mailbox, Message, MessageRejected,
                                  PeerTimeout, ProtocolError, Rejected, TransportError)
from secureflhv.transport.certs import generate_certificates, load_party_credentials
from secureflhv.transport.tls import channel_credentials, target_name_options

from grpc_harness import grpc_factory, link

PARTIES = ["guest", "host-1", "host-2"]


# ------------------------------------------------------------------ mailbox caps (in-process)
def test_flood_of_future_rounds_is_capped_while_another_sender_gets_through(caplog):
    net = InProcessNetwork("job-1", PARTIES, deadline=5.0, max_payload_bytes=1000, max_pending=8)
    box = net.mailbox("guest")
    flooder, honest, guest = net.transport("host-1"), net.transport("host-2"), net.transport("guest")
    refused = 0
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        for r in range(1, 501):  # future rounds the guest will never ask for
            try:
                flooder.send("guest", "grad", b"x" * 100, round=r)
            except MessageRejected as exc:
                assert "flood" in str(exc) and "'host-1'" in str(exc)
                refused += 1
            count, size = box.queued("host-1")
            assert count <= box.max_pending and size <= box.max_pending_bytes
    assert box.queued("host-1") == (8, 800) and refused == 492
    assert "flood" in caplog.text and "host-1" in caplog.text
    honest.send("guest", "grad", b"honest", round=1)
    assert guest.recv("host-2", "grad", round=1, timeout=1.0) == b"honest"
    # consuming a queued message frees its slot
    assert guest.recv("host-1", "grad", round=1, timeout=1.0) == b"x" * 100
    assert box.queued("host-1") == (7, 700)
    flooder.send("guest", "grad", b"y", round=1000)


def test_queued_bytes_are_capped_per_sender():
    box = Mailbox("guest", "job-1", PARTIES, max_payload_bytes=1000)  # 2000 queued bytes per sender
    for r in (1, 2, 3):
        box.deliver(Message("job-1", r, "host-1", "guest", "t", b"z" * 600))
    with pytest.raises(MessageRejected, match=r"flood: 'host-1' already has 3 messages \(1800 bytes\)"):
        box.deliver(Message("job-1", 4, "host-1", "guest", "t", b"z" * 600))
    assert box.queued("host-1") == (3, 1800)
    box.deliver(Message("job-1", 4, "host-2", "guest", "t", b"z" * 600))  # the cap is per sender


def test_payload_over_the_limit_is_refused_by_the_mailbox():
    box = Mailbox("guest", "job-1", PARTIES, max_payload_bytes=1000)
    with pytest.raises(MessageRejected, match="exceeds this party's limit of 1000 bytes"):
        box.deliver(Message("job-1", 1, "host-1", "guest", "t", b"z" * 1001))
    assert box.queued("host-1") == (0, 0)


@pytest.mark.parametrize("bad", [0, -5])
def test_mailbox_limits_must_be_positive(bad):
    with pytest.raises(ValueError, match="max_pending must be > 0"):
        Mailbox("guest", "job-1", PARTIES, max_pending=bad)


def test_rejected_records_keep_size_and_digest_not_the_payload():
    net = InProcessNetwork("job-1", PARTIES, deadline=2.0)
    big = bytes(range(256)) * 400  # 102400 bytes
    with pytest.raises(MessageRejected):
        net.inject(Message("job-1", 1, "mallory", "guest", "t", big))  # refused on delivery
    net.transport("host-1").send("guest", "t", big, round=1)

    def refuse(payload):
        raise ProtocolError("wrong shape")

    net.inject(Message("job-1", 2, "host-1", "guest", "t", big + b"!"))  # queued, never consumed
    guest = net.transport("guest")
    with pytest.raises(PeerTimeout):
        guest.recv("host-1", "t", round=1, timeout=0.2, parse=refuse)  # refused on parse
    records = [rec for rec, _ in guest.rejected]
    assert all(isinstance(rec, Rejected) and not hasattr(rec, "payload") for rec in records)
    by_round = {(rec.sender, rec.round): rec for rec in records}
    assert by_round[("mallory", 1)].size == len(big)
    assert by_round[("mallory", 1)].digest == hashlib.sha256(big).hexdigest()[:16]
    assert by_round[("host-1", 1)].reason.startswith("invalid payload: wrong shape")
    assert by_round[("host-1", 1)].size == len(big)
    assert net.mailbox("guest").queued("host-1") == (1, len(big) + 1)  # round 2 still queued, round 1 freed
    assert all(len(repr(rec)) < 600 for rec in records)  # a record is small whatever the payload


def test_abort_reason_is_truncated():
    net = InProcessNetwork("job-1", PARTIES, deadline=2.0)
    net.transport("host-1").abort("x" * 100_000, ["guest"])
    with pytest.raises(JobAborted) as err:
        net.transport("guest").recv("host-1", "t", 1, timeout=1.0)
    assert len(str(err.value)) < 2200


# ------------------------------------------------------------------ gRPC: limits before reading, stalled streams
@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    generate_certificates(d, PARTIES)
    return d


@pytest.fixture
def grpc_parties(certs):
    with grpc_factory(certs, PARTIES) as make:
        yield make


def _raw_stub(certs, sender, receiver):
    tls = load_party_credentials(certs, sender)
    channel = grpc.secure_channel(receiver.address, channel_credentials(tls), target_name_options(receiver.party_id))
    return channel, pb_grpc.PartyServiceStub(channel)


def _header(size, digest=b"\0" * 32, sender="host-1", round=1):
    return pb.Envelope(job_id="job-1", round=round, sender=sender, receiver="guest", tag="t", payload_size=size,
                       payload_sha256=digest)


def test_payload_over_job_limit_is_refused_from_the_header(grpc_parties, certs):
    guest = grpc_parties("guest", max_payload_bytes=64 * 1024)
    channel, stub = _raw_stub(certs, "host-1", guest)
    pulled = []
    declared = 64 * 1024 * 1024

    def chunks():  # claims 64 MiB; counts how much of it gRPC pulled before the refusal came back
        yield pb.Chunk(header=_header(declared, hashlib.sha256(b"big").digest()), data=b"\0" * 65536)
        for _ in range(1023):
            pulled.append(1)
            yield pb.Chunk(data=b"\0" * 65536)

    try:
        ack = stub.Deliver(chunks(), timeout=10)
    finally:
        channel.close()
    assert not ack.accepted and "exceeds this party's limit of 65536 bytes" in ack.error
    assert len(pulled) < 1023 and guest.received_bytes == 0
    rec, _ = guest.rejected[-1]
    assert (rec.sender, rec.size, rec.digest) == ("host-1", declared, hashlib.sha256(b"big").hexdigest()[:16])


def test_stalled_stream_is_cut_within_the_deadline_and_receiver_keeps_serving(grpc_parties, certs, caplog):
    guest = grpc_parties("guest", stream_timeout=1.0)
    host2 = grpc_parties("host-2")
    link(guest, host2)
    channel, stub = _raw_stub(certs, "host-1", guest)
    release = threading.Event()
    data = b"p" * 1000

    def stalling():  # header and half the payload, then nothing: no client deadline either
        yield pb.Chunk(header=_header(len(data), hashlib.sha256(data).digest()), data=data[:500])
        release.wait(30)

    outcome = {}

    def call():
        t0 = time.monotonic()
        try:
            outcome["ack"] = stub.Deliver(stalling())
        except grpc.RpcError as err:
            outcome["code"] = err.code()
        outcome["seconds"] = time.monotonic() - t0

    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        th = threading.Thread(target=call, daemon=True)
        th.start()
        time.sleep(0.3)
        host2.send("guest", "t", b"while stalled", round=1)  # served while the stall holds a thread
        assert guest.recv("host-2", "t", round=1, timeout=5) == b"while stalled"
        th.join(10)
        end = time.monotonic() + 5
        while not guest.rejected and time.monotonic() < end:  # the receiver records it after the cut
            time.sleep(0.01)
    release.set()
    channel.close()
    assert not th.is_alive(), "the stalled stream was never cut"
    assert outcome.get("code") == grpc.StatusCode.CANCELLED, outcome  # the stalling sender gets an error
    assert 0.9 < outcome["seconds"] < 5
    rec, reason = guest.rejected[-1]
    assert rec.sender == "host-1" and rec.size == len(data) and "stream stalled" in reason
    assert "stream stalled" in caplog.text and "host-1" in caplog.text
    host2.send("guest", "t", b"after", round=2)  # and after it
    assert guest.recv("host-2", "t", round=2, timeout=5) == b"after"


def test_stalled_honest_transport_send_fails_with_an_error_naming_the_receiver(grpc_parties):
    """An ordinary GrpcTransport sender whose stream the receiver cuts gets a TransportError (no hang)."""
    guest = grpc_parties("guest", stream_timeout=0.5)
    host = grpc_parties("host-1", chunk_size=1024)
    link(guest, host)
    gate = threading.Event()
    orig = host._chunks

    def slow_chunks(header, data, progress):
        for i, chunk in enumerate(orig(header, data, progress)):
            if i == 1:
                gate.wait(10)  # stall after the first chunk
            yield chunk

    host._chunks = slow_chunks
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="guest") as err:
        host.send("guest", "t", b"q" * 4096, round=1, timeout=8)
    gate.set()
    assert time.monotonic() - t0 < 5
    assert "CANCELLED" in str(err.value)


# ------------------------------------------------------------------ homomorphic codec: agreed exponent, exact count
@pytest.fixture(scope="module")
def paillier_setup():
    from secureflhv.transport.he_codec import backend_and_codec

    he, wire = backend_and_codec("paillier", 40)
    pub, priv = he.generate_keypair(512, True)
    return he, wire, pub, priv


def test_codec_requires_the_agreed_exponent_and_exact_count(paillier_setup):
    he, wire, pub, _ = paillier_setup
    msg = wire.to_proto(he.encrypt(pub, np.array([0.5, -2.0, 3.0])))
    assert msg.exponent == -40
    assert wire.from_proto(msg, pub, (3,), "x", exponent=-40).exponent == -40
    for exponent in (2 ** 31 - 1, -(2 ** 31 - 1), -41):
        bad = type(msg)()
        bad.CopyFrom(msg)
        bad.exponent = exponent
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match=rf"x: EncryptedTensor.exponent {exponent} != the agreed -40"):
            wire.from_proto(bad, pub, (3,), "x", exponent=-40)
        assert time.monotonic() - t0 < 0.5
    with pytest.raises(ProtocolError, match="x: EncryptedTensor.exponent -40 != the agreed -72"):
        wire.from_proto(msg, pub, (3,), "x", exponent=-72)  # an honest value where another is agreed
    for data in (msg.ciphertexts[:-msg.byte_width], msg.ciphertexts + msg.ciphertexts[:msg.byte_width]):
        bad = type(msg)()
        bad.CopyFrom(msg)
        bad.ciphertexts = data
        with pytest.raises(ProtocolError, match="ciphertexts has .* bytes, expected"):
            wire.from_proto(bad, pub, (3,), "x", exponent=-40)
    with pytest.raises(TypeError, match="exponent"):
        wire.from_proto(msg, pub, (3,), "x")  # the exponent is not optional for protocol receivers


def test_masked_values_require_the_mask_exponent(paillier_setup):
    he, wire, pub, priv = paillier_setup
    masked, mask = he.mask(pub, he.encrypt(pub, np.array([1.5, -0.25])))
    reply = wire.masked_to_proto(he.decrypt_masked(priv, masked), priv)
    got = wire.masked_from_proto(reply, pub, (2,), "dec", exponent=mask.exponent)
    np.testing.assert_array_equal(he.unmask(pub, got, mask), [1.5, -0.25])
    reply.exponent = 2 ** 31 - 1
    with pytest.raises(ProtocolError, match="dec: exponent 2147483647, the protocol agreed -40"):
        wire.masked_from_proto(reply, pub, (2,), "dec", exponent=mask.exponent)


def test_identity_codec_values_carry_exponent_zero():
    from secureflhv.transport.he_codec import backend_and_codec

    he, wire = backend_and_codec("identity")
    key, _ = he.generate_keypair(0, True)
    msg = wire.to_proto(he.encrypt(key, np.array([1.0, 2.0])))
    np.testing.assert_array_equal(wire.from_proto(msg, key, (2,), "x", exponent=-40), [1.0, 2.0])
    msg.exponent = 7
    with pytest.raises(ProtocolError, match="x: exponent 7, the protocol agreed 0"):
        wire.from_proto(msg, key, (2,), "x", exponent=-40)


def test_secureboost_row_pairs_at_another_exponent_are_refused(paillier_setup):
    from secureflhv.proto import tree_pb2

    he, wire, pub, priv = paillier_setup
    sums = he.pair_sums(pub, 20, 2, 4)
    part = tree_pb2.SbRowPart()
    wire.put_pairs(part, sums.encrypt(priv, np.array([1, -2, 3, 0]), np.array([4, 1, 2, 3])))
    assert len(wire.pairs_from(part, pub, sums, 4)) == 4
    part.gh.exponent = 2 ** 31 - 1
    with pytest.raises(ProtocolError, match="encrypted gradients: EncryptedTensor.exponent 2147483647 != the agreed"):
        wire.pairs_from(part, pub, sums, 4)
