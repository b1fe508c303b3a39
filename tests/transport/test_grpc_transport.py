"""GrpcTransport over loopback: mutual TLS, chunked streaming, identity checks, retries, shutdown."""
import hashlib
import logging
import os
import socket
import threading
import time

import grpc
import pytest

from secureflhv.proto import messages_pb2
from secureflhv.proto import transport_pb2 as pb
from secureflhv.proto import transport_pb2_grpc as pb_grpc
from secureflhv.transport import JobAborted, MessageRejected, PeerUnavailable, TransportError, parse_message
from secureflhv.transport.certs import TlsConfig, generate_certificates, load_party_credentials
from secureflhv.transport.grpc_transport import GrpcTransport
from secureflhv.transport.tls import channel_credentials, target_name_options

PARTIES = ["guest", "host-1", "host-2", "server"]
NOWHERE = "127.0.0.1:1"  # placeholder address until the peer's port is known (port 0 binding)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    main = tmp_path_factory.mktemp("certs")
    generate_certificates(main, PARTIES)
    other = tmp_path_factory.mktemp("other-ca")
    generate_certificates(other, ["host-1"])  # same party id, different CA
    return main, other


@pytest.fixture
def make(certs):
    """Create transports on 127.0.0.1:0; every one is closed at the end of the test."""
    made = []

    def _make(pid, *, job="job-1", tls=True, cert_dir=None, peers=None, **kw):
        creds = load_party_credentials(cert_dir or certs[0], pid) if tls else None
        t = GrpcTransport(pid, job, "127.0.0.1:0", peers or {p: NOWHERE for p in PARTIES}, tls=creds,
                          insecure=not tls, deadline=kw.pop("deadline", 10.0), **kw)
        made.append(t)
        return t

    yield _make
    for t in made:
        t.close(grace=0)


def link(*transports):
    for a in transports:
        for b in transports:
            if a is not b and b.party_id in a.peers:
                a.set_peer_address(b.party_id, b.address)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


# ------------------------------------------------------------------ round trips
def test_round_trip_bytes_and_protobuf(make):
    guest, host = make("guest"), make("host-1")
    link(guest, host)
    host.send("guest", "hello", b"\x00\x01 bytes", round=1)
    assert guest.recv("host-1", "hello", round=1) == b"\x00\x01 bytes"
    reply = messages_pb2.Strings(values=["a", "\u00e9", ""])
    guest.send("host-1", "reply", reply, round=7)
    got = host.recv("guest", "reply", round=7, parse=parse_message(messages_pb2.Strings))
    assert list(got.values) == ["a", "\u00e9", ""]
    host.send("guest", "empty", b"", round=1)  # zero-byte payload: header-only stream
    assert guest.recv("host-1", "empty", round=1) == b""
    assert host.sent_bytes == len(b"\x00\x01 bytes") and guest.received_bytes == len(b"\x00\x01 bytes")
    assert guest.secure and guest.bound_port > 0 and guest.address == f"127.0.0.1:{guest.bound_port}"


def test_many_chunks_and_concurrent_senders(make):
    guest = make("guest")
    senders = [make(p, chunk_size=4096) for p in ("host-1", "host-2", "server")]
    link(guest, *senders)
    payloads = {s.party_id: os.urandom(300_000 + i) for i, s in enumerate(senders)}  # ~74 chunks each

    def send_all(s):
        for r in range(1, 6):
            s.send("guest", "update", payloads[s.party_id][r:], round=r)

    threads = [threading.Thread(target=send_all, args=(s,)) for s in senders]
    for th in threads:
        th.start()
    for s in senders:
        for r in range(1, 6):
            assert guest.recv(s.party_id, "update", round=r) == payloads[s.party_id][r:]
    for th in threads:
        th.join(10)
    assert guest.rejected == []


@pytest.mark.slow
def test_200mb_payload_streams_over_tls(make):
    guest, host = make("guest", deadline=60.0), make("host-1", deadline=60.0)
    link(guest, host)
    big = os.urandom(200 * 1024 * 1024)
    want = hashlib.sha256(big).digest()
    t0 = time.monotonic()
    th, out = in_thread(lambda: host.send("guest", "histograms", big, round=1))
    got = guest.recv("host-1", "histograms", round=1)
    th.join(60)
    elapsed = time.monotonic() - t0
    assert "error" not in out, out.get("error")
    assert len(got) == len(big) and hashlib.sha256(got).digest() == want
    assert elapsed < 30, f"200 MB took {elapsed:.1f}s"
    print(f"200 MiB over mTLS loopback: {elapsed:.2f}s ({200 / elapsed:.0f} MiB/s)")


