"""Horizontal (sample) partitioners: who gets which rows.

Every partitioner has the shape ``f(labels or table, n_parties, <params>, seed) -> list of
np.ndarray`` (one int64 array of row indices per party; shards are disjoint). Schemes follow
NIID-Bench (Li, Diao, Chen, He, "Federated Learning on Non-IID Data Silos: An Experimental Study",
ICDE 2022, section III) and the survey of Zhu et al. ("Federated learning on non-IID data: a
survey", Neurocomputing 2021, section 3):

=================================  =============================================  ==================
scheme                             definition                                     NIID-Bench name
=================================  =============================================  ==================
iid                                random equal split                             homo
label_quantity (k)                 each party holds k labels (#C=k)               noniid-#label{k}
label_dirichlet (beta)             per label, p ~ Dir(beta) over parties          noniid-labeldir
quantity_dirichlet (beta)          party sizes q ~ Dir(beta), labels IID          iid-diff-quantity
feature_noise (sigma)              IID rows; party i adds N(0, (sigma*i/(P-1))^2)  noise-based
feature_synthetic                  FCUBE octant pairs (see :mod:`.fcube`)         generated (FCUBE)
feature_natural                    whole natural groups (writer, user) per party  real (FEMNIST)
label_noise (flip)                 IID rows; party i flips flip*i/(P-1) labels    --
temporal                           contiguous ranges of a time column             --
label_dirichlet+quantity_dirichlet label skew times size skew                     --
label_dirichlet+feature_noise      label skew plus per-party feature noise        --
=================================  =============================================  ==================

Seeding: default mode draws from ``np.random.default_rng(seed)``. With
``niid_bench_compat=True`` the same algorithms draw from ``np.random.RandomState(seed)`` and
``random.Random(seed)`` in NIID-Bench's exact call order, so ``iid``, ``label_dirichlet``,
``label_quantity`` and ``quantity_dirichlet`` reproduce NIID-Bench's shards (seeded with
``np.random.seed(s); random.seed(s)``) row for row, provided labels are 0..K-1.

The vectorised implementations do the per-row work with numpy (one stable argsort by label instead of
one ``np.where`` scan per label; array splits instead of Python-list concatenation); only loops over
labels and parties remain in Python. ``benchmarks/partition.py`` measures the difference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Callable

import numpy as np

from .._rng import PartitionRng
from ..dataset import Dataset

Indices = list[np.ndarray]


# ------------------------------------------------------------------------------------------------
# validation helpers: every error names the offending parameter
# ------------------------------------------------------------------------------------------------
def _check_n_parties(n_parties, n_rows: int) -> int:
    if isinstance(n_parties, bool) or not isinstance(n_parties, Integral) or n_parties < 1:
        raise ValueError(f"n_parties must be a positive int, got {n_parties!r}")
    if n_parties > n_rows:
        raise ValueError(f"n_parties={n_parties} exceeds the number of rows ({n_rows})")
    return int(n_parties)


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_nonneg(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_fraction(name: str, value) -> float:
    v = _check_nonneg(name, value)
    if v > 1:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


def _as_labels(labels, name: str = "labels") -> np.ndarray:
    if labels is None:
        raise ValueError(f"{name} are required for this scheme (pass a label array or a Dataset with y)")
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if y.size == 0:
        raise ValueError(f"{name} is empty")
    return y


def _n_rows(labels_or_n) -> int:
    if isinstance(labels_or_n, Integral) and not isinstance(labels_or_n, bool):
        if labels_or_n < 1:
            raise ValueError(f"n_rows must be >= 1, got {labels_or_n}")
        return int(labels_or_n)
    a = np.asarray(labels_or_n)
    if a.ndim == 0 or a.shape[0] == 0:
        raise ValueError("labels/table is empty")
    return a.shape[0]


def _group_by_label(y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sorted distinct labels and, per label, its row indices in ascending order.

    Equals ``[np.where(y == c)[0] for c in classes]`` (what NIID-Bench computes) in one stable sort.
    """
    order = np.argsort(y, kind="stable")
    classes, counts = np.unique(y[order], return_counts=True)
    bounds = np.cumsum(counts)[:-1]
    return classes, np.split(order.astype(np.int64, copy=False), bounds)


