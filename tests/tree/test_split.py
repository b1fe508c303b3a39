"""tree/split.py against hand-computed values (XGBoost, Chen & Guestrin 2016, eqs. 5-7) and its edge cases."""
from fractions import Fraction

import numpy as np
import pytest

from secureflhv.tree.params import SecureBoostParams
from secureflhv.tree.split import beats_gamma, candidate_gains, leaf_weight, split_gain, valid_candidates


def _params(**kw):
    return SecureBoostParams(**kw)


def _exact_gain(GL, HL, G, H, lam):
    """The gain in rationals, written independently of split.py."""
    GL, HL, G, H, lam = map(Fraction, (GL, HL, G, H, lam))
    return (GL ** 2 / (HL + lam) + (G - GL) ** 2 / (H - HL + lam) - G ** 2 / (H + lam)) / 2


def test_gain_matches_hand_computed_values():
    # GR = 0, HR = 2: 1/2 (4/2 + 0/3 - 4/4) = 1/2
    assert split_gain(2.0, 1.0, 2.0, 3.0, 1.0) == 0.5
    # GR = 4, HR = 3, lambda = 0: 1/2 (9/2 + 16/3 - 1/5) = 289/60
    assert split_gain(-3.0, 2.0, 1.0, 5.0, 0.0) == pytest.approx(289 / 60, rel=1e-15)
    assert _exact_gain(-3, 2, 1, 5, 0) == Fraction(289, 60)


def test_vectorised_gain_is_the_scalar_gain_bit_for_bit():
    rng = np.random.default_rng(0)
    GL, HL = rng.normal(size=50), rng.uniform(0, 4, size=50)
    G, H, lam = 1.25, 5.0, 0.75
    vec = split_gain(GL, HL, G, H, lam)
    assert vec.dtype == np.float64 and vec.shape == (50,)
    assert [float(v) for v in vec] == [split_gain(float(a), float(b), G, H, lam) for a, b in zip(GL, HL)]
    assert np.allclose(vec, [float(_exact_gain(a, b, G, H, lam)) for a, b in zip(GL, HL)], rtol=1e-12, atol=1e-12)


def test_leaf_weight_is_minus_eta_g_over_h_plus_lambda():
    p = _params(learning_rate=0.5, reg_lambda=1.0)
    assert leaf_weight(2.0, 3.0, p) == -0.25
    assert leaf_weight(-6.0, 2.0, p) == 1.0
    np.testing.assert_array_equal(leaf_weight(np.array([2.0, -6.0]), np.array([3.0, 2.0]), p), [-0.25, 1.0])


def test_min_child_weight_is_inclusive_on_both_sides():
    mcw, H = 2.0, 5.0
    below = np.nextafter(mcw, 0.0)
    HL = np.array([below, mcw, 2.5, H - mcw, np.nextafter(H - mcw, H)])
    np.testing.assert_array_equal(valid_candidates(HL, H, mcw), [False, True, True, True, False])


def test_counts_reject_an_empty_bin_and_an_empty_right_child():
    HL = np.array([1.0, 1.0, 2.0, 3.0])        # cumulative over bins 0..3 (bin 1 empty, bin 4 last)
    counts = np.array([2, 0, 3, 1, 0])         # bin 4 empty: candidate 3 leaves no row right
    np.testing.assert_array_equal(valid_candidates(HL, 10.0, 0.0, counts, 6), [True, False, True, False])
    # the node's count, not the histogram's, decides the right child (a client gone since the parent)
    np.testing.assert_array_equal(valid_candidates(HL, 10.0, 0.0, counts, 7), [True, False, True, True])


def test_candidate_gains_mask_invalid_and_say_none_when_nothing_is_valid():
    p = _params(reg_lambda=1.0, min_child_weight=1.0)
    GL, HL = np.array([2.0, -1.0, 0.5]), np.array([0.5, 1.0, 2.0])
    gain = candidate_gains(GL, HL, 1.0, 3.0, p)
    assert gain[0] == -np.inf                  # H_L = 0.5 < 1
    assert gain[1] == split_gain(-1.0, 1.0, 1.0, 3.0, 1.0) and gain[2] == split_gain(0.5, 2.0, 1.0, 3.0, 1.0)
    assert int(np.argmax(gain)) == 1           # the first maximum is the best
    assert candidate_gains(GL, HL, 1.0, 1.8, p) is None    # no child pair reaches min_child_weight
    assert candidate_gains(GL, np.array([1.0, 1.0, 1.0]), 1.0, 3.0, p, np.array([0, 2, 0, 0]), 2) is None


def test_ties_keep_the_first_candidate():
    p = _params(reg_lambda=1.0, min_child_weight=0.0)
    gain = candidate_gains(np.array([1.0, 1.0]), np.array([1.0, 1.0]), 2.0, 4.0, p)
    assert gain[0] == gain[1] and int(np.argmax(gain)) == 0


def test_gamma_must_be_strictly_beaten():
    p = _params(gamma=0.5)
    assert not beats_gamma(0.5, p)
    assert beats_gamma(np.nextafter(0.5, 1.0), p)
    assert not beats_gamma(float("nan"), p)
    assert beats_gamma(1e-300, _params(gamma=0.0)) and not beats_gamma(0.0, _params(gamma=0.0))


def test_zero_denominator_is_not_guarded():
    """H + lambda = 0 (lambda = 0, zero hessian sum) is not guarded: Python floats raise, arrays give inf."""
    p = _params(reg_lambda=0.0)
    with pytest.raises(ZeroDivisionError):
        leaf_weight(1.0, 0.0, p)
    with np.errstate(divide="ignore", invalid="ignore"):
        with pytest.raises(ZeroDivisionError):   # the G^2 / (H + lambda) term, in Python floats
            split_gain(np.array([0.0]), np.array([0.0]), 1.0, 0.0, 0.0)
        assert leaf_weight(np.array([1.0]), np.array([0.0]), p)[0] == -np.inf
        # an empty left child (H_L = 0) under lambda = 0 gives a NaN / inf gain, not an error
        assert np.isnan(split_gain(np.array([0.0]), np.array([0.0]), 1.0, 2.0, 0.0)[0])
