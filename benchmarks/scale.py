"""A party's heavy work on the local pool versus Ray with 1 and 2 workers (issue 15).

Per engine, in a fresh child process (so that its peak memory is its own), the Paillier work one party
set does per unit of training, without the network (the wire is measured in ``secureboost.py`` and
``vertical_lr.py``):

* SecureBoost, per tree (guest ``--guest-features`` + host ``--host-features``, depth ``--depth``,
  32 bins): the guest encrypts every row's packed (g, h); the host builds the root's encrypted
  histograms and, level by level, the smaller child's (the sibling by subtraction); the guest decrypts
  the compressed candidate sums. Host-side guest features cost the same and are left out.
* Vertical LR, per epoch (10 + 10 features, batches of ``--batch``): the guest encrypts the residuals,
  the host computes ``X^T·[[d]]``, the key holder decrypts the gradient.

Engines: ``local`` (the process pool, all cores), ``ray1`` (a local Ray cluster, one node with one
CPU), ``ray2`` (two nodes with one CPU each), both started here with ``ray start`` and stopped.
Printed and, unless ``--quick``, recorded (``benchmarks/_report.py``): seconds per tree / epoch, the
scaling ray2/ray1, Ray's overhead over the local pool, each engine's party-process peak RSS (the
party process only: pool and Ray workers are not counted).

    .venv/bin/python benchmarks/scale.py                 # 100,000 rows, 2048-bit keys
    .venv/bin/python benchmarks/scale.py --quick         # 5,000 rows, 1024-bit test key, not recorded
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's secureflhv, not an installed one
RAY = str(Path(sys.executable).parent / "ray")


# ------------------------------------------------------------------------------- the workload (child)
def secureboost_tree(n: int, d_guest: int, d_host: int, depth: int, bits: int, seed: int = 0) -> dict:
    from secureflhv.crypto import he
    from secureflhv.crypto import paillier as pl
    from secureflhv.crypto import paillier_hist as ph

    rng = np.random.default_rng(seed)
    pub, priv = pl.generate_keypair(bits, insecure_test_key=bits < 2048)
    sums = he.PaillierPairSums(pub, 16, 8, n)
    g, h = rng.integers(-2 ** 15, 2 ** 15, n), rng.integers(0, 2 ** 15, n)
    bins = rng.integers(0, 32, size=(n, d_host)).astype(np.uint8)
    t0 = time.perf_counter()
    enc = sums.encrypt(priv, g, h)  # the guest holds the key: CRT encryption
    cts = list(enc.ciphertexts)
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    level = [(np.arange(n, dtype=np.int64), ph.build_node(cts, np.arange(n, dtype=np.int64), bins, [32] * d_host,
                                                          pub.nsquare))]
    hists = [level[0][1]]
    for _ in range(depth - 1):
        nxt = []
        for rows, hist in level:
            left_mask = rng.random(len(rows)) < 0.35
            small, big = rows[left_mask], rows[~left_mask]
            hs = ph.build_node(cts, small, bins, [32] * d_host, pub.nsquare)
            nxt += [(small, hs), (big, ph.subtract(hist, hs, pub.nsquare))]
        level = nxt
        hists += [hh for _, hh in level]
    t_hist = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = [c for hist in hists for f in ph.cumulative(hist, pub.nsquare) for c in f if c is not None]
    comp = ph.compress(packed, sums.per, sums.spec.slot_bits * 2, pub.nsquare)
    t_comp = time.perf_counter() - t0
    t0 = time.perf_counter()
    pl._decrypt_ints(priv, comp)
    t_dec = time.perf_counter() - t0
    return {"seconds": t_enc + t_hist + t_comp + t_dec, "encrypt": t_enc, "histograms": t_hist,
            "compress": t_comp, "decrypt": t_dec}


def lr_epoch(n: int, d_guest: int, d_host: int, batch: int, bits: int, seed: int = 0) -> dict:
    from secureflhv.crypto import paillier as pl

    rng = np.random.default_rng(seed)
    pub, priv = pl.generate_keypair(bits, insecure_test_key=bits < 2048)
    Xh = rng.normal(size=(n, d_host))
    resid = rng.normal(size=n) * 0.5
    t = {"encrypt": 0.0, "dot": 0.0, "decrypt": 0.0}
    for s in range(0, n, batch):
        t0 = time.perf_counter()
        enc = pl.encrypt(pub, resid[s:s + batch])
        t1 = time.perf_counter()
        grad = pl.dot(Xh[s:s + batch], enc)
        t2 = time.perf_counter()
        pl.decrypt(priv, grad)
        t3 = time.perf_counter()
        t["encrypt"] += t1 - t0
        t["dot"] += t2 - t1
        t["decrypt"] += t3 - t2
    return {"seconds": sum(t.values()), **t}


def child(args) -> None:
    from secureflhv.crypto import executor as ex

    executor = None
    if args.address:
        from secureflhv.crypto.executor_ray import RayExecutor

        executor = RayExecutor(args.address, owner="bench")
    out = {}
    with ex.using(executor):
        lr_epoch(512, 1, 2, 512, 512)  # the first tasks start the workers: not part of the steady state
        out["secureboost"] = secureboost_tree(args.rows, args.guest_features, args.host_features, args.depth,
                                              args.key_bits)
        out["lr"] = lr_epoch(args.rows, 10, 10, args.batch, args.key_bits)
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if executor is not None:
        executor.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------ the driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(nodes: int) -> tuple[str, str]:
    temp = tempfile.mkdtemp(prefix="sfbench", dir="/tmp")
    port = _free_port()
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--ray-client-server-port", str(_free_port()),
                    "--include-dashboard=false", "--temp-dir", temp, *common], check=True, capture_output=True)
    for _ in range(nodes - 1):
        subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", *common], check=True, capture_output=True)
    return f"127.0.0.1:{port}", temp


def stop_cluster(temp: str) -> None:
    subprocess.run([RAY, "stop", "--force"], capture_output=True)
    shutil.rmtree(temp, ignore_errors=True)


def measure(engine: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--rows", str(args.rows), "--key-bits", str(args.key_bits),
           "--guest-features", str(args.guest_features), "--host-features", str(args.host_features),
           "--depth", str(args.depth), "--batch", str(args.batch)]
    temp = None
    if engine != "local":
        address, temp = start_cluster(int(engine[-1]))
        cmd += ["--address", address]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        if temp:
            stop_cluster(temp)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{engine} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[7:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="not recorded; defaults 5,000 rows, 1024-bit test key, "
                                                         "30 host features")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--key-bits", type=int)
    ap.add_argument("--guest-features", type=int, default=30)
    ap.add_argument("--host-features", type=int)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--engines", nargs="+", default=["local", "ray1", "ray2"], choices=["local", "ray1", "ray2"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    full = (100_000, 2048, 300)
    quick = (5_000, 1024, 30)
    args.rows, args.key_bits, args.host_features = (v if v is not None else d for v, d in zip(
        (args.rows, args.key_bits, args.host_features), quick if args.quick else full))
    load = os.getloadavg()[0]
    res = {}
    for engine in args.engines:
        res[engine] = measure(engine, args)
        sb, lr = res[engine]["secureboost"], res[engine]["lr"]
        print(f"{engine:6s} SecureBoost {sb['seconds']:8.1f} s/tree (enc {sb['encrypt']:.1f}, hist "
              f"{sb['histograms']:.1f}, compress {sb['compress']:.1f}, dec {sb['decrypt']:.1f})   LR "
              f"{lr['seconds']:7.1f} s/epoch   party peak RSS {res[engine]['rss_mb']:.0f} MB", flush=True)
    print(f"load average at start {load:.1f} on {os.cpu_count()} cores")
    if {"ray1", "ray2"} <= res.keys():
        for w in ("secureboost", "lr"):
            print(f"{w}: 2 Ray workers vs 1: x{res['ray1'][w]['seconds'] / res['ray2'][w]['seconds']:.2f}", end="")
            if "local" in res:
                print(f"; Ray (2) over the local pool: "
                      f"{100 * (res['ray2'][w]['seconds'] / res['local'][w]['seconds'] - 1):+.0f}%", end="")
            print()
    if args.quick or set(args.engines) != {"local", "ray1", "ray2"}:
        return
    import _report

    def fmt(w, unit):
        return ", ".join(f"{e} {res[e][w]['seconds']:.1f} s/{unit}" for e in ("local", "ray1", "ray2"))

    for w, unit, what in (("secureboost", "tree", f"SecureBoost guest {args.guest_features} + host "
                                                   f"{args.host_features} features, depth {args.depth}"),
                          ("lr", "epoch", "vertical LR 10 + 10 features")):
        _report.record(f"scale_{w}", {
            "what": f"{what}, {args.rows:,} rows, {args.key_bits}-bit Paillier, party work only (`scale.py`)",
            "ours": fmt(w, unit) + "; party peak RSS " + ", ".join(f"{e} {res[e]['rss_mb']:.0f} MB" for e in res),
            "baseline": f"local pool {res['local'][w]['seconds']:.1f} s/{unit}",
            "ratio": f"ray2/ray1 x{res['ray1'][w]['seconds'] / res['ray2'][w]['seconds']:.2f}; ray2/local "
                     f"x{res['ray2'][w]['seconds'] / res['local'][w]['seconds']:.2f} (load {load:.1f})",
        })


if __name__ == "__main__":
    main()
