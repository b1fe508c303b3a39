"""IFCA (Ghosh et al. 2020) under secure aggregation: the cluster models equal plaintext IFCA on the same
quantised updates (and an independent float computation within quantisation error); the server's
transcript holds no cluster choice; clients from two tasks separate into two clusters."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fl_harness import run_fl  # noqa: E402
from secagg_harness import RecordingTransport  # noqa: E402

from secureflhv.horizontal.ifca import IFCA  # noqa: E402
from secureflhv.horizontal.models import ModelSpec  # noqa: E402
from secureflhv.horizontal.strategy_registry import make_strategy  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig  # noqa: E402
from secureflhv.proto import secagg_pb2  # noqa: E402

SPEC = ModelSpec(name="mlp", n_features=4, n_classes=2, hidden=(8,))
LOCAL = LocalTrainConfig(epochs=2, batch_size=16, lr=0.2)


def two_tasks(n_clients=4, n=48, seed=0):
    """Clients 0, 2, ... label by sign(x0), clients 1, 3, ... by the opposite sign: two clusters."""
    rng = np.random.default_rng(seed)
    shards = []
    for i in range(n_clients):
        X = rng.normal(0, 1, (n, 4)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int64)
        shards.append((X, y if i % 2 == 0 else 1 - y))
    return shards


def _recording(clients, store):
    """Wrap each client's IFCA.client_update to keep (choice, update of its cluster)."""
    for c in clients:
        orig = c.strategy.client_update

        def wrapped(*a, _orig=orig, _c=c, **kw):
            upd = _orig(*a, **kw)
            j = _c.strategy.choice
            store[_c.party_id] = (j, upd.parts[f"cluster{j}"][0].copy())
            return upd
        c.strategy.client_update = wrapped


def test_make_strategy_and_bad_k():
    assert make_strategy("ifca", clusters=3).k == 3
    with pytest.raises(ValueError, match="k >= 2"):
        IFCA(1)


def test_secagg_equals_plaintext_ifca_on_the_same_quantised_updates(monkeypatch):
    import fl_harness
    shards = two_tasks()
    store: dict = {}
    original = fl_harness.HorizontalClient

    class Recording(original):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            _recording([self], store)

    monkeypatch.setattr(fl_harness, "HorizontalClient", Recording)
    runs = {}
    for kind in ("secagg", "plain_quantised"):
        store.clear()
        server, clients, errors = run_fl(shards, shards[0], SPEC, "ifca", kind, rounds=1, seed=3, local=LOCAL,
                                         strategy_kw={"clusters": 2})
        assert not errors, errors
        runs[kind] = (server, dict(store))
    (sec, sec_store), (pq, pq_store) = runs["secagg"], runs["plain_quantised"]
    for a, b in zip(sec.strategy.clusters, pq.strategy.clusters):
        assert np.array_equal(a, b)  # bit for bit: the same quantised updates, summed per cluster
    assert {c: j for c, (j, _) in sec_store.items()} == {c: j for c, (j, _) in pq_store.items()}
    # independent plaintext IFCA (float): θ_j + mean of the chosen clients' updates; untouched if none chose j
    initial = sec.initial
    choices = Counter(j for j, _ in sec_store.values())
    for j in range(2):
        ups = [d for (c, d) in sec_store.values() if c == j]
        want = initial[j].astype(np.float64) + (np.mean(ups, axis=0) if ups else 0.0)
        np.testing.assert_allclose(sec.strategy.clusters[j], want, atol=len(ups) * 2.0 ** -15 + 1e-6)
        assert sec.history[0].aggregation[f"cluster{j}"]["weight"] == choices[j]  # the server learns the count
    assert np.all(np.isfinite(sec.global_vec))


def _transcript(forced: list[int], kind="secagg"):
    """One IFCA round with each client's choice forced; the server's received (sender, tag, size) and transcript."""
    import fl_harness
    shards = two_tasks()
    recs: list = []

    class Rec(RecordingTransport):
        def __init__(self, net, pid):
            super().__init__(net, pid)
            recs.append(self)

    class Forced(fl_harness.HorizontalClient):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            j = forced[int(self.party_id[1:])]
            self.strategy.choose = lambda model, models, X, y: j

    orig = fl_harness.HorizontalClient
    fl_harness.HorizontalClient = Forced
    try:
        server, clients, errors = run_fl(shards, shards[0], SPEC, "ifca", kind, rounds=1, seed=3, local=LOCAL,
                                         strategy_kw={"clusters": 2}, server_transport_cls=Rec)
    finally:
        fl_harness.HorizontalClient = orig
    assert not errors, errors
    assert [c.strategy.choice for c in clients] == forced
    received = recs[0].received
    return server, sorted((s, t, len(p)) for s, t, p in received), received