# ------------------------------------------------------------------ identity and TLS
def test_certificate_of_another_party_is_refused(make, caplog):
    guest, host1 = make("guest"), make("host-1")
    impostor = make("host-2")  # holds host-2's valid certificate ...
    link(guest, host1, impostor)
    impostor.party_id = "host-1"  # ... but claims to be host-1 in the envelope
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        with pytest.raises(MessageRejected, match=r"does not match the TLS certificate.*'host-2'"):
            impostor.send("guest", "gradient", b"forged", round=1)
    assert len(guest.rejected) == 1
    bad, reason = guest.rejected[0]
    assert bad.sender == "host-1" and "CN 'host-2'" in reason
    assert "does not match the TLS certificate" in caplog.text
    # the receiver keeps working, and the forged message did not consume host-1's round 1
    host1.send("guest", "gradient", b"genuine", round=1)
    assert guest.recv("host-1", "gradient", round=1) == b"genuine"


def test_client_certificate_from_another_ca_fails_handshake(make, certs):
    guest = make("guest")
    stranger = make("host-1", cert_dir=certs[1])
    link(stranger, guest)
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable, match="TLS handshake") as err:
        stranger.send("guest", "gradient", b"x", round=1, timeout=20)
    assert time.monotonic() - t0 < 4  # a certificate problem fails fast instead of retrying to the deadline
    assert "'guest'" in str(err.value) and guest.address in str(err.value)
    assert guest.rejected == []  # never reached the application
    legit = make("host-1")
    link(legit, guest)
    legit.send("guest", "gradient", b"ok", round=1)
    assert guest.recv("host-1", "gradient", round=1) == b"ok"


def test_server_requires_a_client_certificate_from_the_job_ca(make, certs):
    guest = make("guest")
    # trusts the job CA (so it accepts guest's server certificate) but presents a foreign certificate
    foreign = TlsConfig(ca_cert=(certs[0] / "ca.pem").read_bytes(), cert=(certs[1] / "host-1.pem").read_bytes(),
                        key=(certs[1] / "host-1.key").read_bytes(), identity="host-1")
    client = GrpcTransport("host-1", "job-1", "127.0.0.1:0", {"guest": guest.address}, tls=foreign)
    try:
        with pytest.raises(PeerUnavailable, match="'guest'"):
            client.send("guest", "gradient", b"x", round=1, timeout=1.0)
    finally:
        client.close(grace=0)
    assert guest.rejected == [] and guest.received_bytes == 0


def test_server_certificate_must_belong_to_the_receiver(make):
    host2 = make("host-2")
    guest = make("guest")
    guest.set_peer_address("host-1", host2.address)  # wrong address: host-2 answers there
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable, match=r"TLS handshake with 'host-1'"):
        guest.send("host-1", "secret", b"for host-1 only", round=1, timeout=20)
    assert time.monotonic() - t0 < 3
    assert host2.rejected == [] and host2.received_bytes == 0


def test_transport_refuses_certificate_of_another_party(certs):
    with pytest.raises(ValueError, match=r"'host-2'.*'host-1'"):
        GrpcTransport("host-1", "job-1", "127.0.0.1:0", {}, tls=load_party_credentials(certs[0], "host-2"))


def test_unknown_sender_is_refused(make):
    guest = make("guest", peers={"host-1": NOWHERE})  # host-2 is not a party of this job
    outsider = make("host-2")
    link(outsider, guest)
    with pytest.raises(MessageRejected, match="not a party of job"):
        outsider.send("guest", "t", b"x", round=1)


# ------------------------------------------------------------------ wire rules over gRPC
def test_stale_and_replayed_rounds_are_rejected(make):
    guest, host = make("guest"), make("host-1")
    link(guest, host)
    host.send("guest", "residual", b"r5", round=5)
    with pytest.raises(MessageRejected, match="duplicate"):
        host.send("guest", "residual", b"r5", round=5)
    assert guest.recv("host-1", "residual", round=5) == b"r5"
    with pytest.raises(MessageRejected, match="stale or replayed"):
        host.send("guest", "residual", b"r5", round=5)
    with pytest.raises(MessageRejected, match="stale or replayed"):
        host.send("guest", "residual", b"r3", round=3)
    host.send("guest", "residual", b"r6", round=6)
    assert guest.recv("host-1", "residual", round=6) == b"r6"
    assert len(guest.rejected) == 3


