"""Per-sender limits on incoming gRPC streams (issue 36): one authenticated peer that opens many streams
and stalls them cannot delay another peer's message, cannot take the receiver's threads, and cannot
buffer more than its byte cap in streams still arriving. Real gRPC with mutual TLS on loopback."""
import hashlib
import logging
import threading
import time

import grpc
import pytest

from secureflhv.proto import transport_pb2 as pb
from secureflhv.proto import transport_pb2_grpc as pb_grpc
from secureflhv.transport.certs import generate_certificates, load_party_credentials
from secureflhv.transport.tls import channel_credentials, target_name_options

from grpc_harness import grpc_factory, link

PARTIES = ["guest", "host-1", "host-2", "server"]
KiB = 1024


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    generate_certificates(d, PARTIES)
    return d


@pytest.fixture
def parties(certs):
    with grpc_factory(certs, PARTIES) as make:
        yield make


def _channel(certs, sender, receiver, tls=True):
    """A raw client channel of ``sender`` to ``receiver`` (an attacker holding ``sender``'s certificate)."""
    if not tls:
        return grpc.insecure_channel(receiver.address)
    creds = load_party_credentials(certs, sender)
    return grpc.secure_channel(receiver.address, channel_credentials(creds), target_name_options(receiver.party_id))


def _header(size, data=b"", round=1, tag="t", sender="host-1"):
    return pb.Envelope(job_id="job-1", round=round, sender=sender, receiver="guest", tag=tag, payload_size=size,
                       payload_sha256=hashlib.sha256(data).digest())


def _stalling(release, data=None, round=1, sender="host-1"):
    """A stream that sends nothing (``data`` None) or its header and 10 payload bytes, then stalls."""
    if data is not None:
        yield pb.Chunk(header=_header(len(data), data, round=round, sender=sender), data=data[:10])
    release.wait(30)


def _outcome(future):
    """("ok", "") for an accepted message, ("refused", error) for a refusal Ack, (code, details) for an RPC error."""
    try:
        ack = future.result()
        return ("ok", "") if ack.accepted else ("refused", ack.error)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""


def _wait(cond, seconds=5.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_24_stalled_streams_from_one_peer_do_not_delay_another_peers_message(parties, certs, caplog):
    guest = parties("guest", first_chunk_timeout=2.0, stream_timeout=3.0)
    host2 = parties("host-2")
    link(guest, host2)
    channel = _channel(certs, "host-1", guest)
    stub = pb_grpc.PartyServiceStub(channel)
    release = threading.Event()
    data = b"f" * 1000
    with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
        try:
            # half open a stream and send nothing, half send a header and stall mid-payload; no client deadline
            flood = [stub.Deliver.future(_stalling(release, None if i % 2 else data, round=i + 1))
                     for i in range(24)]
            assert _wait(lambda: sum(f.done() for f in flood) >= 20), "excess streams were not refused"
            assert guest.streams_in_flight()["host-1"][0] == 4
            refused = [_outcome(f) for f in flood if f.done()]
            assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many streams in flight from 'host-1'"
                       in details for code, details in refused), refused

            t0 = time.monotonic()
            host2.send("guest", "t", b"honest", round=1, timeout=6)  # 6 bytes: failed after 6 s before the cap
            latency = time.monotonic() - t0
            assert guest.recv("host-2", "t", round=1, timeout=1) == b"honest"
            print(f"honest 6-byte message under a 24-stream flood: delivered in {latency * 1000:.1f} ms")
            assert latency < 2.0

            # the 4 admitted stalls are cut by the server's deadlines (no client deadline was set)
            held = [f for f in flood if not f.done()]
            assert _wait(lambda: all(f.done() for f in held), 6), "stalled streams were never cut"
            assert {_outcome(f)[0] for f in held} == {grpc.StatusCode.CANCELLED}
            assert _wait(lambda: guest.streams_in_flight() == {}), guest.streams_in_flight()
        finally:
            release.set()
            channel.close()
    busy = [r.getMessage() for r in caplog.records if "already in flight" in r.getMessage()]
    assert busy and all("host-1" in m for m in busy)
    assert len(busy) <= 5  # 20 refusals, logged at the 1st, 2nd, 4th, 8th, 16th
    assert "stream stalled" in caplog.text
    # the flooder's slots came back: it can deliver again
    host1 = parties("host-1")
    link(guest, host1)
    host1.send("guest", "t", b"after", round=100)
    assert guest.recv("host-1", "t", round=100, timeout=2) == b"after"


