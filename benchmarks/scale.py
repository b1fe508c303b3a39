"""A party's heavy work on the local pool versus Ray with 1 and 2 workers (issue 15).

Per engine, in a fresh child process (so that its peak memory is its own), the Paillier work one party
set does per unit of training, without the network (the wire is measured in ``secureboost.py`` and
``vertical_lr.py``):

* SecureBoost, per tree (guest ``--guest-features`` + host ``--host-features``, depth ``--depth``,
  32 bins): the guest encrypts every row's packed (g, h); the host builds the root's encrypted
  histograms and, level by level, the smaller child's (the sibling by subtraction); the guest decrypts
  the compressed candidate sums. Host-side guest features cost the same and are left out (the guest's
  30 features are plaintext work, not timed here). This is a fixed workload for comparing engines, the
  protocol's work until 2026-11-24: since then the protocol neither subtracts nor compresses nor
  decrypts derived siblings (the guest derives their sums in plaintext), so it does less than this.
* Vertical LR, per epoch (10 + 10 features, batches of ``--batch``): the guest encrypts the residuals,
  the host computes ``X^T·[[d]]``, the key holder decrypts the gradient.

Engines (``--engines``, comma-separated): ``local`` (the process pool, all cores), ``local1`` /
``local2`` (the pool with 1 / 2 worker processes: the same code path), ``ray1`` (a local Ray cluster,
one node with one CPU), ``ray2`` (two nodes with one CPU each). Ray clusters are started here with
``ray start`` on loopback in their own temp folder and stopped by killing exactly their processes
(never ``ray stop``, which would stop other users' clusters on the machine).

Printed per engine: seconds per tree / epoch (the first tree separately: it includes the per-worker
table building), the phases, CPU seconds (party + workers: robust to a shared machine), peak resident
memory of the party process, of the largest worker and (Ray) of the raylets holding the object store.
Then the scaling (2 workers vs 1), Ray's overhead over the local pool and a projection to 100 million
rows on a ``--nodes``-node cluster from the measured CPU seconds per row. Recorded
(``benchmarks/_report.py``) only with ``--record``.

    .venv/bin/python benchmarks/scale.py                 # 100,000 rows, 2048-bit keys, all engines
    .venv/bin/python benchmarks/scale.py --quick         # 5,000 rows, 1024-bit test key, 30 host features
    .venv/bin/python benchmarks/scale.py --rows 1000000 --only sb --engines local1,local2 --trees 1
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
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
ENGINES = ("local", "local1", "local2", "ray1", "ray2")
_TICK = os.sysconf("SC_CLK_TCK")


def say(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ processes of our Ray cluster
def _proc_table() -> dict:
    """pid -> (ppid, cmdline, cpu seconds, peak RSS MB) of every readable process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            hwm = next((int(x.split()[1]) for x in (d / "status").read_text().splitlines()
                        if x.startswith("VmHWM:")), 0)
            out[int(d.name)] = (int(stat[1]), cmd, (int(stat[11]) + int(stat[12])) / _TICK, hwm / 1024)
        except (OSError, ValueError, IndexError):
            continue
    return out


def cluster_processes(temp: str) -> dict:
    """Our cluster's processes: those naming its temp folder and their descendants (pid -> table row)."""
    table = _proc_table()
    ours = {pid for pid, (_, cmd, _, _) in table.items() if temp in cmd}
    grew = True
    while grew:
        kids = {pid for pid, (ppid, _, _, _) in table.items() if ppid in ours and pid not in ours}
        grew = bool(kids)
        ours |= kids
    return {pid: table[pid] for pid in ours if pid != os.getpid()}


def ray_usage(temp: str) -> dict:
    """CPU seconds of our cluster's task workers (``ray::``), their largest peak RSS and the raylets'."""
    procs = cluster_processes(temp).values()
    workers = [p for p in procs if p[1].startswith("ray::") and "Agent" not in p[1].split(" ")[0]]
    raylets = [p for p in procs if "raylet" in p[1].split(" ")[0]]
    return {"cpu": sum(p[2] for p in workers), "worker_rss_mb": max((p[3] for p in workers), default=0.0),
            "raylet_rss_mb": sum(p[3] for p in raylets)}


