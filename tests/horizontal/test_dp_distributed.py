"""Client-level DP with the noise distributed across the clients inside secure aggregation (issue 38): the unmasked
sum equals the plaintext sum of the noised, quantised inputs (with dropouts too); the summed noise's variance is
within its confidence interval for the survivors; the plan fits the ring; the server refuses an unclipped input;
ε per round equals the Skellam RDP bound evaluated here with numpy and dp-accounting's conversion; the budget stop;
what the placement cannot take is refused."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.rdp import compute_epsilon

from fl_harness import job_dict, partitioned_blobs, run_in_process
from secagg_harness import config as secagg_config
from secagg_harness import run_round

from secureflhv.dp.calibration import plan_skellam
from secureflhv.horizontal.dp_distributed import DistributedDP
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.runtime.job.load import parse_job
from secureflhv.proto import secagg_pb2
from secureflhv.secagg import AggregateResult

ORDERS = list(range(2, 64)) + list(range(64, 257, 8)) + [320, 384, 512, 768, 1024]


def _dp(agg, n, d, *, bits=24, z=1.0, clip=1.0, noise_seed=5, **kw) -> DistributedDP:
    sizes = tuple((m, agg.resolve_threshold(m) - agg.max_colluders) for m in range(agg.smallest_round(), n + 1))
    return DistributedDP(clip_norm=clip, bits=bits, aggregation=agg, sizes=sizes, noise_multiplier=z, job_seed=3,
                         noise_seed=noise_seed, **kw).bound(d)


def _kairouz_l2(c_over_gamma: float, d_pad: int, beta: float = math.exp(-0.5)) -> float:
    """Kairouz, Liu, Steinke (ICML 2021) Sec. 4.1: the conditional rounding's L2 bound, written out here."""
    return min(c_over_gamma + math.sqrt(d_pad),
               math.sqrt(c_over_gamma ** 2 + d_pad / 4 + math.sqrt(2 * math.log(1 / beta)) *
                         (c_over_gamma + math.sqrt(d_pad) / 2)))


def _skellam_epsilon(variances, l2, l1, delta) -> float:
    """Agarwal, Kairouz, Liu (NeurIPS 2021): RDP of the Skellam mechanism per release, summed, then converted."""
    a = np.array(ORDERS, float)
    rdp = sum(a * l2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * v ** 2), 3 * l1 / (2 * v))
              for v in variances)
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


@pytest.mark.parametrize("vanish", [{}, {"client4": 2}])
def test_the_unmasked_sum_is_the_plaintext_sum_of_the_noised_quantised_inputs(vanish):
    """Secure aggregation of the encoded inputs returns exactly (mod 2^k, centred) the sum of the survivors'
    integer vectors; a client that vanishes before sending its masked input is not in it."""
    ids = [f"client{i}" for i in range(5)]
    agg = secagg_config(ring_bits=20)
    dp = _dp(agg, 5, 300, bits=20)
    rng = np.random.default_rng(0)
    xs = {c: dp.client_input(rng.normal(0, 0.2, 300), 1, 5, c)[0] for c in ids}
    assert all(v.shape == (512,) and np.array_equal(v, np.round(v)) for v in xs.values())
    res, errors, _, server_t, _ = run_round(dp.aggregation_for(agg), ids, xs, {c: 1.0 for c in ids}, vanish=vanish)
    assert isinstance(res, AggregateResult), res
    masked = [secagg_pb2.MaskedInput.FromString(p).y for _, tag, p in server_t.received if tag == "agg.masked"]
    assert masked and all(m.dtype == "<u4" and len(m.data) == 4 * (512 + 2) for m in masked)  # a 20-bit ring
    survivors = [c for c in ids if c not in vanish]
    assert sorted(res.survivors) == survivors and res.weight == len(survivors)
    plain = sum(xs[c].astype(np.int64) for c in survivors)
    wrapped = (plain + (1 << 19)) % (1 << 20) - (1 << 19)  # the ring's centred residue
    assert np.array_equal(res.total.astype(np.int64), wrapped)
    assert res.k_bits == 20 and res.n_clipped == 0


def test_a_16_bit_ring_travels_in_2_byte_words():
    ids = [f"client{i}" for i in range(4)]
    agg = secagg_config(ring_bits=16)
    dp = _dp(agg, 4, 100, bits=16)
    xs = {c: dp.client_input(np.full(100, 0.01), 1, 4, c)[0] for c in ids}
    res, errors, _, server_t, _ = run_round(dp.aggregation_for(agg), ids, xs, {c: 1.0 for c in ids})
    assert not errors and np.array_equal(res.total.astype(np.int64), sum(xs[c].astype(np.int64) for c in ids))
    masked = [secagg_pb2.MaskedInput.FromString(p).y for _, tag, p in server_t.received if tag == "agg.masked"]
    assert len(masked) == 4 and all(m.dtype == "<u2" and len(m.data) == 2 * (128 + 2) for m in masked)


