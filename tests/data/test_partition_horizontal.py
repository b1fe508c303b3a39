"""Horizontal partitioners: disjoint/covering shards, each scheme's defining property,
determinism per seed, and clear errors for bad input."""
import numpy as np
import pytest

from secureflhv.data import Dataset, apply_feature_noise, available_schemes, make_fcube, octant_pair, partition

RNG = np.random.default_rng(2024)
Y = RNG.integers(0, 10, 6000)
GROUPS = RNG.integers(0, 150, 6000)
TIMES = RNG.normal(size=6000)
FCUBE, FCUBE_TEST = make_fcube(4000, 1000, seed=1)


def run(scheme, n_parties=8, seed=0, **params):
    if scheme == "feature_synthetic":
        return partition(scheme, FCUBE, n_parties, seed, **params)
    return partition(scheme, Y, n_parties, seed, groups=GROUPS, times=TIMES, **params)


DEFAULTS = {"label_quantity": {"k": 2}, "label_dirichlet": {"beta": 0.3}, "quantity_dirichlet": {"beta": 0.5},
            "feature_noise": {"sigma": 0.5}, "label_noise": {"flip": 0.4},
            "label_dirichlet+quantity_dirichlet": {"beta": 0.5, "beta_quantity": 0.5},
            "label_dirichlet+feature_noise": {"beta": 0.5, "sigma": 0.3}}


@pytest.mark.parametrize("scheme", available_schemes())
def test_disjoint_and_covering(scheme):
    n_parties = {"feature_synthetic": 4, "label_quantity": 10}.get(scheme, 8)
    part = run(scheme, n_parties, **DEFAULTS.get(scheme, {}))
    n = len(FCUBE) if scheme == "feature_synthetic" else len(Y)
    assert len(part) == n_parties
    allrows = np.concatenate(part.indices)
    assert allrows.dtype == np.int64
    assert len(np.unique(allrows)) == len(allrows), "a row is in two shards"
    # every scheme here covers all rows (label_quantity with P >= K holds every label)
    np.testing.assert_array_equal(np.sort(allrows), np.arange(n))
    assert all(len(s) > 0 for s in part)


@pytest.mark.parametrize("scheme", [s for s in available_schemes() if s != "temporal"])
def test_deterministic_per_seed_and_varies_with_seed(scheme):
    p = DEFAULTS.get(scheme, {})
    a, b, c = run(scheme, seed=11, **p), run(scheme, seed=11, **p), run(scheme, seed=12, **p)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c))


def test_temporal_is_seed_independent_and_contiguous():
    a, b = run("temporal", seed=1), run("temporal", seed=2)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))
    spans = [(TIMES[s].min(), TIMES[s].max()) for s in a]
    for (lo0, hi0), (lo1, hi1) in zip(spans, spans[1:]):
        assert hi0 <= lo1
    # each shard is exactly the rows whose time falls in its range (no interleaving)
    for s, (lo, hi) in zip(a, spans):
        assert np.sum((TIMES >= lo) & (TIMES <= hi)) == len(s)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_label_quantity_each_party_exactly_k_labels(k):
    for compat in (False, True):
        part = partition("label_quantity", Y, 12, 3, niid_bench_compat=compat, k=k)
        assert [len(np.unique(Y[s])) for s in part] == [k] * 12
        # each label's rows are split evenly among its holders
        for c in range(10):
            sizes = [np.sum(Y[s] == c) for s in part if np.any(Y[s] == c)]
            if sizes:
                assert max(sizes) - min(sizes) <= 1


def test_label_quantity_fewer_parties_than_labels_drops_unheld_labels():
    part = partition("label_quantity", Y, 3, 0, k=2)
    held = set(np.concatenate([np.unique(Y[s]) for s in part]).tolist())
    rows = np.concatenate(part.indices)
    assert len(np.unique(rows)) == len(rows)
    assert set(np.unique(Y[rows]).tolist()) == held
    assert len(rows) == int(np.isin(Y, list(held)).sum())


