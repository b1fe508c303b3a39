"""Paillier engine benchmark: secureflhv (DJN + gmpy2 + process pool) versus phe, same run.

Prints ops/s per core for encrypt (public key and key-holder CRT), decrypt, add, scalar-multiply
(53-bit and 16-bit scalars), dot (X.T @ enc), and 2-worker throughput with the scaling factor, for
1024/2048/3072-bit keys.  Ratios are against phe 1.5 (with gmpy2) measured in the same process.

    python benchmarks/paillier.py            # full run (a few minutes)
    python benchmarks/paillier.py --quick    # smoke run, 1024-bit only, small counts
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from secureflhv.crypto import paillier as P


CLOCK = time.process_time  # one-core rows: ops per CPU-second of this process (robust to a busy machine)


def rate(fn, count: int, min_time: float = 0.0, clock=None) -> float:
    """ops/s of fn() which performs ``count`` operations (repeated until min_time has passed)."""
    clock = clock or CLOCK
    reps, t0 = 0, clock()
    while True:
        fn()
        reps += 1
        dt = clock() - t0
        if dt >= min_time:
            return reps * count / max(dt, 1e-9)


def bench_key(bits: int, quick: bool, workers: int) -> list[tuple]:
    rows = []
    scale = 0.1 if quick else 1.0
    N = lambda k: max(8, int(k * scale))  # noqa: E731
    t0 = time.perf_counter()
    pk, sk = P.generate_keypair(bits, insecure_test_key=bits < 2048)
    print(f"[{bits}] keygen {time.perf_counter() - t0:.1f}s", flush=True)
    ppk, psk = pk.to_phe(), sk.to_phe()
    rng = np.random.default_rng(0)

    # ---------------------------------------------------------------- ours, one core (inline)
    P.set_workers(1)
    t0 = time.perf_counter()
    P.encrypt(pk, np.zeros(P.PAR_ENCRYPT_MIN))      # builds the fixed-base table (one-off per key)
    P.encrypt(sk, np.zeros(P.PAR_ENCRYPT_MIN))      # CRT tables
    print(f"[{bits}] fixed-base tables built in {time.perf_counter() - t0:.2f}s", flush=True)
    x = rng.normal(size=N(3000))
    enc_pub = rate(lambda: P.encrypt(pk, x), len(x))
    enc_crt = rate(lambda: P.encrypt(sk, x), len(x))
    e = P.encrypt(pk, x)
    xd = x[:N(600)]
    ed = e[:len(xd)]
    dec = rate(lambda: P.decrypt(sk, ed), len(xd))
    e2 = P.encrypt(pk, x)
    add = rate(lambda: e + e2, len(x), 0.5)
    k53 = rng.integers(-(2 ** 53) + 1, 2 ** 53, size=N(1500))
    k16 = rng.integers(-(2 ** 16) + 1, 2 ** 16, size=N(3000))
    es53, es16 = e[:len(k53)], P.encrypt(pk, rng.normal(size=len(k16)))
    smul53 = rate(lambda: es53 * k53, len(k53))
    smul16 = rate(lambda: es16 * k16, len(k16))
    n_rows, d = N(5000), 10
    X = rng.normal(size=(n_rows, d))
    ex = P.encrypt(pk, rng.normal(size=n_rows))
    dot = rate(lambda: P.dot(X, ex), n_rows * d)

    # ---------------------------------------------------------------- phe, one core
    nphe = N(150) if bits <= 2048 else N(60)
    xs = [float(v) for v in x[:nphe]]
    phe_enc = rate(lambda: [ppk.encrypt(v) for v in xs], nphe)
    pe = [ppk.encrypt(v) for v in xs]
    phe_dec = rate(lambda: [psk.decrypt(c) for c in pe], nphe)
    pe2 = [ppk.encrypt(v) for v in xs]
    phe_add = rate(lambda: [a + b for a, b in zip(pe, pe2)], nphe, 0.5)
    ks53 = [int(k) for k in k53[:nphe]]   # same signed scalars as ours (phe: inverse + n-k exponent)
    ks16 = [int(k) for k in k16[:nphe]]
    phe_s53 = rate(lambda: [c * k for c, k in zip(pe, ks53)], nphe)
    phe_s16 = rate(lambda: [c * k for c, k in zip(pe, ks16)], nphe)
    phe_dot = rate(lambda: [sum(ec * float(X[i, j]) for i, ec in enumerate(pe[:20]))
                            for j in range(2)], 40)

    rows += [
        (bits, "encrypt (public key, DJN)", enc_pub, phe_enc),
        (bits, "encrypt (key holder, DJN+CRT)", enc_crt, phe_enc),
        (bits, "decrypt (CRT)", dec, phe_dec),
        (bits, "add (enc + enc)", add, phe_add),
        (bits, "scalar mul, 53-bit signed", smul53, phe_s53),
        (bits, "scalar mul, 16-bit signed", smul16, phe_s16),
        (bits, "dot X.T@enc (per X entry)", dot, phe_dot),
    ]

    # ---------------------------------------------------------------- ours, `workers` processes
    if workers > 1:
        P.set_workers(workers)
        big = rng.normal(size=N(6000))
        P.encrypt(pk, big[: 64 * workers * 4])              # start pool, build worker tables
        P.encrypt(sk, big[: 64 * workers * 4])
        P.decrypt(sk, e[: 8 * workers * 4])
        enc2 = rate(lambda: P.encrypt(pk, big), len(big), clock=time.perf_counter)
        crt2 = rate(lambda: P.encrypt(sk, big), len(big), clock=time.perf_counter)
        ed2 = e[:N(1200)] if len(e) >= N(1200) else e
        dec2 = rate(lambda: P.decrypt(sk, ed2), len(ed2), clock=time.perf_counter)
        s2 = rate(lambda: es53 * k53, len(k53), clock=time.perf_counter)
        Xb = rng.normal(size=(N(10000), d))
        exb = P.encrypt(pk, rng.normal(size=Xb.shape[0]))
        dot2 = rate(lambda: P.dot(Xb, exb), Xb.size, clock=time.perf_counter)
        rows += [
            (bits, f"encrypt public, {workers} workers", enc2, enc_pub),
            (bits, f"encrypt key holder, {workers} workers", crt2, enc_crt),
            (bits, f"decrypt, {workers} workers", dec2, dec),
            (bits, f"scalar mul 53-bit, {workers} workers", s2, smul53),
            (bits, f"dot, {workers} workers", dot2, dot),
        ]
        P.shutdown_workers()
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1024-bit key, small counts")
    ap.add_argument("--bits", type=int, nargs="*", default=None, help="key sizes (default 1024 2048 3072)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes for the throughput rows")
    args = ap.parse_args(argv)
    bits_list = args.bits or ([1024] if args.quick else [1024, 2048, 3072])
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    rows = []
    for bits in bits_list:
        rows += bench_key(bits, args.quick, args.workers)
    print()
    print(f"{'bits':>5} | {'operation':<36} | {'secureflhv ops/s':>16} | {'baseline ops/s':>14} | {'ratio':>7}")
    print("-" * 92)
    for bits, name, ours, base in rows:
        print(f"{bits:>5} | {name:<36} | {ours:>16,.0f} | {base:>14,.0f} | {ours / base:>6.2f}x")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("\none-core rows: ops per CPU-second (time.process_time); worker rows: wall-clock ops/s.")
    print("baseline = phe 1.5 (gmpy2) on one core, except 'N workers' rows whose baseline is secureflhv "
          "on one core (ratio = scaling).")


if __name__ == "__main__":
    main()