def _cuts(weights: np.ndarray, n: int) -> np.ndarray:
    """NIID-Bench's cut points: ``(cumsum(w) * n).astype(int)[:-1]`` for normalised weights w."""
    return (np.cumsum(weights) * n).astype(int)[:-1]


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)


# ------------------------------------------------------------------------------------------------
# partitioners
# ------------------------------------------------------------------------------------------------
def iid(labels_or_n, n_parties: int, seed=0, *, niid_bench_compat: bool = False) -> Indices:
    """IID split (NIID-Bench "homo"): a random permutation cut into ``n_parties`` equal parts.

    Args:
        labels_or_n: the label array (only its length is used) or the number of rows.
        n_parties: number of parties P (1 <= P <= n_rows).
    Returns: P int64 arrays of row indices; sizes differ by at most one.
    """
    n = _n_rows(labels_or_n)
    P = _check_n_parties(n_parties, n)
    rng = PartitionRng(seed, niid_bench_compat)
    return [a.astype(np.int64, copy=False) for a in np.array_split(rng.permutation(n), P)]


def label_dirichlet(labels, n_parties: int, beta: float = 0.5, seed=0, *, min_size: int = 10,
                    balance: bool = True, max_draws: int = 1000,
                    niid_bench_compat: bool = False) -> Indices:
    """Label-distribution skew, p_k ~ Dir(beta) (NIID-Bench "noniid-labeldir", section III-A).

    For each label k (in sorted order): shuffle its rows, draw p ~ Dir(beta * 1_P), zero the share of
    every party that already holds at least N/P rows (NIID-Bench's balancing rule; ``balance=False``
    disables it), renormalise, and cut the shuffled rows at ``floor(cumsum(p) * n_k)``. If the smallest
    party ends with fewer than ``min_size`` rows (NIID-Bench: 10) the whole draw is repeated. Finally
    each party's rows are shuffled. In compat mode this is NIID-Bench's exact call sequence.

    Smaller beta = more skew. Raises ValueError for beta <= 0, n_parties > rows, a min_size that
    cannot be met (N < min_size * P) or that was not met within ``max_draws`` draws.
    """
    y = _as_labels(labels)
    N = y.shape[0]
    P = _check_n_parties(n_parties, N)
    beta = _check_positive("beta", beta)
    min_size = int(_check_nonneg("min_size", min_size))
    if min_size * P > N:
        raise ValueError(f"min_size={min_size} is unreachable: {P} parties x {min_size} > {N} rows")
    rng = PartitionRng(seed, niid_bench_compat)
    _, groups = _group_by_label(y)
    alpha = np.repeat(beta, P)
    cap = N / P
    def by_label_share(sizes):
        p = rng.dirichlet(alpha)
        return p * (sizes < cap) if balance else p

    return _deal_until_min_size(groups, P, rng, min_size, max_draws, lambda: by_label_share,
                                f"label_dirichlet: no draw gave every party >= min_size={min_size} rows in "
                                f"max_draws={max_draws} attempts; raise beta, lower min_size or use fewer parties")


def _deal_rows(rows: np.ndarray, rng, shards: list[list[np.ndarray]], sizes: np.ndarray, weights) -> None:
    """Shuffle one label's rows and cut them among the parties in proportion to ``weights(sizes)``.

    ``weights`` is called after the shuffle (the draw order NIID-Bench uses); ``shards`` and ``sizes``
    are updated in place.
    """
    idx_k = rows.copy()
    rng.shuffle(idx_k)
    w = weights(sizes)
    w = w / w.sum()
    for j, part in enumerate(np.split(idx_k, _cuts(w, idx_k.shape[0]))):
        shards[j].append(part)
        sizes[j] += part.shape[0]