def test_job_id_mismatch_is_rejected(make):
    guest, other = make("guest"), make("host-1", job="job-2")
    link(guest, other)
    with pytest.raises(MessageRejected, match=r"job 'job-2'.*'job-1'"):
        other.send("guest", "t", b"x", round=1)
    assert guest.rejected[0][0].job_id == "job-2"


def test_abort_propagates(make):
    guest, host = make("guest"), make("host-1")
    link(guest, host)
    th, out = in_thread(lambda: guest.recv("host-1", "gradient", round=3, timeout=10))
    time.sleep(0.1)
    host.abort("host-1 ran out of memory", ["guest"])
    th.join(5)
    assert isinstance(out.get("error"), JobAborted)
    assert "ran out of memory" in str(out["error"]) and "host-1" in str(out["error"])


def _raw_stub(certs, target_party, address):
    tls = load_party_credentials(certs[0], "host-1")
    channel = grpc.secure_channel(address, channel_credentials(tls), target_name_options(target_party))
    return channel, pb_grpc.PartyServiceStub(channel)


def test_malformed_streams_are_refused_and_receiver_survives(make, certs, caplog):
    guest, host = make("guest", max_payload_bytes=1_000_000), make("host-1")
    link(guest, host)
    channel, stub = _raw_stub(certs, "guest", guest.address)

    def header(size, data=b"", **kw):
        fields = dict(job_id="job-1", round=1, sender="host-1", receiver="guest", tag="t", payload_size=size,
                      payload_sha256=hashlib.sha256(data).digest())
        fields.update(kw)
        return pb.Envelope(**fields)

    data = b"0123456789"
    cases = [
        ([], "empty stream"),
        ([pb.Chunk(data=data)], "no Envelope header"),
        ([pb.Chunk(header=header(10, data), data=data[:5])], "truncated"),
        ([pb.Chunk(header=header(10, data), data=data), pb.Chunk(data=b"more")], "more payload bytes"),
        ([pb.Chunk(header=header(10, b"other bytes!"), data=data)], "SHA-256 does not match"),
        ([pb.Chunk(header=header(10, data, payload_sha256=b"short"), data=data)], "expected 32"),
        ([pb.Chunk(header=header(10 ** 12), data=data)], "exceeds this party's limit"),
        ([pb.Chunk(header=header(10, data), data=data[:5]), pb.Chunk(header=header(10, data), data=data[5:])],
         "second header"),
    ]
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        try:
            for chunks, needle in cases:
                ack = stub.Deliver(iter(chunks), timeout=5)
                assert not ack.accepted and needle in ack.error, (needle, ack.error)
        finally:
            channel.close()
    assert "no Envelope header" in caplog.text and "SHA-256 does not match" in caplog.text
    assert len(guest.rejected) == len(cases) - 2  # the two header-less streams have no message to record
    host.send("guest", "t", data, round=1)  # nothing above consumed round 1
    assert guest.recv("host-1", "t", round=1) == data


def test_sender_dying_mid_stream_queues_nothing(make, certs, caplog):
    guest, host = make("guest"), make("host-1")
    link(guest, host)
    channel, stub = _raw_stub(certs, "guest", guest.address)
    data = os.urandom(64 * 1024)
    head = pb.Envelope(job_id="job-1", round=1, sender="host-1", receiver="guest", tag="t",
                       payload_size=len(data), payload_sha256=hashlib.sha256(data).digest())

    def dying_sender():
        yield pb.Chunk(header=head, data=data[:1024])
        time.sleep(0.3)  # let the receiver start reading, then "crash"
        raise RuntimeError("sender process killed")

    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        try:
            with pytest.raises(grpc.RpcError):
                stub.Deliver(dying_sender(), timeout=5)
        finally:
            channel.close()
        # gRPC either cancels the call or half-closes the stream first: both must queue nothing
        outcomes = ("broke before the message was complete", "payload truncated")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(o in caplog.text for o in outcomes):
            time.sleep(0.05)
    assert any(o in caplog.text for o in outcomes)
    assert guest.received_bytes == 0
    host.send("guest", "t", data, round=1)  # round 1 still open; the receiver still serves
    assert guest.recv("host-1", "t", round=1) == data


