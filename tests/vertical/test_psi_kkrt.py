"""KKRT-PSI protocol (secureflhv.vertical.psi_kkrt) over the in-process transport, one thread per party:
the same PsiResult as ECDH-PSI and as a plain set intersection; hostile messages rejected."""
import dataclasses
import random
import re
import threading

import numpy as np
import pytest

from test_psi_protocol import JOB, POOL, RecordingNetwork, check, ids_from, wait_rejected
from secureflhv.crypto import kkrt
from secureflhv.proto import psi_pb2
from secureflhv.transport import InProcessNetwork, Message, MessageRejected, ProtocolError
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
    assert set(got) == {vpsi.TAG_HELLO, vk.TAG_MATRIX, vk.TAG_OPRF_ACK, vpsi.TAG_INTERSECTION}
    # the guest's acknowledgements of the host's OPRF values hold only what the host sent (its count)
    assert [psi_pb2.PsiPoints.FromString(p) for p in got[vk.TAG_OPRF_ACK]] == [
        psi_pb2.PsiPoints(item_bytes=16, count=900)] * 2
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
DELTA = bytes(range(64))  # the guest's swap bits in part 0 of U


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
    pts, delta, U = matrix(psi_pb2.KkrtMatrix(ot_points=good, rows=rows, matrix=u, delta=DELTA).SerializeToString())
    assert pts == good and U.shape == (rows, 64) and U.tobytes() == u
    assert delta.dtype == bool and delta.shape == (512,) and kkrt.bits_to_mask(delta).tobytes() == DELTA
    for msg, why in [(dict(ot_points=good, rows=rows + 128, matrix=u), "rows, expected"),
                     (dict(ot_points=good, rows=rows, matrix=u[:-1]), "bytes for"),
                     (dict(ot_points=good, rows=rows, matrix=u + u), "bytes for"),
                     (dict(ot_points=good[:-1], rows=rows, matrix=u), "bytes, expected"),
                     (dict(ot_points=_point(2) + good[32:], rows=rows, matrix=u), "not a valid"),
                     (dict(ot_points=good, rows=rows, matrix=u, delta=b""), "delta of 0 bytes, expected 64"),
                     (dict(ot_points=good, rows=rows, matrix=u, delta=DELTA[:-1]), "delta of 63 bytes")]:
        msg.setdefault("delta", DELTA)
        with pytest.raises(ProtocolError, match=why):
            matrix(psi_pb2.KkrtMatrix(**msg).SerializeToString())
    oprf = vk._oprf_parser("host", 16)
    assert oprf(psi_pb2.PsiPoints(item_bytes=16, count=6, items=b"\1" * 96).SerializeToString()) == (6, b"\1" * 96)
    for msg, why in [(dict(item_bytes=12, count=6, items=b"\1" * 72), "item_bytes"),
                     (dict(item_bytes=16, count=5, items=b"\1" * 80), "not 3 per ID"),
                     (dict(item_bytes=16, count=6, items=b"\1" * 80), "5 values of 6, expected a positive multiple"),
                     (dict(item_bytes=16, count=6, items=b"\1" * 81), "not a multiple of 16")]:
        with pytest.raises(ProtocolError, match=why):
            oprf(psi_pb2.PsiPoints(**msg).SerializeToString())
    with pytest.raises(Exception):
        oprf(b"\xff\xff\xff not a protobuf")