def _deal_until_min_size(groups, n_parties: int, rng, min_size: int, max_draws: int, draw, failure: str):
    """Deal every label's rows (:func:`_deal_rows`) with the weights ``draw()`` returns, drawing again
    until every party holds ``min_size`` rows (NIID-Bench's resampling); ValueError ``failure`` after
    ``max_draws`` draws."""
    for _ in range(int(max_draws)):
        weights = draw()
        shards: list[list[np.ndarray]] = [[] for _ in range(n_parties)]
        sizes = np.zeros(n_parties, dtype=np.int64)
        for rows in groups:
            _deal_rows(rows, rng, shards, sizes, weights)
        if sizes.min() >= min_size:
            return _shuffled_shards(shards, rng)
    raise ValueError(failure)


def _shuffled_shards(shards: list[list[np.ndarray]], rng) -> list[np.ndarray]:
    """Each party's collected pieces joined and shuffled (the last step of NIID-Bench's Dirichlet loops)."""
    out = []
    for parts in shards:
        a = _concat(parts)
        rng.shuffle(a)
        out.append(a)
    return out


def _choose_labels(K: int, P: int, k: int, rng: PartitionRng) -> list[list[int]]:
    """NIID-Bench's #C=k label assignment: party i gets label i % K plus k-1 distinct random labels."""
    if k == K:
        return [list(range(K)) for _ in range(P)]
    contain = []
    for i in range(P):
        current = [i % K]
        while len(current) < k:
            c = rng.py_randint(0, K - 1)
            if c not in current:
                current.append(c)
        contain.append(current)
    return contain


def label_quantity(labels, n_parties: int, k: int = 2, seed=0, *,
                   niid_bench_compat: bool = False) -> Indices:
    """Quantity-based label imbalance, #C=k (NIID-Bench "noniid-#label{k}", section III-A).

    Party i holds label ``i % K`` and k-1 further distinct labels drawn uniformly (rejection
    sampling, as NIID-Bench); each label's shuffled rows are split evenly (``np.array_split``) among
    the parties holding it. Every party holds exactly k distinct labels (given enough rows per
    label). Rows of a label no party holds (possible when P < K) are left out of every shard
    (NIID-Bench itself fails in that case). Shards are ordered by label, not shuffled.

    Raises ValueError if k < 1 or k > number of distinct labels, or n_parties > rows.
    """
    y = _as_labels(labels)
    P = _check_n_parties(n_parties, y.shape[0])
    classes, groups = _group_by_label(y)
    K = len(classes)
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > K:
        raise ValueError(f"k={k} exceeds the number of distinct labels ({K})")
    rng = PartitionRng(seed, niid_bench_compat)
    contain = _choose_labels(K, P, int(k), rng)
    holders: list[list[int]] = [[] for _ in range(K)]
    for j, labs in enumerate(contain):
        for c in labs:
            holders[c].append(j)
    shards: list[list[np.ndarray]] = [[] for _ in range(P)]
    for c, rows in enumerate(groups):
        idx_k = rows.copy()
        rng.shuffle(idx_k)  # NIID-Bench shuffles every label, held or not
        hs = sorted(holders[c])
        if not hs:
            continue
        for j, part in zip(hs, np.array_split(idx_k, len(hs))):
            shards[j].append(part)
    return [_concat(parts) for parts in shards]


def _dirichlet_sizes(N: int, P: int, beta: float, min_size: int, max_draws: int,
                     rng: PartitionRng, who: str) -> np.ndarray:
    """NIID-Bench's quantity draw: q ~ Dir(beta) until min(q * N) >= min_size."""
    if min_size * P > N:
        raise ValueError(f"min_size={min_size} is unreachable: {P} parties x {min_size} > {N} rows")
    alpha = np.repeat(beta, P)
    for _ in range(int(max_draws)):
        q = rng.dirichlet(alpha)
        q = q / q.sum()
        if np.min(q * N) >= min_size:
            return q
    raise ValueError(f"{who}: no Dirichlet draw gave every party >= min_size={min_size} rows in "
                     f"max_draws={max_draws} attempts; raise beta_quantity/beta or lower min_size")


