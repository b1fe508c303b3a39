"""Distributed-DP client mechanism (secureflhv.dp.mechanisms): clipping, the randomised Hadamard rotation,
conditional randomised rounding, the Skellam sampler against its pmf, dropout-robust noise calibration, the
ring size and the server's decode. Twins are plain numpy/scipy (scipy.linalg.hadamard, scipy.stats.skellam)."""
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from secureflhv.dp import mechanisms as m

Z999 = scipy.stats.norm.ppf(0.9995)  # two-sided 99.9%
Z99 = scipy.stats.norm.ppf(0.995)  # two-sided 99%


def _variance_ci(sample: np.ndarray, z: float) -> tuple[float, float]:
    """Asymptotic CI of the variance: sqrt(n) (s^2 - sigma^2) -> N(0, mu_4 - sigma^4), any distribution."""
    c = sample - sample.mean()
    s2, m4 = float(np.mean(c ** 2)), float(np.mean(c ** 4))
    half = z * math.sqrt((m4 - s2 * s2) / sample.size)
    return s2 - half, s2 + half


# -- clipping -------------------------------------------------------------------------------------------


def test_clip_l2_scales_down_to_the_bound_and_says_so():
    x = np.array([3.0, 4.0, 0.0])
    y, clipped = m.clip_l2(x, 2.0)
    assert clipped and y.dtype == np.float64
    assert np.linalg.norm(y) == pytest.approx(2.0, rel=1e-12) and np.linalg.norm(y) <= 2.0 * (1 + 1e-15)
    np.testing.assert_allclose(y, x * 0.4)  # same direction
    z, clipped = m.clip_l2(x, 5.0)
    assert not clipped and np.array_equal(z, x) and z is not x
    big, clipped = m.clip_l2(np.full(4, 1e300), 1.0)  # the naive norm would overflow to inf
    assert clipped and np.allclose(big, 0.5)
    for bad_x, bad_c in ((x, 0.0), (x, math.inf), (np.array([1.0, math.nan]), 1.0), (np.ones((2, 2)), 1.0)):
        with pytest.raises(ValueError):
            m.clip_l2(bad_x, bad_c)


# -- rotation ---------------------------------------------------------------------------------------------


def test_rotation_equals_the_hadamard_matrix_twin_and_is_orthogonal():
    n, seed = 64, (7, 3)
    signs = np.random.default_rng(seed).integers(0, 2, size=n, dtype=np.int8) * 2.0 - 1.0  # the documented D
    twin = scipy.linalg.hadamard(n) @ np.diag(signs) / math.sqrt(n)
    x = np.random.default_rng(0).normal(size=50)  # padded with zeros to 64
    np.testing.assert_allclose(m.rotate(x, seed), twin[:, :50] @ x, atol=1e-12)
    rows = m.rotate(np.eye(n), seed)  # row i = R e_i, so rows = R^T
    np.testing.assert_allclose(rows @ rows.T, np.eye(n), atol=1e-12)
    assert np.allclose(np.abs(rows), 1 / math.sqrt(n))
    spike = np.zeros(n)
    spike[5] = 3.0
    np.testing.assert_allclose(np.abs(m.rotate(spike, seed)), 3.0 / math.sqrt(n))  # flattened evenly


@pytest.mark.parametrize("d", [1, 2, 3, 1000, 4096])
def test_rotation_round_trip_keeps_norm_and_pads_to_a_power_of_two(d):
    x = np.random.default_rng(d).normal(size=d)
    seed = m.rotation_seed(11, 4)
    y = m.rotate(x, seed)
    assert y.shape == (m.padded_dim(d),) and m.padded_dim(d) >= d > m.padded_dim(d) // 2
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    np.testing.assert_allclose(m.unrotate(y, seed, d), x, atol=1e-12)
    np.testing.assert_allclose(m.unrotate(y, seed)[d:], 0.0, atol=1e-12)  # the padding comes back as zeros
    if d >= 3:
        assert not np.allclose(m.unrotate(y, m.rotation_seed(11, 5), d), x)  # another round: another rotation