# ------------------------------------------------------------------ availability
def test_retries_until_the_receiver_starts(make, certs):
    port = free_port()
    host = make("host-1", retry_window=15.0)
    host.set_peer_address("guest", f"127.0.0.1:{port}")
    th, out = in_thread(lambda: host.send("guest", "early", b"sent before guest was up", round=1))
    time.sleep(1.0)
    assert th.is_alive()  # still retrying
    guest = GrpcTransport("guest", "job-1", f"127.0.0.1:{port}", {"host-1": host.address},
                          tls=load_party_credentials(certs[0], "guest"), deadline=10)
    try:
        assert guest.recv("host-1", "early", round=1) == b"sent before guest was up"
        th.join(10)
        assert "error" not in out, out.get("error")
    finally:
        guest.close(grace=0)


def test_unreachable_peer_fails_within_deadline(make):
    host = make("host-1")
    address = f"127.0.0.1:{free_port()}"
    host.set_peer_address("guest", address)
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable) as err:
        host.send("guest", "t", b"x", round=1, timeout=1.0)
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 4.0
    assert "'guest'" in str(err.value) and address in str(err.value)
    with pytest.raises(PeerUnavailable, match="mallory"):
        host.send("mallory", "t", b"x", round=1)


def test_retry_window_caps_the_retries(make):
    host = make("host-1", retry_window=0.5)
    host.set_peer_address("guest", f"127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable):
        host.send("guest", "t", b"x", round=1, timeout=20.0)
    assert time.monotonic() - t0 < 3.0


def test_port_in_use_and_bad_addresses(make):
    guest = make("guest")
    with pytest.raises(TransportError, match=guest.address):
        GrpcTransport("host-1", "job-1", guest.address, {}, insecure=True)
    with pytest.raises(ValueError, match="host:port"):
        GrpcTransport("host-1", "job-1", "localhost", {}, insecure=True)
    with pytest.raises(ValueError, match="peer 'guest'"):
        GrpcTransport("host-1", "job-1", "127.0.0.1:0", {"guest": "nowhere"}, insecure=True)


def test_send_to_self_is_local(make):
    guest = make("guest")
    guest.send("guest", "note", b"to myself", round=1)
    assert guest.recv("guest", "note", round=1) == b"to myself"


# ------------------------------------------------------------------ insecure mode and shutdown
def test_tls_is_required_unless_insecure_is_explicit(certs):
    with pytest.raises(ValueError, match="insecure=True"):
        GrpcTransport("guest", "job-1", "127.0.0.1:0", {})
    with pytest.raises(ValueError, match="choose one"):
        GrpcTransport("guest", "job-1", "127.0.0.1:0", {}, tls=load_party_credentials(certs[0], "guest"),
                      insecure=True)


def test_insecure_mode_works_and_warns(make, caplog):
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        guest, host = make("guest", tls=False), make("host-1", tls=False)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "plaintext" in r.getMessage()]
    assert len(warnings) == 2 and "NOT verified" in warnings[0].getMessage()
    link(guest, host)
    host.send("guest", "t", b"clear", round=1)
    assert guest.recv("host-1", "t", round=1) == b"clear"
    assert not guest.secure


def test_close_is_clean(make):
    guest, host = make("guest"), make("host-1")
    link(guest, host)
    host.send("guest", "t", b"x", round=1)
    th, out = in_thread(lambda: guest.recv("host-1", "never", round=1, timeout=30))
    time.sleep(0.1)
    t0 = time.monotonic()
    guest.close()
    th.join(5)
    assert time.monotonic() - t0 < 5 and not th.is_alive()
    assert isinstance(out.get("error"), TransportError) and "closed" in str(out["error"])
    assert not [t for t in threading.enumerate() if t.name.startswith("secureflhv-guest-rx")]
    guest.close()  # idempotent
    with pytest.raises(TransportError, match="closed"):
        guest.send("host-1", "t", b"x", round=2)
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailable, match="guest"):
        host.send("guest", "t", b"x", round=2, timeout=1.0)  # the server is really gone
    assert time.monotonic() - t0 < 3


def test_close_interrupts_a_retrying_send(make):
    host = make("host-1")
    host.set_peer_address("guest", f"127.0.0.1:{free_port()}")
    th, out = in_thread(lambda: host.send("guest", "t", b"x", round=1, timeout=30))
    time.sleep(0.3)
    t0 = time.monotonic()
    host.close()
    th.join(5)
    assert not th.is_alive() and time.monotonic() - t0 < 5
    assert isinstance(out.get("error"), TransportError) and "closed" in str(out["error"])