@pytest.mark.parametrize("flaw", ["invalid_point", "wrong_rows", "garbage"])
def test_hostile_matrix_rejected_at_host_and_protocol_completes(flaw):
    guest, host = POOL[:300], POOL[200:500]
    rows = kkrt.cuckoo_bins(len(guest))
    pts = _point(2) * kkrt.BASE_OTS
    if flaw == "invalid_point":
        bad = psi_pb2.KkrtMatrix(ot_points=pts, rows=rows, matrix=bytes(64 * rows)).SerializeToString()
    elif flaw == "wrong_rows":
        bad = psi_pb2.KkrtMatrix(ot_points=pts, rows=rows + 128, matrix=bytes(64 * (rows + 128))).SerializeToString()
    else:
        bad = b"\xff\xff\xff not a protobuf"
    # delivered in place of the guest's first part until the host has refused it (no race with the honest one)
    net = TamperingNetwork(JOB, ["guest", "host"], deadline=20.0, tamper={("host", vk.TAG_MATRIX, 0): lambda p: bad})
    results, errors, threads = start_hosts(net, {"host": host})
    g = vk.align_ids_guest(net.transport("guest"), guest, ["host"])
    threads[0].join(30)
    assert not errors
    check(guest, {"host": host}, g, results)
    assert len(net.mailbox("host").rejected) == 1


def test_hostile_base_ot_and_values_rejected_at_guest_and_protocol_completes():
    # the bad values replace the host's first ones until the guest has refused them (no race with the honest ones)
    bad_values = psi_pb2.PsiPoints(item_bytes=16, count=4, items=bytes(64)).SerializeToString()
    net = TamperingNetwork(JOB, ["guest", "host"], deadline=20.0,
                           tamper={("guest", vk.TAG_OPRF, 0): lambda payload: bad_values})
    guest, host = POOL[:300], POOL[200:500]
    net.inject(Message(JOB, 0, "host", "guest", vk.TAG_BASE_OT,
                       psi_pb2.KkrtBaseOt(points=_point(1) * kkrt.BASE_OTS).SerializeToString()))
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


def test_a_first_part_above_the_message_limit_is_refused_before_any_work_and_the_host_is_told():
    # 16 KiB of base-OT points + 128 rows x 64 bytes in part 0, above a 16 KiB job.max_message_mb
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0, max_payload_bytes=16 * 1024)
    results, errors, threads = start_hosts(net, {"host": POOL[:100]})
    with pytest.raises(ValueError, match=r"first part of the OT-extension matrix \(with the base-OT points\) of "
                                         r"0.02 MiB, above this job.s message limit of 0.02 MiB: set "
                                         r"job.max_message_mb to at least 2 at every party, or use job.psi_protocol: "
                                         r"ecdh"):
        vk.align_ids_guest(net.transport("guest"), POOL[:2000], ["host"], workers=1)
    threads[0].join(30)
    assert not results and "PSI failed at 'guest'" in str(errors["host"]), errors
    sent = net.wire_stats()["guest"].get("peers", {}).get("host", {}).get("by_tag", {})
    assert not [t for t in sent if t.startswith("psi/")], sent  # refused before the hello: no work, nothing sent


# ------------------------------------------------------------------ U in parts (matrix_parts, flow control)
LIMIT = 64 * 1024  # 2,000 guest IDs: 3,072 bins in 24 parts of 128 rows (8 KiB), 7 in flight


class TamperingNetwork(RecordingNetwork):
    """Delivers ``tamper[(receiver, tag, round)](payload)`` in place of that honest message, waits until the
    receiver has rejected it, then delivers the honest one (what an attack the parser catches looks like)."""

    def __init__(self, *args, tamper=None, **kw):
        super().__init__(*args, **kw)
        self.tamper = dict(tamper or {})

    def inject(self, msg):
        bad = self.tamper.pop((msg.receiver, msg.tag, msg.round), None)
        if bad is not None:
            self.inject_until_rejected(dataclasses.replace(msg, payload=bad(msg.payload)))
        super().inject(msg)