def test_label_dirichlet_skew_grows_as_beta_shrinks_and_min_size_holds():
    def emd(beta):
        part = partition("label_dirichlet", Y, 10, 0, beta=beta)
        assert part.sizes.min() >= 10
        q = np.bincount(Y, minlength=10) / len(Y)
        return np.mean([np.abs(np.bincount(Y[s], minlength=10) / len(s) - q).sum() for s in part])
    assert emd(0.05) > emd(1.0) > emd(100.0)
    assert emd(100.0) < 0.2


def test_label_dirichlet_balance_rule():
    # NIID-Bench's rule: a party already at N/P rows receives no rows of later labels
    y = np.repeat(np.arange(10), 500)
    part = partition("label_dirichlet", y, 10, 3, beta=0.1)
    cap = len(y) / 10
    for s in part:
        per_label = np.bincount(y[s], minlength=10)
        before = np.concatenate([[0], np.cumsum(per_label)[:-1]])
        assert not np.any((before >= cap) & (per_label > 0))
    unbalanced = partition("label_dirichlet", y, 10, 3, beta=0.1, balance=False)
    assert unbalanced.sizes.max() > part.sizes.max() or not np.array_equal(unbalanced.sizes, part.sizes)


def test_quantity_dirichlet_sizes_skewed_labels_iid():
    part = partition("quantity_dirichlet", Y, 10, 0, beta=0.3)
    assert part.sizes.max() > 3 * part.sizes.min()
    big = part.indices[int(np.argmax(part.sizes))]
    q = np.bincount(Y, minlength=10) / len(Y)
    assert np.abs(np.bincount(Y[big], minlength=10) / len(big) - q).sum() < 0.15


def test_feature_noise_grows_with_party_index():
    X = np.zeros((6000, 20))
    ds = Dataset(X, Y)
    part = partition("feature_noise", ds, 6, 4, sigma=1.0)
    np.testing.assert_allclose(part.noise_levels, np.arange(6) / 5)
    stds = [part.party_data(ds, i).X.std() for i in range(6)]
    assert stds[0] == 0.0
    assert all(a < b for a, b in zip(stds, stds[1:]))
    np.testing.assert_allclose(stds[1:], part.noise_levels[1:], rtol=0.05)
    # a party can regenerate its own noise from (seed, party)
    np.testing.assert_array_equal(part.party_data(ds, 3).X,
                                  apply_feature_noise(X[part[3]], part.noise_levels[3], 4, 3))


def test_mixed_label_feature_noise_has_both_skews():
    part = partition("label_dirichlet+feature_noise", Y, 5, 0, beta=0.1, sigma=2.0)
    assert part.noise_levels[-1] == 2.0 and part.noise_levels[0] == 0.0
    q = np.bincount(Y, minlength=10) / len(Y)
    assert np.mean([np.abs(np.bincount(Y[s], minlength=10) / len(s) - q).sum() for s in part]) > 0.8


def test_mixed_label_quantity_has_both_skews():
    part = partition("label_dirichlet+quantity_dirichlet", Y, 10, 2, beta=0.2, beta_quantity=0.2)
    assert part.sizes.min() >= 10
    assert part.sizes.max() > 5 * np.median(part.sizes) or part.sizes.max() > 4 * part.sizes.min()
    q = np.bincount(Y, minlength=10) / len(Y)
    assert np.mean([np.abs(np.bincount(Y[s], minlength=10) / len(s) - q).sum() for s in part]) > 0.8


def test_fcube_generator_and_octant_partition():
    X, y = FCUBE.X, FCUBE.y
    assert X.shape == (4000, 3) and np.all(np.abs(X) <= 1)
    np.testing.assert_array_equal(y, (X[:, 0] <= 0).astype(int))  # label by the plane x1 = 0
    part = partition("feature_synthetic", FCUBE, 4, 0)
    for i, s in enumerate(part):
        pts = X[s]
        pair = octant_pair(pts)
        assert np.all(pair == pair[0])  # one octant pair per party ...
        octants = {tuple(o) for o in (np.sign(pts) > 0).astype(int)}
        assert len(octants) == 2  # ... i.e. exactly two octants ...
        a, b = sorted(octants)
        assert all(x + z == 1 for x, z in zip(a, b))  # ... symmetric through the origin
        assert abs(np.mean(y[s]) - 0.5) < 1e-9  # with both labels equally
    assert len({int(octant_pair(X[s])[0]) for s in part}) == 4
    # test set is uniform in the cube, every octant populated, label by x1 > 0
    T = FCUBE_TEST.X
    assert len({tuple(o) for o in (np.sign(T) > 0).astype(int)}) == 8
    np.testing.assert_array_equal(FCUBE_TEST.y, (T[:, 0] <= 0).astype(int))