def quantity_dirichlet(labels_or_n, n_parties: int, beta: float = 0.5, seed=0, *, min_size: int = 10,
                       max_draws: int = 10000, niid_bench_compat: bool = False) -> Indices:
    """Quantity skew (NIID-Bench "iid-diff-quantity"): sizes q ~ Dir(beta), rows drawn IID.

    A random permutation is cut at ``floor(cumsum(q) * N)``; q is redrawn until ``min(q * N) >=
    min_size``. Raises ValueError for beta <= 0, n_parties > rows, or an unreachable min_size.
    """
    N = _n_rows(labels_or_n)
    P = _check_n_parties(n_parties, N)
    beta = _check_positive("beta", beta)
    min_size = int(_check_nonneg("min_size", min_size))
    rng = PartitionRng(seed, niid_bench_compat)
    perm = rng.permutation(N)
    q = _dirichlet_sizes(N, P, beta, min_size, max_draws, rng, "quantity_dirichlet")
    return [a.astype(np.int64, copy=False) for a in np.split(perm, _cuts(q, N))]


def noise_levels(n_parties: int, sigma: float) -> np.ndarray:
    """Per-party Gaussian noise std ``sigma * i / (P - 1)`` for i = 0..P-1 (0 for P == 1)."""
    sigma = _check_nonneg("sigma", sigma)
    if n_parties == 1:
        return np.zeros(1)
    return sigma * np.arange(n_parties) / (n_parties - 1)


def feature_noise(labels_or_n, n_parties: int, sigma: float = 0.1, seed=0, *,
                  niid_bench_compat: bool = False) -> tuple[Indices, np.ndarray]:
    """Noise-based feature skew (NIID-Bench section III-B): IID rows, party i's features get
    N(0, (sigma * i / (P-1))^2) noise, so the level grows linearly with the party index.

    Returns ``(indices, levels)``; apply the noise with :func:`apply_feature_noise` (each party can
    do it locally). Raises ValueError for sigma < 0 or n_parties > rows.
    """
    levels = noise_levels(_check_n_parties(n_parties, _n_rows(labels_or_n)), sigma)
    return iid(labels_or_n, n_parties, seed, niid_bench_compat=niid_bench_compat), levels


def apply_feature_noise(X: np.ndarray, level: float, seed=0, party: int = 0,
                        clip: tuple[float, float] | None = None) -> np.ndarray:
    """Return ``X + N(0, level^2)`` (a new array, same dtype), optionally clipped to ``clip``.

    The noise stream is ``default_rng(SeedSequence(seed, spawn_key=(party,)))``: independent per
    party and reproducible from (seed, party) alone, so a party can regenerate its own noise.
    """
    level = _check_nonneg("level", level)
    X = np.asarray(X)
    dtype = X.dtype if np.issubdtype(X.dtype, np.floating) else np.float64
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(party),)))
    out = X.astype(dtype) + rng.normal(0.0, 1.0, X.shape).astype(dtype) * dtype.type(level)
    if clip is not None:
        np.clip(out, clip[0], clip[1], out=out)
    return out


