"""Paillier engine benchmark: secureflhv (DJN + gmpy2 + process pool) versus phe and HEU, same run.

Prints ops/s per core for encrypt (public key and key-holder CRT), decrypt, add (elementwise
``enc + enc``, ``enc.sum()``, and the SecureBoost host's histogram bucket adds per row and feature,
whose baseline is one phe addition per entry), scalar-multiply (53-bit and 16-bit scalars), dot
(X.T @ enc), and 2-worker throughput with the scaling factor, for 1024/2048/3072-bit keys.  Ratios are against phe 1.5 (with gmpy2) measured in the same process.
When SecretFlow's HEU (``sf-heu``) is installed, its Paillier (``ZPaillier``) and Okamoto-Uchiyama
(``OU``) rates at the same key size are measured in the same run, one thread, beside ours.
A full run records its 2048-bit figures in ``docs/benchmarks.json`` (``benchmarks/_report.py``).
Key sizes: those listed (1024-bit keys are below current guidance and are measured for comparison
only); the fixed-base tables are built before timing (their one-off cost is printed).

    python benchmarks/paillier.py            # full run (a few minutes)
    python benchmarks/paillier.py --quick    # smoke run, 1024-bit only, small counts, nothing recorded
    python benchmarks/paillier.py --scaling-only --bits 2048   # 2 workers vs a pool of 1 only

Worker rows: the same code path (the process pool) with N workers and with a pool of one (except the
key holder's encryption: by rows on a pool of one, one CRT half per worker on an even pool), tables
built in every worker before timing (start-up printed apart), wall clock best of k with the pool
sizes alternating, plus CPU seconds per operation of the parent and the workers together (on a
shared machine: "efficiency" = CPU per op at 1 worker / at N; "CPU-bound scaling" = N x efficiency).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import gmpy2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's secureflhv, not an installed one

from secureflhv.crypto.homomorphic import paillier as P  # noqa: E402
from secureflhv.crypto.homomorphic import paillier_engine as E  # noqa: E402
from secureflhv.crypto.homomorphic import paillier_hist as H  # noqa: E402
from secureflhv.compute import pool as _par  # noqa: E402


CLOCK = time.process_time  # one-core rows: ops per CPU-second of this process, best of 3 (robust to a busy machine)


class _OwnKeyWarnings(logging.Filter):
    """Drop the library's per-object "INSECURE key" warnings: this benchmark states every key size it
    uses itself (``key_note``), once, so nothing is printed about keys it did not use."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "INSECURE" not in record.getMessage()


def key_note(bits: int) -> str:
    """What a key size means (NIST SP 800-57 part 1, table 2)."""
    if bits < 2048:
        return f"{bits}-bit keys: INSECURE (~80-bit security), below current guidance, measured for comparison only"
    return f"{bits}-bit keys: ~{112 if bits < 3072 else 128}-bit security"


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


def best(fn, count: int, min_time: float = 0.0, reps: int = 3) -> float:
    """The highest of ``reps`` rates: on a shared machine the least disturbed run is the engine's rate.
    Ours and the baselines are measured the same way, so their ratio stays fair."""
    return max(rate(fn, count, min_time) for _ in range(reps))


