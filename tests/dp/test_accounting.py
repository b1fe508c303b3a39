"""secureflhv.dp.accounting against the libraries it delegates to, built here independently.

The reference ε values come from ``dp_accounting`` events and accountants, and from Opacus's ``RDPAccountant``
stepped one step at a time, all constructed in this file; the library helpers are never used to build them.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant, compute_epsilon

from secureflhv.dp import (
    SKELLAM_ORDERS,
    ClientLevelAccountant,
    SkellamAccountant,
    dpsgd_epsilon,
    noise_multiplier_for,
    skellam_epsilon,
    skellam_rdp,
    skellam_variance_for,
)

DELTA = 1e-5


def reference_epsilon(z, q, amplified, rounds, kind="rdp", delta=DELTA):
    """ε of ``rounds`` DP-FedAvg rounds, straight from dp_accounting (composed with ``count``, not a
    SelfComposedDpEvent, so the path differs from the module's)."""
    event = dp_accounting.GaussianDpEvent(z)
    if amplified:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    acc = RdpAccountant() if kind == "rdp" else PLDAccountant()
    acc.compose(event, rounds)
    return acc.get_epsilon(delta)


# ------------------------------------------------------------------------------------------ client level
@pytest.mark.parametrize("z, q, amplified, rounds", [
    (1.1, 0.01, True, 1000), (0.8, 0.2, True, 30), (2.0, 1.0, False, 50), (1.0, 0.1, False, 7), (5.0, 1.0, True, 1)])
def test_client_rdp_epsilon_equals_dp_accounting(z, q, amplified, rounds):
    acc = ClientLevelAccountant(z, clip_norm=0.7, sampling_rate=q, amplification=amplified)
    expected = reference_epsilon(z, q, amplified and q < 1, rounds)
    assert acc.epsilon(DELTA, rounds) == pytest.approx(expected, abs=1e-6)
    acc.step(rounds - 1)
    acc.step()
    assert acc.rounds == rounds and acc.epsilon(DELTA) == pytest.approx(expected, abs=1e-6)
    assert ClientLevelAccountant(z, 0.7, q, amplified).epsilon(DELTA) == 0.0  # no round released yet


@pytest.mark.parametrize("z, q, amplified, rounds", [(1.0, 0.05, True, 40), (3.0, 1.0, False, 10)])
def test_client_pld_epsilon_equals_dp_accounting(z, q, amplified, rounds):
    acc = ClientLevelAccountant(z, 1.0, q, amplified, accountant="pld")
    expected = reference_epsilon(z, q, amplified, rounds, kind="pld")
    assert acc.epsilon(DELTA, rounds) == pytest.approx(expected, abs=1e-6)
    # PLD is tighter than the RDP conversion, and the per-call override reaches the RDP path
    assert acc.epsilon(DELTA, rounds) < acc.epsilon(DELTA, rounds, accountant="rdp")
    assert acc.epsilon(DELTA, rounds, accountant="rdp") == pytest.approx(
        reference_epsilon(z, q, amplified, rounds), abs=1e-6)


def test_amplification_off_gives_larger_epsilon_and_ignores_q():
    on = ClientLevelAccountant(1.0, 1.0, sampling_rate=0.1, amplification=True)
    off = ClientLevelAccountant(1.0, 1.0, sampling_rate=0.1, amplification=False)
    for rounds in (1, 10, 100):
        assert off.epsilon(DELTA, rounds) > on.epsilon(DELTA, rounds) * 1.5
        # without amplification the sampled rate plays no part: every round is the full Gaussian mechanism
        assert off.epsilon(DELTA, rounds) == pytest.approx(reference_epsilon(1.0, 1.0, False, rounds), abs=1e-6)


def test_record_is_json_ready_and_complete():
    import json

    acc = ClientLevelAccountant(1.2, 0.5, 0.3, amplification=True, accountant="rdp")
    acc.step(12)
    rec = json.loads(json.dumps(acc.record(DELTA)))
    assert rec == {"mechanism": "gaussian", "unit": "client", "noise_multiplier": 1.2, "clip_norm": 0.5,
                   "noise_std": pytest.approx(0.6), "sampling_rate": 0.3, "amplification": True, "rounds": 12,
                   "epsilon": pytest.approx(reference_epsilon(1.2, 0.3, True, 12), abs=1e-6), "delta": DELTA,
                   "accountant": "rdp"}


# ------------------------------------------------------------------------------------------ calibration
@pytest.mark.parametrize("q, amplified, rounds", [(0.05, True, 200), (1.0, False, 20)])
def test_noise_multiplier_for_meets_target_within_tolerance(q, amplified, rounds):
    tol = 1e-5
    zs = []
    for target in (1.0, 2.0, 4.0, 8.0):
        z = noise_multiplier_for(target, DELTA, rounds, q, amplified, tol=tol)
        eps = reference_epsilon(z, q, amplified, rounds)
        # z is within tol above the exact z*: ε(z) ≤ target ≤ ε(z - tol)
        assert eps <= target + 1e-12
        assert reference_epsilon(z - tol, q, amplified, rounds) >= target
        assert eps == pytest.approx(target, rel=1e-3)
        zs.append(z)
    assert all(a > b for a, b in zip(zs, zs[1:])), f"z not decreasing in ε: {zs}"


def test_noise_multiplier_for_pld_is_tighter_than_rdp():
    z_pld = noise_multiplier_for(4.0, DELTA, 10, accountant="pld", tol=1e-4)
    z_rdp = noise_multiplier_for(4.0, DELTA, 10, accountant="rdp", tol=1e-4)
    eps = reference_epsilon(z_pld, 1.0, False, 10, kind="pld")
    assert eps <= 4.0 and eps == pytest.approx(4.0, rel=1e-3)
    assert z_pld < z_rdp


def test_noise_multiplier_for_reports_a_target_met_without_noise():
    # RDP gives ε ≈ 5.5e5 for one round at z = 1e-3; a target above that needs no noise worth calibrating
    with pytest.raises(ValueError, match="epsilon=1000000.0"):
        noise_multiplier_for(1e6, DELTA, 1)


# ------------------------------------------------------------------------------------------ budget stop
def test_budget_stop_flips_at_the_right_round():
    budget = 4.0
    acc = ClientLevelAccountant(3.0, 1.0)
    last = acc.rounds_within(budget, DELTA)
    assert last > 5  # the parameters give a non-trivial run
    assert reference_epsilon(3.0, 1.0, False, last) <= budget < reference_epsilon(3.0, 1.0, False, last + 1)
    assert not acc.would_exceed(budget, DELTA, next_round=last)
    assert acc.would_exceed(budget, DELTA, next_round=last + 1)
    ran = 0  # a job loop: check before each round, stop before the one that would exceed
    while not acc.would_exceed(budget, DELTA):
        acc.step()
        ran += 1
    assert ran == last and acc.epsilon(DELTA) <= budget


def test_rounds_within_zero_and_cap():
    acc = ClientLevelAccountant(0.5, 1.0)
    assert acc.rounds_within(reference_epsilon(0.5, 1.0, False, 1) * 0.99, DELTA) == 0
    assert acc.would_exceed(reference_epsilon(0.5, 1.0, False, 1) * 0.99, DELTA)
    assert ClientLevelAccountant(1e4, 1.0).rounds_within(1.0, DELTA, max_rounds=1000) == 1000


def test_rounds_within_with_subsampling_matches_a_linear_scan():
    acc = ClientLevelAccountant(1.0, 1.0, 0.1, amplification=True)
    last = acc.rounds_within(3.0, DELTA)
    eps = [reference_epsilon(1.0, 0.1, True, k) for k in range(1, last + 2)]
    assert eps[last - 1] <= 3.0 < eps[last]


# ------------------------------------------------------------------------------------------ record level (Opacus)
@pytest.mark.parametrize("z, q, steps", [(1.1, 0.01, 1000), (0.9, 0.004, 2500), (2.0, 0.05, 300)])
def test_dpsgd_epsilon_equals_opacus_and_dp_accounting(z, q, steps):
    from opacus.accountants import RDPAccountant

    opacus_acc = RDPAccountant()
    for _ in range(steps):
        opacus_acc.step(noise_multiplier=z, sample_rate=q)
    ours = dpsgd_epsilon(z, q, steps, DELTA)
    assert ours == pytest.approx(opacus_acc.get_epsilon(DELTA), abs=1e-6)
    google = RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
    google.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    # same orders, same conversion formula; see the next test for where the two RDP curves differ
    assert ours == pytest.approx(google.get_epsilon(DELTA), abs=1e-6)


def test_opacus_and_dp_accounting_rdp_differ_only_at_fractional_orders():
    """Why the two ε can differ at all: at integer orders both evaluate the same finite sum for A_α (Mironov,
    Talwar, Zhang 2019, Section 3.2), at fractional orders both sum the infinite series of Section 3.3, but
    Opacus keeps the signs of the generalised binomial coefficients while dp_accounting sums their absolute
    values (an upper bound). So dp_accounting's RDP is never below Opacus's and the two match at integers."""
    from opacus.accountants.analysis.rdp import compute_rdp

    z, q, orders = 1.1, 0.01, [1.5, 2, 3, 4.5, 8, 9.6, 16, 32]
    theirs = np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=1, orders=orders))
    google = RdpAccountant(orders=orders)
    google.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    integer = np.array([float(a).is_integer() for a in orders])
    np.testing.assert_allclose(google.rdp[integer], theirs[integer], rtol=1e-9)
    assert np.all(google.rdp >= theirs * (1 - 1e-12))


