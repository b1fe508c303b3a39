"""Tiny in-process runs of every protocol over a :class:`FuzzNetwork` (not a test module).

Each runner takes a network class (see :func:`fuzz_net.network_class`) and returns
``(fingerprint, errors, nets)``: a comparable fingerprint of every party's result (timings left out),
the exceptions raised by the parties (by party id) and the networks the run used (their captures).
The existing test harnesses are reused; their ``InProcessNetwork`` is swapped for the fuzz network.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parents[1]
for sub in ("vertical", "tree", "horizontal", "runtime"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))

import fl_harness  # noqa: E402
import mc_harness  # noqa: E402
import sb_harness  # noqa: E402
import secagg_harness  # noqa: E402
import snn_harness  # noqa: E402
import vlr_harness  # noqa: E402

from secureflhv.crypto.homomorphic import paillier as pl  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.tree.params import SecureBoostParams  # noqa: E402
from secureflhv.vertical import psi_kkrt  # noqa: E402
from secureflhv.vertical.psi import align_ids_guest, align_ids_host  # noqa: E402
from secureflhv.vertical.split_nn import SplitNNConfig  # noqa: E402

KEY = {"key_bits": 512, "insecure_test_key": True}
DEADLINE = 8.0  # seconds a receiver waits: an attacked run that stalls ends with PeerTimeout (slack for loaded CI)
SKIP_KEYS = ("second", "time", "timing", "duration")
_SB_KEY = None


def fingerprint(obj, depth: int = 0):
    """A hashable, ==-comparable summary of a result object: arrays by bytes, floats exactly,
    dataclasses / objects by their fields (fields naming timings skipped)."""
    if depth > 8:
        return "..."
    if isinstance(obj, np.ndarray):
        return ("nd", obj.shape, str(obj.dtype), obj.tobytes())
    if isinstance(obj, (np.generic,)):
        return fingerprint(obj.item(), depth)
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, dict):
        return tuple(sorted(((str(k), fingerprint(v, depth + 1)) for k, v in obj.items()
                             if not any(s in str(k) for s in SKIP_KEYS)), key=lambda kv: kv[0]))
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return tuple(fingerprint(v, depth + 1) for v in items)
    if dataclasses.is_dataclass(obj):
        return (type(obj).__name__, fingerprint({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)},
                                                depth + 1))
    if hasattr(obj, "state_dict"):
        return fingerprint({k: v.detach().numpy() for k, v in obj.state_dict().items()}, depth + 1)
    if hasattr(obj, "__dict__"):
        return (type(obj).__name__, fingerprint({k: v for k, v in vars(obj).items() if not k.startswith("_")},
                                                depth + 1))
    return repr(obj)


def same(a, b, tol: float = 1e-9) -> bool:
    """Fingerprints equal, floats (and float arrays) up to ``tol`` relative/absolute: the split NN's
    fixed-point masking leaves ~1e-12 noise between two honest runs; any lie that matters is far bigger."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= tol * (1 + abs(b)) or (a != a and b != b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        if len(a) == 4 and len(b) == 4 and a[:1] == b[:1] == ("nd",):
            if a[1:3] != b[1:3]:
                return False
            x, y = np.frombuffer(a[3], a[2]), np.frombuffer(b[3], b[2])
            return bool(np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True)) if x.dtype.kind == "f" else a == b
        return len(a) == len(b) and all(same(u, v, tol) for u, v in zip(a, b))
    return a == b


@contextlib.contextmanager
def _patched(module, net_cls):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "InProcessNetwork", net_cls)
        yield


def run_psi(net_cls):
    guest_ids = [f"id-{i}" for i in range(0, 12)]
    host_ids = [f"id-{i}" for i in range(5, 16)]
    net = net_cls("fuzz-psi", ["guest", "host-1"], deadline=DEADLINE)
    results, errors = sb_harness.run_threads({
        "guest": lambda: align_ids_guest(net.transport("guest"), guest_ids, ["host-1"], workers=1),
        "host-1": lambda: align_ids_host(net.transport("host-1"), host_ids, "guest", workers=1),
    }, timeout=30)
    return fingerprint(results), errors, [net]