def bench_key(bits: int, quick: bool, workers: int) -> list[tuple]:
    rows = []
    scale = 0.1 if quick else 1.0
    N = lambda k: max(8, int(k * scale))  # noqa: E731
    t0 = time.perf_counter()
    pk, sk = P.generate_keypair(bits, insecure_test_key=bits < 2048)
    print(f"[{bits}] Paillier keygen {time.perf_counter() - t0:.1f}s", flush=True)
    ppk, psk = pk.to_phe(), sk.to_phe()
    rng = np.random.default_rng(0)

    # ---------------------------------------------------------------- ours, one core (inline)
    P.set_workers(1)
    t0 = time.perf_counter()
    E.public_engine(pk.n).prepare()                 # the large fixed-base table (one-off per key)
    E.private_engine(sk.p, sk.q).prepare()          # CRT tables
    print(f"[{bits}] fixed-base tables built in {time.perf_counter() - t0:.2f}s", flush=True)
    x = rng.normal(size=N(3000))
    enc_pub = best(lambda: P.encrypt(pk, x), len(x))
    enc_crt = best(lambda: P.encrypt(sk, x), len(x))
    e = P.encrypt(pk, x)
    xd = x[:N(600)]
    ed = e[:len(xd)]
    dec = best(lambda: P.decrypt(sk, ed), len(xd))
    e2 = P.encrypt(pk, x)
    add = best(lambda: e + e2, len(x), 0.5)
    esum = best(lambda: e.sum(), len(x), 0.5)
    # SecureBoost host histograms (the adds the tree algorithms make): per (row, feature) entry
    hb = rng.integers(0, 32, size=(len(x), 4)).astype(np.uint8)
    hcts = e.ciphertexts.tolist()
    hist = best(lambda: H.histograms(hcts, hb, [32] * 4, pk.nsquare), hb.size, 0.5)
    k53 = rng.integers(-(2 ** 53) + 1, 2 ** 53, size=N(1500))
    k16 = rng.integers(-(2 ** 16) + 1, 2 ** 16, size=N(3000))
    es53, es16 = e[:len(k53)], P.encrypt(pk, rng.normal(size=len(k16)))
    smul53 = best(lambda: es53 * k53, len(k53))
    smul16 = best(lambda: es16 * k16, len(k16))
    n_rows, d = N(5000), 10
    X = rng.normal(size=(n_rows, d))
    ex = P.encrypt(pk, rng.normal(size=n_rows))
    dot = best(lambda: P.dot(X, ex), n_rows * d)
    limits = gmpy2_limits(pk, sk, e, e2, len(xd))

    # ---------------------------------------------------------------- phe, one core
    nphe = N(150) if bits <= 2048 else N(60)
    xs = [float(v) for v in x[:nphe]]
    phe_enc = best(lambda: [ppk.encrypt(v) for v in xs], nphe)
    pe = [ppk.encrypt(v) for v in xs]
    phe_dec = best(lambda: [psk.decrypt(c) for c in pe], nphe)
    pe2 = [ppk.encrypt(v) for v in xs]
    phe_add = best(lambda: [a + b for a, b in zip(pe, pe2)], nphe, 0.5)
    phe_sum = best(lambda: sum(pe[1:], pe[0]), nphe - 1, 0.5)
    ks53 = [int(k) for k in k53[:nphe]]   # same signed scalars as ours (phe: inverse + n-k exponent)
    ks16 = [int(k) for k in k16[:nphe]]
    phe_s53 = best(lambda: [c * k for c, k in zip(pe, ks53)], nphe)
    phe_s16 = best(lambda: [c * k for c, k in zip(pe, ks16)], nphe)
    phe_dot = best(lambda: [sum(ec * float(X[i, j]) for i, ec in enumerate(pe[:20]))
                            for j in range(2)], 40)

    rows += [
        (bits, "encrypt (public key, DJN)", enc_pub, phe_enc),
        (bits, "encrypt (key holder, DJN+CRT)", enc_crt, phe_enc),
        (bits, "decrypt (CRT)", dec, phe_dec),
        (bits, "add (enc + enc)", add, phe_add),
        (bits, "sum (enc.sum(), per ciphertext)", esum, phe_sum),
        (bits, "histogram adds (per row x feature)", hist, phe_add),
        (bits, "scalar mul, 53-bit signed", smul53, phe_s53),
        (bits, "scalar mul, 16-bit signed", smul16, phe_s16),
        (bits, "dot X.T@enc (per X entry)", dot, phe_dot),
        (bits, f"encrypt vs {limits['digits'] - 1} bare x*y % n^2", enc_pub, limits["encrypt"]),
        (bits, "decrypt vs 2 bare half-size powmods", dec, limits["decrypt"]),
        (bits, "add vs bare x*y % n^2", add, limits["mulmod"]),
    ]

    # ---------------------------------------------------------------- ours, `workers` processes
    if workers > 1:
        rows += bench_scaling(pk, sk, workers, N, rng)
    return rows


