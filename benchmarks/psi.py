"""Benchmark ECDH-PSI (secureflhv.vertical.psi) and KKRT-PSI (secureflhv.vertical.psi_kkrt) against an insecure
plain hash join.

Both parties run in this process as threads over InProcessNetwork (payloads are still serialised
protobuf); each party has its own process pool of ``--workers`` processes, so with 2 parties on a
2-core machine both parties' work shares the same 2 cores (a real deployment gives each party its
own machine, roughly halving the wall time; the per-party CPU estimate is printed too).

Baseline, measured in the same run: the naive (insecure) PSI -- each side sends SHA-256(id) and
the intersection is a hash join. It reveals every hashed ID to the other side, so the ratio is the
price of security.

    python benchmarks/psi.py            # 1,000,000 IDs per side, 50% overlap, both protocols (recorded in
                                        # docs/benchmarks.json: rows psi and psi_kkrt)
    python benchmarks/psi.py --protocol kkrt   # only KKRT-PSI (ecdh: only ECDH-PSI; both: the default)
    python benchmarks/psi.py --quick    # 20,000 IDs, a smoke run
    python benchmarks/psi.py --protocol kkrt --max-message-mb 4   # KKRT-PSI with its messages in 1 MiB parts

With ``both`` the two protocols run one after the other on the same IDs in the same process, and the
ratio of their wall times is printed. KKRT-PSI runs in each party's own process (no pool). ECDH-PSI is what
jobs run by default (``job.psi_security: malicious``); KKRT-PSI needs ``job.psi_security: semi_honest``, so
the ratio is the price of that default.

Whenever KKRT-PSI runs, it also runs in the same process *without* the guest's choice-bit swap (the protocol
before issue 36, which a host with all-zero choice bits turns against the guest; both parties patched), so
the swap's cost is measured in the same run (``--no-swap-baseline`` skips it). ``--no-record`` leaves
docs/benchmarks.json alone (e.g. for a smaller ``--n``).

Printed beside the time: bytes each party sent and received (payload + framing, ``secureflhv.transport.wire``),
the load average, and the compute floor: the X25519 operations and hashes to the curve the protocol
needs, at their per-call CPU cost measured in this process just before the run, spread over the CPUs.

    python benchmarks/psi.py --primitives   # per-call CPU cost of each candidate group/library, then exit

``--primitives`` compares, interleaved in one process (best of 3, CPU time): X25519 through libsodium
(PyNaCl, what we use) and through ``cryptography``, and, where installed, Ristretto255 through
libsodium (``rbcl``: scalar multiplication and hash-to-group) and secp256k1 (``coincurve``).
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

from secureflhv.crypto.ecdh_psi import blind, hash_context, hash_to_points, new_scalar  # noqa: E402
from secureflhv.transport import InProcessNetwork  # noqa: E402
from secureflhv.vertical import psi as psi_ecdh, psi_kkrt  # noqa: E402

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


def _best_cpu(fn, samples: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` CPU seconds per item of ``fn()`` (which handles ``samples`` items)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / samples


def op_costs(samples: int = 20_000) -> tuple[float, float]:
    """CPU seconds per X25519 call (:func:`blind`) and per ID hashed to the curve, measured now, one core."""
    ids = [f"calib-{i}" for i in range(samples)]
    ctx = hash_context("calib", b"\0" * 32)
    pts, k = hash_to_points(ids, ctx), new_scalar()
    hash_s = _best_cpu(lambda: hash_to_points(ids, ctx), samples)
    mult_s = _best_cpu(lambda: blind(pts, k), samples)
    return mult_s, hash_s


def primitives(samples: int = 20_000) -> None:
    """Per-call CPU cost of each candidate group/library, interleaved in this process (best of 3)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from nacl.bindings import crypto_scalarmult

    pts = hash_to_points([f"calib-{i}" for i in range(samples)], hash_context("calib", b"\0" * 32))
    items = [pts[i:i + 32] for i in range(0, len(pts), 32)]
    k = new_scalar()
    rows = {}

    def x25519_cryptography():
        ex, pub = X25519PrivateKey.from_private_bytes(k).exchange, X25519PublicKey.from_public_bytes
        for p in items:
            ex(pub(p))

    def x25519_libsodium():
        for p in items:
            crypto_scalarmult(k, p)
    rows["X25519 scalar mult, libsodium, ours (blind(): pointers into one buffer)"] = lambda: blind(pts, k)
    rows["X25519 scalar mult, libsodium via PyNaCl's public binding"] = x25519_libsodium
    rows["X25519 scalar mult, cryptography (OpenSSL)"] = x25519_cryptography
    rows["hash ID to Curve25519 (ours: BLAKE2b + Jacobi try-and-increment)"] = \
        lambda: hash_to_points([f"calib-{i}" for i in range(samples)], hash_context("calib", b"\1" * 32))
    from nacl.bindings import crypto_core_ed25519_from_uniform
    uniform = [hashlib.sha256(p).digest() for p in items]
    rows["Elligator 2 to edwards25519 (libsodium from_uniform; conversion to u not counted)"] = \
        lambda: [crypto_core_ed25519_from_uniform(r) for r in uniform]
    try:
        import rbcl
        r_pts = [rbcl.crypto_core_ristretto255_from_hash(hashlib.sha512(p).digest()) for p in items]
        r_k = rbcl.crypto_core_ristretto255_scalar_random()
        digests = [hashlib.sha512(p).digest() for p in items]
        rows["Ristretto255 scalar mult, libsodium via rbcl"] = \
            lambda: [rbcl.crypto_scalarmult_ristretto255(r_k, p) for p in r_pts]
        rows["Ristretto255 from_hash (SHA-512 given), libsodium via rbcl"] = \
            lambda: [rbcl.crypto_core_ristretto255_from_hash(d) for d in digests]
    except ImportError:
        print("rbcl not installed: Ristretto255 not measured")
    try:
        import coincurve
        c_pts = [coincurve.PrivateKey().public_key.format() for _ in range(samples)]
        c_k = coincurve.PrivateKey().secret
        rows["secp256k1 parse + scalar mult + serialise, coincurve"] = \
            lambda: [coincurve.PublicKey(p).multiply(c_k).format() for p in c_pts]
    except ImportError:
        print("coincurve not installed: secp256k1 not measured")
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(3):  # interleaved: load changes hit every row alike
        for name, fn in rows.items():
            best[name] = min(best[name], _best_cpu(fn, samples, repeats=1))
    for name, sec in best.items():
        print(f"  {sec * 1e6:6.2f} us CPU per call  {name}")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {samples:,} calls per row, best of 3")


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