def run_psi_kkrt(net_cls):
    # 100 guest IDs make 256 cuckoo bins: under a 32 KiB message limit U travels in 2 parts; 200 host IDs
    # make 600 OPRF values, in 2 parts (of 507 and 93); every part acknowledged
    guest_ids = [f"id-{i}" for i in range(0, 100)]
    host_ids = [f"id-{i}" for i in range(90, 290)]
    net = net_cls("fuzz-psi-kkrt", ["guest", "host-1"], deadline=DEADLINE, max_payload_bytes=32 * 1024)
    results, errors = sb_harness.run_threads({
        "guest": lambda: psi_kkrt.align_ids_guest(net.transport("guest"), guest_ids, ["host-1"]),
        "host-1": lambda: psi_kkrt.align_ids_host(net.transport("host-1"), host_ids, "guest"),
    }, timeout=30)
    return fingerprint(results), errors, [net]


def _lr_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 4))
    y = (X @ rng.normal(size=4) > 0).astype(int)
    return X, y


def _run_vlr(net_cls, mode):
    X, y = _lr_data()
    cfg = dict(KEY, mode=mode, epochs=2, batch_size=6, learning_rate=0.3, l2=0.01, seed=3, early_stopping_rounds=None)
    with _patched(vlr_harness, net_cls):
        hosts = [X[:, 2:3], X[:, 3:]] if mode == "arbiter" else [X[:, 2:]]  # two hosts: the cross terms
        results, errors, net, _ = vlr_harness.run_vertical_lr(X[:, :2], y, hosts, cfg, deadline=DEADLINE,
                                                               predict_sets=(X[:3, :2], [h[:3] for h in hosts]),
                                                               job_id=f"fuzz-vlr-{mode}")
    return fingerprint(results), errors, [net]


def run_vlr_arbiter(net_cls):
    return _run_vlr(net_cls, "arbiter")


def run_vlr_two_party(net_cls):
    return _run_vlr(net_cls, "two_party")


def run_split_nn(net_cls):
    X, y = snn_harness.toy(n=8, d=4, seed=1)
    cfg = SplitNNConfig(**KEY, host_bottom=[3], guest_bottom=[2], interactive_units=2, top_hidden=[2], epochs=1,
                        batch_size=4, learning_rate=0.05, interactive_lr=0.2, weight_noise=1.0, seed=5, init_seed=2)
    with _patched(snn_harness, net_cls):
        net, guest, hosts = snn_harness.make_roles(X[:, :2], y, [X[:, 2:]], cfg, deadline=DEADLINE)
    results, errors = snn_harness.run_roles(guest, hosts, predict_sets=(X[:3, :2], [X[:3, 2:]]), timeout=60)
    return fingerprint(results), errors, [net]


def run_sb_vertical(net_cls):
    global _SB_KEY
    if _SB_KEY is None:
        _SB_KEY = pl.generate_keypair(512, insecure_test_key=True)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(16, 4))
    y = (X[:, 0] + X[:, 3] > 0).astype(float)
    params = SecureBoostParams(n_trees=1, max_depth=2, max_bin=4, learning_rate=0.3, shuffle_seed=3, **KEY)
    with _patched(sb_harness, net_cls):
        run = sb_harness.vertical_run(X, y, [[0, 1], [2, 3]], params, X_pred=X[:4], deadline=DEADLINE,
                                      keypair=_SB_KEY)
    res = run.get("result")
    fp = fingerprint((None if res is None else res.model, run.get("pred"),
                      [h.records for h in run["hosts"]]))
    return fp, run["errors"], [run["net"]]


def run_sb_horizontal(net_cls):
    rng = np.random.default_rng(4)
    parts = []
    for _ in range(2):
        X = rng.normal(size=(10, 3))
        parts.append((X, (X[:, 0] > 0).astype(float)))
    params = SecureBoostParams(n_trees=1, max_depth=2, max_bin=4, sketch_bins=16, learning_rate=0.3)
    with _patched(sb_harness, net_cls):
        run = sb_harness.horizontal_run(parts, params, deadline=DEADLINE,
                                        agg_kw=dict(min_clients=2, max_colluders=0))  # the two-client opt-in
    return fingerprint((run["server_model"], run["client_models"])), run["errors"], [run["net"]]


