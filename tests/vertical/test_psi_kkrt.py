"""KKRT-PSI protocol (secureflhv.vertical.psi_kkrt) over the in-process transport, one thread per party:
the same PsiResult as ECDH-PSI and as a plain set intersection; hostile messages rejected."""
import random
import threading

import numpy as np
import pytest

from test_psi_protocol import JOB, POOL, RecordingNetwork, check, ids_from, wait_rejected
from secureflhv.crypto import kkrt
from secureflhv.proto import psi_pb2
from secureflhv.transport import InProcessNetwork, Message, ProtocolError
from secureflhv.vertical import psi_kkrt as vk
from secureflhv.vertical import psi as vpsi

PROTOCOLS = {"ecdh": vpsi, "kkrt": vk}


def start_hosts(net, host_ids, protocol="kkrt", round_base=0):
    results, errors, threads = {}, {}, []

    def run(h, ids):
        try:
            results[h] = PROTOCOLS[protocol].align_ids_host(net.transport(h), ids, "guest", round_base=round_base,
                                                            workers=1)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            errors[h] = exc

    for h, ids in host_ids.items():
        t = threading.Thread(target=run, args=(h, ids), daemon=True)
        t.start()
        threads.append(t)
    return results, errors, threads


def run_psi(guest_ids, host_ids, protocol="kkrt", net=None, round_base=0, **kw):
    net = net or InProcessNetwork(JOB, ["guest", *host_ids], deadline=20.0)
    results, errors, threads = start_hosts(net, host_ids, protocol, round_base)
    g = PROTOCOLS[protocol].align_ids_guest(net.transport("guest"), guest_ids, list(host_ids), round_base=round_base,
                                            workers=1, **kw)
    for t in threads:
        t.join(30)
    assert not errors, errors
    return g, results


@pytest.mark.parametrize("case", ["random", "empty_guest", "empty_host", "disjoint", "identical", "truncate_12"])
def test_two_party_intersection_equals_set_intersection(case):
    rng = random.Random(case)
    guest, host, kw = ids_from(rng, POOL, 900), ids_from(rng, POOL, 1200), {}
    if case == "empty_guest":
        guest = []
    elif case == "empty_host":
        host = []
    elif case == "disjoint":
        guest, host = POOL[:300], POOL[300:700]
    elif case == "identical":
        host = rng.sample(guest, len(guest))
    elif case == "truncate_12":
        kw = {"truncate_bytes": 12}
    g, res = run_psi(guest, {"host": host}, **kw)
    expected = check(guest, {"host": host}, g, res)
    if case in ("random", "truncate_12"):
        assert 0 < len(expected) < 900
    if case == "identical":
        assert len(expected) == 900
    if case in ("disjoint", "empty_guest", "empty_host"):
        assert expected == [] and g.rows.shape == (0,)


def test_two_hosts_same_result_as_ecdh():
    rng = random.Random(5)
    guest = ids_from(rng, POOL, 1500)
    hosts = {"host-1": ids_from(rng, POOL, 1500), "host-2": ids_from(rng, POOL, 1500)}
    g, res = run_psi(guest, hosts)
    expected = check(guest, hosts, g, res)
    assert 0 < len(expected) < len(set(guest) & set(hosts["host-1"]))
    g_e, res_e = run_psi(guest, hosts, protocol="ecdh")
    assert g_e.ids == g.ids and np.array_equal(g_e.rows, g.rows) and g_e.peer_sizes == g.peer_sizes
    for h in hosts:
        assert res_e[h].ids == res[h].ids and np.array_equal(res_e[h].rows, res[h].rows)
        assert res_e[h].peer_sizes == res[h].peer_sizes
    assert {"hash", "base_ot", "extend", "oprf", "match", "total"} <= set(g.timings)