def test_matrix_in_parts_gives_the_same_result_as_one_part_and_as_ecdh():
    rng = random.Random(11)
    guest = ids_from(rng, POOL, 2000)
    hosts = {"host-1": ids_from(rng, POOL, 1500), "host-2": ids_from(rng, POOL, 900)}
    assert vk.matrix_parts(kkrt.cuckoo_bins(2000), LIMIT) == (128, 7)
    assert vk.value_parts(4500, 16, LIMIT) == (1020, 4)  # host-1's 72 KB of OPRF values: 5 parts
    assert vk.matrix_parts(kkrt.cuckoo_bins(2000), None) == (3072, 8)  # one part
    assert vk.matrix_parts(10 ** 7, 256 * 2 ** 20) == (262144, 8)    # 16 MiB parts, 128 MiB in flight
    net = RecordingNetwork(JOB, ["guest", *hosts], deadline=20.0, max_payload_bytes=LIMIT)
    g, res = run_psi(guest, hosts, net=net)
    assert 0 < len(check(guest, hosts, g, res))
    for h in hosts:
        parts = [m for m in net.received[h] if m.tag == vk.TAG_MATRIX]
        assert [m.round for m in parts] == list(range(24))
        msgs = [psi_pb2.KkrtMatrix.FromString(m.payload) for m in parts]
        assert [x.rows for x in msgs] == [128] * 24 and all(len(x.matrix) == 64 * 128 for x in msgs)
        assert len(msgs[0].ot_points) == OT_BYTES and not any(x.ot_points for x in msgs[1:])
        acks = [psi_pb2.KkrtMatrix.FromString(m.payload).rows for m in net.received["guest"]
                if m.tag == vk.TAG_MATRIX_ACK and m.sender == h]
        assert acks == [128 * (k + 1) for k in range(24)]
        assert max(len(m.payload) for m in net.received[h]) <= LIMIT
        values = [psi_pb2.PsiPoints.FromString(m.payload) for m in net.received["guest"]
                  if m.tag == vk.TAG_OPRF and m.sender == h]
        n = 3 * len(hosts[h])
        assert len(values) == -(-n // 1020) and {v.count for v in values} == {n}
        assert [len(v.items) for v in values] == [16 * min(1020, n - 1020 * k) for k in range(len(values))]
        acks = [psi_pb2.PsiPoints.FromString(m.payload).count for m in net.received[h] if m.tag == vk.TAG_OPRF_ACK]
        assert acks == [min(n, 1020 * (k + 1)) for k in range(len(values))]
    assert not any(net.mailbox(p).rejected for p in net.party_ids)
    for protocol in ("kkrt", "ecdh"):  # one part (default limit) and ECDH-PSI: the same results
        g1, res1 = run_psi(guest, hosts, protocol=protocol)
        assert g1.ids == g.ids and np.array_equal(g1.rows, g.rows) and g1.peer_sizes == g.peer_sizes
        for h in hosts:
            assert res1[h].ids == res[h].ids and np.array_equal(res1[h].rows, res[h].rows)


def test_flow_control_keeps_a_slow_host_within_its_mailbox_limits(monkeypatch):
    # the host reads U late: 24 parts of 8 KiB (192 KiB) are more than a sender may have queued (2 x 64 KiB)
    real, go, queued = vk.KkrtHost._receive_matrix, threading.Event(), []

    def late(self, *args):
        go.wait(10)
        queued.append(self.t._mailbox().queued("guest"))  # (messages, bytes) the guest got in before we read
        return real(self, *args)

    monkeypatch.setattr(vk.KkrtHost, "_receive_matrix", late)
    guest, host = POOL[:2000], POOL[1500:2500]
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0, max_payload_bytes=LIMIT)
    threading.Timer(0.6, go.set).start()
    g, res = run_psi(guest, {"host": host}, net=net)
    assert check(guest, {"host": host}, g, res) == sorted(POOL[1500:2000])
    assert not net.mailbox("host").rejected and not net.mailbox("guest").rejected
    assert queued[0][0] <= 7 and queued[0][1] <= 7 * (8192 + 64) + OT_BYTES, queued  # W = 7 parts at most
    # the same run without the window floods the host's mailbox: the window is what kept it in bounds
    go.clear()
    monkeypatch.setattr(vk, "matrix_parts", lambda bins, limit: (128, 10 ** 6))
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0, max_payload_bytes=LIMIT)
    results, errors, threads = start_hosts(net, {"host": host})
    with pytest.raises(MessageRejected, match="flood"):
        vk.align_ids_guest(net.transport("guest"), guest, ["host"], workers=1)
    go.set()
    threads[0].join(30)
    assert "flood" in str(errors["host"])


