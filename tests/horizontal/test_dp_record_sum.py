"""Distributed record-level DP-GD (``params.record_dp.placement: distributed``, secureflhv.horizontal.dp_record_sum):
the per-record clipped gradient sum against an autograd loop, the sensitivity of one record after rounding, secure
aggregation's exactness, one released step against a numpy twin of clipped full-batch gradient descent, the Skellam
accounting per record, and the job's wiring and refusals."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting.rdp import compute_epsilon

from fl_harness import job_dict, partitioned_blobs, run_in_process
from secagg_harness import config as secagg_config
from secagg_harness import run_round

from secureflhv.horizontal.clipped_gradients import clipped_gradient_sum
from secureflhv.horizontal.dp_record_sum import RecordSumDP
from secureflhv.horizontal.models import ModelSpec, build_model, get_flat
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job
from secureflhv.secagg import AggregateResult

ORDERS = list(range(2, 64)) + list(range(64, 257, 8)) + [320, 384, 512, 768, 1024]


def _dp(agg, d, *, z=1.0, clip=1.0, bits=32, lr=0.5, wd=0.0, noise_seed=5) -> RecordSumDP:
    n = len(agg.job_clients)
    return RecordSumDP(clip_norm=clip, bits=bits, aggregation=agg,
                       least_honest=agg.resolve_threshold(n) - agg.max_colluders, lrs=(lr,), weight_decay=wd,
                       noise_multiplier=z, job_seed=3, noise_seed=noise_seed).bound(d)


def _blobs(n, d=6, k=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.0, (k, d))
    y = rng.integers(0, k, n)
    return (centres[y] + rng.normal(0, 1.0, (n, d))).astype(np.float32), y


def test_the_clipped_gradient_sum_equals_a_per_record_autograd_loop():
    """torch.func's vectorised per-record gradients, clipped and summed, against one backward pass per record."""
    model = build_model(ModelSpec(name="mlp", n_features=6, n_classes=4, hidden=[5]), seed=0)
    X, y = _blobs(37)
    got = clipped_gradient_sum(model, X, y, clip=0.3, chunk=8)
    want = np.zeros_like(got)
    for i in range(len(y)):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(X[i:i + 1])), torch.tensor([int(y[i])]))
        loss.backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy()
        want += g * min(1.0, 0.3 / np.linalg.norm(g))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert np.linalg.norm(got) <= 0.3 * len(y) + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_one_record_moves_the_encoded_vector_by_at_most_the_sensitivity(seed):
    """Add one record (its clipped gradient of norm C, any direction): with the same rounding draws and noise (a
    coupling), the two integer vectors differ by at most Δ2 = √((K + √d')² + c²) in L2 and Δ1 in L1, written out
    here from C, γ and d'."""
    rng = np.random.default_rng(seed)
    d = 300
    dp = _dp(secagg_config(ring_bits=32, job_clients=[f"c{i}" for i in range(4)]), d, clip=0.7)
    base = rng.normal(0, 5.0, d)
    record = rng.normal(0, 1, d) * (rng.uniform(0, 50) if seed % 2 else 1.0)
    record *= min(1.0, 0.7 / np.linalg.norm(record))
    a = dp.client_input(base, 2, 4, "c1", weight=40)[0]
    b = dp.client_input(base + record, 2, 4, "c1", weight=41)[0]
    d_pad, k = 512, 0.7 / dp.plan.gamma
    c = math.ceil(k / 8)
    assert k == pytest.approx(32 * math.sqrt(d_pad)) and dp.plan.count_scale == c
    assert b[-1] - a[-1] == c
    assert np.linalg.norm(b - a) <= math.hypot(k + math.sqrt(d_pad), c) <= dp.plan.l2_sensitivity
    assert np.abs(b - a).sum() <= math.sqrt(d_pad) * k + d_pad + c <= dp.plan.l1_sensitivity


def test_secure_aggregation_sums_the_encoded_inputs_exactly():
    ids = [f"client{i}" for i in range(4)]
    agg = secagg_config(ring_bits=32, job_clients=ids)
    dp = _dp(agg, 100)
    rng = np.random.default_rng(1)
    xs = {c: dp.client_input(rng.normal(0, 3, 100), 1, 4, c, weight=30 + i)[0] for i, c in enumerate(ids)}
    assert all(v.shape == (129,) and np.array_equal(v, np.round(v)) for v in xs.values())
    res, errors, *_ = run_round(dp.aggregation_for(agg), ids, xs, {c: 1.0 for c in ids})
    assert isinstance(res, AggregateResult), (res, errors)
    assert np.array_equal(res.total.astype(np.int64), sum(xs[c].astype(np.int64) for c in ids))