@pytest.mark.parametrize("n,survivors", [(10, 10), (10, 6)])
def test_the_summed_noise_variance_is_what_the_survivors_carry(n, survivors):
    """Σ over s survivors of (decoded input − clipped update) has per-coordinate variance γ²·(s·μ/(t−c)) plus at
    most γ²·s/4 of rounding; the sample variance over d' = 2^14 coordinates falls in its 99.9% interval."""
    from secureflhv.secagg import AggregationConfig

    agg = AggregationConfig(kind="secagg", max_colluders=1)
    d = 16384
    dp = _dp(agg, n, d, bits=24, z=2.0, noise_seed=None)
    t = agg.resolve_threshold(n)
    share = dp.plan.variance / (t - 1)
    assert dp.share(n) == pytest.approx(share) and (survivors - 1) * share >= dp.plan.variance * (1 - 1e-12)
    rng = np.random.default_rng(1)
    updates = [rng.normal(0, 1, d) for _ in range(survivors)]
    total = sum(dp.client_input(u, 7, n, f"c{i}")[0] for i, u in enumerate(updates))
    res = AggregateResult(total=total, weight=float(survivors), survivors=[f"c{i}" for i in range(survivors)],
                          dropped={}, n_clipped=0, clip=0, scale=1, k_bits=24)
    new, why = dp.release(np.zeros(d, np.float32), res, 7, n)
    assert why == ""
    clipped = sum(u * min(1.0, 1.0 / np.linalg.norm(u)) for u in updates)
    err = (new.astype(np.float64) * survivors - clipped) / dp.plan.gamma  # back in integer units, unrotated
    # the error is rotated back by an orthogonal map: its coordinates keep the variance (padding aside)
    var = float(np.mean(err ** 2))
    low, high = survivors * share, survivors * share + survivors / 4
    slack = 3.3 * math.sqrt(2 / d)  # chi-square with d degrees of freedom, 99.9% two-sided
    assert low * (1 - slack) <= var <= high * (1 + slack) + survivors * share * 1e-3, (var, low, high)


def test_the_plan_fits_the_ring_and_more_bits_mean_a_finer_scale():
    sizes = [(100, 51)]
    coarse = plan_skellam(1.0, 50_000, 16, sizes, noise_multiplier=1.0)
    fine = plan_skellam(1.0, 50_000, 20, sizes, noise_multiplier=1.0)
    assert fine.gamma < coarse.gamma
    for plan, bits in ((coarse, 16), (fine, 20)):
        d_pad = 1 << (50_000 - 1).bit_length()
        # the rotated signal of 100 clipped inputs (8 sigmas) plus 8 sigmas of the noise of 100 shares fit 2^(k-1)
        signal = 8 * 100 * (1.0 / plan.gamma) / math.sqrt(d_pad) + 100
        noise = 8 * math.sqrt(100 * plan.variance / 51)
        assert signal + noise < 2 ** (bits - 1)
        assert plan.noise_std == pytest.approx(1.0, rel=1e-9)  # z·C in model units
        assert plan.l2_sensitivity == pytest.approx(_kairouz_l2(1.0 / plan.gamma, d_pad), rel=1e-8)  # float margin
    with pytest.raises(ValueError, match="bits: 8 bits per coordinate cannot hold"):
        plan_skellam(1.0, 50_000, 8, [(1000, 501)], noise_multiplier=1.0)
    with pytest.raises(ValueError, match="bits: 40 bits per coordinate need Poisson means"):
        plan_skellam(1.0, 50_000, 40, [(10, 6)], noise_multiplier=1.0)


def test_a_target_epsilon_plan_meets_it():
    plan = plan_skellam(1.0, 2000, 20, [(20, 11)], epsilon=2.0, delta=1e-5, rounds=30)
    eps = _skellam_epsilon([plan.variance] * 30, plan.l2_sensitivity, plan.l1_sensitivity, 1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, abs=1e-3)


def test_the_server_refuses_a_sum_no_clipped_inputs_can_reach():
    from secureflhv.secagg import AggregationConfig

    dp = _dp(AggregationConfig(kind="secagg"), 4, 1000, bits=24)
    honest = sum(dp.client_input(np.full(1000, 5.0), 2, 4, f"c{i}")[0] for i in range(4))
    res = AggregateResult(total=honest, weight=4.0, survivors=["a", "b", "c", "d"], dropped={}, n_clipped=0,
                          clip=0, scale=1, k_bits=24)
    assert dp.release(np.zeros(1000, np.float32), res, 2, 4)[1] == ""
    # the check sees the noised sum only, so it stops gross excesses (an unclipped update, a wrapped ring), not
    # one hidden below the noise's own norm: an input twice the whole sum's bound
    forged = honest.copy()
    forged[:200] += 2 * dp.norm_bound(4, 4) / math.sqrt(200)
    res_bad = AggregateResult(total=forged, weight=4.0, survivors=["a", "b", "c", "d"], dropped={}, n_clipped=0,
                              clip=0, scale=1, k_bits=24)
    new, why = dp.release(np.zeros(1000, np.float32), res_bad, 2, 4)
    assert new is None and "did not clip" in why