# ------------------------------------------------------------------------------- the workload (child)
class Meter:
    """Wall and CPU seconds of a step: this process plus the executor's workers."""

    def __init__(self, engine: str, temp: str | None):
        self.engine, self.temp = engine, temp

    def cpu(self) -> float:
        from secureflhv.compute import pool as par

        own = time.process_time()
        if self.temp:
            return own + ray_usage(self.temp)["cpu"]
        return own + (par.worker_cpu_seconds() if par.pooled() else 0.0)

    def __enter__(self):
        self.c0, self.t0 = self.cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu_s = time.perf_counter() - self.t0, self.cpu() - self.c0


def secureboost_tree(keys, n: int, bins: np.ndarray, depth: int, rng, label: str) -> dict:
    from secureflhv.crypto.homomorphic import backend as he
    from secureflhv.crypto.homomorphic import paillier as pl
    from secureflhv.crypto.homomorphic import paillier_hist as ph

    pub, priv = keys
    d_host = bins.shape[1]
    sums = he.PaillierPairSums(pub, 16, 8, n)
    g, h = rng.integers(-2 ** 15, 2 ** 15, n), rng.integers(0, 2 ** 15, n)
    t0 = time.perf_counter()
    enc = sums.encrypt(priv, g, h)  # the guest holds the key: CRT encryption
    cts = list(enc.ciphertexts)
    t_enc = time.perf_counter() - t0
    say(f"{label}: encrypted {n:,} rows in {t_enc:.1f}s")
    t0 = time.perf_counter()
    all_rows = np.arange(n, dtype=np.int64)
    level = [(all_rows, ph.build_node(cts, all_rows, bins, [32] * d_host, pub.nsquare))]
    hists = [level[0][1]]
    say(f"{label}: root histograms ({n:,} rows x {d_host} features) after {time.perf_counter() - t0:.1f}s")
    for lev in range(1, depth):
        nxt = []
        for rows, hist in level:
            left_mask = rng.random(len(rows)) < 0.35
            small, big = rows[left_mask], rows[~left_mask]
            hs = ph.build_node(cts, small, bins, [32] * d_host, pub.nsquare)
            nxt += [(small, hs), (big, ph.subtract(hist, hs, pub.nsquare))]
        level = nxt
        hists += [hh for _, hh in level]
        say(f"{label}: level {lev} histograms after {time.perf_counter() - t0:.1f}s")
    t_hist = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = [c for hist in hists for f in ph.cumulative(hist, pub.nsquare) for c in f if c is not None]
    comp = ph.compress(packed, sums.per, sums.spec.slot_bits * 2, pub.nsquare)
    t_comp = time.perf_counter() - t0
    t0 = time.perf_counter()
    pl._decrypt_ints(priv, comp)
    t_dec = time.perf_counter() - t0
    return {"encrypt": t_enc, "histograms": t_hist, "compress": t_comp, "decrypt": t_dec}


