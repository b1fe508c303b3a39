"""The default training loop with the optimiser and learning-rate scheduler a job names (issue 37): Adam / AdamW
equal a plain torch loop, the per-round learning rate follows the named scheduler's closed form, and what the
strategies cannot take is refused at validation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fl_harness import job_dict

from secureflhv.horizontal.strategies import FedAvg, LocalTrainConfig, batch_rng
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job

MODEL = {"name": "mlp", "n_features": 5, "n_classes": 3, "hidden": [8]}


@pytest.mark.parametrize("name,cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_the_default_loop_with_adam_equals_a_plain_torch_loop(name, cls):
    """One client's local round with ``optimizer: adam`` / ``adamw``: the same weights as torch's optimiser
    stepping the same batches (the batch order of :func:`batch_rng`)."""
    from secureflhv.horizontal.models import ModelSpec, build_model, get_flat

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 5)).astype(np.float32), rng.integers(0, 3, 50)
    cfg = LocalTrainConfig(epochs=2, batch_size=16, lr=0.01, weight_decay=1e-3, optimizer=name)
    model = build_model(ModelSpec(**MODEL), seed=1)
    twin = build_model(ModelSpec(**MODEL), seed=1)
    start = get_flat(model)
    FedAvg().client_update(model, start, X, y, cfg, batch_rng(0, 1, "c"))

    order = batch_rng(0, 1, "c")
    opt = cls(twin.parameters(), lr=0.01, weight_decay=1e-3)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    for _ in range(2):
        perm = torch.from_numpy(order.permutation(50))
        for s in range(0, 50, 16):
            idx = perm[s:s + 16]
            opt.zero_grad()
            nn.functional.cross_entropy(twin(Xt[idx]), yt[idx]).backward()
            opt.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n


def test_the_learning_rate_per_round_follows_the_scheduler():
    """CosineAnnealingLR with T_max = R and eta_min: round r trains at eta_min + (lr - eta_min)(1 + cos(pi (r-1) / R)) / 2;
    StepLR: lr · gamma^floor((r-1)/step)."""
    cfg = LocalTrainConfig(lr=0.1, lr_scheduler=("CosineAnnealingLR", (("T_max", 10), ("eta_min", 0.001))))
    want = [0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * (r - 1) / 10)) / 2 for r in range(1, 11)]
    np.testing.assert_allclose(cfg.round_lrs(10), want, rtol=1e-12)
    assert [cfg.for_round(r).lr for r in (1, 4, 10)] == [cfg.round_lrs(10)[i] for i in (0, 3, 9)]
    step = LocalTrainConfig(lr=0.2, lr_scheduler=("StepLR", (("gamma", 0.5), ("step_size", 3))))
    np.testing.assert_allclose(step.round_lrs(7), [0.2 * 0.5 ** ((r - 1) // 3) for r in range(1, 8)], rtol=1e-12)


def _params(**change) -> dict:
    return {"model": MODEL, "rounds": 4, "aggregation": {"kind": "plain"}, **change}


@pytest.mark.parametrize("change,words", [
    ({"strategy": "scaffold", "optimizer": "adam"}, "params.optimizer: scaffold's update assumes SGD"),
    ({"strategy": "fednova", "optimizer": "adamw"}, "params.optimizer: fednova's update assumes SGD"),
    ({"lr_scheduler": {"name": "CosineAnnealingLR", "kwargs": {"T_max": 3}}}, "learning rate 0.0 in round 4 of 4"),
    ({"lr_scheduler": {"name": "StepLR", "kwargs": {"gama": 0.5}}}, "params.lr_scheduler: StepLR"),
    ({"lr_scheduler": {"name": "ReduceLROnPlateau"}}, "params.lr_scheduler.name"),
])
def test_what_the_strategies_cannot_take_is_refused(tmp_path, change, words):
    doc = job_dict([tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"], _params(**change))
    with pytest.raises(JobConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_job(doc, tmp_path)


def test_a_job_with_adam_and_a_scheduler_validates(tmp_path):
    doc = job_dict([tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"],
                   _params(optimizer="adamw", lr_scheduler={"name": "ExponentialLR", "kwargs": {"gamma": 0.9}}))
    assert parse_job(doc, tmp_path).job.algorithm == "horizontal"
