"""Bytes-on-the-wire counters (secureflhv.transport.wire) and their hooks in the gRPC and in-process transports."""
import os
import threading
from types import SimpleNamespace

import pytest

from secureflhv.proto import transport_pb2 as pb
from secureflhv.transport import InProcessNetwork, MessageRejected
from secureflhv.transport import wire
from secureflhv.transport.certs import generate_certificates, load_party_credentials
from secureflhv.transport.grpc_transport import GrpcTransport, _Progress
from secureflhv.transport.wire import WireCounter


# ------------------------------------------------------------------ arithmetic
@pytest.mark.parametrize("n, size", [(0, 1), (1, 1), (127, 1), (128, 2), (16383, 2), (16384, 3), (1 << 21, 4)])
def test_varint_size(n, size):
    assert wire.varint_size(n) == size


@pytest.mark.parametrize("payload, chunk", [(0, 1024), (1, 1024), (1023, 1024), (1024, 1024), (1025, 1024),
                                            (300_000, 4096), (3 * (1 << 20) + 7, 1 << 20)])
def test_chunk_layout_and_sizes_match_the_real_chunker_and_protobuf(payload, chunk):
    data = os.urandom(payload)
    header = pb.Envelope(job_id="job-1", round=12345, sender="host-1", receiver="guest", tag="vlr.d",
                         payload_size=payload, payload_sha256=b"\1" * 32)
    chunks = list(GrpcTransport._chunks(SimpleNamespace(chunk_size=chunk), header, data, _Progress()))
    lengths = wire.split_lengths(payload, chunk)
    assert [len(c.data) for c in chunks] == lengths
    assert wire.chunk_message_sizes(header.ByteSize(), lengths) == [c.ByteSize() for c in chunks]
    assert wire.envelope_size("job-1", 12345, "host-1", "guest", "vlr.d", payload) == header.ByteSize()


def test_request_framing_on_a_known_size():
    hdrs = wire.REQUEST_HEADERS
    # 40,000 payload bytes in one chunk, header of 60 bytes: chunk = (1+1+60) + (1+3+40,000) = 40,066 bytes
    # gRPC message 40,071 -> 3 DATA frames of <= 16 KiB; + HEADERS frame (9 + hdrs) + closing DATA frame (9)
    h2 = (9 + hdrs) + (40_071 + 3 * 9) + 9
    assert wire.request_framing(60, [40_000], tls=False) == h2 - 40_000
    assert h2 == 40_116 + hdrs
    # TLS: ceil(h2 / 16,384) = 3 full records + 2 for the call's separate writes, 22 bytes each
    assert wire.request_framing(60, [40_000], tls=True) == h2 - 40_000 + (3 + 2) * 22
    # two chunks: 5 + 62 + (1+3+20,000) in 2 DATA frames; the second, 5 + (1+2+16,000), in one
    two = (9 + hdrs) + (5 + 62 + 4 + 20_000 + 2 * 9) + (5 + 3 + 16_000 + 9) + 9
    assert wire.request_framing(60, [20_000, 16_000], tls=False) == two - 36_000


def test_reply_framing_is_an_ack_in_frames():
    ack = pb.Ack(accepted=True).ByteSize()
    plain = (9 + wire.RESPONSE_HEADERS) + (5 + ack + 9) + 9  # headers, DATA, trailers frames
    assert wire.reply_framing(tls=False) == plain
    assert wire.reply_framing(tls=True) == plain + (1 + 1) * 22


def test_counter_per_peer_and_tag_and_totals():
    c = WireCounter(tls=False)
    c.record_sent("guest", "a", 100, 10, 3)
    c.record_sent("guest", "b", 50, 5, 3)
    c.record_received("guest", "a", 7, 2, 1)
    c.record_received("server", "c", 1000, 20, 1)
    s = c.stats()
    assert s["guest"]["sent"] == 150 and s["guest"]["received"] == 7
    assert s["guest"]["sent_framing"] == 10 + 5 + 1 and s["guest"]["received_framing"] == 3 + 3 + 2
    assert s["guest"]["by_tag"]["a"] == {"sent": 100, "received": 7, "sent_framing": 11, "received_framing": 5,
                                         "messages_sent": 1, "messages_received": 1}
    assert s["server"]["by_tag"]["c"]["received"] == 1000
    t = wire.totals(s)
    assert t["sent"] == 150 and t["received"] == 1007 and t["messages_received"] == 2
    s["guest"]["sent"] = 0  # a snapshot, not the live counters
    assert c.stats()["guest"]["sent"] == 150
    rep = wire.report(c.stats())
    assert rep["total"] == t and rep["peers"] == c.stats() and "estimated" in rep["counted"]


def test_counter_is_thread_safe():
    c = WireCounter()
    barrier = threading.Barrier(8)

    def hammer(i):
        barrier.wait()
        for k in range(2000):
            c.record_sent(f"p{k % 3}", f"t{i % 2}", 3, 1, 1)
            c.record_received(f"p{k % 3}", "r", 5, 2, 1)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tot = wire.totals(c.stats())
    assert tot == {"sent": 8 * 2000 * 3, "received": 8 * 2000 * 5, "sent_framing": 8 * 2000 * 2,
                   "received_framing": 8 * 2000 * 3, "messages_sent": 16000, "messages_received": 16000}
    assert sum(e["by_tag"]["t0"]["messages_sent"] + e["by_tag"]["t1"]["messages_sent"]
               for e in c.stats().values()) == 16000


