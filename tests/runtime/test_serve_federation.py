"""The serving exchange in one process (runtime/serve/federation.py), the family's scoring stubbed (its own
exchange is the prediction job's, tested per family in test_predict_vertical.py): unknown ids are named per
host, a feature store that fails fails one request and the next is served, a swap a host refuses changes
nothing and one every host accepts switches both sides, a hostile control message is rejected by the host."""
from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace as NS

import numpy as np
import pytest

from secureflhv.proto import messages_pb2
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.serve import federation as fed
from secureflhv.runtime.serve.feature_store import MemoryFeatureStore
from secureflhv.transport import InProcessNetwork
from serve_harness import stub_loader, stub_scoring_patches

HOSTS = ["host-1", "host-2"]


class FlakyStore(MemoryFeatureStore):
    failures = 0

    def lookup(self, ids):
        if type(self).failures:
            type(self).failures -= 1
            raise OSError("database is locked")
        return super().lookup(ids)


@pytest.fixture
def served():
    net = InProcessNetwork("serve-test", ["guest", *HOSTS], deadline=5.0)
    guest = NS(id="guest", role="guest")
    hosts = [NS(id=h, role="host") for h in HOSTS]
    cfg = NS(guest=guest, hosts=hosts)
    refuse = {"host-2": {"v3"}}
    stores = {"host-1": lambda: FlakyStore(["a", "b"], np.ones((2, 1)), ["x"]),  # a fresh store per model
              "host-2": lambda: MemoryFeatureStore(["a"], np.ones((1, 1)), ["y"])}
    patches = stub_scoring_patches()
    for p in patches:
        p.start()
    loops = {h.id: fed.HostLoop(net.transport(h.id), cfg, h, stub_loader(h.id, refuse), lambda cols, h=h.id: stores[h](), "v1", 8)
             for h in hosts}
    ends = {}

    def run(h):
        try:
            ends[h] = loops[h].run()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            ends[h] = exc

    threads = [threading.Thread(target=run, args=(h,)) for h in HOSTS]
    for th in threads:
        th.start()
    g = fed.GuestFederation(net.transport("guest"), cfg, guest, stub_loader("guest", refuse), "v1", max_rows=8)
    yield NS(g=g, loops=loops, net=net, ends=ends)
    g.close()
    for th in threads:
        th.join(10)
    for p in patches:
        p.stop()
    assert ends == {h: loops[h].served for h in HOSTS}


def test_unknown_ids_are_named_per_host_and_a_failing_store_fails_one_request(served):
    scores, missing = served.g.score(["a", "b", "zz"], np.array([[1.0], [2.0], [3.0]]))
    assert scores.tolist() == [1.0, 2.0, 3.0]
    assert missing == {"b": ["host-2"], "zz": ["host-1", "host-2"]}
    FlakyStore.failures = 1
    with pytest.raises(fed.StepRefused, match=r"host-1: feature store: OSError: database is locked"):
        served.g.score(["a"], np.array([[1.0]]))
    assert served.g.down is None
    assert served.g.score(["a"], np.array([[4.0]]))[0].tolist() == [4.0]  # the next request is served


def test_a_swap_one_host_refuses_changes_nothing_and_one_all_accept_switches(served):
    with pytest.raises(JobConfigError, match=r"swap refused: host-2: no bundle of host-2 in v3"):
        served.g.swap("v3")
    assert served.g.model == "fp-v1"
    assert all(loop.scoring.bundle.model_dir == "v1" for loop in served.loops.values())
    assert served.g.swap("v2") == "fp-v2"
    assert served.g.score(["a"], np.array([[1.0]]))[0].tolist() == [1.0]
    assert all(loop.scoring.bundle.model_dir == "v2" for loop in served.loops.values())


@pytest.mark.parametrize("text, reason", [
    ({"op": "score", "ids": json.dumps(["a"] * 4097)}, "ids must be a list of 1..4096"),
    ({"op": "score", "ids": json.dumps([1, 2])}, "every id must be a string"),
    ({"op": "score", "ids": "[" * 10}, "invalid payload"),
    ({"op": "rm -rf"}, "unknown op 'rm -rf'"),
    ({"op": "prepare", "model_dir": "x"}, "needs model_dir and fingerprint"),
])
def test_a_hostile_control_message_is_rejected_and_the_host_keeps_serving(served, text, reason):
    t = served.net.transport("guest")
    t.send("host-1", fed.TAG_CTL, messages_pb2.Bundle(text=text), round=served.g.step + 1)
    rejected = []
    for _ in range(100):  # the host takes it, rejects it (logged) and keeps waiting
        rejected = [why for m, why in served.net.mailbox("host-1").rejected if m.tag == fed.TAG_CTL]
        if rejected:
            break
        time.sleep(0.05)
    assert any(reason in why for why in rejected), rejected
    scores, _ = served.g.score(["a"], np.array([[2.0]]))  # an honest step of the same round is then served
    assert scores.tolist() == [2.0]
