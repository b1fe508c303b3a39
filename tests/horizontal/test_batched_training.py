"""Batched local training (torch.func vmap over stacked client parameters) equals the per-client loop:
same batches from the same seeds, same SGD-with-momentum maths, for the MLP and the CNN, for FedAvg,
FedProx and SCAFFOLD client updates, with unequal client sizes (short last batches, clients that stop
early); and the rendezvous trainer gives a threaded FL run the same models as the loop."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from secureflhv.horizontal.batched import BatchedTrainer, TrainRequest, batch_plan, batched_local_sgd, resolve_device
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat, set_flat  # noqa: E402
from secureflhv.horizontal.strategy_registry import make_strategy  # noqa: E402
from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd  # noqa: E402

CFG = LocalTrainConfig(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4)
SIZES = [20, 9, 27]  # unequal: short last batches and clients with fewer steps than the longest


def _data(spec: ModelSpec, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.random((n, spec.n_features), dtype=np.float32), rng.integers(0, spec.n_classes, n)) for n in SIZES]


SPECS = {"mlp": ModelSpec(name="mlp", n_features=12, n_classes=4, hidden=(16, 8)),
         "cnn": ModelSpec(name="cnn", n_features=16 * 16, n_classes=3)}


def test_batch_plan_is_local_sgds_batch_order():
    plan = batch_plan(11, CFG, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    expected = [p[s:s + 8] for p in (rng.permutation(11), rng.permutation(11)) for s in (0, 8)]
    assert len(plan) == 4 and all(np.array_equal(a, b) for a, b in zip(plan, expected))


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "scaffold"])
def test_batched_client_updates_equal_the_loop(model, strategy):
    spec = SPECS[model]
    data = _data(spec)
    start = get_flat(build_model(spec, seed=1))
    control = (np.random.default_rng(2).normal(size=start.size) * 0.01).astype(np.float32)
    runs = {}
    for mode in ("loop", "batched"):
        trainer = BatchedTrainer(wait_s=30.0)
        strategies = [make_strategy(strategy, mu=0.5) for _ in SIZES]  # a large mu so the proximal term matters
        for k, s in enumerate(strategies):
            if strategy == "scaffold":  # a non-zero local control variate, so c − c_i is not c
                s.c_local = (control * (k + 1) * 0.5).astype(np.float32)
            if mode == "batched":
                s.trainer = trainer.handle()
                s.trainer.begin(1, len(SIZES))
        models = [build_model(spec) for _ in SIZES]
        out = [None] * len(SIZES)

        def client(k):
            out[k] = strategies[k].client_update(models[k], start, *data[k], CFG, batch_rng(0, 1, f"p{k}"),
                                                 {"control": control})
        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(SIZES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        runs[mode] = out
        if mode == "batched":
            assert trainer.samples == sum(SIZES) * CFG.epochs  # one batch of all three clients
    for lo, ba in zip(runs["loop"], runs["batched"]):
        assert lo.steps == ba.steps and abs(lo.loss - ba.loss) < 1e-5
        for part, (vec, weight) in lo.parts.items():
            assert weight == ba.parts[part][1]
            assert np.abs(vec - ba.parts[part][0]).max() < 1e-5, part
            assert np.abs(vec).max() > 1e-3  # training moved the model: the comparison means something


def test_prox_term_changes_the_result():
    """The proximal term is not silently dropped by the batched path (FedProx differs from FedAvg)."""
    spec = SPECS["mlp"]
    (X, y), start = _data(spec)[0], get_flat(build_model(spec, seed=1))
    out = {}
    for prox in (None, (0.5, start)):
        m = build_model(spec)
        set_flat(m, start)
        batched_local_sgd([TrainRequest(m, X, y, CFG, batch_rng(0, 1, "p"), prox=prox)])
        out[prox is None] = get_flat(m)
    assert np.abs(out[True] - out[False]).max() > 1e-4


def test_loop_and_batched_agree_on_an_unequal_group_trained_directly():
    spec = SPECS["mlp"]
    data, start = _data(spec, seed=3), get_flat(build_model(spec, seed=4))
    loop, batched = [build_model(spec) for _ in SIZES], [build_model(spec) for _ in SIZES]
    for m in loop + batched:
        set_flat(m, start)
    stats = [local_sgd(loop[k], X, y, CFG, batch_rng(7, 2, f"p{k}")) for k, (X, y) in enumerate(data)]
    got = batched_local_sgd([TrainRequest(batched[k], X, y, CFG, batch_rng(7, 2, f"p{k}"))
                             for k, (X, y) in enumerate(data)])
    assert [s for s, _ in stats] == [s for s, _ in got] == [6, 4, 8]
    for a, b in zip(loop, batched):
        assert np.abs(get_flat(a) - get_flat(b)).max() < 1e-5


def test_trainer_trains_whoever_came_when_a_client_never_arrives():
    spec = SPECS["mlp"]
    (X, y), start = _data(spec)[0], get_flat(build_model(spec, seed=1))
    trainer = BatchedTrainer(wait_s=0.2)
    h = trainer.handle()
    h.begin(1, 3)  # expects three, only one comes
    m = build_model(spec)
    set_flat(m, start)
    steps, loss = h.train(m, X, y, CFG, batch_rng(0, 1, "p"))
    ref = build_model(spec)
    set_flat(ref, start)
    assert (steps, round(loss, 5)) == (6, round(local_sgd(ref, X, y, CFG, batch_rng(0, 1, "p"))[1], 5))


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="cpu' or 'cuda"):
        resolve_device("tpu")
    assert resolve_device(None).type == "cpu"


@pytest.mark.parametrize("strategy", ["fedprox", "scaffold"])
def test_an_fl_run_with_the_batched_trainer_gives_the_loops_global_model(strategy):
    """Server and client threads over the in-process transport (benchmarks/niid_accuracy.py's run_fl): the
    batched trainer (each round's clients as one batch) ends at the loop's global model, to 1e-5."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import niid_accuracy as nb  # noqa: PLC0415

    from secureflhv.horizontal.fl import FLConfig
    from secureflhv.secagg import AggregationConfig

    spec = SPECS["mlp"]
    shards = [(X, np.asarray(y)) for X, y in _data(spec, seed=6)]
    cfg = FLConfig(rounds=2, seed=3, local=CFG, aggregation=AggregationConfig(kind="plain", seed=3),
                   round_timeout_s=60)
    trainer = BatchedTrainer(wait_s=30.0)
    loop = nb.run_fl(shards, spec, strategy, cfg, 0.5, deadline=60.0)
    batched = nb.run_fl(shards, spec, strategy, cfg, 0.5, deadline=60.0, trainer=trainer)
    assert trainer.samples == 2 * sum(SIZES) * CFG.epochs  # both rounds trained as batches
    assert np.abs(loop.global_vec - batched.global_vec).max() < 1e-5
    assert np.abs(loop.global_vec - get_flat(build_model(spec, seed=3))).max() > 1e-3