def test_consecutive_runs_and_what_the_host_receives():
    net = RecordingNetwork(JOB, ["guest", "host"], deadline=20.0)
    guest, host = POOL[:200], POOL[100:400]
    for rb in (0, 1):
        g, res = run_psi(guest, {"host": host}, net=net, round_base=rb)
        assert check(guest, {"host": host}, g, res) == sorted(POOL[100:200])
    got = {}
    for m in net.received["host"]:
        got.setdefault(m.tag, []).append(m.payload)
    assert set(got) == {vpsi.TAG_HELLO, vk.TAG_MATRIX, vpsi.TAG_INTERSECTION}
    hellos = [psi_pb2.PsiHello.FromString(p) for p in got[vpsi.TAG_HELLO]]
    assert [h.protocol for h in hellos] == ["kkrt", "kkrt"] and hellos[0].salt != hellos[1].salt
    mats = [psi_pb2.KkrtMatrix.FromString(p) for p in got[vk.TAG_MATRIX]]
    m = kkrt.cuckoo_bins(200)
    assert all(x.rows == m and len(x.matrix) == 64 * m for x in mats)
    assert mats[0].matrix != mats[1].matrix and mats[0].ot_points != mats[1].ot_points  # fresh per run
    # the guest's item hashes and codewords (what a host could compute from a guessed ID and the salt)
    # appear nowhere in what the host received
    ctx = kkrt.session_context(JOB, hellos[0].salt)
    items, _ = kkrt.hash_ids(guest, ctx, m)
    codes = kkrt.Prc(ctx).encode(np.repeat(items, 3, axis=0), np.tile(np.arange(3), len(guest)))
    blob = b"".join(p for ps in got.values() for p in ps)
    assert not any(bytes(r[:16]) in blob for r in codes) and not any(bytes(r) in blob for r in items[:50])


def test_protocol_mismatch_is_rejected_by_the_host():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    hello = psi_pb2.PsiHello(version=1, salt=b"\0" * 32, set_size=3, truncate_bytes=16).SerializeToString()
    with pytest.raises(ProtocolError, match="protocol '', this party runs 'kkrt'"):
        vpsi._hello_parser("guest", "kkrt")(hello)
    kk = psi_pb2.PsiHello(version=1, salt=b"\0" * 32, set_size=3, truncate_bytes=16, protocol="kkrt")
    with pytest.raises(ProtocolError, match="protocol 'kkrt', this party runs 'ecdh'"):
        vpsi._hello_parser("guest")(kk.SerializeToString())
    big = psi_pb2.PsiHello(version=1, salt=b"\0" * 32, set_size=vk.MAX_SET_SIZE + 1, truncate_bytes=16,
                           protocol="kkrt")
    with pytest.raises(ProtocolError, match="set_size"):
        vpsi._hello_parser("guest", "kkrt", max_set_size=vk.MAX_SET_SIZE)(big.SerializeToString())
    # an ECDH hello first: the KKRT host refuses it and completes with the real guest
    net.inject(Message(JOB, 0, "guest", "host", vpsi.TAG_HELLO, hello))
    results, errors, threads = start_hosts(net, {"host": POOL[50:150]})
    wait_rejected(net, "host")
    g = vk.align_ids_guest(net.transport("guest"), POOL[:100], ["host"])
    threads[0].join(30)
    assert not errors and check(POOL[:100], {"host": POOL[50:150]}, g, results) == sorted(POOL[50:100])


def _point(byte0):
    return bytes([byte0]) + bytes(31)


OT_BYTES = kkrt.BASE_OTS * 32


def test_parsers_reject_hostile_messages():
    good = kkrt.BaseOtReceiver(kkrt.session_context(JOB, b""), np.zeros(kkrt.BASE_OTS, bool)).points()
    cp = kkrt.base_ot_cp(kkrt.session_context(JOB, b""))
    base = vk._base_ot_parser("host", cp)
    assert base(psi_pb2.KkrtBaseOt(points=good).SerializeToString()) == good
    for bad, why in [(good[:-32], "bytes"), (good + good[:32], "bytes"), (b"", "bytes"),
                     (good[:96] + cp + good[128:], "Cp - point 3 is not a valid"),               # PK1 = identity
                     (good[:64] + _point(2) + good[96:], "point 2 is not a valid"),                 # not on the curve
                     (good[:32] + _point(1) + good[64:], "point 1 is not a valid"),                 # identity
                     (b"\xec" + b"\xff" * 30 + b"\x7f" + good[32:], "point 0 is not a valid")]:     # order 2
        with pytest.raises(ProtocolError, match=why):
            base(psi_pb2.KkrtBaseOt(points=bad).SerializeToString())
    rows = kkrt.cuckoo_bins(10)
    matrix = vk._matrix_parser("guest", rows)
    u = bytes(range(64)) * rows
    pts, U = matrix(psi_pb2.KkrtMatrix(ot_points=good, rows=rows, matrix=u).SerializeToString())
    assert pts == good and U.shape == (rows, 64) and U.tobytes() == u
    for msg, why in [(dict(ot_points=good, rows=rows + 128, matrix=u), "rows, expected"),
                     (dict(ot_points=good, rows=rows, matrix=u[:-1]), "bytes for"),
                     (dict(ot_points=good, rows=rows, matrix=u + u), "bytes for"),
                     (dict(ot_points=good[:-1], rows=rows, matrix=u), "bytes, expected"),
                     (dict(ot_points=_point(2) + good[32:], rows=rows, matrix=u), "not a valid")]:
        with pytest.raises(ProtocolError, match=why):
            matrix(psi_pb2.KkrtMatrix(**msg).SerializeToString())
    oprf = vk._oprf_parser("host", 16)
    assert oprf(psi_pb2.PsiPoints(item_bytes=16, count=6, items=b"\1" * 96).SerializeToString()) == b"\1" * 96
    for msg, why in [(dict(item_bytes=12, count=6, items=b"\1" * 72), "item_bytes"),
                     (dict(item_bytes=16, count=5, items=b"\1" * 80), "not 3 per ID"),
                     (dict(item_bytes=16, count=6, items=b"\1" * 80), "bytes for")]:
        with pytest.raises(ProtocolError, match=why):
            oprf(psi_pb2.PsiPoints(**msg).SerializeToString())
    with pytest.raises(Exception):
        oprf(b"\xff\xff\xff not a protobuf")