def test_server_transcript_holds_no_cluster_choice():
    a_server, a_shape, a_msgs = _transcript([0, 0, 0, 0])
    b_server, b_shape, b_msgs = _transcript([1, 0, 0, 1])
    # the clusters did get different updates ...
    assert not np.array_equal(a_server.strategy.clusters[1], b_server.strategy.clusters[1])
    # ... yet the server received the same messages, of the same sizes, whatever the choice
    assert a_shape == b_shape
    # and every masked input (chosen cluster or zeros) is a uniform-looking word vector: no all-zero input
    for msgs in (a_msgs, b_msgs):
        masked = [secagg_pb2.MaskedInput.FromString(p) for _, t, p in msgs if t == "agg.masked"]
        assert len(masked) == 4 * 2
        for m in masked:
            words = np.frombuffer(m.y.data, dtype=m.y.dtype)
            assert np.count_nonzero(words == 0) <= 2
            assert len(np.unique(words)) > 0.9 * len(words)


def test_plain_quantised_transcript_does_show_the_choice():
    """Control: without masks, the non-chosen clusters' inputs are visibly zero (the detector above works)."""
    _, _, msgs = _transcript([1, 0, 0, 1], kind="plain_quantised")
    inputs = [secagg_pb2.PlainInput.FromString(p) for _, t, p in msgs if t == "agg.plain"]
    zero = sum(not np.any(np.frombuffer(m.vector.data, dtype=m.vector.dtype)) for m in inputs)
    assert len(inputs) == 8 and zero == 4


def test_two_tasks_separate_into_two_clusters():
    shards = two_tasks(n=96, seed=1)
    server, clients, errors = run_fl(shards, None, SPEC, "ifca", "secagg", rounds=4, seed=3,
                                     local=LocalTrainConfig(epochs=2, batch_size=16, lr=0.3),
                                     strategy_kw={"clusters": 2})
    assert not errors, errors
    choice = [c.strategy.choice for c in clients]
    assert choice[0] == choice[2] != choice[1] == choice[3], choice


def test_job_params_pick_ifca_and_bound_the_clusters(tmp_path):
    from test_fl_job import PARAMS, job_dict

    from secureflhv.runtime.job.load import JobConfigError, parse_job
    from secureflhv.runtime.algorithms import horizontal_fl as hj
    from secureflhv.runtime.job.registry import job_params

    paths = [tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"]
    cfg = parse_job(job_dict(paths, {**PARAMS, "strategy": "ifca", "clusters": 3}), tmp_path)
    params = job_params(cfg)
    assert make_strategy(params.strategy, clusters=params.clusters).parts == ("cluster0", "cluster1", "cluster2")
    assert hj.HorizontalJobParams.model_fields["strategy"].annotation.__args__[-2:] == ("ifca", "fedper")
    with pytest.raises(JobConfigError, match=r"params\.clusters: 9 IFCA clusters exceed"):
        parse_job(job_dict(paths, {**PARAMS, "strategy": "ifca", "clusters": 9}), tmp_path)
    with pytest.raises(JobConfigError, match=r"params\.contribution_temperature: .* IFCA"):
        parse_job(job_dict(paths, {**PARAMS, "strategy": "ifca", "contribution_temperature": 1.0}), tmp_path)


def test_ifca_job_saves_every_cluster_model(tmp_path):
    from test_fl_job import PARAMS, job_dict, run_in_process, shards as job_shards

    from secureflhv.runtime.job.load import parse_job

    npz, _ = job_shards(tmp_path, 3)
    cfg = parse_job(job_dict(npz, {**PARAMS, "strategy": "ifca", "clusters": 3, "rounds": 1}), tmp_path)
    run_in_process(cfg)
    out = tmp_path / "out" / "server"
    with np.load(out / "cluster_models.npz", allow_pickle=False) as z:
        names = sorted(z.files)
        global_arrays = np.load(out / "global_model.npz", allow_pickle=False)
        # the saved global model is one of the clusters
        assert any(all(np.array_equal(z[f"cluster{j}/{k}"], global_arrays[k]) for k in global_arrays.files)
                   for j in range(3))
    assert {n.split("/")[0] for n in names} == {"cluster0", "cluster1", "cluster2"}