def lr_epoch(keys, Xh: np.ndarray, resid: np.ndarray, batch: int, label: str) -> dict:
    from secureflhv.crypto.homomorphic import paillier as pl

    pub, priv = keys
    n = len(resid)
    t = {"encrypt": 0.0, "dot": 0.0, "decrypt": 0.0}
    step, last = max(batch, n // 10), time.perf_counter()
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
        if (s + batch) // step != s // step or t3 - last > 30:
            last = t3
            say(f"{label}: {min(n, s + batch):,}/{n:,} rows, {sum(t.values()):.1f}s")
    return t


def _units(name: str, count: int, run, meter: Meter) -> dict:
    """Run ``count`` units (trees / epochs); per unit: wall, CPU and phases."""
    units = []
    for i in range(count):
        with meter as m:
            phases = run(f"{meter.engine} {name} {i + 1}/{count}")
        units.append({"seconds": m.wall, "cpu": m.cpu_s, **phases})
        say(f"{meter.engine} {name} {i + 1}/{count}: {m.wall:.1f}s wall, {m.cpu_s:.1f} CPU-s")
    steady = units[1:] or units  # after the first: tables built, workers warm
    mean = {k: sum(u[k] for u in steady) / len(steady) for k in units[0]}
    return {**mean, "first": units[0]["seconds"], "units": len(units)}


def child(args) -> None:
    from secureflhv.compute import executor as ex
    from secureflhv.crypto.homomorphic import paillier as pl
    from secureflhv.compute import pool as par

    executor, engine = None, args.engine
    if args.address:
        from secureflhv.compute.ray_executor import RayExecutor

        executor = RayExecutor(args.address, owner="bench")
    elif engine in ("local1", "local2"):
        par.set_workers(int(engine[-1]), pool_for_one=True)
    t0 = time.perf_counter()
    keys = pl.generate_keypair(args.key_bits, insecure_test_key=args.key_bits < 2048)
    say(f"{engine}: {args.key_bits}-bit key in {time.perf_counter() - t0:.1f}s")
    out = {"workers": executor.workers() if executor else par.get_workers()}
    meter = Meter(engine, args.temp)
    rng = np.random.default_rng(0)
    with ex.using(executor):
        t0 = time.perf_counter()
        pl.decrypt(keys[1], pl.encrypt(keys[0], np.zeros(4096)))  # start the workers (tables: first unit)
        out["startup_s"] = time.perf_counter() - t0
        say(f"{engine}: workers started in {out['startup_s']:.1f}s")
        if args.only in (None, "sb"):
            bins = rng.integers(0, 32, size=(args.rows, args.host_features)).astype(np.uint8)
            out["secureboost"] = _units("tree", args.trees, lambda lab: secureboost_tree(
                keys, args.rows, bins, args.depth, rng, lab), meter)
            del bins
        if args.only in (None, "lr"):
            Xh = rng.normal(size=(args.rows, 10))
            resid = rng.normal(size=args.rows) * 0.5
            out["lr"] = _units("epoch", args.epochs, lambda lab: lr_epoch(keys, Xh, resid, args.batch, lab),
                               meter)
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if executor is not None:
        usage = ray_usage(args.temp)  # before shutdown: the workers of a driver end with it
        out["worker_rss_mb"], out["raylet_rss_mb"] = usage["worker_rss_mb"], usage["raylet_rss_mb"]
        executor.shutdown()
    elif par.pooled():
        out["worker_rss_mb"] = max(par.on_each_worker(_peak_rss_mb))
        par.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------ the driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(nodes: int) -> tuple[str, str]:
    temp = tempfile.mkdtemp(prefix="sfbench", dir="/tmp")  # Ray's socket paths must stay short
    port = _free_port()
    # task results up to 4 MiB go straight back to the party (README, "Running a party on a cluster"): an LR
    # mini-batch's ciphertexts (~0.5 MB) then skip the object store's round trip (48 -> 23 ms per step here)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_max_direct_call_object_size": str(4 << 20)}
    env.pop("RAY_ADDRESS", None)
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--ray-client-server-port", str(_free_port()),
                        "--include-dashboard=false", "--temp-dir", temp, *common], check=True, capture_output=True,
                       env=env, timeout=300)
        for _ in range(nodes - 1):
            subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", *common], check=True,
                           capture_output=True, env=env, timeout=300)
    except BaseException:
        stop_cluster(temp)
        raise
    return f"127.0.0.1:{port}", temp