def test_a_stalled_opener_is_cut_by_the_first_chunk_deadline(parties, certs, caplog):
    guest = parties("guest", first_chunk_timeout=0.5, stream_timeout=30)
    channel = _channel(certs, "host-1", guest)
    release = threading.Event()
    try:
        with caplog.at_level(logging.WARNING, logger="secureflhv.transport"):
            t0 = time.monotonic()
            future = pb_grpc.PartyServiceStub(channel).Deliver.future(_stalling(release))
            assert _wait(future.done, 10)
            seconds = time.monotonic() - t0
            # the client sees the cut before the receiver's handler logs it and frees the slot: wait for both
            assert _wait(lambda: guest.streams_in_flight() == {}), guest.streams_in_flight()
    finally:
        release.set()
        channel.close()
    assert _outcome(future)[0] == grpc.StatusCode.CANCELLED
    assert 0.4 < seconds < 3, seconds  # the first-chunk deadline, far below stream_timeout
    assert "host-1" in caplog.text and "no first chunk within 0.5s" in caplog.text


def test_declared_sizes_in_flight_count_toward_the_senders_byte_cap(parties, certs):
    guest = parties("guest", max_payload_bytes=64 * KiB)  # byte cap per sender: 128 KiB, queued + in flight
    channel = _channel(certs, "host-1", guest)
    stub = pb_grpc.PartyServiceStub(channel)
    big = [bytes([i]) * (60 * KiB) for i in range(4)]
    finish_a, hold_b = threading.Event(), threading.Event()

    def stream_a():  # header + 10 bytes, then the rest once told
        yield pb.Chunk(header=_header(len(big[0]), big[0], round=1), data=big[0][:10])
        finish_a.wait(30)
        yield pb.Chunk(data=big[0][10:])

    try:
        a = stub.Deliver.future(stream_a())
        b = stub.Deliver.future(_stalling(hold_b, big[1], round=2))
        assert _wait(lambda: guest.streams_in_flight().get("host-1") == (2, 120 * KiB)), guest.streams_in_flight()

        # C declares 60 KiB more, over the cap with A and B in flight, and stalls after its header: an
        # answer while it stalls shows the refusal came from the header, before any payload was read
        ack = stub.Deliver(_stalling(hold_b, big[2], round=3), timeout=5)
        assert not ack.accepted and "flood: 'host-1'" in ack.error and "122880 bytes declared by streams" in ack.error
        rec, _ = guest.rejected[-1]
        assert (rec.sender, rec.round, rec.size) == ("host-1", 3, 60 * KiB)

        finish_a.set()  # A completes: its reservation becomes a queued message
        assert _outcome(a)[0] == "ok"
        assert guest._box.queued("host-1") == (1, 60 * KiB)
        assert guest.streams_in_flight()["host-1"] == (1, 60 * KiB)

        b.cancel()  # B's sender goes away: its reservation is released
        assert _wait(lambda: guest.streams_in_flight() == {}), guest.streams_in_flight()

        ack = stub.Deliver(iter([pb.Chunk(header=_header(len(big[3]), big[3], round=4), data=big[3])]), timeout=5)
        assert ack.accepted, ack.error  # 60 KiB queued + 60 KiB: within the cap again
        ack = stub.Deliver(iter([pb.Chunk(header=_header(10 * KiB, b"x" * 10 * KiB, round=5), data=b"x" * 10 * KiB)]),
                           timeout=5)
        assert not ack.accepted and "flood" in ack.error  # 120 KiB queued: 10 KiB more is over
    finally:
        finish_a.set()
        hold_b.set()
        channel.close()
    assert guest.recv("host-1", "t", round=1, timeout=1) == big[0]
    assert guest.recv("host-1", "t", round=4, timeout=1) == big[3]
    assert guest.streams_in_flight() == {} and guest._box.reserved("host-1") == 0