def test_fcube_more_parties_share_pairs():
    part = partition("feature_synthetic", FCUBE, 8, 0)
    for i, s in enumerate(part):
        assert np.all(octant_pair(FCUBE.X[s]) == i % 4)
    assert part.sizes.max() - part.sizes.min() <= 1


def test_feature_natural_groups_never_straddle():
    part = partition("feature_natural", Y, 7, 5, groups=GROUPS)
    owner = {}
    for i, s in enumerate(part):
        for g in np.unique(GROUPS[s]):
            assert owner.setdefault(int(g), i) == i
    assert len(owner) == len(np.unique(GROUPS))
    counts = [len(np.unique(GROUPS[s])) for s in part]
    assert max(counts) - min(counts) <= 1


def test_label_noise_rates_grow_and_flip_to_other_labels():
    for mode in ("symmetric", "pair"):
        part = partition("label_noise", Y, 5, 0, flip=0.4, mode=mode)
        np.testing.assert_allclose(part.flip_rates, [0, 0.1, 0.2, 0.3, 0.4])
        for s, r in zip(part, part.flip_rates):
            changed = part.labels[s] != Y[s]
            assert changed.sum() == int(round(r * len(s)))
            if mode == "pair":
                assert np.all(part.labels[s][changed] == (Y[s][changed] + 1) % 10)
        unchanged_rows = np.setdiff1d(np.arange(len(Y)), np.concatenate(part.indices))
        assert unchanged_rows.size == 0


@pytest.mark.parametrize("scheme,params,match", [
    ("label_dirichlet", {"beta": 0.0}, "beta"),
    ("label_dirichlet", {"beta": -1.0}, "beta"),
    ("quantity_dirichlet", {"beta": 0}, "beta"),
    ("label_dirichlet+quantity_dirichlet", {"beta_quantity": -0.5}, "beta_quantity"),
    ("label_quantity", {"k": 11}, "k=11"),
    ("label_quantity", {"k": 0}, "k"),
    ("feature_noise", {"sigma": -1.0}, "sigma"),
    ("label_noise", {"flip": 1.5}, "flip"),
    ("label_noise", {"mode": "wild"}, "mode"),
    ("iid", {"beta": 0.5}, "beta"),
    ("label_dirichlet", {"min_size": 1000}, "min_size"),
])
def test_bad_parameters_name_the_parameter(scheme, params, match):
    with pytest.raises(ValueError, match=match):
        partition(scheme, Y, 10, 0, **params)


def test_bad_inputs():
    with pytest.raises(ValueError, match="n_parties"):
        partition("iid", np.arange(5), 6)
    with pytest.raises(ValueError, match="n_parties"):
        partition("label_dirichlet", Y, 0)
    with pytest.raises(ValueError, match="scheme 'nope'"):
        partition("nope", Y, 3)
    with pytest.raises(ValueError, match="groups"):
        partition("feature_natural", Dataset(np.zeros((10, 1)), np.zeros(10)), 2)
    with pytest.raises(ValueError, match="distinct groups"):
        partition("feature_natural", Y, 200, groups=GROUPS)
    with pytest.raises(ValueError, match="times"):
        partition("temporal", Y, 3)
    with pytest.raises(ValueError, match="labels"):
        partition("label_dirichlet", Dataset(np.zeros((10, 1))), 2)
    with pytest.raises(ValueError, match="seed"):
        partition("iid", Y, 3, seed=-1)
    with pytest.raises(ValueError, match="max_draws"):
        partition("label_dirichlet", np.repeat(np.arange(2), 30), 5, 0, beta=0.01, min_size=10, max_draws=3)
    with pytest.raises(ValueError, match="k=3 conflicts"):
        partition("noniid-#label2", Y, 3, k=3)