def test_rotation_seed_is_public_and_per_round_and_refuses_generators():
    assert m.rotation_seed(1, 2) == m.rotation_seed(1, 2) != m.rotation_seed(1, 3) != m.rotation_seed(1, 2, 1)
    x = np.arange(8.0)
    assert np.array_equal(m.rotate(x, m.rotation_seed(1, 2)), m.rotate(x, m.rotation_seed(1, 2)))
    with pytest.raises(ValueError):
        m.rotation_seed(-1, 0)
    for bad in (None, np.random.default_rng(0)):
        with pytest.raises(TypeError):
            m.rotate(x, bad)
    with pytest.raises(ValueError):
        m.unrotate(np.ones(6), 1)  # not a power of two


# -- conditional randomised rounding ----------------------------------------------------------------------


def test_l2_bound_formula_and_sensitivity():
    c, gamma, d, beta = 1.0, 1 / 16, 256, m.BETA
    s = c / gamma
    expected = min(s + 16, math.sqrt(s * s + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (s + 8)))
    assert m.l2_bound(c, gamma, d, beta) == pytest.approx(expected) and expected < s + 16
    assert m.l2_bound(c, gamma, d, 0.0) == s + 16
    l1, l2 = m.sensitivity(c, gamma, d, beta)
    assert l2 == pytest.approx(expected) and l1 == pytest.approx(min(l2 * l2, 16 * l2)) and l1 >= l2
    with pytest.raises(ValueError):
        m.l2_bound(c, gamma, d, 1.0)


@pytest.mark.parametrize("beta", [m.BETA, 0.0])
def test_conditional_rounding_keeps_the_bound_and_is_unbiased(beta):
    d, clip, gamma, draws = 64, 1.0, 1 / 8, 4000
    v = np.random.default_rng(1).normal(size=d)
    v *= clip / np.linalg.norm(v)  # at the clip bound: where the conditioning rejects most
    rng = m.noise_rng(2)
    bound = m.l2_bound(clip, gamma, d, beta)
    out, tries = zip(*(m.scale_and_round(v, gamma, beta, rng, clip=clip) for _ in range(draws)))
    out = np.array(out)
    assert out.dtype == np.int64 and out.shape == (draws, d)
    assert np.linalg.norm(out, axis=1).max() <= bound
    assert np.all(np.abs(out - v / gamma) < 1)  # each coordinate is a floor or a ceiling
    assert min(tries) == 1 and (beta > 0 or max(tries) == 1)
    # unbiased per coordinate within a Bonferroni 99.9% CI (the conditioning's pull towards 0 is of order
    # P(reject) ~ 1% of a step here, far below this resolution: Kairouz et al. 2021, Sec. 4.1)
    se = out.std(axis=0, ddof=1) / math.sqrt(draws)
    z = scipy.stats.norm.ppf(1 - 0.001 / (2 * d))
    assert np.all(np.abs(out.mean(axis=0) - v / gamma) <= z * se + 1e-12)


def test_conditional_rounding_refuses_unclipped_input_and_gives_up_after_max_tries():
    class AlwaysUp:  # a "generator" that rounds every coordinate up: never within the bound below
        def random(self, n):
            return np.zeros(n)

    v = np.full(64, 0.5)  # norm 4; rounded up: norm 8 > l2_bound(4, 1, 64) ~ 6.4
    with pytest.raises(RuntimeError, match="3 times"):
        m.scale_and_round(v, 1.0, m.BETA, AlwaysUp(), 3, clip=4.0)
    r, tries = m.scale_and_round(v, 1.0, 0.0, AlwaysUp(), 3, clip=4.0)  # beta = 0: the deterministic bound
    assert tries == 1 and np.all(r == 1)
    with pytest.raises(ValueError, match="exceeds clip"):
        m.scale_and_round(v, 1.0, m.BETA, m.noise_rng(0), clip=3.9)