# ------------------------------------------------------------------------------------------ Skellam
def test_skellam_rdp_transcribes_the_theorem():
    # μ = 100, Δ2 = 2, Δ1 = 4, α = 3: 3·4/200 + min((5·4 + 24)/40000, 3·4/200) = 0.06 + 0.0011
    assert skellam_rdp(100.0, 2.0, 4.0, orders=[3])[0] == pytest.approx(0.0611, rel=1e-12)
    # small μ: the second branch of the min, 3Δ1/(2μ)
    assert skellam_rdp(1.0, 1.0, 1.0, orders=[2])[0] == pytest.approx(2 / 2 + 3 / 2, rel=1e-12)


def test_skellam_epsilon_decreases_in_variance_and_composes_by_adding_rdp():
    mus = [1e2, 1e3, 1e4, 1e5, 1e6]
    eps = [skellam_epsilon(mu, 30.0, 300.0, DELTA, rounds=5) for mu in mus]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps
    one = skellam_rdp(1e4, 30.0, 300.0)
    assert eps[2] == pytest.approx(compute_epsilon(list(SKELLAM_ORDERS), 5 * one, DELTA)[0], abs=1e-9)


@pytest.mark.parametrize("z", [0.8, 1.5, 4.0])
def test_skellam_approaches_the_gaussian_with_the_same_sensitivity_to_std_ratio(z):
    """Sanity check: at std/Δ2 = z fixed, the discreteness surcharge is O(1/μ) relative, so Skellam's ε tends to
    the Gaussian's (computed by dp_accounting at the same integer orders and the same conversion) from above;
    within 1e-3 relative at μ = 1e8."""
    rounds, dim = 10, 10_000
    gauss = RdpAccountant(orders=SKELLAM_ORDERS)
    gauss.compose(dp_accounting.GaussianDpEvent(z), rounds)
    target = gauss.get_epsilon(DELTA)
    gaps = []
    for mu in (1e4, 1e6, 1e8):
        d2 = math.sqrt(mu) / z
        eps = skellam_epsilon(mu, d2, d2 * math.sqrt(dim), DELTA, rounds)
        assert eps >= target - 1e-12
        gaps.append((eps - target) / target)
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3, gaps


