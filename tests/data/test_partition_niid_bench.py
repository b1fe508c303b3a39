"""NIID-Bench reproduction: the library's vectorised partitioners, in niid_bench_compat mode, must
give exactly the shards of NIID-Bench's partition_data (Li et al., ICDE 2022).

The reference functions below are an independent, deliberately plain transcription of NIID-Bench's
algorithm (Python lists, one np.where per label, the global np.random / random functions seeded with
np.random.seed(s) and random.seed(s)), written separately from secureflhv.data.partition.samples.
"""
import random

import numpy as np
import pytest

from secureflhv.data import iid, label_dirichlet, label_quantity, partition, quantity_dirichlet


@pytest.fixture
def global_seed():
    """Seed the *global* legacy generators as NIID-Bench does; restore them afterwards."""
    np_state, py_state = np.random.get_state(), random.getstate()

    def seed(s):
        np.random.seed(s)
        random.seed(s)

    yield seed
    np.random.set_state(np_state)
    random.setstate(py_state)


def reference_labeldir(y, n_parties, beta, n_classes):
    N = len(y)
    smallest = 0
    while smallest < 10:
        batches = [[] for _ in range(n_parties)]
        for label in range(n_classes):
            members = np.where(y == label)[0]
            np.random.shuffle(members)
            share = np.random.dirichlet(np.repeat(beta, n_parties))
            keep = []
            for s, b in zip(share, batches):
                keep.append(s if len(b) < N / n_parties else 0.0)
            share = np.array(keep)
            share = share / share.sum()
            cut = (np.cumsum(share) * len(members)).astype(int)[:-1]
            pieces = np.split(members, cut)
            for j in range(n_parties):
                batches[j] = batches[j] + pieces[j].tolist()
            smallest = min(len(b) for b in batches)
    for j in range(n_parties):
        np.random.shuffle(batches[j])
    return batches


def reference_label_k(y, n_parties, num, n_classes):
    if num == n_classes:
        out = [np.zeros(0, dtype=np.int64) for _ in range(n_parties)]
        for label in range(n_classes):
            members = np.where(y == label)[0]
            np.random.shuffle(members)
            for j, piece in enumerate(np.array_split(members, n_parties)):
                out[j] = np.append(out[j], piece)
        return out
    times = [0] * n_classes
    holds = []
    for i in range(n_parties):
        mine = [i % n_classes]
        times[i % n_classes] += 1
        while len(mine) < num:
            c = random.randint(0, n_classes - 1)
            if c not in mine:
                mine.append(c)
                times[c] += 1
        holds.append(mine)
    out = [np.zeros(0, dtype=np.int64) for _ in range(n_parties)]
    for label in range(n_classes):
        members = np.where(y == label)[0]
        np.random.shuffle(members)
        pieces = np.array_split(members, times[label])
        used = 0
        for j in range(n_parties):
            if label in holds[j]:
                out[j] = np.append(out[j], pieces[used])
                used += 1
    return out


def reference_quantity(n, n_parties, beta):
    perm = np.random.permutation(n)
    smallest = 0
    while smallest < 10:
        share = np.random.dirichlet(np.repeat(beta, n_parties))
        share = share / share.sum()
        smallest = np.min(share * n)
    cut = (np.cumsum(share) * n).astype(int)[:-1]
    return np.split(perm, cut)


def counts(y, shards, n_classes):
    return np.array([np.bincount(y[np.asarray(s, dtype=np.int64)], minlength=n_classes) for s in shards])


def test_reference_sizes_from_issue():
    y = np.repeat(np.arange(10), 5000)
    shards = label_dirichlet(y, 10, 0.5, 0, niid_bench_compat=True)
    assert [len(s) for s in shards] == [5307, 3688, 4435, 5047, 5189, 3803, 5202, 4325, 8078, 4926]


@pytest.mark.parametrize("seed,n_parties,beta,n_classes,per_class", [
    (0, 10, 0.5, 10, 5000), (1, 7, 0.5, 10, 300), (2, 20, 0.1, 10, 400), (3, 5, 1.0, 4, 250),
    (12345, 16, 0.3, 10, 500),
])
def test_label_dirichlet_matches_reference(global_seed, seed, n_parties, beta, n_classes, per_class):
    y = np.random.default_rng(99).permutation(np.repeat(np.arange(n_classes), per_class))
    global_seed(seed)
    ref = reference_labeldir(y, n_parties, beta, n_classes)
    got = label_dirichlet(y, n_parties, beta, seed, niid_bench_compat=True)
    np.testing.assert_array_equal(counts(y, got, n_classes), counts(y, ref, n_classes))
    for g, r in zip(got, ref):  # same rows in the same order, not just the same counts
        np.testing.assert_array_equal(g, np.asarray(r, dtype=np.int64))


@pytest.mark.parametrize("seed,n_parties,k,n_classes", [
    (0, 10, 2, 10), (1, 10, 3, 10), (7, 13, 1, 10), (3, 25, 2, 10), (5, 6, 10, 10), (11, 8, 2, 4),
])
def test_label_quantity_matches_reference(global_seed, seed, n_parties, k, n_classes):
    y = np.random.default_rng(5).integers(0, n_classes, 3000)
    global_seed(seed)
    ref = reference_label_k(y, n_parties, k, n_classes)
    got = label_quantity(y, n_parties, k, seed, niid_bench_compat=True)
    np.testing.assert_array_equal(counts(y, got, n_classes), counts(y, ref, n_classes))
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("seed,n_parties,beta", [(0, 10, 0.5), (4, 30, 1.0), (9, 5, 0.2)])
def test_quantity_dirichlet_matches_reference(global_seed, seed, n_parties, beta):
    global_seed(seed)
    ref = reference_quantity(5000, n_parties, beta)
    got = quantity_dirichlet(5000, n_parties, beta, seed, niid_bench_compat=True)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


def test_iid_matches_homo(global_seed):
    global_seed(3)
    ref = np.array_split(np.random.permutation(1234), 9)
    for g, r in zip(iid(1234, 9, 3, niid_bench_compat=True), ref):
        np.testing.assert_array_equal(g, r)


def test_alias_names_resolve_to_same_shards():
    y = np.random.default_rng(1).integers(0, 10, 2000)
    a = partition("noniid-#label3", y, 8, 4, niid_bench_compat=True)
    b = partition("label_quantity", y, 8, 4, niid_bench_compat=True, k=3)
    assert a.scheme == "label_quantity" and a.params == {"k": 3}
    for x, z in zip(a, b):
        np.testing.assert_array_equal(x, z)


def test_compat_mode_leaves_global_state_untouched():
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    label_dirichlet(np.repeat(np.arange(3), 100), 4, 0.5, 0, niid_bench_compat=True)
    np.testing.assert_array_equal(np.random.get_state()[1], before)