# ------------------------------------------------------------------ transports
def test_inprocess_counts_both_ends_and_not_refused_or_self_messages():
    net = InProcessNetwork("job-1", ["guest", "host-1"])
    g, h = net.transport("guest"), net.transport("host-1")
    h.send("guest", "x", b"a" * 1000, round=1)
    h.send("guest", "y", b"b" * 10, round=1)
    with pytest.raises(MessageRejected):
        h.send("guest", "x", b"a" * 1000, round=1)  # duplicate: refused, not counted
    g.send("guest", "self", b"z", round=1)  # to oneself: never on the wire
    sent, got = h.wire_stats()["guest"], g.wire_stats()["host-1"]
    assert sent["sent"] == got["received"] == 1010 and sent["messages_sent"] == 2
    assert sent["sent_framing"] == got["received_framing"] > 2 * 60  # envelope, prefixes, frames, TLS
    assert sent["by_tag"]["x"]["sent"] == 1000 and "self" not in g.wire_stats().get("guest", {}).get("by_tag", {})
    assert net.wire_stats() == {"guest": g.wire_stats(), "host-1": h.wire_stats()}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    generate_certificates(d, ["guest", "host-1"])
    return d


@pytest.mark.parametrize("tls", [True, False])
def test_grpc_sender_and_receiver_agree_with_chunked_streams(certs, tls):
    made = []
    for pid in ("guest", "host-1"):
        creds = load_party_credentials(certs, pid) if tls else None
        made.append(GrpcTransport(pid, "job-1", "127.0.0.1:0", {"guest": "127.0.0.1:1", "host-1": "127.0.0.1:1"},
                                  tls=creds, insecure=not tls, deadline=10.0, chunk_size=4096))
    guest, host = made
    try:
        guest.set_peer_address("host-1", host.address)
        host.set_peer_address("guest", guest.address)
        big, small = os.urandom(300_000), b"hi"
        host.send("guest", "big", big, round=1)
        host.send("guest", "small", small, round=1)
        guest.send("host-1", "back", b"", round=2)  # header-only message
        with pytest.raises(MessageRejected):
            host.send("guest", "small", small, round=1)  # duplicate: refused by the receiver, not counted
        assert guest.recv("host-1", "big", 1) == big
        sent, got = host.wire_stats()["guest"], guest.wire_stats()["host-1"]
        assert sent["sent"] == got["received"] == len(big) + len(small)
        assert sent["received"] == got["sent"] == 0 and sent["messages_received"] == got["messages_sent"] == 1
        assert sent["sent_framing"] == got["received_framing"] and sent["received_framing"] == got["sent_framing"]
        header = wire.envelope_size("job-1", 1, "host-1", "guest", "big", len(big))
        expected = wire.request_framing(header, wire.split_lengths(len(big), 4096), tls)
        assert sent["by_tag"]["big"]["sent_framing"] == expected
        assert expected > 74 * (5 + 3)  # 74 chunks, each with a gRPC prefix and a field header at least
        assert sent["by_tag"]["small"] == {"sent": 2, "received": 0, "messages_sent": 1, "messages_received": 0,
                                           "sent_framing": sent["by_tag"]["small"]["sent_framing"],
                                           "received_framing": wire.reply_framing(tls)}
        assert got["by_tag"]["back"]["messages_sent"] == 1 and got["by_tag"]["back"]["sent"] == 0
    finally:
        for t in made:
            t.close(grace=0)


def _kernel_bytes_sent(port: int) -> int | None:
    """Bytes the kernel sent on the connections to ``port`` (``ss -ti``), or None where ss cannot tell."""
    import re
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        return None
    out = subprocess.run(["ss", "-tin", "dport", "=", f":{port}"], capture_output=True, text=True).stdout
    counts = re.findall(r"bytes_sent:(\d+)", out)
    return sum(map(int, counts)) if counts else None


@pytest.mark.parametrize("size, count, tolerance", [(100, 100, 0.06), (1_500_000, 2, 0.002)])
def test_estimate_is_close_to_what_the_kernel_sent(certs, size, count, tolerance):
    """Counted bytes (payload + estimated framing) of ``count`` messages against the kernel's count for the
    TLS connection, after a first message (the handshake and connection set-up are not counted)."""
    made = [GrpcTransport(pid, "job-1", "127.0.0.1:0", {"guest": "127.0.0.1:1", "host-1": "127.0.0.1:1"},
                          tls=load_party_credentials(certs, pid), deadline=10.0) for pid in ("guest", "host-1")]
    guest, host = made

    def counted():
        sent = host.wire_stats()["guest"]
        return sent["sent"] + sent["sent_framing"]

    try:
        host.set_peer_address("guest", guest.address)
        before = None
        for r in range(count + 1):
            host.send("guest", "m", os.urandom(size), round=r)
            guest.recv("host-1", "m", r)
            if r == 0:
                before = (counted(), _kernel_bytes_sent(guest.bound_port))
        kernel = _kernel_bytes_sent(guest.bound_port)
        if kernel is None or before[1] is None:
            pytest.skip("this machine's `ss` does not report per-connection byte counts")
        ours, theirs = counted() - before[0], kernel - before[1]
        assert abs(ours - theirs) <= tolerance * theirs, (ours, theirs)
    finally:
        for t in made:
            t.close(grace=0)