def _part(rows, matrix_rows=None, points=b"", delta=None):
    delta = (DELTA if points else b"") if delta is None else delta
    return psi_pb2.KkrtMatrix(ot_points=points, rows=rows, delta=delta,
                              matrix=bytes(64 * (rows if matrix_rows is None else matrix_rows))).SerializeToString()


def test_part_and_ack_parsers_reject_lies():
    good = kkrt.BaseOtReceiver(kkrt.session_context(JOB, b""), np.zeros(kkrt.BASE_OTS, bool)).points()
    rows = 1024  # parts of 384 rows: 0..383, 384..767, 768..1023
    pts, _, U = vk._matrix_parser("guest", rows)(_part(384, points=good))
    assert pts == good and U.shape == (384, 64)
    assert vk._matrix_parser("guest", rows, 2, 384)(_part(256)).shape == (256, 64)
    for part, part_rows, payload, why in [
            (0, None, _part(0, points=good), "0 rows, expected a multiple of 128 in"),
            (0, None, _part(200, points=good), "200 rows, expected a multiple"),
            (0, None, _part(1152, points=good), "1152 rows, expected"),        # more rows than the bins
            (0, None, _part(384), "base-OT sender points"),                    # no points
            (0, None, _part(384, 383, points=good), "bytes for 384 rows"),
            (1, 384, _part(256), "256 rows, expected 384 .rows 384..767"),     # too few: a gap
            (1, 384, _part(512), "512 rows, expected 384"),                    # too many: an overlap
            (2, 384, _part(384), "384 rows, expected 256 .rows 768..1023"),    # beyond the bins
            (1, 384, _part(384, 385), "bytes for 384 rows"),
            (1, 384, _part(384, points=good), "points belong in part 0 only"),
            (1, 384, _part(384, delta=DELTA), "delta belongs in part 0 only"),
            (0, None, _part(384, points=good, delta=b""), "delta of 0 bytes")]:
        with pytest.raises(ProtocolError, match=why):
            vk._matrix_parser("guest", rows, part, part_rows)(payload)
    oprf = vk._oprf_parser("host", 16, 2, 300, 750)  # values 600..749 of 750 in parts of 300
    assert oprf(psi_pb2.PsiPoints(item_bytes=16, count=750, items=bytes(16 * 150)).SerializeToString()) == bytes(2400)
    for msg, why in [(dict(count=750, items=bytes(16 * 149)), "149 values of count 750, expected 150 of 750"),
                     (dict(count=750, items=bytes(16 * 300)), "300 values"),
                     (dict(count=900, items=bytes(16 * 150)), "count 900, expected 150 of 750"),
                     (dict(count=750, items=bytes(16 * 150 + 1)), "not a multiple of 16")]:
        with pytest.raises(ProtocolError, match=why):
            oprf(psi_pb2.PsiPoints(item_bytes=16, **msg).SerializeToString())
    with pytest.raises(ProtocolError, match="0 values of 6"):  # an empty part 0 of a non-empty list: no progress
        vk._oprf_parser("host", 16)(psi_pb2.PsiPoints(item_bytes=16, count=6).SerializeToString())
    vack = vk._values_ack_parser("guest", 16, 0, 300)
    assert vack(psi_pb2.PsiPoints(item_bytes=16, count=300).SerializeToString()) == 300
    for bad in (dict(item_bytes=16, count=299), dict(item_bytes=12, count=300), dict(item_bytes=16, count=300,
                                                                                      items=b"x")):
        with pytest.raises(ProtocolError, match="acknowledgement of OPRF values part 0 from 'guest'"):
            vack(psi_pb2.PsiPoints(**bad).SerializeToString())
    ack = vk._ack_parser("host", 1, 768)
    assert ack(psi_pb2.KkrtMatrix(rows=768).SerializeToString()) == 768
    for bad in (dict(rows=384), dict(rows=1024), dict(rows=768, matrix=b"x"), dict(rows=768, ot_points=good),
                dict(rows=768, delta=DELTA)):
        with pytest.raises(ProtocolError, match="acknowledgement of matrix part 1 from 'host'"):
            ack(psi_pb2.KkrtMatrix(**bad).SerializeToString())