def run_fl(net_cls, fl_kw=None):
    shards, test = fl_harness.blobs(12, 2, n_features=3, n_classes=2, seed=0)
    spec = ModelSpec(name="mlp", n_features=3, n_classes=2)
    with _patched(fl_harness, net_cls):
        server, clients, errors = fl_harness.run_fl(shards, (test[0][:10], test[1][:10]), spec, rounds=2,
                                                    deadline=DEADLINE, fl_kw=fl_kw,
                                                    agg_kw=dict(min_clients=2, max_colluders=0))  # 2-client opt-in
    fp = fingerprint((server.global_vec, [c.global_vec for c in clients],
                      [{k: v for k, v in vars(r).items() if "second" not in k} for r in server.history]))
    nets = net_cls.instances[-1:]
    return fp, errors, nets


def run_fl_contrib(net_cls):
    """FL with client contribution normalisation (horizontal/contribution.py): its two server answers."""
    return run_fl(net_cls, fl_kw={"contribution_temperature": 1.0})


def run_mc(net_cls):
    """MultiConfederated learning (horizontal/mc_peer.py): three peers, two rounds, peer-to-peer updates."""
    shards = [(X[:24], y[:24]) for X, y in mc_harness.cancer_shards(3, rows=30)]
    net = net_cls("fuzz-mc", ["p0", "p1", "p2"], deadline=DEADLINE)
    cfg = mc_harness.config(rounds=2, round_timeout_s=DEADLINE, send_timeout_s=DEADLINE / 2)
    peers, errors, _ = mc_harness.run_peers(shards, cfg, net=net, test_rows=4)
    return fingerprint([(p.pool, [dataclasses.replace(r, seconds=0.0) for r in p.history]) for p in peers]), \
        errors, [net]


def run_secagg(net_cls):
    cfg = secagg_harness.config(stage_timeout_s=DEADLINE, input_timeout_s=DEADLINE, consistency_check=True)
    ids, xs, ws = secagg_harness.make_inputs(3, 4, seed=1)
    net = net_cls("fuzz-secagg", ["server", *ids], deadline=DEADLINE)
    res, errors, _, _, _ = secagg_harness.run_round(cfg, ids, xs, ws, network=net,
                                                    server_transport=net.transport("server"))
    if isinstance(res, BaseException):
        errors = {**errors, "server": res}
        res = None
    return fingerprint(res), errors, [net]


def run_rendezvous(net_cls):
    """Two parties meet (runtime/process/rendezvous.py) with a minimal job description (duck-typed JobConfig)."""
    from types import SimpleNamespace as NS

    from secureflhv.runtime.process.rendezvous import meet

    parties = [NS(id="guest", role="guest", address="10.0.0.1:1"), NS(id="host-1", role="host", address="10.0.0.2:1")]
    cfg = NS(job=NS(id="fuzz-meet", algorithm="vertical_lr", startup_timeout_s=DEADLINE, startup_log_interval_s=1.0),
             params={"epochs": 1}, parties=parties, security=NS(insecure_test_keys=True))
    net = net_cls("fuzz-meet", ["guest", "host-1"], deadline=DEADLINE)
    results, errors = sb_harness.run_threads({
        p.id: (lambda me=p.id, other=q.id: sorted(meet(net.transport(me), cfg, [other])))
        for p, q in (parties, parties[::-1])}, timeout=30)
    return fingerprint(results), errors, [net]


def run_resume(net_cls):
    """Three parties agree on a checkpoint step (runtime/store/resume.py): honest answer step 4."""
    from secureflhv.runtime.store.resume import agree_step

    held = {"guest": [3, 4], "host-1": [4, 5], "server": [2, 4]}
    net = net_cls("fuzz-resume", list(held), deadline=DEADLINE)
    results, errors = sb_harness.run_threads({
        me: (lambda me=me: agree_step(net.transport(me), [p for p in held if p != me], held[me])) for me in held},
        timeout=30)
    return fingerprint(results), errors, [net]