def test_skellam_accountant_uses_the_variance_the_survivors_carried():
    acc = SkellamAccountant(1e4, 30.0, 300.0)
    acc.step()
    acc.step(variance=2e4)  # more survivors than the threshold: more noise than calibrated
    acc.step(variance=1.5e4)
    rdp = sum(skellam_rdp(mu, 30.0, 300.0) for mu in (1e4, 2e4, 1.5e4))
    expected = compute_epsilon(list(SKELLAM_ORDERS), rdp, DELTA)[0]
    assert acc.epsilon(DELTA) == pytest.approx(expected, abs=1e-9)
    assert acc.epsilon(DELTA) < skellam_epsilon(1e4, 30.0, 300.0, DELTA, rounds=3)
    assert acc.epsilon(DELTA, 1) == pytest.approx(skellam_epsilon(1e4, 30.0, 300.0, DELTA), abs=1e-9)
    rec = acc.record(DELTA)
    assert rec["mechanism"] == "skellam" and rec["rounds"] == 3 and rec["min_variance_carried"] == 1e4
    with pytest.raises(ValueError, match="variance"):
        acc.step(variance=5e3)


def test_skellam_budget_and_calibration():
    budget = 3.0
    acc = SkellamAccountant(2e4, 30.0, 300.0)
    last = acc.rounds_within(budget, DELTA)
    assert last > 1
    assert skellam_epsilon(2e4, 30.0, 300.0, DELTA, last) <= budget < skellam_epsilon(2e4, 30.0, 300.0, DELTA, last + 1)
    assert not acc.would_exceed(budget, DELTA, last) and acc.would_exceed(budget, DELTA, last + 1)
    mu = skellam_variance_for(budget, DELTA, 20, 30.0, 300.0, rtol=1e-6)
    assert skellam_epsilon(mu, 30.0, 300.0, DELTA, 20) <= budget
    assert skellam_epsilon(mu / (1 + 2e-6), 30.0, 300.0, DELTA, 20) > budget