def stop_cluster(temp: str) -> None:
    """Kill exactly our cluster's processes (TERM, then KILL after 10 s) and remove its folder."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = list(cluster_processes(temp))
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and cluster_processes(temp):
            time.sleep(0.2)
    shutil.rmtree(temp, ignore_errors=True)


def measure(engine: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--engine", engine, "--rows", str(args.rows),
           "--key-bits", str(args.key_bits), "--guest-features", str(args.guest_features),
           "--host-features", str(args.host_features), "--depth", str(args.depth), "--batch", str(args.batch),
           "--trees", str(args.trees), "--epochs", str(args.epochs)] + (["--only", args.only] if args.only else [])
    temp = None
    if engine.startswith("ray"):
        say(f"{engine}: starting a local Ray cluster of {engine[-1]} node(s), one CPU each")
        address, temp = start_cluster(int(engine[-1]))
        cmd += ["--address", address, "--temp", temp]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # progress (stderr) goes straight through
    finally:
        if temp:
            stop_cluster(temp)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{engine} failed (exit {proc.returncode})\n{proc.stdout[-3000:]}")
    return json.loads(line[7:])


def report(res: dict, args, load0: float) -> None:
    works = [w for w in ("secureboost", "lr") if any(w in r for r in res.values())]
    unit = {"secureboost": "tree", "lr": "epoch"}
    print(f"\n{args.rows:,} rows, {args.key_bits}-bit Paillier; load average at start {load0:.1f}, now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" +
          (" (shared machine: wall figures are low; CPU-s are the engine's own)" if load0 > 1.5 else ""))
    for e, r in res.items():
        mem = f"peak RSS: total <= {_total_rss_mb(r):,.0f} MB; party {r['rss_mb']:,.0f} MB"
        if "worker_rss_mb" in r:
            mem += f", largest worker {r['worker_rss_mb']:,.0f} MB"
        if "raylet_rss_mb" in r:
            mem += f", raylets (object store) {r['raylet_rss_mb']:,.0f} MB"
        print(f"{e:7s} ({r['workers']} workers, start-up {r['startup_s']:.1f}s)  {mem}")
        for w in works:
            if w in r:
                x = r[w]
                phases = ", ".join(f"{k} {x[k]:.1f}" for k in x if k not in ("seconds", "cpu", "first", "units"))
                print(f"    {w:11s} {x['seconds']:9.1f} s/{unit[w]} ({x['cpu']:.1f} CPU-s; {phases}; "
                      f"first {x['first']:.1f}s; mean of {max(1, x['units'] - 1)})")
    for w in works:
        for a, b in (("local1", "local2"), ("ray1", "ray2"), ("local2", "ray2"), ("local", "ray2")):
            if w in res.get(a, {}) and w in res.get(b, {}):
                ra, rb = res[a][w], res[b][w]
                what = "scaling" if a[:-1] == b[:-1] else "Ray over the local pool"
                cpu_eff = ra["cpu"] / rb["cpu"]
                print(f"{w}: {b} vs {a} ({what}): wall x{ra['seconds'] / rb['seconds']:.2f}"
                      + (f" ({100 * (rb['seconds'] / ra['seconds'] - 1):+.0f}% time)" if what != "scaling" else "")
                      + f"; CPU-s per {unit[w]} {rb['cpu']:.1f} vs {ra['cpu']:.1f} (efficiency {cpu_eff:.2f})")
        project(res, w, unit[w], args)


def project(res: dict, work: str, unit: str, args) -> None:
    """100M rows on ``--nodes`` x ``--cores-per-node``: measured CPU-s per row, divided over the cores at
    the measured CPU efficiency of 2 workers (Ray if measured, else the local pool)."""
    one = next((res[e][work] for e in ("ray1", "local1", "local", "ray2", "local2") if work in res.get(e, {})), None)
    if one is None:
        return
    cores = args.nodes * args.cores_per_node
    eff = 1.0
    for a, b in (("ray1", "ray2"), ("local1", "local2")):
        if work in res.get(a, {}) and work in res.get(b, {}):
            eff = min(1.0, res[a][work]["cpu"] / res[b][work]["cpu"])
            break
    per_row = one["cpu"] / args.rows
    rows = 100_000_000
    t = per_row * rows / (cores * eff)
    print(f"projection {work}: {per_row * 1e3:.3f} CPU-ms per row per {unit} -> 100,000,000 rows on "
          f"{args.nodes} nodes x {args.cores_per_node} cores at efficiency {eff:.2f}: ~{t / 60:.1f} min per {unit} "
          f"(compute only; the guest's {rows * 2 * args.key_bits // 8 / 1e9:.0f} GB of ciphertexts must also "
          f"cross the WAN)")
    if work == "lr":  # one mini-batch is the unit of parallel work: its rows bound how many cores it can use
        print(f"  (LR: a mini-batch of {args.batch:,} rows keeps at most {max(1, args.batch // 256)} cores busy "
              f"(tasks of >= 256 rows); the projection assumes batches of >= {cores * 256:,} rows, e.g. "
              f"full-batch gradients)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="defaults 5,000 rows, 1024-bit test key, 30 host features")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--key-bits", type=int)
    ap.add_argument("--guest-features", type=int, default=30)
    ap.add_argument("--host-features", type=int)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--trees", type=int, default=1, help="SecureBoost trees per engine (>1: the first is reported "
                                                         "apart, the others averaged)")
    ap.add_argument("--epochs", type=int, default=1, help="vertical LR epochs per engine")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--only", choices=["sb", "lr"], help="only SecureBoost or only vertical LR")
    ap.add_argument("--engines", default="local,ray1,ray2", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--nodes", type=int, default=32, help="projection: cluster nodes")
    ap.add_argument("--cores-per-node", type=int, default=16, help="projection: cores per node")
    ap.add_argument("--record", action="store_true", help="record the figures in docs/benchmarks.*")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--temp", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    # a TERM (kill, timeout) unwinds through measure()'s finally: our Ray cluster is stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        ap.error(f"--engines: unknown {bad}; choose from {', '.join(ENGINES)}")
    full = (100_000, 2048, 300)
    quick = (5_000, 1024, 30)
    args.rows, args.key_bits, args.host_features = (v if v is not None else d for v, d in zip(
        (args.rows, args.key_bits, args.host_features), quick if args.quick else full))
    load0 = os.getloadavg()[0]
    print(f"scale.py: {args.rows:,} rows, {args.key_bits}-bit key, SecureBoost host {args.host_features} features "
          f"depth {args.depth} x {args.trees} tree(s), LR 10+10 x {args.epochs} epoch(s); engines {engines}; "
          f"load average {load0:.1f}", flush=True)
    res, failed = {}, {}
    for engine in engines:
        try:  # one engine failing (a cluster lost, say) must not lose the others' figures
            res[engine] = measure(engine, args)
        except SystemExit as e:
            failed[engine] = str(e)
            print(str(e)[-3000:], file=sys.stderr, flush=True)
            continue
        print("RESULT " + engine + " " + json.dumps(res[engine]), flush=True)
    report(res, args, load0)
    for engine, why in failed.items():
        print(f"{engine}: FAILED ({why.splitlines()[0]}; its output is above)")
    if args.record and not failed:
        record(res, args, load0)


def _total_rss_mb(r: dict) -> float:
    """An upper bound of the engine's peak memory: party + workers x the largest worker + raylets."""
    return r["rss_mb"] + r["workers"] * r.get("worker_rss_mb", 0.0) + r.get("raylet_rss_mb", 0.0)