def _softmax_step(w: np.ndarray, b: np.ndarray, X, y, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin: Σ_r clip_C(∇ of the cross-entropy of softmax(x W^T + b)) over records, both tensors."""
    logits = X @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    gw = p[:, :, None] * X[:, None, :]                       # (n, k, d)
    norms = np.sqrt((gw ** 2).sum((1, 2)) + (p ** 2).sum(1))
    f = np.minimum(1.0, clip / norms)
    return (gw * f[:, None, None]).sum(0), (p * f[:, None]).sum(0)


def test_a_released_step_is_clipped_full_batch_gradient_descent_up_to_the_noise():
    """Four clients' encoded sums through the server's release equal w − lr·(Σ clipped gradients / N) of a numpy
    twin, within the rounding and noise the plan says (a small noise multiplier makes that tight)."""
    ids = [f"client{i}" for i in range(4)]
    agg = secagg_config(ring_bits=40, job_clients=ids)
    model = build_model(ModelSpec(name="mlp", n_features=6, n_classes=4, hidden=[]), seed=2)
    w0 = get_flat(model)
    d = w0.size
    dp = _dp(agg, d, z=0.01, clip=0.5, bits=40, lr=0.8, wd=0.01)
    shards = [_blobs(50 + 10 * i, seed=i) for i in range(4)]
    xs = {}
    for c, (X, y) in zip(ids, shards):
        upd = dp.local_update(model, w0, X, y)
        assert math.isnan(upd.loss) and upd.parts["model"][1] == len(y)
        xs[c] = dp.client_input(upd.parts["model"][0], 1, 4, c, weight=upd.parts["model"][1])[0]
    res, _, *_ = run_round(dp.aggregation_for(agg), ids, xs, {c: 1.0 for c in ids})
    new, why = dp.release(w0, res, 1, 4)
    assert why == "" and new.dtype == np.float32
    W, b = w0[:24].reshape(4, 6).astype(np.float64), w0[24:].astype(np.float64)
    gw, gb = np.zeros_like(W), np.zeros_like(b)
    for X, y in shards:
        sw, sb = _softmax_step(W, b, X.astype(np.float64), y, 0.5)
        gw, gb = gw + sw, gb + sb
    n = sum(len(y) for _, y in shards)
    twin = np.concatenate([(W - 0.8 * (gw / n + 0.01 * W)).ravel(), b - 0.8 * (gb / n + 0.01 * b)])
    # per client: rounding ≤ γ√d' in L2; noise std γ·√(carried variance) per coordinate; the count's noise is tiny
    err = 0.8 * (4 * dp.plan.gamma * math.sqrt(dp.plan.d_pad) + 6 * dp.plan.noise_std * math.sqrt(d)) / n
    assert np.linalg.norm(new - twin) <= err + 0.8 * 0.5 * 0.01  # + the count's relative error × the step
    assert np.linalg.norm(new - twin) < 0.02 * np.linalg.norm(twin - w0)


def test_the_server_refuses_a_sum_no_clipped_records_can_reach():
    ids = [f"client{i}" for i in range(4)]
    agg = secagg_config(ring_bits=32, job_clients=ids)
    dp = _dp(agg, 100)
    honest = sum(dp.client_input(np.zeros(100), 1, 4, c, weight=10)[0] for c in ids)
    liar = honest.copy()
    liar[:128] += 50 * dp.plan.scale  # 50 records' worth more gradient than 40 records can carry, no more count
    w = np.zeros(100, np.float32)
    ok = AggregateResult(honest, 4.0, ids, [], 2.0 ** 31, 1.0, 32, 0)
    assert dp.release(w, ok, 1, 4)[1] == ""
    new, why = dp.release(w, AggregateResult(liar, 4.0, ids, [], 2.0 ** 31, 1.0, 32, 0), 1, 4)
    assert new is None and "did not clip" in why and "params.record_dp.bits" in why


def test_a_client_whose_own_vector_leaves_the_ring_is_told_to_raise_bits():
    dp = _dp(secagg_config(ring_bits=16, job_clients=["a", "b", "c"]), 10, bits=16, z=0.001)
    with pytest.raises(ValueError, match="params.record_dp.bits"):
        dp.client_input(np.full(10, 1.0), 1, 3, "a", weight=5000)  # the count: 5000 · 16 > 2^15


# ------------------------------------------------------------------------------------------ the job
DP = {"placement": "distributed", "clip_norm": 1.0, "noise_multiplier": 0.5, "delta": 1e-4, "noise_seed": 7}


def _job(tmp_path: Path, kind="secagg", rounds=4, **rec) -> dict:
    shards = partitioned_blobs(tmp_path / "data", "iid", {}, n_clients=4, n_rows=800)
    return job_dict(shards, {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 4,
                                                             "hidden": []},
                             "rounds": rounds, "learning_rate": 1.0, "seed": 1, "weight_decay": 0.0,
                             "aggregation": {"kind": kind, "seed": 3}, "record_dp": {**DP, **rec}}, tls=True)


def _run(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run_in_process(parse_job(copy.deepcopy(doc), out))
    return out / "out"


def _skellam_epsilon(variances, l2, l1, delta) -> float:
    """Agarwal, Kairouz, Liu (NeurIPS 2021): RDP of the Skellam mechanism per release, summed, then converted."""
    a = np.array(ORDERS, float)
    rdp = sum(a * l2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * v ** 2), 3 * l1 / (2 * v))
              for v in variances)
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


def test_a_distributed_dp_gd_job_learns_equals_plain_quantised_and_accounts_per_record(tmp_path):
    """Seeded noise: secure aggregation ends where unmasked aggregation of the same integers ends. Every round's ε
    is the Skellam bound at a record's sensitivities (from C and d' here) and the honest survivors' variance;
    the clients withhold their loss and record count; the model learns (blobs: far above the majority class)."""
    doc = _job(tmp_path / "a")
    secure = _run(doc, tmp_path / "a")
    doc["params"]["aggregation"]["kind"] = "plain_quantised"
    plain = _run(doc, tmp_path / "b")
    with np.load(secure / "server" / "global_model.npz") as a, np.load(plain / "server" / "global_model.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    metrics = json.loads((secure / "server" / "metrics.json").read_text())
    rounds = metrics["rounds"]
    d_pad = 32  # 6 * 4 + 4 = 28 parameters
    k = 32 * math.sqrt(d_pad)
    l2, l1 = math.hypot(k + math.sqrt(d_pad), math.ceil(k / 8)), math.sqrt(d_pad) * k + d_pad + math.ceil(k / 8)
    variances = []
    for rec in rounds:
        p = rec["privacy"]
        assert p["unit"] == "record" and p["level"] == "record" and p["placement"] == "distributed"
        assert p["l2_sensitivity"] == pytest.approx(l2, rel=1e-8) and p["l1_sensitivity"] == pytest.approx(l1, rel=1e-8)
        assert p["variance"] == pytest.approx((0.5 * p["l2_sensitivity"]) ** 2, rel=1e-12)
        assert p["variance_accounted"] == pytest.approx(1.5 * p["variance"], rel=1e-12)  # 3 of 4 honest, t - c = 2
        assert abs(p["records_noised"] - 800 * 0.8) < 10 * p["count_std"] * math.sqrt(2)
        assert rec["train_loss"] is None or math.isnan(rec["train_loss"])  # withheld
        variances.append(p["variance_accounted"])
        assert p["epsilon"] == pytest.approx(_skellam_epsilon(variances, l2, l1, 1e-4), abs=1e-6)
    assert rounds[-1]["test_accuracy"] > 0.6
    manifest = json.loads((secure / "server" / "model" / "manifest.json").read_text())
    assert manifest["extra"]["privacy"]["epsilon"] == pytest.approx(rounds[-1]["privacy"]["epsilon"], abs=1e-9)
    assert manifest["extra"]["privacy"]["unit"] == "record"


@pytest.mark.parametrize("change,words", [
    ({"aggregation": {"kind": "plain"}}, "distributed noise is added in the ring"),
    ({"strategy": "fedprox"}, "strategy fedavg, not fedprox"),
    ({"record_dp": {**DP, "accountant": "prv"}}, "params.record_dp.accountant"),
    ({"optimizer": "adam"}, "plain gradient steps"),
    ({"dp": {"clip_norm": 1.0, "noise_multiplier": 1.0}}, "both own the model's aggregation"),
])
def test_what_distributed_dp_gd_cannot_take_is_refused(tmp_path, change, words):
    doc = _job(tmp_path)
    doc["params"].update(change)
    with pytest.raises(JobConfigError, match=words):
        parse_job(doc, tmp_path)