def _cpu_now() -> float:
    """CPU seconds of this process plus the pool's workers (read from each worker)."""
    return time.process_time() + _par.worker_cpu_seconds()


CPU_EFFICIENCY: dict = {}  # (bits, operation) -> CPU per op at 1 worker / at N (bench_scaling)


def _control_task(n2: int, base: int, count: int) -> int:
    """``count`` chained full-size powmods: pure CPU, a few KB of data (the machine's own scaling)."""
    b, e, n2 = gmpy2.mpz(base), gmpy2.mpz(base) >> (n2.bit_length() // 4), gmpy2.mpz(n2)  # n-bit/2 exponent
    for _ in range(count):
        b = gmpy2.powmod(b, e, n2)
    return int(b)


def _control_batch(pk, count: int) -> None:
    """The control row: the same pool, chunking and result path as the crypto rows, with a task that
    touches no table and no big data; its scaling is what the cores themselves give two processes (on a
    VM whose two vCPUs share a physical core, or on a busy machine, it falls short of 2)."""
    from secureflhv.compute import executor as ex

    parts = ex.parallel_chunks(count, 1)
    ex.run(_control_task, (int(pk.nsquare), int(pk.n) - 12345), [(count // parts,)] * parts)


def bench_scaling(pk, sk, workers: int, N, rng, rounds: int = 2, reps: int = 2) -> list[tuple]:
    """Each batch operation through the process pool with ``workers`` processes and with a pool of ONE
    (same code path, same chunking rule), warm tables, best of ``rounds`` x ``reps`` wall-clock runs,
    the pool sizes alternating round by round.  Also the CPU seconds per operation (this process plus
    the workers): their ratio is the efficiency the pool keeps when the cores are shared.

    Rows: (bits, "<op>, N workers", wall ops/s at N, wall ops/s at 1); the CPU figures are printed.
    """
    bits = pk.n.bit_length()
    big = rng.normal(size=N(6000))
    e = P.encrypt(pk, rng.normal(size=N(1200)))
    es = P.encrypt(pk, rng.normal(size=N(1500)))
    k53 = rng.integers(-(2 ** 53) + 1, 2 ** 53, size=len(es))
    Xb = rng.normal(size=(N(10000), 10))
    exb = P.encrypt(pk, rng.normal(size=Xb.shape[0]))
    n_ctl = N(600)
    # SecureBoost host: one node of 10,000 rows x 10 features, 32 bins (scenario (a)'s root; the tree's
    # row ciphertexts are sent to the workers once, at the first call, as in a tree), and the cipher
    # compression of a level's candidates (26 per ciphertext, 78-bit shifts)
    hrows = np.arange(Xb.shape[0], dtype=np.int64)
    hbins = rng.integers(0, 32, size=Xb.shape).astype(np.uint8)
    hcts = exb.ciphertexts.tolist()
    ccts = hcts[:N(2600)]
    ops = {
        "control: powmod": (lambda: _control_batch(pk, n_ctl), n_ctl),
        "encrypt public": (lambda: P.encrypt(pk, big), len(big)),
        "encrypt key holder": (lambda: P.encrypt(sk, big), len(big)),
        "decrypt": (lambda: P.decrypt(sk, e), len(e)),
        "scalar mul 53-bit": (lambda: es * k53, len(k53)),
        "dot X^T·[[d]]": (lambda: P.dot(Xb, exb), Xb.size),
        "host histograms": (lambda: H.build_node(hcts, hrows, hbins, [32] * hbins.shape[1], pk.nsquare), hbins.size),
        "cipher compression": (lambda: H.compress(ccts, 26, 78, pk.nsquare), len(ccts)),
    }
    wall = {w: {k: 0.0 for k in ops} for w in (1, workers)}
    cpu = {w: {k: float("inf") for k in ops} for w in (1, workers)}
    for rnd in range(rounds):
        for w in (1, workers):
            P.set_workers(w, pool_for_one=True)
            start = E.warm(pk.n, (sk.p, sk.q))
            if rnd == 0:
                print(f"[{bits}] pool of {w}: start-up + worker tables {start:.2f}s (one-off, not in the rates)",
                      flush=True)
            for name, (fn, count) in ops.items():
                fn()  # first call: anything still lazy
                for _ in range(reps):
                    c0, t0 = _cpu_now(), time.perf_counter()
                    fn()
                    t1 = time.perf_counter()
                    c1 = _cpu_now()
                    wall[w][name] = max(wall[w][name], count / (t1 - t0))
                    cpu[w][name] = min(cpu[w][name], (c1 - c0) / count)
            P.shutdown_workers()
    P.set_workers(1)
    print(f"[{bits}] {workers} workers vs a pool of 1 (load average {os.getloadavg()[0]:.2f}):", flush=True)
    rows = []
    for name in ops:
        w1, wn = wall[1][name], wall[workers][name]
        eff = cpu[1][name] / cpu[workers][name]
        got = wn * cpu[workers][name]  # cores this run actually had (CPU seconds per wall second)
        print(f"[{bits}]   {name:<20} wall {wn:,.0f}/s vs {w1:,.0f}/s = {wn / w1:.2f}x; CPU per op "
              f"{cpu[workers][name] * 1e6:,.0f} vs {cpu[1][name] * 1e6:,.0f} us (efficiency {eff:.2f}, "
              f"CPU-bound scaling {workers * eff:.2f}x); cores had {got:.2f}", flush=True)
        rows.append((bits, f"{name}, {workers} workers", wn, w1))
        CPU_EFFICIENCY[(bits, name)] = eff
    return rows


def gmpy2_limits(pk, sk, e, e2, n_dec: int) -> dict:
    """What Python + gmpy2 cannot beat on this machine, same run: one ``x * y % n^2`` on ciphertexts
    (an addition; the public-key encryption's fixed-base step, ``digits - 1`` of them per value with
    the large table) and the two bare half-size powmods of CRT decryption (``c^(p-1) mod p^2``, same
    for q).  Rows "... vs bare ..." show how close each operation is to that bound (ratio <= 1)."""
    import gmpy2

    n2 = pk.nsquare
    a, b = e.ciphertexts.tolist(), e2.ciphertexts.tolist()
    mulmod = best(lambda: [x * y % n2 for x, y in zip(a, b)], len(a), 0.5)
    p, q = gmpy2.mpz(sk.p), gmpy2.mpz(sk.q)
    cts = a[:n_dec]
    dec = best(lambda: (gmpy2.powmod_base_list(cts, p - 1, p * p), gmpy2.powmod_base_list(cts, q - 1, q * q)),
               len(cts))
    digits = E.public_engine(pk.n)._ensure_table().n_digits
    return {"mulmod": mulmod, "decrypt": dec, "digits": digits, "encrypt": mulmod / (digits - 1)}


def bench_heu(bits: int, quick: bool) -> dict | None:
    """HEU (sf-heu) one-thread rates at ``bits``: {"paillier"|"ou": {"encrypt", "decrypt", "add"}}.

    Scalar API (one ciphertext per call), the same counts as ours; None when sf-heu is not installed.
    """
    try:
        from heu import phe as hphe
    except ImportError:
        return None
    scale = 0.1 if quick else 1.0
    out = {}
    for name, schema, n_enc in (("paillier", hphe.SchemaType.ZPaillier, 3000), ("ou", hphe.SchemaType.OU, 20000)):
        kit = hphe.setup(schema, bits)
        enc, dec, ev = kit.encryptor(), kit.decryptor(), kit.evaluator()
        pts = [hphe.Plaintext(kit.get_schema(), i * 7919 - 10 ** 6) for i in range(max(8, int(n_enc * scale)))]
        [enc.encrypt(p) for p in pts[:8]]
        r_enc = best(lambda: [enc.encrypt(p) for p in pts], len(pts))
        cts = [enc.encrypt(p) for p in pts]
        nd = max(8, len(cts) // 5)
        r_dec = best(lambda: [dec.decrypt(c) for c in cts[:nd]], nd)
        r_add = best(lambda: [ev.add(a, b) for a, b in zip(cts, cts)], len(cts), 0.5)
        out[name] = {"encrypt": r_enc, "decrypt": r_dec, "add": r_add}
        print(f"[{bits}] HEU {name}: encrypt {r_enc:,.0f}/s, decrypt {r_dec:,.0f}/s, add {r_add:,.0f}/s", flush=True)
    return out


def bench_our_ou(bits: int, quick: bool) -> dict | None:
    """Our OU backend (crypto.ou: HEU's key, gmpy2 arithmetic, 256-bit randomness), one core:
    {"encrypt", "decrypt", "add", "keygen_s"}; None without sf-heu."""
    try:
        from secureflhv.crypto.homomorphic import ou
        t0 = time.perf_counter()
        pub, priv = ou.generate_keypair(bits, insecure_test_key=bits < 2048)
    except ImportError:
        return None
    keygen = time.perf_counter() - t0
    x = np.random.default_rng(3).normal(size=max(8, int(20000 * (0.1 if quick else 1.0))))
    ou.encrypt(pub, x[:64], 40)  # tables
    ou.encrypt(priv, x[:64], 40)  # the key holder's (CRT) tables
    r_enc = best(lambda: ou.encrypt(pub, x, 40), len(x))
    r_crt = best(lambda: ou.encrypt(priv, x, 40), len(x))
    e = ou.encrypt(pub, x, 40)
    nd = max(8, len(x) // 5)
    r_dec = best(lambda: ou.decrypt(priv, e[:nd]), nd)
    r_add = best(lambda: e + e, len(x), 0.5)
    print(f"[{bits}] our OU: keygen {keygen:.1f}s, encrypt {r_enc:,.0f}/s (key holder, CRT: {r_crt:,.0f}/s), "
          f"decrypt {r_dec:,.0f}/s, add {r_add:,.0f}/s", flush=True)
    return {"encrypt": r_enc, "encrypt_crt": r_crt, "decrypt": r_dec, "add": r_add, "keygen_s": keygen}


def heu_rows(bits: int, heu: dict | None, ours: dict) -> list[tuple]:
    """Table rows comparing our Paillier with HEU's (ratio = ours / HEU)."""
    if not heu:
        return []
    h = heu["paillier"]
    return [(bits, "encrypt (public key) vs HEU Paillier", ours["encrypt"], h["encrypt"]),
            (bits, "decrypt vs HEU Paillier", ours["decrypt"], h["decrypt"]),
            (bits, "add vs HEU Paillier", ours["add"], h["add"]),
            (bits, "HEU OU encrypt vs our Paillier", heu["ou"]["encrypt"], ours["encrypt"]),
            (bits, "HEU OU decrypt vs our Paillier", heu["ou"]["decrypt"], ours["decrypt"]),
            (bits, "HEU OU add vs our Paillier", heu["ou"]["add"], ours["add"])] + ou_rows(bits, heu)


def ou_rows(bits: int, heu: dict) -> list[tuple]:
    """Our OU against HEU's OU (ratio = ours / HEU); empty when our OU was not measured."""
    o = heu.get("ou_ours")
    if not o:
        return []
    return [(bits, f"our OU {k} vs HEU OU", o[k], heu["ou"][k]) for k in ("encrypt", "decrypt", "add")]


def record_figures(rows: list[tuple], heu: dict | None, load: tuple[float, float]) -> None:
    """Record the 2048-bit figures (docs/benchmarks.json) as the 'paillier', 'paillier_workers', 'ou' rows."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import record

    r = {name: (ours, base) for bits, name, ours, base in rows if bits == 2048}
    if "encrypt (public key, DJN)" not in r:
        return
    note = (f" Load average {load[0]:.1f} / {load[1]:.1f} (start / end) on {os.cpu_count()} cores"
            + (": measured under load, absolute rates low, ratios from the same run." if max(load) > 1.5 else "."))
    enc, crt, dec, add = (r[k] for k in ("encrypt (public key, DJN)", "encrypt (key holder, DJN+CRT)",
                                         "decrypt (CRT)", "add (enc + enc)"))
    ssum, hist = r["sum (enc.sum(), per ciphertext)"], r["histogram adds (per row x feature)"]
    dot = r["dot X.T@enc (per X entry)"]
    hp = heu["paillier"] if heu else None
    baseline = (f"phe 1.5 + gmpy2: encrypt {enc[1]:,.0f}/s; decrypt {dec[1]:,.0f}/s; add {add[1]:,.0f}/s; "
                f"X^T·[[d]] {dot[1]:,.0f}/s")
    ratio = (f"phe: {enc[0] / enc[1]:.1f}× ({crt[0] / crt[1]:.1f}×); {dec[0] / dec[1]:.1f}×; "
             f"{add[0] / add[1]:.1f}×; "
             f"{dot[0] / dot[1]:.1f}×")
    if hp:
        baseline += (f". HEU 0.5 ZPaillier, one thread: encrypt {hp['encrypt']:,.0f}/s; "
                     f"decrypt {hp['decrypt']:,.0f}/s; "
                     f"add {hp['add']:,.0f}/s")
        ratio += (f". HEU: {enc[0] / hp['encrypt']:.2f}×; {dec[0] / hp['decrypt']:.2f}×; "
                  f"{add[0] / hp['add']:.2f}×")
    else:
        baseline += ". HEU: not measured (sf-heu not installed)"
    record("paillier", dict(
        what="Paillier 2048-bit (~112-bit security), one core, ops per CPU-second, best of 3 (`paillier.py`)",
        ours=(f"encrypt {enc[0]:,.0f}/s (key holder, CRT: {crt[0]:,.0f}/s); decrypt {dec[0]:,.0f}/s; "
              f"add {add[0]:,.0f}/s (sum {ssum[0]:,.0f}/s, histogram {hist[0]:,.0f} entries/s); "
              f"X^T·[[d]] {dot[0]:,.0f} entries/s." + note),
        baseline=baseline, ratio=ratio))
    w = {k.split(",")[0]: v for k, v in r.items() if "workers" in k}
    if w and max(load) >= (os.cpu_count() or 1):
        print("2-worker scaling not recorded: other processes held the cores (load average >= core count)")
    elif w:
        record("paillier_workers", dict(
            what=("Paillier 2048-bit, 2 workers vs a pool of 1 (same code path, except the key holder's "
                  "encryption: by rows on 1, one CRT half per worker on 2; tables built in every worker "
                  "first), wall clock best of 4, rounds alternating; CPU efficiency = CPU per op at 1 / at 2 "
                  "(`paillier.py`)"),
            ours=", ".join(f"{k} {v[0] / v[1]:.2f}× (CPU {CPU_EFFICIENCY.get((2048, k), float('nan')):.2f})"
                           for k, v in w.items()) + "." + note,
            baseline="the same operation through a pool of one worker, same run", ratio=""))
    if heu and heu.get("ou_ours"):
        record_ou(heu, enc[0], dec[0], add[0], note)


def record_ou(heu: dict, p_enc: float, p_dec: float, p_add: float, note: str) -> None:
    """The 'ou' row: our OU backend beside HEU's OU engine and our Paillier, same run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import record

    o, h = heu["ou_ours"], heu["ou"]
    record("ou", dict(
        what=("Okamoto-Uchiyama 2048-bit (~112-bit security; HEU key, our gmpy2 arithmetic, 256-bit randomness), "
              "one core, ops per CPU-second, best of 3 (`paillier.py`)"),
        ours=(f"encrypt {o['encrypt']:,.0f}/s (key holder, CRT: {o['encrypt_crt']:,.0f}/s); "
              f"decrypt {o['decrypt']:,.0f}/s; add {o['add']:,.0f}/s; "
              f"key generation {o['keygen_s']:.1f} s." + note),
        baseline=(f"HEU 0.5 OU, one thread (110-bit randomness): encrypt {h['encrypt']:,.0f}/s; decrypt "
                  f"{h['decrypt']:,.0f}/s; add {h['add']:,.0f}/s. Our Paillier 2048-bit: encrypt {p_enc:,.0f}/s; "
                  f"decrypt {p_dec:,.0f}/s; add {p_add:,.0f}/s"),
        ratio=(f"HEU OU: {o['encrypt'] / h['encrypt']:.2f}×; {o['decrypt'] / h['decrypt']:.2f}×; "
               f"{o['add'] / h['add']:.2f}×. Our Paillier: {o['encrypt'] / p_enc:.1f}×; "
               f"{o['decrypt'] / p_dec:.1f}×; "
               f"{o['add'] / p_add:.1f}×")))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1024-bit key, small counts")
    ap.add_argument("--bits", type=int, nargs="*", default=None, help="key sizes (default 1024 2048 3072)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes for the throughput rows")
    ap.add_argument("--scaling-only", action="store_true",
                    help="only the N-workers-vs-pool-of-1 rows (nothing recorded)")
    ap.add_argument("--rounds", type=int, default=2, help="scaling rows: alternating rounds per pool size")
    args = ap.parse_args(argv)
    bits_list = args.bits or ([1024] if args.quick else [1024, 2048, 3072])
    for name in ("secureflhv.crypto.homomorphic.paillier", "secureflhv.crypto.homomorphic.ou"):
        logging.getLogger(name).addFilter(_OwnKeyWarnings())
    print("key sizes: " + "; ".join(key_note(b) for b in bits_list), flush=True)
    if args.scaling_only:
        print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
        for bits in bits_list:
            pk, sk = P.generate_keypair(bits, insecure_test_key=bits < 2048)
            scale = 0.1 if args.quick else 1.0
            bench_scaling(pk, sk, args.workers, lambda k: max(8, int(k * scale)), np.random.default_rng(0),
                          rounds=args.rounds)
        print(f"load average at end: {os.getloadavg()}", flush=True)
        return
    load0 = os.getloadavg()[0]
    print(f"load average at start: {load0:.2f} on {os.cpu_count()} cores", flush=True)
    rows, heu = [], {}
    for bits in bits_list:
        key_rows = bench_key(bits, args.quick, args.workers)
        heu[bits] = bench_heu(bits, args.quick)
        if heu[bits]:
            heu[bits]["ou_ours"] = bench_our_ou(bits, args.quick)
        ours = {k: v for b, name, v, _ in key_rows for k, n in
                (("encrypt", "encrypt (public key, DJN)"), ("decrypt", "decrypt (CRT)"), ("add", "add (enc + enc)"))
                if name == n}
        rows += key_rows + heu_rows(bits, heu[bits], ours)
    print()
    print(f"{'bits':>5} | {'operation':<36} | {'secureflhv ops/s':>16} | {'baseline ops/s':>14} | {'ratio':>7}")
    print("-" * 92)
    for bits, name, ours, base in rows:
        print(f"{bits:>5} | {name:<36} | {ours:>16,.0f} | {base:>14,.0f} | {ours / base:>6.2f}x")
    load1 = os.getloadavg()[0]
    print(f"\nload average at end: {load1:.2f} on {os.cpu_count()} cores")
    print("\none-core rows: ops per CPU-second (time.process_time); worker rows: wall-clock ops/s.")
    print("baseline = phe 1.5 (gmpy2) on one core, except 'N workers' rows whose baseline is secureflhv "
          "on one core (ratio = scaling), and 'HEU' rows (HEU one thread, same key size, same run).")
    if not args.quick:
        record_figures(rows, heu.get(2048), (load0, load1))


if __name__ == "__main__":
    main()