def record(res: dict, args, load: float) -> None:
    import _report

    for w, unit, what in (("secureboost", "tree", f"SecureBoost guest {args.guest_features} + host "
                                                   f"{args.host_features} features, depth {args.depth}"),
                          ("lr", "epoch", "vertical LR 10 + 10 features")):
        have = [e for e in res if w in res[e]]
        if not have:
            continue
        ratio = []
        for a, b in (("ray1", "ray2"), ("local1", "local2"), ("local", "ray2"), ("local2", "ray2")):
            if a in have and b in have:
                ratio.append(f"{b}/{a} x{res[a][w]['seconds'] / res[b][w]['seconds']:.2f}")
        _report.record(f"scale_{w}_{args.rows // 1000}k", {  # one row per table size
            "what": f"{what}, {args.rows:,} rows, {args.key_bits}-bit Paillier, party work only (`scale.py`)",
            "ours": ", ".join(f"{e} {res[e][w]['seconds']:.1f} s/{unit}" for e in have)
                    + "; peak RSS, party + workers (+ raylets): "
                    + ", ".join(f"{e} {_total_rss_mb(res[e]) / 1024:.1f} GB" for e in have),
            "baseline": "; ".join(f"{e} {res[e][w]['seconds']:.1f} s/{unit}" for e in have if e.startswith("local")),
            "ratio": "; ".join(ratio) + f" (load {load:.1f})",
        })


if __name__ == "__main__":
    main()