PROTOCOLS = {"ecdh": ("ECDH-PSI", psi_ecdh), "kkrt": ("KKRT-PSI", psi_kkrt)}


class without_swap:
    """Context: KKRT-PSI as before issue 36 -- the guest keeps its base-OT key pairs and the host its own choice
    bits (both sides, so the result stays correct). Only to measure what the swap costs."""

    def __enter__(self):
        self._swap, self._eff = psi_kkrt.kkrt.swap_base_ot_keys, psi_kkrt.KkrtHost._effective_choices
        psi_kkrt.kkrt.swap_base_ot_keys = lambda k0, k1, delta: (k0, k1)
        psi_kkrt.KkrtHost._effective_choices = staticmethod(lambda chosen, delta: chosen)
        return self

    def __exit__(self, *exc):
        psi_kkrt.kkrt.swap_base_ot_keys = self._swap
        psi_kkrt.KkrtHost._effective_choices = staticmethod(self._eff)


def run_psi(guest_ids, host_ids_list, workers, module=psi_ecdh, max_message_mb=256.0):
    hosts = [f"host-{j + 1}" for j in range(len(host_ids_list))]
    net = InProcessNetwork("bench-psi", ["guest", *hosts], deadline=600.0,
                           max_payload_bytes=int(max_message_mb * 2 ** 20))
    results, errors = {}, []

    def host(name, ids):
        try:
            results[name] = module.align_ids_host(net.transport(name), ids, "guest", workers=workers)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(h, ids)) for h, ids in zip(hosts, host_ids_list)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    results["guest"] = module.align_ids_guest(net.transport("guest"), guest_ids, hosts, workers=workers)
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
    ap.add_argument("--protocol", choices=("ecdh", "kkrt", "both"), default="both",
                    help="PSI protocol(s) to run (default both, one after the other, each recorded as its own row)")
    ap.add_argument("--max-message-mb", type=float, default=256.0,
                    help="every party's job.max_message_mb (default 256, the job default): KKRT-PSI sends its large "
                         "messages in parts of at most a quarter of it")
    ap.add_argument("--no-swap-baseline", action="store_true",
                    help="skip the run of KKRT-PSI without the choice-bit swap (the protocol before issue 36)")
    ap.add_argument("--no-record", action="store_true", help="print only; leave docs/benchmarks.json alone")
    ap.add_argument("--primitives", action="store_true",
                    help="only print the per-call CPU cost of each candidate group/library")
    args = ap.parse_args(argv)
    if args.primitives:
        primitives(2_000 if args.quick else 20_000)
        return 0
    n = 20_000 if args.quick else args.n

    guest_ids, host_ids = make_ids(n, args.overlap, args.hosts, args.seed)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    protocols = ["ecdh", "kkrt"] if args.protocol == "both" else [args.protocol]
    print(f"PSI benchmark: {n:,} IDs per party, {args.hosts} host(s), overlap {args.overlap:.0%}, "
          f"{cpus} CPUs, workers per party: {args.workers or 'all CPUs'}, protocols: {', '.join(protocols)}")

    if "ecdh" in protocols:
        mult_s, hash_s = op_costs(2_000 if args.quick else 20_000)  # before the run: no pool competing for CPUs
    base_s, base_size = naive_psi(guest_ids, host_ids)
    expected = set(guest_ids)
    for ids in host_ids:
        expected &= set(ids)
    walls, all_ok = {}, base_size == len(expected)
    if "kkrt" in protocols and not args.no_swap_baseline:
        with without_swap():
            cpu0 = cpu_seconds()
            wall, res, _ = run_psi(guest_ids, host_ids, args.workers, psi_kkrt, args.max_message_mb)
            cpu = cpu_seconds() - cpu0
        ok = res["guest"].ids == sorted(expected)
        all_ok &= ok
        walls["kkrt_no_swap"] = wall
        print(f"KKRT-PSI without the choice-bit swap (before issue 36; {'correct' if ok else 'WRONG'}): "
              f"{wall:.2f} s wall, {cpu:.1f} core-s")
    for proto in protocols:
        name, module = PROTOCOLS[proto]
        cpu0 = cpu_seconds()
        wall, res, wire = run_psi(guest_ids, host_ids, args.workers, module, args.max_message_mb)
        walls[proto] = wall
        sent = sum(s for s, _ in _wire.per_party(wire).values())
        cpu = cpu_seconds() - cpu0
        g = res["guest"]
        ok = g.ids == sorted(expected) and all(r.ids == g.ids for r in res.values()) and base_size == len(expected)
        all_ok &= ok
        print(f"{name} intersection: {len(g):,} IDs ({'correct' if ok else 'WRONG'}); "
              f"sent by all parties: {sent / 1e6:.1f} MB")
        for party, r in res.items():
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in r.timings.items())
            print(f"  {party:8s} {phases}")
        print(f"{name} wall (all parties, shared {cpus} CPUs): {wall:.2f} s; bytes: {_wire.line(wire)}")
        print(f"{name} CPU time, all parties and worker processes: {cpu:.1f} core-s "
              f"(= {cpu / cpus:.1f} s on {cpus} dedicated CPUs); with one {cpus}-CPU machine per party the guest, "
              f"the busiest, does about half: ~{cpu / 2 / cpus:.0f} s")
        print(f"naive SHA-256 hash join (insecure baseline):  {base_s:.2f} s")
        print(f"{name} security overhead ratio: {wall / base_s:.1f}x")
        load = os.getloadavg()
        what = f"PSI, {n:,} ids per side, {args.overlap:.0%} overlap, {args.hosts} host(s)"
        if proto == "ecdh":
            ops, hashes = 2 * (n + n * args.hosts), n + n * args.hosts
            floor = (ops * mult_s + hashes * hash_s) / cpus
            print(f"compute floor: {ops:,} X25519 calls at {mult_s * 1e6:.1f} us CPU + {hashes:,} hashes to the curve "
                  f"at {hash_s * 1e6:.1f} us = {floor * cpus:.0f} core-s -> {floor:.1f} s on {cpus} CPUs if nothing "
                  f"else cost anything; measured wall / floor = {wall / floor:.2f}, CPU / floor = "
                  f"{cpu / (floor * cpus):.2f}")
            key, row = "psi", {
                "what": f"{what} (`psi.py`)",
                "ours": f"{wall:.1f} s with all parties on the same {cpus} cores ({cpu:.0f} core-s, compute floor "
                        f"{floor:.0f} s; load average {load[0]:.1f})"}
        else:
            vs = f"; ECDH-PSI in the same run {walls['ecdh']:.1f} s" if "ecdh" in walls else ""
            if "kkrt_no_swap" in walls:
                vs += f"; without the choice-bit swap {walls['kkrt_no_swap']:.1f} s"
                print(f"choice-bit swap: KKRT-PSI {wall:.2f} s with it, {walls['kkrt_no_swap']:.2f} s without "
                      f"({(wall / walls['kkrt_no_swap'] - 1) * 100:+.1f}%, one run each: noise dominates)")
            key, row = "psi_kkrt", {
                "what": f"{what}, KKRT OT-extension PSI (`psi.py --protocol kkrt`)",
                "ours": f"{wall:.1f} s with all parties on the same {cpus} cores ({cpu:.0f} core-s{vs}; "
                        f"load average {load[0]:.1f})"}
        print(f"load average (1, 5 min) after the run: {load[0]:.2f}, {load[1]:.2f}")
        if ok and not args.quick and not args.no_record:
            _report.record(key, {**row, "baseline": f"insecure SHA-256 hash join {base_s:.2f} s",
                                 "ratio": f"{wall / base_s:.0f}×", "bytes": _wire.cell(wire)})
    if "ecdh" in walls and "kkrt" in walls:
        print(f"KKRT-PSI / ECDH-PSI wall time: {walls['kkrt'] / walls['ecdh']:.3f} "
              f"({walls['ecdh'] / walls['kkrt']:.1f}x faster); load average {os.getloadavg()[0]:.2f}; jobs run "
              f"ECDH-PSI unless job.psi_security is semi_honest")
    ok = all_ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
