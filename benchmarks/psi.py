"""Benchmark ECDH-PSI (secureflhv.vertical.psi) against an insecure plain hash join.

Both parties run in this process as threads over InProcessNetwork (payloads are still serialised
protobuf); each party has its own process pool of ``--workers`` processes, so with 2 parties on a
2-core machine both parties' work shares the same 2 cores (a real deployment gives each party its
own machine, roughly halving the wall time; the per-party CPU estimate is printed too).

Baseline, measured in the same run: the naive (insecure) PSI -- each side sends SHA-256(id) and
the intersection is a hash join. It reveals every hashed ID to the other side, so the ratio is the
price of security.

    python benchmarks/psi.py            # 1,000,000 IDs per side, 50% overlap (recorded in docs/benchmarks.json)
    python benchmarks/psi.py --quick    # 20,000 IDs, a smoke run

Printed beside the time: bytes each party sent and received (payload + framing, ``secureflhv.transport.wire``).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from secureflhv.crypto.psi import blind, hash_context, hash_to_points, new_scalar  # noqa: E402
from secureflhv.transport import InProcessNetwork  # noqa: E402
from secureflhv.vertical.psi import align_ids_guest, align_ids_host  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402
import _wire  # noqa: E402


def make_ids(n: int, overlap: float, hosts: int, seed: int):
    """Guest IDs 0..n-1; each host has a random ``overlap * n`` of them plus its own fresh IDs; shuffled."""
    rng = np.random.default_rng(seed)
    common = int(round(overlap * n))
    guest = [f"CUST-{i:012d}" for i in rng.permutation(n).tolist()]
    out = []
    for j in range(hosts):
        shared = rng.choice(n, size=common, replace=False)
        own = np.arange(n + j * n, n + j * n + n - common)  # disjoint from the guest and other hosts
        vals = rng.permutation(np.concatenate([shared, own]))
        out.append([f"CUST-{i:012d}" for i in vals.tolist()])
    return guest, out


def x25519_cost(samples: int = 20_000) -> float:
    """Seconds per X25519 operation (from_public_bytes + exchange) on one core, measured now."""
    pts = hash_to_points([f"calib-{i}" for i in range(samples)], hash_context("calib", b"\0" * 32))
    t0 = time.perf_counter()
    blind(pts, new_scalar())
    return (time.perf_counter() - t0) / samples


def naive_psi(guest_ids, host_ids_list):
    """Insecure baseline: SHA-256 every ID on each side, intersect by hash join. Returns (seconds, size)."""
    t0 = time.perf_counter()
    sha = hashlib.sha256
    g = {sha(x.encode()).digest(): i for i, x in enumerate(guest_ids)}
    common = set(g)
    for ids in host_ids_list:
        common &= {sha(x.encode()).digest() for x in ids}
    rows = sorted((g[h] for h in common), key=guest_ids.__getitem__)
    return time.perf_counter() - t0, len(rows)


def cpu_seconds() -> float:
    """User+system CPU seconds of this process and of its reaped children (the pool workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_psi(guest_ids, host_ids_list, workers):
    hosts = [f"host-{j + 1}" for j in range(len(host_ids_list))]
    net = InProcessNetwork("bench-psi", ["guest", *hosts], deadline=600.0)
    results, errors = {}, []

    def host(name, ids):
        try:
            results[name] = align_ids_host(net.transport(name), ids, "guest", workers=workers)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(h, ids)) for h, ids in zip(hosts, host_ids_list)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    results["guest"] = align_ids_guest(net.transport("guest"), guest_ids, hosts, workers=workers)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, results, net.wire_stats()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="IDs per party (default 1,000,000)")
    ap.add_argument("--overlap", type=float, default=0.5, help="fraction of each host's IDs the guest also has")
    ap.add_argument("--hosts", type=int, default=1, help="number of hosts (default 1)")
    ap.add_argument("--workers", type=int, default=None, help="processes per party (default: all CPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run with 20,000 IDs per party")
    args = ap.parse_args(argv)
    n = 20_000 if args.quick else args.n

    guest_ids, host_ids = make_ids(n, args.overlap, args.hosts, args.seed)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"PSI benchmark: {n:,} IDs per party, {args.hosts} host(s), overlap {args.overlap:.0%}, "
          f"{cpus} CPUs, workers per party: {args.workers or 'all CPUs'}")

    op_s = x25519_cost(2_000 if args.quick else 20_000)  # before the run: no pool competing for CPUs
    base_s, base_size = naive_psi(guest_ids, host_ids)
    cpu0 = cpu_seconds()
    wall, res, wire = run_psi(guest_ids, host_ids, args.workers)
    sent = sum(s for s, _ in _wire.per_party(wire).values())
    cpu = cpu_seconds() - cpu0
    g = res["guest"]
    expected = set(guest_ids)
    for ids in host_ids:
        expected &= set(ids)
    ok = g.ids == sorted(expected) and all(r.ids == g.ids for r in res.values()) and base_size == len(expected)
    print(f"intersection: {len(g):,} IDs ({'correct' if ok else 'WRONG'}); sent by all parties: {sent / 1e6:.1f} MB")
    for party, r in res.items():
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in r.timings.items())
        print(f"  {party:8s} {phases}")
    print(f"ECDH-PSI wall (all parties, shared {cpus} CPUs): {wall:.2f} s; bytes: {_wire.line(wire)}")
    print(f"ECDH-PSI CPU time, all parties and worker processes: {cpu:.1f} core-s "
          f"(= {cpu / cpus:.1f} s on {cpus} dedicated CPUs); with one {cpus}-CPU machine per party the guest, "
          f"the busiest, does about half: ~{cpu / 2 / cpus:.0f} s")
    print(f"naive SHA-256 hash join (insecure baseline):  {base_s:.2f} s")
    print(f"security overhead ratio: {wall / base_s:.1f}x")
    ops = 2 * (n + n * args.hosts)
    floor = ops * op_s / cpus
    print(f"X25519 operations: {ops:,} at {op_s * 1e6:.1f} us each on one core -> {floor:.1f} s on {cpus} CPUs "
          f"if nothing else cost anything; measured wall / that floor = {wall / floor:.2f}")
    if ok and not args.quick:
        _report.record("psi", {
            "what": f"PSI, {n:,} ids per side, {args.overlap:.0%} overlap, {args.hosts} host(s) (`psi.py`)",
            "ours": f"{wall:.1f} s with all parties on the same {cpus} cores ({cpu:.0f} core-s; load average "
                    f"{os.getloadavg()[0]:.1f})",
            "baseline": f"insecure SHA-256 hash join {base_s:.2f} s", "ratio": f"{wall / base_s:.0f}×",
            "bytes": _wire.cell(wire)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