def feature_synthetic(table, n_parties: int = 4, seed=0, *, niid_bench_compat: bool = False) -> Indices:
    """FCUBE octant partition (NIID-Bench section III-B, "synthetic feature imbalance").

    ``table`` is an (n, 3) array from :func:`secureflhv.data.partition.fcube.make_fcube`. The cube's 8 octants
    form 4 pairs symmetric through the origin; pair id = 2*[x2*sign(x1) < 0] + [x3*sign(x1) < 0]
    (NIID-Bench's ``loc``). With P <= 4, pair j goes to party j % P; with P > 4, parties i with
    i % 4 == j share pair j's rows (random equal split). Each party therefore sees two opposite
    octants, i.e. both labels but a different region of feature space. Shards are shuffled (ascending
    in compat mode, which for P == 4 equals NIID-Bench's contiguous split of its generated data).
    """
    from .fcube import octant_pair

    X = np.asarray(table, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 3:
        raise ValueError(f"table must be FCUBE points of shape (n, 3), got {X.shape}")
    P = _check_n_parties(n_parties, X.shape[0])
    rng = PartitionRng(seed, niid_bench_compat)
    pair = octant_pair(X)
    _, pair_rows = _group_by_label(pair)
    pair_ids = np.unique(pair)
    shards: list[list[np.ndarray]] = [[] for _ in range(P)]
    for pid, rows in zip(pair_ids, pair_rows):
        if P <= 4:
            shards[int(pid) % P].append(rows)
        else:
            owners = [i for i in range(P) if i % 4 == pid]
            rows = rows.copy()
            rng.shuffle(rows)
            for j, part in zip(owners, np.array_split(rows, len(owners))):
                shards[j].append(part)
    out = []
    for parts in shards:
        a = np.sort(_concat(parts))
        if not rng.legacy:
            rng.shuffle(a)
        out.append(a)
    return out


def feature_natural(groups, n_parties: int, seed=0, *, niid_bench_compat: bool = False) -> Indices:
    """Real-world feature skew by a natural id (NIID-Bench "real" on FEMNIST writers).

    Distinct group ids (writer, user, site) are shuffled and dealt to parties in P near-equal runs
    (``np.array_split`` of the permutation); a party gets every row of each of its groups, so no
    group straddles two parties. Rows within a shard are ascending.

    Raises ValueError if groups is missing or has fewer distinct ids than n_parties.
    """
    g = _as_labels(groups, "groups")
    P = _check_n_parties(n_parties, g.shape[0])
    uniq, inverse = np.unique(g, return_inverse=True)
    if P > uniq.shape[0]:
        raise ValueError(f"n_parties={P} exceeds the number of distinct groups ({uniq.shape[0]})")
    rng = PartitionRng(seed, niid_bench_compat)
    party_of_group = np.empty(uniq.shape[0], dtype=np.int64)
    for j, chunk in enumerate(np.array_split(rng.permutation(uniq.shape[0]), P)):
        party_of_group[chunk] = j
    party_of_row = party_of_group[inverse.reshape(-1)]
    order = np.argsort(party_of_row, kind="stable")
    bounds = np.cumsum(np.bincount(party_of_row, minlength=P))[:-1]
    return np.split(order.astype(np.int64, copy=False), bounds)


def label_noise(labels, n_parties: int, flip: float = 0.3, seed=0, *, mode: str = "symmetric",
                niid_bench_compat: bool = False) -> tuple[Indices, np.ndarray, np.ndarray]:
    """Label-preference skew by noisy labels (Zhu et al. survey, section 3.1, "label noise").

    IID rows; party i relabels a fraction ``flip * i / (P-1)`` of its rows (exact count
    ``round(rate * n_i)``, rows drawn without replacement): ``mode="symmetric"`` picks a uniformly
    random *different* label, ``mode="pair"`` maps label c to the next class (c+1 mod K). Party 0 is
    clean; the noise rate grows with the index.

    Returns ``(indices, rates, noisy_labels)`` where noisy_labels is a full-length copy of labels.
    Raises ValueError for flip outside [0, 1], unknown mode, fewer than 2 labels.
    """
    y = _as_labels(labels)
    flip = _check_fraction("flip", flip)
    if mode not in ("symmetric", "pair"):
        raise ValueError(f"mode must be 'symmetric' or 'pair', got {mode!r}")
    P = _check_n_parties(n_parties, y.shape[0])
    classes, code = np.unique(y, return_inverse=True)
    code = code.reshape(-1)
    K = len(classes)
    if K < 2:
        raise ValueError("labels: label_noise needs at least 2 distinct labels")
    rng = PartitionRng(seed, niid_bench_compat)
    indices = [a.astype(np.int64, copy=False) for a in np.array_split(rng.permutation(y.shape[0]), P)]
    rates = np.zeros(1) if P == 1 else flip * np.arange(P) / (P - 1)
    noisy = code.copy()
    for rows, rate in zip(indices, rates):
        m = int(round(rate * rows.shape[0]))
        if m == 0:
            continue
        pick = rows[rng.choice(rows.shape[0], m, replace=False)]
        shift = rng.integers(1, K, m) if mode == "symmetric" else np.ones(m, dtype=np.int64)
        noisy[pick] = (code[pick] + shift) % K  # a nonzero shift guarantees a different label
    return indices, rates, classes[noisy]


def temporal(times, n_parties: int, seed=0) -> Indices:
    """Temporal skew: rows sorted by ``times`` (stable) and cut into P contiguous equal ranges, so
    party i's latest time <= party i+1's earliest. Deterministic; ``seed`` is accepted for a uniform
    signature and unused. Raises ValueError if times is missing or n_parties > rows."""
    t = _as_labels(times, "times")
    P = _check_n_parties(n_parties, t.shape[0])
    del seed
    order = np.argsort(t, kind="stable").astype(np.int64, copy=False)
    return np.array_split(order, P)


def label_quantity_dirichlet(labels, n_parties: int, beta: float = 0.5, beta_quantity: float = 0.5,
                             seed=0, *, min_size: int = 10, max_draws: int = 1000,
                             niid_bench_compat: bool = False) -> Indices:
    """Mixed label + quantity skew: sizes q ~ Dir(beta_quantity) drawn once, then per label
    p ~ Dir(beta) and label k's rows cut by weights proportional to ``p_j * q_j`` (no balancing
    rule, which would undo the size skew). Expected party size is proportional to q_j times its
    label mass; each party's label mix follows p. Both draws are repeated until every party holds
    ``min_size`` rows. Raises ValueError for beta/beta_quantity <= 0 or unreachable min_size."""
    y = _as_labels(labels)
    N = y.shape[0]
    P = _check_n_parties(n_parties, N)
    beta = _check_positive("beta", beta)
    beta_q = _check_positive("beta_quantity", beta_quantity)
    min_size = int(_check_nonneg("min_size", min_size))
    rng = PartitionRng(seed, niid_bench_compat)
    _, groups = _group_by_label(y)
    def draw_party_sizes():
        q = _dirichlet_sizes(N, P, beta_q, min_size, 10000, rng, "label_dirichlet+quantity_dirichlet")
        return lambda _sizes: rng.dirichlet(np.repeat(beta, P)) * q

    return _deal_until_min_size(groups, P, rng, min_size, max_draws, draw_party_sizes,
                                f"label_dirichlet+quantity_dirichlet: no draw gave every party >= "
                                f"min_size={min_size} rows in max_draws={max_draws}; raise beta or lower min_size")


def label_dirichlet_feature_noise(labels, n_parties: int, beta: float = 0.5, sigma: float = 0.1, seed=0,
                                  *, min_size: int = 10,
                                  niid_bench_compat: bool = False) -> tuple[Indices, np.ndarray]:
    """Mixed label + feature skew: :func:`label_dirichlet` shards plus :func:`feature_noise` levels
    ``sigma * i / (P-1)``. Returns ``(indices, levels)``."""
    levels = noise_levels(_check_n_parties(n_parties, _n_rows(labels)), sigma)
    idx = label_dirichlet(labels, n_parties, beta, seed, min_size=min_size,
                          niid_bench_compat=niid_bench_compat)
    return idx, levels


# ------------------------------------------------------------------------------------------------
# registry and single entry point
# ------------------------------------------------------------------------------------------------
@dataclass
class HorizontalPartition:
    """Result of :func:`partition`: per-party row indices plus any per-party transformation.

    Behaves like the list of index arrays (``len``, indexing, iteration).

    Attributes:
        scheme, n_parties, seed, params, niid_bench_compat: how it was made.
        indices: P disjoint int64 arrays of row indices.
        noise_levels: (P,) Gaussian noise std per party (feature_noise schemes) or None.
        flip_rates: (P,) label flip fraction per party (label_noise) or None.
        labels: full-length noisy label array (label_noise) or None.
    """

    scheme: str
    n_parties: int
    seed: object
    params: dict
    indices: Indices
    niid_bench_compat: bool = False
    noise_levels: np.ndarray | None = None
    flip_rates: np.ndarray | None = None
    labels: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.indices[i]

    def __iter__(self):
        return iter(self.indices)

    @property
    def sizes(self) -> np.ndarray:
        """Rows per party, int64 (n_parties,)."""
        return np.array([a.shape[0] for a in self.indices], dtype=np.int64)

    def party_data(self, dataset: Dataset, party: int) -> Dataset:
        """The party's shard of ``dataset`` with its noise / noisy labels applied."""
        if not 0 <= party < self.n_parties:
            raise ValueError(f"party must be in [0, {self.n_parties}), got {party}")
        shard = dataset.subset(self.indices[party])
        if self.labels is not None:
            shard.y = self.labels[self.indices[party]]
        if self.noise_levels is not None and self.noise_levels[party] > 0:
            seed = self.seed if isinstance(self.seed, Integral) else 0
            shard.X = apply_feature_noise(shard.X, float(self.noise_levels[party]), seed, party)
        return shard


@dataclass(frozen=True)
class SchemeSpec:
    """A registered scheme: which input column it needs and which keyword parameters it accepts."""

    name: str
    func: Callable
    needs: str  # "rows" | "labels" | "table" | "groups" | "times"
    params: tuple[str, ...]
    description: str
    compat: bool = True  # accepts niid_bench_compat


SCHEMES: dict[str, SchemeSpec] = {}
ALIASES: dict[str, str] = {
    "homo": "iid",
    "noniid-labeldir": "label_dirichlet",
    "iid-diff-quantity": "quantity_dirichlet",
    "real": "feature_natural",
    "fcube": "feature_synthetic",
    "mixed_label_quantity": "label_dirichlet+quantity_dirichlet",
    "mixed_label_feature_noise": "label_dirichlet+feature_noise",
}


def _register(spec: SchemeSpec) -> None:
    SCHEMES[spec.name] = spec


_register(SchemeSpec("iid", iid, "rows", (), "random equal split (NIID-Bench homo)"))
_register(SchemeSpec("label_quantity", label_quantity, "labels", ("k",),
                     "#C=k: each party holds k labels (NIID-Bench noniid-#label{k})"))
_register(SchemeSpec("label_dirichlet", label_dirichlet, "labels", ("beta", "min_size", "balance", "max_draws"),
                     "p_k ~ Dir(beta) per label, min size 10, balancing (NIID-Bench noniid-labeldir)"))
_register(SchemeSpec("quantity_dirichlet", quantity_dirichlet, "rows", ("beta", "min_size", "max_draws"),
                     "party sizes q ~ Dir(beta), IID labels (NIID-Bench iid-diff-quantity)"))
_register(SchemeSpec("feature_noise", feature_noise, "rows", ("sigma",),
                     "IID rows, Gaussian noise sigma*i/(P-1) on party i's features"))
_register(SchemeSpec("feature_synthetic", feature_synthetic, "table", (),
                     "FCUBE: each party a pair of octants symmetric through the origin"))
_register(SchemeSpec("feature_natural", feature_natural, "groups", (),
                     "whole natural groups (writer/user/site) dealt to parties"))
_register(SchemeSpec("label_noise", label_noise, "labels", ("flip", "mode"),
                     "IID rows, party i flips flip*i/(P-1) of its labels"))
_register(SchemeSpec("temporal", temporal, "times", (),
                     "contiguous ranges of a time column", compat=False))
_register(SchemeSpec("label_dirichlet+quantity_dirichlet", label_quantity_dirichlet, "labels",
                     ("beta", "beta_quantity", "min_size", "max_draws"),
                     "label skew Dir(beta) x size skew Dir(beta_quantity)"))
_register(SchemeSpec("label_dirichlet+feature_noise", label_dirichlet_feature_noise, "labels",
                     ("beta", "sigma", "min_size"), "label skew Dir(beta) + feature noise sigma*i/(P-1)"))


def available_schemes() -> list[str]:
    """Canonical scheme names (aliases such as NIID-Bench's ``homo`` are accepted by :func:`partition`)."""
    return list(SCHEMES)


def resolve_scheme(scheme: str) -> tuple[SchemeSpec, dict]:
    """Canonical spec for a name or alias; NIID-Bench's ``noniid-#label{k}`` yields ``{"k": k}``."""
    if not isinstance(scheme, str):
        raise ValueError(f"scheme must be a string, got {scheme!r}")
    extra: dict = {}
    if scheme.startswith("noniid-#label") and scheme[len("noniid-#label"):].isdigit():
        extra["k"] = int(scheme[len("noniid-#label"):])
        scheme = "label_quantity"
    scheme = ALIASES.get(scheme, scheme)
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is unknown; choose one of {', '.join(SCHEMES)} "
                         f"(aliases: {', '.join(ALIASES)}, noniid-#label<k>)")
    return SCHEMES[scheme], extra