# ------------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("call, name", [
    (lambda: ClientLevelAccountant(1.0, 1.0).epsilon(1.0, 3), "delta"),
    (lambda: ClientLevelAccountant(1.0, 1.0).epsilon(1.5, 3), "delta"),
    (lambda: ClientLevelAccountant(1.0, 1.0).epsilon(0.0, 3), "delta"),
    (lambda: ClientLevelAccountant(0.0, 1.0), "noise_multiplier"),
    (lambda: ClientLevelAccountant(-1.0, 1.0), "noise_multiplier"),
    (lambda: ClientLevelAccountant(1.0, 0.0), "clip_norm"),
    (lambda: ClientLevelAccountant(1.0, 1.0, sampling_rate=0.0), "sampling_rate"),
    (lambda: ClientLevelAccountant(1.0, 1.0, sampling_rate=1.5), "sampling_rate"),
    (lambda: ClientLevelAccountant(1.0, 1.0, accountant="moments"), "accountant"),
    (lambda: ClientLevelAccountant(1.0, 1.0).epsilon(DELTA, -1), "rounds"),
    (lambda: ClientLevelAccountant(1.0, 1.0).would_exceed(0.0, DELTA), "budget_epsilon"),
    (lambda: ClientLevelAccountant(1.0, 1.0).rounds_within(1.0, 1.0), "delta"),
    (lambda: noise_multiplier_for(1.0, 1.0, 10), "delta"),
    (lambda: noise_multiplier_for(0.0, DELTA, 10), "epsilon"),
    (lambda: noise_multiplier_for(1.0, DELTA, 10, sampling_rate=2.0), "sampling_rate"),
    (lambda: noise_multiplier_for(1.0, DELTA, 0), "rounds"),
    (lambda: dpsgd_epsilon(0.0, 0.01, 10, DELTA), "noise_multiplier"),
    (lambda: dpsgd_epsilon(1.0, 0.0, 10, DELTA), "sample_rate"),
    (lambda: dpsgd_epsilon(1.0, 1.01, 10, DELTA), "sample_rate"),
    (lambda: dpsgd_epsilon(1.0, 0.01, 10, 1.0), "delta"),
    (lambda: skellam_epsilon(1e4, 1.0, 1.0, 1.0), "delta"),
    (lambda: skellam_rdp(0.0, 1.0, 1.0), "variance"),
    (lambda: skellam_rdp(1e4, -1.0, 1.0), "l2_sensitivity"),
    (lambda: skellam_rdp(1e4, 2.0, 1.0), "l1_sensitivity"),
    (lambda: skellam_rdp(1e4, 1.0, 1.0, orders=[1.5, 2]), "orders"),
])
def test_bad_inputs_raise_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