def run_fed_stats(net_cls):
    """Federated preprocessing statistics (fedstats/preprocessing.py), two clients, both rounds."""
    from secureflhv.fedstats.statistics import StatsSpec
    from secureflhv.fedstats.preprocessing import FederatedStatsClient, FederatedStatsServer, stats_aggregation_config

    rng = np.random.default_rng(5)
    spec = StatsSpec(("a", "b", "c"), {"c": ("x", "y")})
    tables = {}
    for c in ("client-0", "client-1"):
        X = np.column_stack([rng.normal(3, 2, 8), rng.normal(-1, 5, 8), rng.integers(0, 2, 8)]).astype(float)
        X[0, 1] = np.nan
        tables[c] = X
    cfg = stats_aggregation_config("plain_quantised", seed=1, stage_timeout_s=DEADLINE, input_timeout_s=DEADLINE,
                                   min_clients=2, max_colluders=0)  # the two-client opt-in
    net = net_cls("fuzz-fpp", ["server", *tables], deadline=DEADLINE)
    targets = {"server": lambda: FederatedStatsServer(net.transport("server"), list(tables), cfg,
                                                      timeout_s=DEADLINE).run().to_dict()}
    for c, X in tables.items():
        targets[c] = (lambda c=c, X=X: FederatedStatsClient(net.transport(c), "server", list(tables), spec,
                                                            cfg).run(X).to_dict())
    results, errors = sb_harness.run_threads(targets, timeout=30)
    return fingerprint(results), errors, [net]


def run_woe(net_cls):
    """Federated WOE binning (vertical/woe_binning.py): one host, binary labels, every message once."""
    from secureflhv.data.woe import ColumnBins, column_edges
    from secureflhv.vertical import woe_binning as wb

    rng = np.random.default_rng(6)
    X = rng.normal(size=(24, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=24) > 0).astype(int)
    bins = [ColumnBins(f"h{j}", column_edges(X[:, j], "quantile", 3)) for j in range(2)]
    net = net_cls("fuzz-woe", ["guest", "host-1"], deadline=DEADLINE)
    guest = wb.BinningGuest(net.transport("guest"), ["host-1"], y, 2, max_features=4, max_bins=3, **KEY)

    def run_guest():
        got = guest.host_counts()["host-1"]
        guest.send_decisions({"host-1": wb.HostDecision([np.ones(b.n_bins - 2, bool) for b in bins], [True, False],
                                                        [np.linspace(-1, 1, b.n_bins) for b in bins])})
        return got.names, got.counts

    def run_host():
        d = wb.BinningHost(net.transport("host-1"), "guest", bins, X, max_bins=3, insecure_test_key=True).run()
        return d.keep_cuts, d.selected, d.woe

    results, errors = sb_harness.run_threads({"guest": run_guest, "host-1": run_host}, timeout=30)
    return fingerprint(results), errors, [net]


def _run_corr(net_cls, reveal_to):
    from secureflhv.vertical.correlation import CorrelationConfig, CorrelationGuest, CorrelationHost

    rng = np.random.default_rng(7)
    X = rng.normal(size=(12, 3))
    cfg = CorrelationConfig(**KEY, reveal_to=reveal_to)
    net = net_cls(f"fuzz-corr-{reveal_to}", ["guest", "host-1"], deadline=DEADLINE)
    results, errors = sb_harness.run_threads({
        "guest": lambda: CorrelationGuest(net.transport("guest"), ["host-1"], X[:, :1], cfg).run(),
        "host-1": lambda: CorrelationHost(net.transport("host-1"), "guest", X[:, 1:], cfg).run(),
    }, timeout=30)
    return fingerprint(results), errors, [net]


def run_corr_guest(net_cls):
    """Cross-party correlation (vertical/correlation.py), the guest learns the matrix."""
    return _run_corr(net_cls, "guest")


def run_corr_host(net_cls):
    """Cross-party correlation, the host learns it (masked decryption by the guest)."""
    return _run_corr(net_cls, "host")