# -- Skellam noise ----------------------------------------------------------------------------------------


def _gof_pvalue(sample: np.ndarray, mu: float) -> float:
    """Chi-square goodness of fit against scipy's Skellam pmf; tails pooled so every bin expects >= 5."""
    dist = scipy.stats.skellam(mu / 2, mu / 2)
    n = sample.size
    lo, hi = int(dist.ppf(5 / n)), int(dist.isf(5 / n))
    inner = np.arange(lo + 1, hi)
    expected = np.concatenate([[dist.cdf(lo)], dist.pmf(inner), [dist.sf(hi - 1)]]) * n
    observed = np.concatenate([[np.sum(sample <= lo)], [np.sum(sample == k) for k in inner], [np.sum(sample >= hi)]])
    assert observed.sum() == n and expected.min() >= 4.9
    return scipy.stats.chisquare(observed, expected * n / expected.sum()).pvalue


@pytest.mark.parametrize("mu", [0.6, 7.0, 40.0])  # lambda = mu/2 on both of numpy's Poisson branches
def test_skellam_sampler_fits_its_pmf_mean_and_variance(mu):
    sample = m.skellam_noise(mu, 40_000, m.noise_rng(123))
    assert sample.dtype == np.int64 and sample.shape == (40_000,)
    assert _gof_pvalue(sample, mu) > 0.001
    assert abs(sample.mean()) <= Z999 * math.sqrt(mu / sample.size)
    low, high = _variance_ci(sample.astype(float), Z999)
    assert low <= mu <= high


def test_skellam_secure_mode_draws_a_fresh_os_seeded_generator_per_call(monkeypatch):
    a, b = m.skellam_noise(10.0, 1000, secure=True), m.skellam_noise(10.0, 1000, secure=True)
    assert not np.array_equal(a, b)
    seeds = iter(range(1, 100))
    monkeypatch.setattr(m.secrets, "randbits", lambda bits: next(seeds))  # pin the OS seed: reproducible fit
    sample = m.skellam_noise(7.0, 40_000, secure=True)
    assert np.array_equal(sample, m.skellam_noise(7.0, 40_000, np.random.default_rng(1)))  # PCG64(seed 1)
    assert _gof_pvalue(sample, 7.0) > 0.001
    assert np.array_equal(m.skellam_noise(0.0, 5, m.noise_rng(0)), np.zeros(5))
    with pytest.raises(ValueError):
        m.skellam_noise(1.0, 5, m.noise_rng(0), secure=True)
    with pytest.raises(ValueError):
        m.skellam_noise(1.0, 5)
    with pytest.raises(ValueError):
        m.skellam_noise(-1.0, 5, m.noise_rng(0))


def test_noise_rng_is_reproducible_only_when_seeded():
    assert np.array_equal(m.noise_rng(5).integers(0, 1 << 62, 4), m.noise_rng(5).integers(0, 1 << 62, 4))
    assert not np.array_equal(m.noise_rng().integers(0, 1 << 62, 4), m.noise_rng().integers(0, 1 << 62, 4))


def test_skellam_tail_bound_holds_and_is_not_vacuous():
    for mu in (0.5, 4.0, 100.0, 1e4):
        for k in (1.0, 3.0, 6.0, 10.0):
            a = k * math.sqrt(mu)
            exact = scipy.stats.skellam(mu / 2, mu / 2).sf(math.ceil(a) - 1)  # P(Y >= a)
            bound = m.skellam_tail(a, mu)
            assert exact <= bound * (1 + 1e-9) and bound <= 1.0
            assert exact == 0.0 or bound <= 200 * exact  # within a modest factor of the truth
            assert mu < 100 or bound <= math.exp(-0.45 * k * k)  # close to the Gaussian exp(-k^2/2) for large mu