def _rows(n, matrix_rows=None, points=False):
    def bad(payload):
        msg = psi_pb2.KkrtMatrix.FromString(payload)
        return psi_pb2.KkrtMatrix(ot_points=(msg.ot_points or bytes(OT_BYTES)) if points else b"", rows=n,
                                  delta=(msg.delta or DELTA) if points else b"",
                                  matrix=bytes(64 * (n if matrix_rows is None else matrix_rows))).SerializeToString()
    return bad


def _values(count=None, n=None):
    def bad(payload):
        msg = psi_pb2.PsiPoints.FromString(payload)
        items = msg.items if n is None else bytes(16 * n)
        return psi_pb2.PsiPoints(item_bytes=16, count=msg.count if count is None else count,
                                 items=items).SerializeToString()
    return bad


# 600 guest IDs: 1,024 bins in 8 parts of 128 rows under a 32 KiB limit, 3 in flight; 500 host IDs: 1,500
# OPRF values in 3 parts of 507, 507 and 486, 4 in flight
@pytest.mark.parametrize("receiver, tag, rnd, bad, why", [
    ("guest", vk.TAG_OPRF, 0, _values(n=0), "part 0 .*0 values of 1500"),
    ("guest", vk.TAG_OPRF, 1, _values(count=1503), "part 1 .*count 1503, expected 507 of 1500"),
    ("guest", vk.TAG_OPRF, 2, _values(n=489), "part 2 .*489 values of count 1500, expected 486"),
    ("host", vk.TAG_OPRF_ACK, 1, _values(count=1500), "acknowledgement of OPRF values part 1 .*count 1500"),
    ("host", vk.TAG_MATRIX, 0, _rows(200, points=True), "part 0 .*200 rows, expected a multiple of 128"),
    ("host", vk.TAG_MATRIX, 3, _rows(256), "part 3 .*256 rows, expected 128"),
    ("host", vk.TAG_MATRIX, 7, _rows(128, 127), "part 7 .*8128 bytes for 128 rows"),
    ("host", vk.TAG_MATRIX, 5, _rows(128, points=True), "part 5 .*points belong in part 0 only"),
    ("guest", vk.TAG_MATRIX_ACK, 2, lambda p: psi_pb2.KkrtMatrix(rows=1024).SerializeToString(),
     "acknowledgement of matrix part 2 .*1024 rows"),
    ("host", vk.TAG_MATRIX, 4, lambda p: b"\xff\xff not a protobuf", "part 4|invalid payload")])
def test_a_hostile_part_or_ack_is_rejected_and_the_run_completes(receiver, tag, rnd, bad, why):
    guest, host = POOL[:600], POOL[400:900]
    assert vk.matrix_parts(kkrt.cuckoo_bins(600), 32 * 1024) == (128, 3)
    assert vk.value_parts(1500, 16, 32 * 1024) == (507, 4)
    net = TamperingNetwork(JOB, ["guest", "host"], deadline=20.0, max_payload_bytes=32 * 1024,
                           tamper={(receiver, tag, rnd): bad})
    g, res = run_psi(guest, {"host": host}, net=net)
    assert check(guest, {"host": host}, g, res) == sorted(POOL[400:600])
    assert not net.tamper  # the lie was delivered ...
    reasons = [r for _, r in net.mailbox(receiver).rejected]
    assert len(reasons) == 1 and re.search(why, reasons[0]), reasons  # ... and refused