def test_an_honest_sender_over_the_stream_cap_waits_and_delivers(parties):
    guest = parties("guest", max_streams_per_sender=1)
    host = parties("host-1", chunk_size=1024)
    link(guest, host)
    orig = host._chunks

    def slow_chunks(header, data, progress):  # each stream lasts ~0.3 s: concurrent sends overlap
        for i, chunk in enumerate(orig(header, data, progress)):
            if i == 1:
                time.sleep(0.3)
            yield chunk

    host._chunks = slow_chunks
    errors = []

    def send(r):
        try:
            host.send("guest", "t", bytes([r]) * 4096, round=r, timeout=8)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(r,)) for r in range(1, 5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(15)
    assert not errors, errors
    assert [guest.recv("host-1", "t", round=r, timeout=1) for r in range(1, 5)] == [bytes([r]) * 4096
                                                                                    for r in range(1, 5)]
    assert guest._busy_refusals.get("host-1", 0) >= 1  # the cap did refuse, and the sender retried


def test_plaintext_counts_streams_by_the_claimed_sender_at_the_header(parties, certs):
    guest = parties("guest", tls=False, max_streams_per_sender=1)
    channel = _channel(certs, "host-1", guest, tls=False)
    stub = pb_grpc.PartyServiceStub(channel)
    release = threading.Event()
    data = b"d" * 100
    try:
        held = stub.Deliver.future(_stalling(release, data, round=1))
        assert _wait(lambda: "host-1" in guest.streams_in_flight())
        with pytest.raises(grpc.RpcError) as err:
            stub.Deliver(_stalling(release, data, round=2), timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "'host-1'" in err.value.details()
        ack = stub.Deliver(iter([pb.Chunk(header=_header(len(data), data, sender="host-2"), data=data)]), timeout=5)
        assert ack.accepted  # another sender is not affected
    finally:
        release.set()
        channel.close()
    assert _outcome(held)[0] != "ok"
    assert _wait(lambda: guest.streams_in_flight() == {})


def test_server_threads_and_concurrent_call_limit(parties, certs):
    default = parties("guest")
    assert default._executor._max_workers == 3 * 4 + 2  # 3 peers x 4 streams + 2 spare
    guest = parties("guest", max_workers=2, max_streams_per_sender=4)  # 2 threads, 4 calls admitted
    channel = _channel(certs, "host-1", guest)
    stub = pb_grpc.PartyServiceStub(channel)
    release = threading.Event()
    try:
        held = [stub.Deliver.future(_stalling(release, b"z" * 100, round=r)) for r in (1, 2, 3, 4)]
        assert _wait(lambda: guest.streams_in_flight().get("host-1", (0, 0))[0] == 2)  # 2 more wait for a thread
        time.sleep(0.2)
        with pytest.raises(grpc.RpcError) as err:  # gRPC's maximum_concurrent_rpcs: refused without a thread
            stub.Deliver(_stalling(release, b"z" * 100, round=5), timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "too many streams" not in err.value.details()  # not the per-sender cap (4): gRPC's own limit
    finally:
        release.set()
        channel.close()
    assert all(_outcome(f)[0] != "ok" for f in held)
    with pytest.raises(ValueError, match="first_chunk_timeout"):
        parties("host-2", first_chunk_timeout=0)
    with pytest.raises(ValueError, match="max_streams_per_sender"):
        parties("host-2", max_streams_per_sender=0)