DP = {"placement": "distributed", "clip_norm": 0.5, "noise_multiplier": 1.2, "delta": 1e-3, "noise_seed": 7,
      "bits": 20}


def _job(tmp_path: Path, kind="secagg", rounds=3, **dp) -> dict:
    shards = partitioned_blobs(tmp_path / "data", "iid", {}, n_clients=4, n_rows=320)
    return job_dict(shards, {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 6, "n_classes": 4,
                                                             "hidden": [8]},
                             "rounds": rounds, "learning_rate": 0.1, "seed": 1,
                             "aggregation": {"kind": kind, "seed": 3}, "dp": {**DP, **dp}}, tls=True)


def _run(doc: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run_in_process(parse_job(copy.deepcopy(doc), out))
    return out / "out"


def test_a_job_with_distributed_noise_equals_plain_quantised_and_accounts_the_skellam_bound(tmp_path):
    """With the noise seeded, secure aggregation ends where unmasked quantised aggregation of the same encoded
    inputs ends; every round's ε is the Skellam RDP bound of the variances recorded, composed here; the bundle has
    the final (ε, δ) and the mechanism's parameters."""
    doc = _job(tmp_path / "a")
    secure = _run(doc, tmp_path / "a")
    doc["params"]["aggregation"]["kind"] = "plain_quantised"
    plain = _run(doc, tmp_path / "b")
    with np.load(secure / "server" / "global_model.npz") as a, np.load(plain / "server" / "global_model.npz") as b:
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    rounds = json.loads((secure / "server" / "metrics.json").read_text())["rounds"]
    variances = []
    for r, rec in enumerate(rounds, 1):
        p = rec["privacy"]
        assert p["placement"] == "distributed" and p["mechanism"] == "skellam" and p["bits"] == 20
        assert rec["aggregation"]["model"]["k_bits"] == 20
        # 4 clients, max_colluders 1 (the default), t = 3: each adds mu / (t - c) = mu / 2; the 4 survivors carry
        # 2 mu, of which the 3 that may be honest carry 3/2 mu
        assert p["max_colluders"] == 1 and p["survivors"] == 4
        assert p["variance_carried"] == pytest.approx(2 * p["variance"], rel=1e-12)
        assert p["variance_accounted"] == pytest.approx(1.5 * p["variance"], rel=1e-12)
        assert rec["aggregation"]["model"]["scale"] == 1 and rec["aggregation"]["model"]["clip"] == 2 ** 19
        assert p["noise_std"] == pytest.approx(1.2 * 0.5, rel=1e-9)
        variances.append(p["variance_accounted"])
        assert p["epsilon"] == pytest.approx(_skellam_epsilon(variances, p["l2_sensitivity"], p["l1_sensitivity"],
                                                              1e-3), abs=1e-6)
    manifest = json.loads((secure / "server" / "model" / "manifest.json").read_text())
    assert manifest["extra"]["privacy"]["epsilon"] == pytest.approx(rounds[-1]["privacy"]["epsilon"], abs=1e-9)
    client = json.loads((secure / "client-1" / "model" / "manifest.json").read_text())
    assert client["extra"]["privacy"]["epsilon"] >= manifest["extra"]["privacy"]["epsilon"] - 1e-9


def test_the_distributed_job_stops_before_it_would_exceed_the_budget(tmp_path):
    out = _run(_job(tmp_path / "a", kind="plain_quantised", rounds=1), tmp_path / "a")
    p = json.loads((out / "server" / "metrics.json").read_text())["rounds"][0]["privacy"]
    nominal = [p["variance"]] * 3
    budget = (_skellam_epsilon(nominal[:2], p["l2_sensitivity"], p["l1_sensitivity"], 1e-3)
              + _skellam_epsilon(nominal, p["l2_sensitivity"], p["l1_sensitivity"], 1e-3)) / 2
    out = _run(_job(tmp_path / "b", kind="plain_quantised", rounds=5, epsilon_budget=budget), tmp_path / "b")
    rounds = json.loads((out / "server" / "metrics.json").read_text())["rounds"]
    # each round carries 3/2 of the nominal variance, so a third round may still fit: what matters is that the
    # job stopped before the budget was crossed, and not earlier than the nominal plan allows
    assert 2 <= len(rounds) < 5 and rounds[-1]["privacy"]["epsilon"] <= budget


@pytest.mark.parametrize("change,words", [
    ({"aggregation": {"kind": "plain"}}, "params.dp.placement: distributed noise"),
    ({"dp": {**DP, "accountant": "pld"}}, "params.dp.accountant"),
    ({"dp": {**DP, "bits": 4}}, "params.dp.bits"),
])
def test_what_the_distributed_placement_cannot_take_is_refused(tmp_path, change, words):
    doc = _job(tmp_path)
    doc["params"].update(change)
    with pytest.raises(JobConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_job(doc, tmp_path)