def partition(scheme: str, data, n_parties: int, seed=0, *, niid_bench_compat: bool = False,
              groups=None, times=None, **params) -> HorizontalPartition:
    """Partition rows among ``n_parties`` with a named scheme (see module docstring for the list).

    Args:
        scheme: canonical name or alias (``homo``, ``noniid-labeldir``, ``noniid-#label2``, ...).
        data: a :class:`Dataset` (its y / X / groups / times are used as the scheme needs), a 1-D
            label array, a 2-D table (feature_synthetic), or an int row count (iid, quantity_dirichlet,
            feature_noise).
        n_parties: number of parties P.
        seed: int seed (or a ``np.random.Generator`` in default mode).
        niid_bench_compat: reproduce NIID-Bench's RNG call sequence (legacy seeding).
        groups, times: columns for feature_natural / temporal when ``data`` is not a Dataset.
        **params: the scheme's parameters (beta, k, sigma, flip, ...).

    Returns: a :class:`HorizontalPartition`.
    Raises: ValueError naming the parameter for an unknown scheme, an unknown/invalid parameter,
        or a missing input column.
    """
    spec, extra = resolve_scheme(scheme)
    for key in extra:
        if key in params and params[key] != extra[key]:
            raise ValueError(f"{key}={params[key]} conflicts with scheme name {scheme!r}")
    params = {**params, **extra}
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        accepted = ", ".join(spec.params) or "none"
        raise ValueError(f"parameter(s) {', '.join(unknown)} not accepted by scheme {spec.name!r} "
                         f"(accepted: {accepted})")
    source = _scheme_input(spec, data, groups, times)
    kwargs = dict(params)
    if spec.compat:
        kwargs["niid_bench_compat"] = niid_bench_compat
    elif niid_bench_compat:
        raise ValueError(f"niid_bench_compat is not applicable to scheme {spec.name!r}")
    result = spec.func(source, n_parties, seed=seed, **kwargs)
    out = HorizontalPartition(spec.name, int(n_parties), seed, params, [], niid_bench_compat)
    if spec.name in ("feature_noise", "label_dirichlet+feature_noise"):
        out.indices, out.noise_levels = result
    elif spec.name == "label_noise":
        out.indices, out.flip_rates, out.labels = result
    else:
        out.indices = result
    out.indices = [np.asarray(a, dtype=np.int64) for a in out.indices]
    return out


def _scheme_input(spec: SchemeSpec, data, groups, times):
    """The column ``spec`` partitions by (``spec.needs``), from a Dataset or the raw arguments."""
    ds = data if isinstance(data, Dataset) else None
    if spec.needs == "rows":
        return len(ds) if ds is not None else data
    if spec.needs == "table":
        return ds.X if ds is not None else data
    if spec.needs == "labels":
        source = ds.y if ds is not None else data
        if source is None:
            raise ValueError(f"scheme {spec.name!r} needs labels; the dataset has no label column")
        return source
    if spec.needs == "groups":
        source = groups if groups is not None else (ds.groups if ds is not None else None)
        if source is None:
            raise ValueError(f"scheme {spec.name!r} needs a groups column (e.g. --group-column / groups=...)")
        return source
    source = times if times is not None else (ds.times if ds is not None else None)
    if source is None:
        raise ValueError(f"scheme {spec.name!r} needs a times column (e.g. --time-column / times=...)")
    return source