# -- dropout-robust calibration ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_clients, threshold, survivors", [
    (6, 6, 6),  # n = t, nobody drops
    (10, 6, 10),  # n > t, nobody drops
    (10, 6, 8),  # n > t, two drop
    (10, 6, 6),  # n > t, down to the threshold
])
def test_summed_noise_carries_the_target_for_any_allowed_survivor_set(n_clients, threshold, survivors):
    target, coords = 60.0, 40_000
    share = m.share_variance(target, threshold)
    assert share == target / threshold
    rng = m.noise_rng(n_clients * 100 + survivors)
    shares = np.stack([m.skellam_noise(share, coords, rng) for _ in range(n_clients)])
    alive = rng.permutation(n_clients)[:survivors]
    total = shares[alive].sum(axis=0).astype(float)
    carried = m.carried_variance(survivors, share)
    assert carried == pytest.approx(survivors * target / threshold) and carried >= target
    low, high = _variance_ci(total, Z99)
    assert low <= carried <= high  # the reported variance is what the survivors' sum carries
    assert abs(total.mean()) <= Z999 * math.sqrt(carried / coords)
    assert m.carried_variance(threshold - 1, share) < target  # below the threshold the target would not hold


def test_calibration_refuses_bad_parameters():
    for args in ((-1.0, 3), (1.0, 0), (math.inf, 3)):
        with pytest.raises(ValueError):
            m.share_variance(*args)
    with pytest.raises(ValueError):
        m.carried_variance(-1, 1.0)


# -- the ring ---------------------------------------------------------------------------------------------


def _centred(values: np.ndarray, k: int) -> np.ndarray:
    r = np.mod(values, 1 << k)
    return np.where(r >= 1 << (k - 1), r - (1 << k), r)


def test_modulus_worst_case_sum_at_the_bound_never_wraps():
    n, clip, gamma, d, mu = 20, 1.0, 1 / 64, 100, 30.0
    ring = m.modulus_bits(n, clip, gamma, mu, d, rotated=False)
    assert ring.d_pad == 128 and ring.bits_per_coordinate == ring.k_bits * 128 / 100
    delta2 = m.l2_bound(clip, gamma, 128)
    assert ring.signal_bound == pytest.approx(n * delta2) and ring.noise_bound == pytest.approx(8 * math.sqrt(n * mu))
    assert ring.wrap_probability < 1e-9
    assert 2 ** (ring.k_bits - 2) <= ring.signal_bound + ring.noise_bound < 2 ** (ring.k_bits - 1)  # k is minimal
    rng = m.noise_rng(9)
    spike = np.zeros(128, dtype=np.int64)
    spike[0] = math.floor(delta2)  # every client puts its whole norm budget on one coordinate, same sign
    for sign in (1, -1):
        for _ in range(50):
            total = sum(sign * spike + m.skellam_noise(mu, 128, rng) for _ in range(n))
            assert np.array_equal(_centred(total, ring.k_bits), total)
        # without the noise headroom the signal alone would already need this many bits
        assert abs(int(total[0])) >= 2 ** (ring.k_bits - 2) - ring.noise_bound


def test_modulus_with_rotation_aligned_clients_at_the_clip_never_wrap():
    n, clip, gamma, d = 30, 1.0, 1 / 256, 3000
    mu = m.share_variance((4 * clip / gamma) ** 2 / 100, n)  # a target of a few steps of noise
    ring = m.modulus_bits(n, clip, gamma, mu, d)
    worst = m.modulus_bits(n, clip, gamma, mu, d, rotated=False)
    assert ring.k_bits < worst.k_bits and ring.wrap_probability < 1e-6
    assert ring.signal_bound == pytest.approx(8 * n * (clip / gamma) / math.sqrt(4096) + n)
    x = np.random.default_rng(3).normal(size=d)
    x *= 5 * clip / np.linalg.norm(x)  # every client sends the same direction, clipped to the bound
    seed = m.rotation_seed(42, 1)
    for trial in range(5):
        wide = sum(m.encode(x, clip=clip, gamma=gamma, seed=seed, k_bits=62, mu=mu, rng=m.noise_rng(trial * n + i))
                   .words.astype(np.int64) for i in range(n))
        exact = _centred(wide, 62)  # the un-wrapped integer sum
        assert np.abs(exact).max() < 2 ** (ring.k_bits - 1)  # fits the smaller ring
        narrow = sum(m.encode(x, clip=clip, gamma=gamma, seed=seed, k_bits=ring.k_bits, mu=mu,
                              rng=m.noise_rng(trial * n + i)).words for i in range(n))
        assert np.array_equal(_centred(narrow.astype(np.int64), ring.k_bits), exact)


