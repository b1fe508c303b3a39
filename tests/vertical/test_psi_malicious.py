"""PSI against a party that lies (issue 36), staged on real in-process runs of both protocols:

* a KKRT host with all-zero base-OT choice bits: the guest's choice-bit swap makes its effective bits
  uniform, so an honest-after-that host gets exactly the true intersection, and the attack (values that
  "match" every bin) matches nothing -- while the same attack without the swap matches every guest ID;
* an announced set above ``max_ids`` (``job.psi_max_ids``) is refused, naming the sender, before any work
  sized by it, in both protocols and both directions; an own set above it is refused before anything is sent.
(The guest-side attack on KKRT -- a crafted U that reveals the host's secret -- is kept away by the job
setting ``psi_security``: tests/runtime/test_psi_job_settings.py.)
"""
import threading

import numpy as np
import pytest

from test_psi_protocol import JOB, POOL, check
from secureflhv.crypto import kkrt
from secureflhv.proto import psi_pb2
from secureflhv.transport import InProcessNetwork, JobAborted, Message, parse_message
from secureflhv.vertical import psi as vpsi
from secureflhv.vertical import psi_kkrt as vk

PROTOCOLS = {"ecdh": vpsi, "kkrt": vk}


def _run(net, guest_fn, host_fns):
    """Run each host's ``fn(transport)`` in a thread and the guest's here; ``(guest result or error, {host:
    result or error})``."""
    out = {}

    def call(name, fn):
        try:
            out[name] = fn(net.transport(name))
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            out[name] = exc

    threads = [threading.Thread(target=call, args=(h, fn), daemon=True) for h, fn in host_fns.items()]
    for t in threads:
        t.start()
    call("guest", guest_fn)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return out.pop("guest"), out


# ------------------------------------------------------------------ KKRT: a host that picks its choice bits
class ZeroChoiceHost(vk.KkrtHost):
    """Picks s' = 0 (the attack's first step), then follows the protocol; records its effective bits."""

    effective = None

    def _choice_bits(self):
        return np.zeros(kkrt.BASE_OTS, bool)

    def _effective_choices(self, chosen, delta):
        type(self).effective = super()._effective_choices(chosen, delta)
        return type(self).effective


def test_zero_choice_bits_become_uniform_and_the_result_is_the_true_intersection():
    guest, host = POOL[:300], POOL[200:500]
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = _run(net, lambda t: vk.align_ids_guest(t, guest, ["host"]),
                  {"host": lambda t: ZeroChoiceHost(t, host, "guest").run()})
    assert check(guest, {"host": host}, g, res) == sorted(POOL[200:300])
    s = ZeroChoiceHost.effective
    # s = 0 xor delta: uniform, ~256 ones; fewer than 128 (what the PRC distance needs) has probability < 2**-96
    assert s.shape == (512,) and 128 < int(s.sum()) < 384