@pytest.mark.parametrize("flaw", ["invalid_point", "wrong_rows", "garbage"])
def test_hostile_matrix_rejected_at_host_and_protocol_completes(flaw):
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    guest, host = POOL[:300], POOL[200:500]
    rows = kkrt.cuckoo_bins(len(guest))
    pts = _point(2) * kkrt.BASE_OTS
    if flaw == "invalid_point":
        bad = psi_pb2.KkrtMatrix(ot_points=pts, rows=rows, matrix=bytes(64 * rows)).SerializeToString()
    elif flaw == "wrong_rows":
        bad = psi_pb2.KkrtMatrix(ot_points=pts, rows=rows + 128, matrix=bytes(64 * (rows + 128))).SerializeToString()
    else:
        bad = b"\xff\xff\xff not a protobuf"
    net.inject(Message(JOB, 0, "guest", "host", vk.TAG_MATRIX, bad))
    results, errors, threads = start_hosts(net, {"host": host})
    g = vk.align_ids_guest(net.transport("guest"), guest, ["host"])
    threads[0].join(30)
    assert not errors
    check(guest, {"host": host}, g, results)
    assert len(net.mailbox("host").rejected) == 1


def test_hostile_base_ot_and_values_rejected_at_guest_and_protocol_completes():
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    guest, host = POOL[:300], POOL[200:500]
    net.inject(Message(JOB, 0, "host", "guest", vk.TAG_BASE_OT,
                       psi_pb2.KkrtBaseOt(points=_point(1) * kkrt.BASE_OTS).SerializeToString()))
    net.inject(Message(JOB, 0, "host", "guest", vk.TAG_OPRF,
                       psi_pb2.PsiPoints(item_bytes=16, count=4, items=bytes(64)).SerializeToString()))
    out = {}
    t = threading.Thread(target=lambda: out.update(g=vk.align_ids_guest(net.transport("guest"), guest, ["host"])),
                         daemon=True)
    t.start()
    wait_rejected(net, "guest")  # the guest refused the invalid base-OT points before the host started
    results, errors, threads = start_hosts(net, {"host": host})
    t.join(30)
    threads[0].join(30)
    assert not errors
    check(guest, {"host": host}, out["g"], results)
    reasons = [r for _, r in net.mailbox("guest").rejected]
    assert len(reasons) == 2 and "not a valid" in reasons[0] and "3 per ID" in reasons[1]


def test_a_matrix_above_the_message_limit_is_refused_before_any_work_and_the_host_is_told():
    # 2,000 guest IDs: 3,072 bins x 64 bytes = 192 KiB, above a 64 KiB job.max_message_mb
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0, max_payload_bytes=64 * 1024)
    results, errors, threads = start_hosts(net, {"host": POOL[:100]})
    with pytest.raises(ValueError, match=r"matrix of 0.2 MiB, above this job.s message limit of 0.1 MiB: set job.max_message_mb to at least 2 at every party, or use job.psi_protocol: ecdh"):
        vk.align_ids_guest(net.transport("guest"), POOL[:2000], ["host"], workers=1)
    threads[0].join(30)
    assert not results and "PSI failed at 'guest'" in str(errors["host"]), errors
    sent = net.wire_stats()["guest"].get("peers", {}).get("host", {}).get("by_tag", {})
    assert not [t for t in sent if t.startswith("psi/")], sent  # refused before the hello: no work, nothing sent
