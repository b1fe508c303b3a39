"""ECDH-PSI protocol (secureflhv.vertical.psi) over the in-process transport, one thread per party."""
import hashlib
import random
import threading
import time

import numpy as np
import pytest

from secureflhv.crypto.ecdh_psi import hash_context, hash_to_points, split_items
from secureflhv.proto import psi_pb2
from secureflhv.transport import InProcessNetwork, JobAborted, Message, ProtocolError
from secureflhv.vertical import psi as vpsi
from secureflhv.vertical.psi import align_ids_guest, align_ids_host

JOB = "job-psi"


class RecordingNetwork(InProcessNetwork):
    """Keeps every message delivered (or offered) to each party."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.received: dict[str, list[Message]] = {p: [] for p in self.party_ids}

    def inject(self, msg):
        self.received[msg.receiver].append(msg)
        super().inject(msg)


def start_hosts(net, host_ids, round_base=0):
    results, errors, threads = {}, {}, []

    def run(h, ids):
        try:
            results[h] = align_ids_host(net.transport(h), ids, "guest", round_base=round_base, workers=1)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            errors[h] = exc

    for h, ids in host_ids.items():
        t = threading.Thread(target=run, args=(h, ids), daemon=True)
        t.start()
        threads.append(t)
    return results, errors, threads


def run_psi(guest_ids, host_ids, net=None, round_base=0):
    net = net or InProcessNetwork(JOB, ["guest", *host_ids], deadline=20.0)
    results, errors, threads = start_hosts(net, host_ids, round_base)
    g = align_ids_guest(net.transport("guest"), guest_ids, list(host_ids), round_base=round_base, workers=1)
    for t in threads:
        t.join(30)
    assert not errors, errors
    return g, results


def check(guest_ids, host_ids, g, results):
    expected = set(guest_ids)
    for ids in host_ids.values():
        expected &= set(ids)
    expected = sorted(expected)
    assert g.ids == expected
    assert g.rows.dtype == np.int64 and [guest_ids[r] for r in g.rows] == expected
    for h, ids in host_ids.items():
        r = results[h]
        assert r.ids == expected
        assert r.rows.dtype == np.int64 and [ids[i] for i in r.rows] == expected
        assert r.peer_sizes == {"guest": len(guest_ids)}
        assert g.peer_sizes[h] == len(ids)
    return expected


def ids_from(rng, pool, k):
    return [pool[i] for i in rng.sample(range(len(pool)), k)]


POOL = ([f"cust-{i}" for i in range(3000)] + [f"клиент-{i}" for i in range(300)]
        + [f"客户{i}" for i in range(300)])


@pytest.mark.parametrize("case", ["random", "empty_guest", "empty_host", "both_empty", "disjoint", "identical"])
def test_two_party_intersection(case):
    rng = random.Random(case)
    if case == "random":
        guest, host = ids_from(rng, POOL, 900), ids_from(rng, POOL, 1200)
    elif case == "empty_guest":
        guest, host = [], ids_from(rng, POOL, 50)
    elif case == "empty_host":
        guest, host = ids_from(rng, POOL, 50), []
    elif case == "both_empty":
        guest, host = [], []
    elif case == "disjoint":
        guest, host = POOL[:300], POOL[300:700]
    else:
        guest = ids_from(rng, POOL, 400)
        host = rng.sample(guest, len(guest))
    g, res = run_psi(guest, {"host": host})
    expected = check(guest, {"host": host}, g, res)
    if case == "random":
        assert 0 < len(expected) < 900
    if case == "identical":
        assert len(expected) == 400
    if case in ("disjoint", "empty_guest", "empty_host", "both_empty"):
        assert expected == [] and g.rows.shape == (0,)


def test_multi_host_final_intersection_common_to_all():
    rng = random.Random(5)
    guest = ids_from(rng, POOL, 1500)
    hosts = {"host-1": ids_from(rng, POOL, 1500), "host-2": ids_from(rng, POOL, 1500)}
    g, res = run_psi(guest, hosts)
    expected = check(guest, hosts, g, res)
    pairwise = set(guest) & set(hosts["host-1"])
    assert len(expected) < len(pairwise)  # host-1 ends with the 3-way intersection, not its pairwise one


def test_consecutive_runs_with_increasing_round_base():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    guest, host = POOL[:200], POOL[100:400]
    for rb in (0, 1):
        g, res = run_psi(guest, {"host": host}, net=net, round_base=rb)
        assert check(guest, {"host": host}, g, res) == sorted(POOL[100:200])


def test_host_learns_only_the_intersection():
    rng = random.Random(11)
    guest = ids_from(rng, POOL, 600)
    host = ids_from(rng, POOL, 600)
    net = RecordingNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = run_psi(guest, {"host": host}, net=net)
    inter = set(g.ids)
    outside = [x for x in guest if x not in inter]
    assert len(outside) > 100 and len(inter) > 20

    got = {m.tag: m.payload for m in net.received["host"]}
    assert set(got) == {vpsi.TAG_HELLO, vpsi.TAG_POINTS, vpsi.TAG_INTERSECTION}
    hello = psi_pb2.PsiHello.FromString(got[vpsi.TAG_HELLO])
    points = psi_pb2.PsiPoints.FromString(got[vpsi.TAG_POINTS])
    final = psi_pb2.PsiIntersection.FromString(got[vpsi.TAG_INTERSECTION])
    # Everything the host could compute from a guess x: the hashed point H(x) (it knows the salt and
    # job), plain hashes and the ID bytes themselves. None of them may appear anywhere it received.
    ctx = hash_context(JOB, hello.salt)
    h_points = split_items(hash_to_points(guest, ctx), 32)
    received = [m.payload for m in net.received["host"]]
    for x, hx in zip(guest, h_points):
        if x in inter:
            continue
        forms = [x.encode(), hx, hx[:16], hashlib.sha256(x.encode()).digest(), hashlib.sha256(x.encode()).digest()[:16]]
        assert not any(f in p for f in forms for p in received), x
    # the singly blinded values are not H(x) for ANY guest ID, in or out of the intersection
    blinded = set(split_items(points.items, 32))
    assert len(blinded) == len(guest) == points.count == hello.set_size
    assert not blinded & set(h_points)
    # the last message names exactly the final intersection, as the host's own rows
    rows = np.frombuffer(final.rows, dtype="<u8")
    assert sorted(host[r] for r in rows) == sorted(inter)
    assert res["host"].ids == g.ids


def test_duplicate_ids_fail_clearly_and_peer_does_not_hang():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    results, errors, threads = start_hosts(net, {"host": POOL[:50]})
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"party 'guest' has duplicate IDs.*'cust-3'"):
        align_ids_guest(net.transport("guest"), POOL[:10] + ["cust-3"], ["host"], workers=1)
    threads[0].join(10)
    assert isinstance(errors["host"], JobAborted) and "duplicate" in str(errors["host"])
    assert time.monotonic() - t0 < 10

    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    results, errors, threads = start_hosts(net, {"host": ["x", "y", "y"]})
    with pytest.raises(JobAborted, match="party 'host' has duplicate IDs"):
        align_ids_guest(net.transport("guest"), POOL[:10], ["host"], workers=1)
    threads[0].join(10)
    assert isinstance(errors["host"], ValueError) and "'y'" in str(errors["host"])


def test_non_string_ids_rejected():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=5.0)
    with pytest.raises(TypeError, match="row 1 is int"):
        align_ids_guest(net.transport("guest"), ["a", 7], ["host"], workers=1)


def wait_rejected(net, party, k=1, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(net.mailbox(party).rejected) < k:
        assert time.monotonic() < deadline, "the bad message was never consumed"
        time.sleep(0.01)


def test_malformed_hello_rejected_and_protocol_completes():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    bad = psi_pb2.PsiHello(version=1, salt=b"short", set_size=3, truncate_bytes=16).SerializeToString()
    net.inject(Message(JOB, 0, "guest", "host", vpsi.TAG_HELLO, bad))
    guest, host = POOL[:300], POOL[200:500]
    results, errors, threads = start_hosts(net, {"host": host})
    wait_rejected(net, "host")  # the host consumed and refused it before the real hello exists
    g = align_ids_guest(net.transport("guest"), guest, ["host"], workers=1)
    threads[0].join(30)
    assert not errors
    check(guest, {"host": host}, g, results)
    (msg, reason), = net.mailbox("host").rejected
    assert (msg.size, msg.digest) == (len(bad), hashlib.sha256(bad).hexdigest()[:16]) and "salt" in reason


@pytest.mark.parametrize("flaw", ["top_bit", "count", "garbage"])
def test_malformed_points_rejected_at_guest_and_protocol_completes(flaw):
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    guest, host = POOL[:300], POOL[200:500]
    items = bytearray(hash_to_points(host, hash_context(JOB, b"\0" * 32)))
    if flaw == "top_bit":
        items[31] |= 0x80
        bad = psi_pb2.PsiPoints(item_bytes=32, count=len(host), items=bytes(items)).SerializeToString()
    elif flaw == "count":
        bad = psi_pb2.PsiPoints(item_bytes=32, count=len(host) + 1, items=bytes(items)).SerializeToString()
    else:
        bad = b"\xff\xff\xff not a protobuf"
    net.inject(Message(JOB, 0, "host", "guest", vpsi.TAG_POINTS, bad))
    out = {}
    t = threading.Thread(target=lambda: out.update(g=align_ids_guest(net.transport("guest"), guest, ["host"],
                                                                     workers=1)), daemon=True)
    t.start()
    wait_rejected(net, "guest")  # guest hashed, sent, and refused the bad points; host not started yet
    results, errors, threads = start_hosts(net, {"host": host})
    t.join(30)
    threads[0].join(30)
    assert not errors
    check(guest, {"host": host}, out["g"], results)
    assert len(net.mailbox("guest").rejected) == 1


def test_intersection_message_validation():
    own = ["a", "b", "c", "d"]
    parse = vpsi._intersection_parser("guest", own)

    def msg(rows):
        return psi_pb2.PsiIntersection(count=len(rows), rows=np.asarray(rows, "<u8").tobytes()).SerializeToString()

    rows, ids = parse(msg([0, 2, 3]))
    assert list(rows) == [0, 2, 3] and ids == ["a", "c", "d"]
    with pytest.raises(ProtocolError, match="out of range"):
        parse(msg([0, 4]))
    with pytest.raises(ProtocolError, match="agreed order"):
        parse(msg([2, 0]))
    with pytest.raises(ProtocolError, match="agreed order"):
        parse(msg([1, 1]))
    with pytest.raises(ProtocolError, match="bytes for"):
        parse(psi_pb2.PsiIntersection(count=3, rows=b"\0" * 8).SerializeToString())
    doubled = vpsi._points_parser("host", 16, 4, points=False)
    with pytest.raises(ProtocolError, match="item_bytes"):
        doubled(psi_pb2.PsiPoints(item_bytes=32, count=4, items=b"\0" * 128).SerializeToString())
    assert doubled(psi_pb2.PsiPoints(item_bytes=16, count=4, items=b"\1" * 64).SerializeToString()) == b"\1" * 64
    hello = vpsi._hello_parser("guest")
    with pytest.raises(ProtocolError, match="truncate_bytes"):
        hello(psi_pb2.PsiHello(version=1, salt=b"\0" * 32, truncate_bytes=8).SerializeToString())
    with pytest.raises(ProtocolError, match="version"):
        hello(psi_pb2.PsiHello(version=2, salt=b"\0" * 32, truncate_bytes=16).SerializeToString())
