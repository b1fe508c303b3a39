"""Partition time for 1,000,000 rows x 100 parties, every horizontal scheme, vs a naive baseline.

Baselines, measured in the same run:
* label_dirichlet (and the label_dirichlet mixes): a NIID-Bench-style loop (one ``np.where`` scan per
  label, Python-list concatenation of shards, per-party shuffle of Python lists) at full size, in
  NIID-Bench compat mode so the output must be identical to ours (checked and printed);
* every other scheme: a straightforward per-row Python loop (each row's party decided and appended
  in Python) on a subsample of ``--naive-rows`` rows, extrapolated linearly to the full size.

    .venv/bin/python benchmarks/partition.py            # 1,000,000 rows x 100 parties
    .venv/bin/python benchmarks/partition.py --quick    # 100,000 rows x 100 parties
"""
from __future__ import annotations

import argparse
import bisect
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from secureflhv.data import make_fcube, partition  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402


def timed(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


# ---- naive baselines ---------------------------------------------------------------------------
def niid_style_labeldir(y, P, beta, seed, n_classes):
    """NIID-Bench-style loop (lists, np.where per label), seeded like NIID-Bench."""
    np.random.seed(seed)
    random.seed(seed)
    N = len(y)
    smallest = 0
    while smallest < 10:
        batches = [[] for _ in range(P)]
        for k in range(n_classes):
            idx = np.where(y == k)[0]
            np.random.shuffle(idx)
            p = np.random.dirichlet(np.repeat(beta, P))
            p = np.array([a * (len(b) < N / P) for a, b in zip(p, batches)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            batches = [b + s.tolist() for b, s in zip(batches, np.split(idx, cuts))]
            smallest = min(len(b) for b in batches)
    for b in batches:
        np.random.shuffle(b)
    return batches


def naive_by_cuts(n, P, seed, sizes=None):
    """Per-row loop: shuffle, then each row looks up its party among cut points."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    if sizes is None:
        sizes = [n // P + (1 if i < n % P else 0) for i in range(P)]
    cuts = np.cumsum(sizes).tolist()
    shards = [[] for _ in range(P)]
    for pos, row in enumerate(order):
        shards[bisect.bisect_right(cuts, pos)].append(row)
    return shards


def naive_label_quantity(y, P, k, seed, K):
    rng = random.Random(seed)
    holders = [[] for _ in range(K)]
    for i in range(P):
        labs = [i % K] + rng.sample([c for c in range(K) if c != i % K], k - 1)
        for c in labs:
            holders[c].append(i)
    shards = [[] for _ in range(P)]
    turn = [0] * K
    rows = list(range(len(y)))
    rng.shuffle(rows)
    for r in rows:
        c = int(y[r])
        if holders[c]:
            shards[holders[c][turn[c] % len(holders[c])]].append(r)
            turn[c] += 1
    return shards


def naive_natural(groups, P, seed):
    uniq = sorted(set(groups.tolist()))
    rng = random.Random(seed)
    rng.shuffle(uniq)
    owner = {g: i * P // len(uniq) for i, g in enumerate(uniq)}
    shards = [[] for _ in range(P)]
    for r, g in enumerate(groups.tolist()):
        shards[owner[g]].append(r)
    return shards


def naive_temporal(times, P):
    order = sorted(range(len(times)), key=times.__getitem__)
    n = len(order)
    shards = [[] for _ in range(P)]
    for pos, r in enumerate(order):
        shards[pos * P // n].append(r)
    return shards


def naive_fcube(X, P):
    shards = [[] for _ in range(P)]
    for r, (a, b, c) in enumerate(X.tolist()):
        s = 1 if a >= 0 else -1
        shards[(2 * (b * s < 0) + (c * s < 0)) % P].append(r)
    return shards


def naive_label_noise(y, P, flip, seed, K):
    shards = naive_by_cuts(len(y), P, seed)
    rng = random.Random(seed)
    noisy = y.tolist()
    for i, rows in enumerate(shards):
        for r in rng.sample(rows, round(flip * i / (P - 1) * len(rows))):
            noisy[r] = (noisy[r] + rng.randrange(1, K)) % K
    return shards, noisy


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--parties", type=int, default=100)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--naive-rows", type=int, default=100_000, help="subsample for per-row naive baselines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="100,000 rows, 20,000-row naive subsample")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.naive_rows = 100_000, 20_000
    N, P, K, n_sub = args.rows, args.parties, args.classes, min(args.naive_rows, args.rows)
    rng = np.random.default_rng(args.seed)
    y = rng.integers(0, K, N)
    groups = rng.integers(0, 20 * P, N)
    times = rng.random(N)
    fcube, _ = make_fcube(N - N % 4, 4, seed=args.seed)
    scale = N / n_sub
    ys, gs, ts = y[:n_sub], groups[:n_sub], times[:n_sub].tolist()

    cases = [
        ("iid", dict(), lambda: naive_by_cuts(n_sub, P, 0)),
        ("label_quantity", dict(k=2), lambda: naive_label_quantity(ys, P, 2, 0, K)),
        ("label_dirichlet", dict(beta=0.5), None),
        ("quantity_dirichlet", dict(beta=0.5),
         lambda: naive_by_cuts(n_sub, P, 0, np.random.default_rng(0).multinomial(n_sub, [1 / P] * P).tolist())),
        ("feature_noise", dict(sigma=0.1), lambda: naive_by_cuts(n_sub, P, 0)),
        ("feature_synthetic", dict(), lambda: naive_fcube(fcube.X[:n_sub], P)),
        ("feature_natural", dict(), lambda: naive_natural(gs, P, 0)),
        ("label_noise", dict(flip=0.3), lambda: naive_label_noise(ys, P, 0.3, 0, K)),
        ("temporal", dict(), lambda: naive_temporal(ts, P)),
        ("label_dirichlet+quantity_dirichlet", dict(beta=0.5, beta_quantity=1.0), None),
        ("label_dirichlet+feature_noise", dict(beta=0.5, sigma=0.1), None),
    ]
    print(f"partition benchmark: {N:,} rows x {P} parties, {K} labels (naive per-row loops on {n_sub:,} rows, "
          f"x{scale:g} extrapolated)")
    print(f"{'scheme':<36}{'secureflhv s':>13}{'naive s':>12}{'ratio':>9}  baseline")
    t_niid = None
    figures = []  # (scheme, ours s, naive s)
    for name, params, naive in cases:
        data = fcube if name == "feature_synthetic" else y
        t_ours, part = timed(lambda: partition(name, data, P, args.seed, groups=groups, times=times, **params))
        assert sum(len(s) for s in part) == (len(fcube) if name == "feature_synthetic" else N)
        if naive is None:
            if t_niid is None:
                t_niid, ref = timed(lambda: niid_style_labeldir(y, P, 0.5, args.seed, K))
                ours = partition("label_dirichlet", y, P, args.seed, niid_bench_compat=True, beta=0.5)
                same = all(np.array_equal(a, np.asarray(b)) for a, b in zip(ours, ref))
                label = f"NIID-Bench-style loop, full size (identical output in compat mode: {same})"
            else:
                label = "NIID-Bench-style label_dirichlet loop, full size"
            t_naive = t_niid
        else:
            t_sub, _ = timed(naive)
            t_naive = t_sub * scale
            label = "per-row Python loop, extrapolated"
        print(f"{name:<36}{t_ours:>13.3f}{t_naive:>12.2f}{t_naive / t_ours:>8.1f}x  {label}")
        figures.append((name, t_ours, t_naive))
    if not args.quick:
        record(N, P, n_sub, figures)


def record(N: int, P: int, n_sub: int, figures: list) -> None:
    """The ``partition`` row of docs/benchmarks.json: ranges over every scheme (no keys: nothing encrypted)."""
    ours, naive = [f[1] for f in figures], [f[2] for f in figures]
    ratios = [b / a for _, a, b in figures]
    _report.record("partition", {
        "what": f"partitions, {N:,} rows × {P} parties, {len(figures)} schemes (`partition.py`)",
        "ours": f"every scheme ≤ {max(ours):.2f} s (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)",
        "baseline": f"naive loops {min(naive):.2f}–{max(naive):.2f} s (per-row Python loop on {n_sub:,} rows, "
                    f"extrapolated; NIID-Bench-style loop at full size for label_dirichlet)",
        "ratio": f"{min(ratios):.1f}–{max(ratios):.0f}×"})


if __name__ == "__main__":
    main()