class OrderedNetwork(InProcessNetwork):
    """Keeps every delivered message in one global order."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.log = []

    def inject(self, msg):
        self.log.append(msg)
        super().inject(msg)


def test_delta_is_sent_only_after_the_hosts_base_ot_points_and_is_fresh_per_run():
    net = OrderedNetwork(JOB, ["guest", "host"], deadline=20.0)
    deltas = []
    for rb in (0, 1):
        g, res = _run(net, lambda t: vk.align_ids_guest(t, POOL[:100], ["host"], round_base=rb),
                      {"host": lambda t: vk.align_ids_host(t, POOL[50:150], "guest", round_base=rb)})
        assert check(POOL[:100], {"host": POOL[50:150]}, g, res) == sorted(POOL[50:100])
        tags = [(m.sender, m.tag) for m in net.log if m.round in (rb, vk.part_round(rb, 0))]
        # the host's points (which fix s') reach the guest before the part that carries delta leaves it
        assert tags.index(("host", vk.TAG_BASE_OT)) < tags.index(("guest", vk.TAG_MATRIX))
        part0 = [psi_pb2.KkrtMatrix.FromString(m.payload) for m in net.log
                 if m.tag == vk.TAG_MATRIX and m.round == vk.part_round(rb, 0)]
        deltas.append(part0[0].delta)
    assert len(deltas[0]) == 64 and deltas[0] != deltas[1]


class AllBinsHost(vk.KkrtHost):
    """The attack of issue 36: s' = 0, so that (without the swap) Q = T and H(j || q_j) is the guest's own value
    of bin j for *every* bin; it sends those values as if they were its IDs', and keeps the rows the guest then
    reports (one per matched guest ID, in the guest's ID order: what its dictionary walk started from)."""

    reported = None

    def _choice_bits(self):
        return np.zeros(kkrt.BASE_OTS, bool)

    def _effective_choices(self, chosen, delta):
        return chosen  # ignores delta: Q = G(k_{s'}) rows, T itself when the guest did not swap

    def _oprf_values(self, ctx, Q, choices, items, cand, width):
        m = Q.shape[0]
        pad = (-m) % kkrt.N_HASHES  # 3 values per "row"
        return kkrt.oprf_hash(ctx, np.arange(m + pad), np.concatenate([Q, np.zeros((pad, 64), np.uint8)]), width)

    def receive_intersection(self, hello):
        def raw(msg):
            return np.frombuffer(msg.rows, "<u8").astype(np.int64)
        rows = self._recv(self.guest, vpsi.TAG_INTERSECTION, None, parse_message(psi_pb2.PsiIntersection, raw))
        type(self).reported = rows
        return rows[:0], []


@pytest.mark.parametrize("swap", [True, False])
def test_a_host_that_makes_every_bin_match_matches_nothing(swap, monkeypatch):
    if not swap:  # the control: the same attack on the protocol without the guest's swap
        monkeypatch.setattr(kkrt, "swap_base_ot_keys", lambda k0, k1, delta: (k0, k1))
    guest, host = POOL[:300], POOL[1000:1200]  # disjoint: every match is the attack's doing
    AllBinsHost.reported = None
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = _run(net, lambda t: vk.align_ids_guest(t, guest, ["host"]),
                  {"host": lambda t: AllBinsHost(t, host, "guest").run()})
    assert not isinstance(g, Exception) and not isinstance(res["host"], Exception), (g, res)
    if swap:
        assert g.ids == [] and AllBinsHost.reported.size == 0  # nothing matched: the guest revealed nothing
    else:  # every guest ID "matched" and the host got each one's bin, in the guest's ID order
        assert g.ids == sorted(guest) and AllBinsHost.reported.size == 300


# ------------------------------------------------------------------ set-size bounds, both protocols
def _host(protocol, ids, **kw):
    return lambda t: PROTOCOLS[protocol].align_ids_host(t, ids, "guest", workers=1, **kw)


def _guest(protocol, ids, **kw):
    return lambda t: PROTOCOLS[protocol].align_ids_guest(t, ids, ["host"], workers=1, **kw)


@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
def test_a_guest_set_above_the_hosts_limit_is_refused_before_any_work(protocol):
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = _run(net, _guest(protocol, POOL[:50]), {"host": _host(protocol, POOL[:30], max_ids=40)})
    err = res["host"]
    assert isinstance(err, vpsi.PsiSetTooLarge) and (err.sender, err.size, err.limit) == ("guest", 50, 40)
    assert str(err) == ("PsiHello from 'guest' announces 50 IDs, above this job's limit of 40 (job.psi_max_ids): "
                        "refused before any work sized by it")
    assert isinstance(g, JobAborted) and "PSI failed at 'host'" in str(g) and "job.psi_max_ids" in str(g)
    sent = net.wire_stats()["host"].get("peers", {}).get("guest", {}).get("by_tag", {})
    assert not [t for t in sent if t.startswith("psi/")], sent  # the host sent nothing: no points, no base OTs


@pytest.mark.parametrize("protocol, what", [("ecdh", "blinded points"), ("kkrt", "OPRF values")])
def test_a_host_set_above_the_guests_limit_is_refused_naming_the_host(protocol, what):
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = _run(net, _guest(protocol, POOL[:30], max_ids=40), {"host": _host(protocol, POOL[:50])})
    assert isinstance(g, vpsi.PsiSetTooLarge) and (g.sender, g.size, g.limit) == ("host", 50, 40)
    assert str(g).startswith(f"{what} from 'host' announces 50 IDs, above this job's limit of 40")
    assert isinstance(res["host"], JobAborted) and "PSI failed at 'guest'" in str(res["host"])


@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
def test_an_own_set_above_the_limit_is_refused_before_anything_is_sent(protocol):
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    g, res = _run(net, _guest(protocol, POOL[:50], max_ids=40), {"host": _host(protocol, POOL[:30], max_ids=40)})
    assert isinstance(g, ValueError) and str(g).startswith(
        "party 'guest' has 50 IDs, above this job's limit of 40 (job.psi_max_ids")
    assert isinstance(res["host"], JobAborted)
    sent = net.wire_stats()["guest"].get("peers", {}).get("host", {}).get("by_tag", {})
    assert not [t for t in sent if t.startswith("psi/")], sent


def test_a_forged_hello_above_the_limit_is_refused_by_an_ecdh_host():
    # the guest's authenticated hello claims 2**40 IDs: the host refuses it before it computes anything
    net = InProcessNetwork(JOB, ["guest", "host"], deadline=20.0)
    hello = psi_pb2.PsiHello(version=1, salt=bytes(32), set_size=2 ** 40, truncate_bytes=16)
    net.inject(Message(JOB, 0, "guest", "host", vpsi.TAG_HELLO, hello.SerializeToString()))
    with pytest.raises(vpsi.PsiSetTooLarge, match=r"PsiHello from 'guest' announces 1,099,511,627,776 IDs"):
        vpsi.align_ids_host(net.transport("host"), POOL[:10], "guest", workers=1)