def test_modulus_refuses_rings_over_62_bits():
    with pytest.raises(ValueError, match="62"):
        m.modulus_bits(1000, 1.0, 1e-17, 1.0, 10, rotated=False)


# -- the server's decode ----------------------------------------------------------------------------------


def test_decode_without_noise_gives_the_clipped_mean_up_to_rounding():
    n, d, clip, gamma = 5, 300, 1.0, 1e-3
    xs = np.random.default_rng(4).normal(size=(n, d)) * np.array([[0.01], [0.2], [1.0], [3.0], [0.05]])
    twin = np.mean([x * min(1.0, clip / np.linalg.norm(x)) for x in xs], axis=0)  # plain numpy clipping
    seed, k = m.rotation_seed(8, 2), 40
    enc = [m.encode(x, clip=clip, gamma=gamma, seed=seed, k_bits=k, mu=0.0, rng=m.noise_rng(i))
           for i, x in enumerate(xs)]
    assert [e.clipped for e in enc] == [bool(np.linalg.norm(x) > clip) for x in xs] == [False, True, True, True,
                                                                                        False]
    words = np.sum([e.words for e in enc], axis=0) & np.uint64((1 << k) - 1)  # what unmasking yields
    mean = m.decode(words, gamma, seed, d, k) / n
    assert mean.shape == (d,)
    err = np.linalg.norm(mean - twin)
    assert err <= gamma * math.sqrt(512)  # each client's rounding moves it by < gamma per rotated coordinate
    assert err <= 4 * gamma * math.sqrt(512 / (4 * n))  # and the errors are independent, zero-mean
    np.testing.assert_allclose(m.decode(words.astype(np.int64) - (1 << k), gamma, seed, d, k) / n, mean)


def test_decode_with_noise_and_dropouts_carries_the_reported_noise():
    n, t, d, clip, gamma = 8, 5, 2000, 1.0, 1 / 64
    target = 25.0  # integer units: noise std 5 steps
    share = m.share_variance(target, t)
    ring = m.modulus_bits(n, clip, gamma, share, d)
    seed = m.rotation_seed(3, 9)
    xs = np.random.default_rng(5).normal(size=(n, d)) * 0.01
    survivors = [0, 2, 3, 5, 6, 7]  # two dropped
    words = sum(m.encode(xs[i], clip=clip, gamma=gamma, seed=seed, k_bits=ring.k_bits, mu=share,
                         rng=m.noise_rng(100 + i)).words for i in survivors)
    out = m.decode(words, gamma, seed, d, ring.k_bits)
    resid = out - xs[survivors].sum(axis=0)  # nothing was clipped: norms are ~0.45
    carried = m.carried_variance(len(survivors), share)
    rounding = len(survivors) / 4  # at most 1/4 step^2 per client and coordinate
    low, high = _variance_ci(resid / gamma, Z99)
    assert low <= carried + rounding and high >= carried  # the noise the survivors reported, plus rounding
    assert carried >= target


def test_encode_and_decode_refuse_bad_rings():
    with pytest.raises(ValueError):
        m.encode(np.ones(4), clip=1.0, gamma=0.1, seed=1, k_bits=63, mu=0.0, rng=m.noise_rng(0))
    with pytest.raises(ValueError):
        m.decode(np.zeros(4, dtype=np.uint64), 0.1, 1, 4, 0)