def run_score_totals(net_cls):
    """A host's per-row totals to the guest (vertical/score_totals.py, the scorecard's last step)."""
    from secureflhv.vertical.score_totals import gather_totals, send_totals

    net = net_cls("fuzz-totals", ["guest", "host-1"], deadline=DEADLINE)
    results, errors = sb_harness.run_threads({
        "guest": lambda: gather_totals(net.transport("guest"), ["host-1"], 5),
        "host-1": lambda: send_totals(net.transport("host-1"), "guest", np.arange(5.0)),
    }, timeout=30)
    return fingerprint(results), errors, [net]


def run_selection(net_cls):
    """Feature selection's exchange (vertical/selection.py): a host's importances, then its kept columns."""
    from secureflhv.vertical.selection import receive_importance, receive_keep, send_importance, send_keep

    net = net_cls("fuzz-selection", ["guest", "host-1"], deadline=DEADLINE)

    def guest():
        n, imp = receive_importance(net.transport("guest"), "host-1", 10)
        send_keep(net.transport("guest"), "host-1", imp > 1.0)
        return n, imp

    def host():
        send_importance(net.transport("host-1"), "guest", 3, importance=np.array([0.5, 2.0, 1.5]))
        return receive_keep(net.transport("host-1"), "guest", 3)

    results, errors = sb_harness.run_threads({"guest": guest, "host-1": host}, timeout=30)
    return fingerprint(results), errors, [net]



def run_serve(net_cls):
    """The serving exchange (runtime/serve/federation.py): a score step with one id the host does not hold, a
    swap the host refuses, a stop. The family's own scoring is stubbed: its messages are fuzzed in the vlr /
    sb / split_nn runs."""
    from types import SimpleNamespace as NS

    from secureflhv.runtime.job.job_file import JobConfigError
    from secureflhv.runtime.serve import federation as fed
    from secureflhv.runtime.serve.feature_store import MemoryFeatureStore
    from serve_harness import stub_loader, stub_scoring_patches

    refuse = {"host-1": {"v2"}}
    guest, host = NS(id="guest", role="guest"), NS(id="host-1", role="host")
    cfg = NS(guest=guest, hosts=[host])
    net = net_cls("fuzz-serve", ["guest", "host-1"], deadline=DEADLINE)
    store = MemoryFeatureStore(["a1", "a2"], np.array([[1.0, 2.0], [3.0, 4.0]]), ["x", "y"])

    def run_guest():
        f = fed.GuestFederation(net.transport("guest"), cfg, guest, stub_loader("guest", refuse), "v1", max_rows=8)
        scores, missing = f.score(["a2", "zz"], np.array([[1.0, 1.0], [2.0, 2.0]]))
        try:
            f.swap("v2")
            refused = False
        except JobConfigError:  # the host's reason is its own text: the outcome is what counts
            refused = True
        f.close()
        return scores, missing, refused

    def run_host():
        loop = fed.HostLoop(net.transport("host-1"), cfg, host, stub_loader("host-1", refuse), lambda cols: store, "v1",
                            8)
        return loop.run()

    patches = stub_scoring_patches()
    for p in patches:
        p.start()
    try:
        results, errors = sb_harness.run_threads({"guest": run_guest, "host-1": run_host}, timeout=30)
    finally:
        for p in patches:
            p.stop()
    return fingerprint(results), errors, [net]


PROTOCOLS = {
    "fed_stats": run_fed_stats,
    "rendezvous": run_rendezvous,
    "resume": run_resume,
    "psi": run_psi,
    "psi_kkrt": run_psi_kkrt,
    "vlr_arbiter": run_vlr_arbiter,
    "vlr_two_party": run_vlr_two_party,
    "split_nn": run_split_nn,
    "sb_vertical": run_sb_vertical,
    "sb_horizontal": run_sb_horizontal,
    "fl": run_fl,
    "fl_contrib": run_fl_contrib,
    "mc": run_mc,
    "secagg": run_secagg,
    "woe": run_woe,
    "corr_guest": run_corr_guest,
    "corr_host": run_corr_host,
    "score_totals": run_score_totals,
    "selection": run_selection,
    "serve": run_serve,
}
