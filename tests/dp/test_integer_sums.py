"""Distributed Skellam noise on exact integer sums (secureflhv/dp/integer_sums.py, issue 38): ε of the composed
releases equals the Skellam RDP bound written out here with numpy and dp-accounting's conversion; calibration
meets its target; the summed noise's variance is within its confidence interval for the survivors, with and
without dropouts; a release carrying less than the plan is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import compute_epsilon

from secureflhv.dp.integer_sums import SumAccountant, SumNoisePlan, SumRelease

ORDERS = list(range(2, 64)) + list(range(64, 257, 8)) + [320, 384, 512, 768, 1024]


def _skellam_epsilon(entries, delta) -> float:
    """Agarwal, Kairouz, Liu (NeurIPS 2021) Thm. 3.5 per release (variance v, Δ2, Δ1), summed, then converted."""
    a = np.array(ORDERS, float)
    rdp = sum(a * l2 ** 2 / (2 * v) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * v ** 2), 3 * l1 / (2 * v))
              for v, l2, l1 in entries)
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


COUNTS = SumRelease("counts", 12, math.sqrt(7), 7.0)
MOMENTS = SumRelease("sum_q", 3, 2 ** 6 * math.sqrt(3), 3 * 2 ** 6)


def test_epsilon_is_the_skellam_rdp_bound_of_the_releases_at_their_carried_variance():
    plan = SumNoisePlan(1.5, 1e-6, (COUNTS, MOMENTS))
    acc = SumAccountant(plan)
    # 5 selected, t = 4, c = 1: honest_min 3; 5 survivors carry (5 - 1) / 3 of mu, 4 survivors exactly mu
    acc.step(COUNTS, plan.honest_variance(COUNTS, 5, 3, 1))
    acc.step(MOMENTS, plan.honest_variance(MOMENTS, 4, 3, 1))
    mu_c, mu_m = (1.5 * math.sqrt(7)) ** 2, (1.5 * 2 ** 6 * math.sqrt(3)) ** 2
    want = _skellam_epsilon([(mu_c * 4 / 3, math.sqrt(7), 7.0), (mu_m, 2 ** 6 * math.sqrt(3), 3 * 2 ** 6)], 1e-6)
    assert acc.epsilon() == pytest.approx(want, rel=1e-12)
    rec = acc.record()
    assert rec["unit"] == "record" and rec["epsilon"] == acc.epsilon()
    assert [r["variance_accounted"] for r in rec["releases"]] == pytest.approx([mu_c * 4 / 3, mu_m])
    # more noise carried than planned: the recorded ε is below the planned one
    assert rec["epsilon"] < rec["planned_epsilon"] == pytest.approx(
        _skellam_epsilon([(mu_c, math.sqrt(7), 7.0), (mu_m, 2 ** 6 * math.sqrt(3), 3 * 2 ** 6)], 1e-6))


@pytest.mark.parametrize("target", [0.5, 4.0])
def test_calibration_meets_the_target_and_is_tight(target):
    plan = SumNoisePlan.calibrate((COUNTS, MOMENTS, MOMENTS), 1e-5, epsilon=target)
    z = plan.noise_multiplier

    def eps(zz):
        return _skellam_epsilon([((zz * r.l2_sensitivity) ** 2, r.l2_sensitivity, r.l1_sensitivity)
                                 for r in (COUNTS, MOMENTS, MOMENTS)], 1e-5)
    assert eps(z) <= target < eps(z * (1 - 1e-5))
    assert SumNoisePlan.calibrate((COUNTS,), 1e-5, noise_multiplier=2.0).noise_multiplier == 2.0


@pytest.mark.parametrize("survivors", [6, 4])
def test_summed_noise_variance_is_within_its_confidence_interval(survivors):
    """6 selected, t = 4, c = 1: every client adds mu / 3; the survivors' sum has variance survivors * mu / 3."""
    release = SumRelease("h", 40_000, 3.0, 9.0)
    plan = SumNoisePlan(2.0, 1e-5, (release,))
    rng = np.random.default_rng(11)
    total = sum(plan.noise(release, 3, rng) for _ in range(survivors))
    assert total.dtype == np.int64
    want = survivors * 36.0 / 3
    # the sample variance of 40k draws has relative std sqrt(2 / 40k) (+ Skellam's excess kurtosis 1 / V)
    assert abs(total.var() / want - 1) < 5 * math.sqrt((2 + 1 / want) / 40_000)
    assert abs(total.mean()) < 5 * math.sqrt(want / 40_000)
    assert plan.honest_variance(release, survivors, 3, 1) >= plan.variance(release)


def test_os_entropy_noise_differs_and_seeded_noise_repeats():
    plan = SumNoisePlan(1.0, 1e-5)
    a, b = plan.noise(COUNTS, 2), plan.noise(COUNTS, 2)
    assert a.shape == (12,) and not np.array_equal(a, b)
    seeded = [plan.noise(COUNTS, 2, np.random.default_rng(3)) for _ in range(2)]
    assert np.array_equal(*seeded)


def test_refusals():
    plan = SumNoisePlan(1.0, 1e-5, (COUNTS,))
    acc = SumAccountant(plan)
    with pytest.raises(ValueError, match="carried variance"):
        acc.step(COUNTS, plan.variance(COUNTS) * 0.9)
    with pytest.raises(ValueError, match="t - c"):
        plan.share(COUNTS, 0)
    with pytest.raises(ValueError, match="sampler"):
        SumNoisePlan(1.0, 1e-5).share(SumRelease("big", 1, 2.0 ** 24, 2.0 ** 24), 1)
    with pytest.raises(ValueError, match="l1_sensitivity"):
        SumRelease("x", 4, 2.0, 1.0)
    with pytest.raises(ValueError, match="one of"):
        SumNoisePlan.calibrate((COUNTS,), 1e-5)
    # Δ1 above sqrt(dim) Δ2 is cut to it (Cauchy-Schwarz)
    assert SumRelease("x", 4, 2.0, 100.0).l1_sensitivity == 4.0
