"""Vertical SecureBoost speed: seconds per tree with Paillier versus the same protocol in plaintext.

Scenarios (issue 6):

* (a) 10,000 rows x 20 features split 10 (guest) / 10 (host), depth 5: the first tree (including
  Paillier key generation and the encryption of the gradients) and every further tree.
  Reference on this machine: SecretFlow SGB 47 s for the first tree, ~5 s per further tree.
* (b) FATE's benchmark shape: guest 100,000 x 30, host 100,000 x 300, depth 3 (FATE's default
  ``max_depth``), 32 bins: seconds per tree. Reference: FATE 1 min 54 s per tree on 16 cores.

Each scenario runs twice in the same process: with 2048-bit Paillier (``backend="paillier"``) and with
encryption replaced by identity (``backend="identity"``: the hosts receive g, h in plaintext; the
baseline a non-private implementation would pay). Guest and host run as threads over the in-process
transport and share the machine's Paillier worker pool (``SECUREFLHV_WORKERS``, default all cores),
started before the timers as a party's runtime starts it when its job starts.
Printed: absolute seconds, the ratio Paillier / plaintext, a phase breakdown and the load average.

    .venv/bin/python benchmarks/secureboost.py            # (a) and (b), 2048-bit keys
    .venv/bin/python benchmarks/secureboost.py --quick    # small smoke run (1024-bit test key)
    .venv/bin/python benchmarks/secureboost.py --only a --he-scheme paillier ou --phases
                                                          # + wall / CPU seconds per protocol phase and depth
    .venv/bin/python benchmarks/secureboost.py --only a --he-scheme paillier ou --repeat 5
                                                          # first tree: median and range of 5 runs
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's secureflhv, not an installed one


def _descendants_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the live descendants of ``pid`` (the Paillier worker pool lives under
    a forkserver child), from /proc; 0 where /proc is unavailable."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    try:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(parts[1]), []).append(int(d))
            stats[int(d)] = (int(parts[11]) + int(parts[12])) / tick
    except OSError:
        return 0.0
    total, todo = 0.0, list(children.get(pid, []))
    while todo:
        c = todo.pop()
        total += stats.get(c, 0.0)
        todo += children.get(c, [])
    return total


def cpu_seconds() -> float:
    """CPU seconds used so far by this process (all threads) and its live worker processes."""
    return time.process_time() + _descendants_cpu(os.getpid())


class CachedCPU:
    """``cpu_seconds`` cheap enough to call per protocol phase: the descendants' pids are re-listed from
    /proc at most every ``rescan_s`` seconds, in between only their stat files are read."""

    def __init__(self, rescan_s: float = 0.25):
        self.rescan_s, self._pids, self._last = rescan_s, [], -1e9
        self._tick = os.sysconf("SC_CLK_TCK")

    def _rescan(self) -> None:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
                except OSError:
                    continue
        pids, todo = [], list(children.get(os.getpid(), []))
        while todo:
            c = todo.pop()
            pids.append(c)
            todo += children.get(c, [])
        self._pids, self._last = pids, time.monotonic()

    def __call__(self) -> float:
        if time.monotonic() - self._last > self.rescan_s:
            try:
                self._rescan()
            except OSError:
                self._pids = []
        total = 0.0
        for pid in self._pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                total += (int(parts[11]) + int(parts[12])) / self._tick
            except OSError:
                continue
        return time.process_time() + total


def phase_profile(records: list, trees: int) -> dict:
    """{phase: (first tree (wall, cpu), mean further tree (wall, cpu), first tree wall per depth)}."""
    out: dict = {}
    for tree, phase, depth, wall, cpu in records:
        first, further, depths = out.setdefault(phase, ([0.0, 0.0], [0.0, 0.0], {}))
        acc = first if tree == 0 else further
        acc[0] += wall
        acc[1] += cpu
        if tree == 0 and depth >= 0:
            depths[depth] = depths.get(depth, 0.0) + wall
    k = max(1, trees - 1)
    return {ph: (tuple(f), (fu[0] / k, fu[1] / k), d) for ph, (f, fu, d) in out.items()}


def print_phases(enc: dict) -> None:
    """Per-phase wall / CPU seconds (CPU: this process and its workers, so a waiting role's 'wait' phase
    carries the other role's work)."""
    for role in ("guest", "host"):
        print(f"  {role} phases: first tree wall/CPU s | further tree (mean) wall/CPU s | first tree wall per depth")
        for ph, (f, fu, d) in enc["phases"][role].items():
            per = " ".join(f"{v:.2f}" for _, v in sorted(d.items()))
            print(f"    {ph:<12} {f[0]:6.2f} /{f[1]:6.2f} | {fu[0]:6.2f} /{fu[1]:6.2f} | {per}")


def make_data(n: int, d_guest: int, d_host: int, seed: int = 0):
    """Binary labels from a noisy linear rule over all columns (both parties matter)."""
    rng = np.random.default_rng(seed)
    Xg, Xh = rng.normal(size=(n, d_guest)), rng.normal(size=(n, d_host))
    w_g, w_h = rng.normal(size=d_guest), rng.normal(size=d_host) / np.sqrt(max(1, d_host / d_guest))
    y = ((Xg @ w_g + Xh @ w_h + rng.normal(size=n)) > 0).astype(int)
    return Xg, Xh, y


def run(Xg, Xh, y, params, backend: str) -> dict:
    from secureflhv.transport import InProcessNetwork
    from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost

    net = InProcessNetwork(f"bench-{backend}", ["guest", "host"], deadline=3600)
    t0 = time.perf_counter()
    guest = SecureBoostGuest(net.transport("guest"), ["host"], Xg, y, params, backend=backend)
    host = SecureBoostHost(net.transport("host"), "guest", Xh, params, backend=backend)
    guest.phases.cpu_clock = host.phases.cpu_clock = CachedCPU()
    setup = time.perf_counter() - t0
    errors = []

    def serve():
        try:
            host.fit()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=serve)
    th.start()
    t1, c1 = time.perf_counter(), cpu_seconds()
    res = guest.fit()
    total, cpu = time.perf_counter() - t1, cpu_seconds() - c1
    th.join()
    if errors:
        raise errors[0]
    first = res.tree_seconds[0] + guest.timings.get("keygen", 0.0)
    return {"first": first, "further": res.tree_seconds[1:], "total": total, "binning": setup, "cpu": cpu,
            "trees": len(res.tree_seconds),
            "guest": dict(guest.timings), "host": dict(host.timings), "bytes": net.sent_bytes,
            "phases": {"guest": phase_profile(guest.phases.records, len(res.tree_seconds)),
                       "host": phase_profile(host.phases.records, len(res.tree_seconds))},
            "wire": net.wire_stats(),  # per party, per peer and tag: see print_bytes
            "model": res.model}


def report(name: str, enc: dict, plain: dict) -> None:
    fe = np.mean(enc["further"]) if enc["further"] else float("nan")
    fp = np.mean(plain["further"]) if plain["further"] else float("nan")
    print(f"\n== {name}")
    print(f"  first tree (keygen + encryption included): paillier {enc['first']:7.2f} s | plaintext "
          f"{plain['first']:6.2f} s | ratio {enc['first'] / plain['first']:6.1f}x")
    if enc["further"]:
        print(f"  per further tree (mean of {len(enc['further'])}):      paillier {fe:7.2f} s | plaintext "
              f"{fp:6.2f} s | ratio {fe / fp:6.1f}x")
    print(f"  CPU seconds per tree (all processes, load-independent): paillier {enc['cpu'] / enc['trees']:.1f} | "
          f"plaintext {plain['cpu'] / plain['trees']:.2f}  -> on an idle machine with {os.cpu_count()} cores: "
          f">= {enc['cpu'] / enc['trees'] / os.cpu_count():.1f} s per tree")
    if len(enc.get("firsts", [])) > 1:
        f, k = enc["firsts"], enc["keygens"]
        print(f"  first tree over {len(f)} runs: median {np.median(f):.2f} s ({f[0]:.2f}-{f[-1]:.2f} s: "
              f"{' '.join(f'{x:.2f}' for x in f)}); key generation median {np.median(k):.2f} s "
              f"({k[0]:.2f}-{k[-1]:.2f})")
    g, h = enc["guest"], enc["host"]
    print(f"  paillier phases (all trees): keygen {g.get('keygen', 0):.2f} s, guest encryption "
          f"{g.get('encrypt', 0):.2f} s, guest decryption {g.get('decrypt', 0):.2f} s, host histograms "
          f"{h['histograms']:.2f} s, host compression {h['compress']:.2f} s")
    print(f"  traffic: paillier {enc['bytes'] / 1e6:.1f} MB, plaintext {plain['bytes'] / 1e6:.1f} MB; "
          f"binning (both parties) {enc['binning']:.2f} s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small smoke run with a 1024-bit test key")
    ap.add_argument("--trees", type=int, default=3, help="trees per scenario (default 3: first + 2 further)")
    ap.add_argument("--only", choices=["a", "b"], help="run one scenario")
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--he-scheme", nargs="+", choices=["paillier", "ou"], default=["paillier"],
                    help="homomorphic scheme(s) of the guest's key (default paillier; 'ou': Okamoto-Uchiyama)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run scenario (a) N times per scheme; its first tree is reported as the median and "
                         "range of the N runs (key generation time varies, HEU's OU key most), the rest from "
                         "the median run (default 1; (b), minutes per run, runs once)")
    ap.add_argument("--phases", action="store_true", help="print wall / CPU seconds per protocol phase and depth")
    ap.add_argument("--plot", metavar="PNG", help="write a bar chart of seconds per tree (e.g. docs/img/secureboost_bench.png)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from secureflhv.compute import pool as paillier_parallel
    from secureflhv.crypto.homomorphic.paillier import get_workers
    from secureflhv.tree.params import SecureBoostParams

    quick = args.quick
    bits = 1024 if quick else args.key_bits
    print(f"secureboost benchmark: {bits}-bit Paillier, {get_workers()} worker processes, "
          f"load average before: {os.getloadavg()[0]:.2f}")
    # as in a party process, whose runtime starts the pool when the job starts (party_executor)
    print(f"worker pool started before the timers: {paillier_parallel.start(wait=True):.2f} s")
    scen = []
    if args.only in (None, "a"):
        scen.append(("(a) 10,000 x (10 + 10), depth 5", (2000 if quick else 10_000, 10, 10), 5))
    if args.only in (None, "b"):
        scen.append(("(b) FATE shape 100,000 x (30 + 300), depth 3", (5000 if quick else 100_000, 30,
                                                                       30 if quick else 300), 3))
    rows = []
    for name, shape, depth in scen:
        Xg, Xh, y = make_data(*shape)
        params = SecureBoostParams(n_trees=2 if quick else args.trees, max_depth=depth, max_bin=32,
                                   learning_rate=0.3, key_bits=bits, insecure_test_key=bits < 2048)
        plain = run(Xg, Xh, y, params, "identity")
        for scheme in args.he_scheme:
            repeat = max(1, args.repeat) if name.startswith("(a)") else 1
            encs = sorted((run(Xg, Xh, y, params, scheme) for _ in range(repeat)),
                          key=lambda e: e["first"])
            enc = encs[len(encs) // 2]  # the median run (of the first tree) stands for the others
            enc["firsts"] = [e["first"] for e in encs]
            enc["keygens"] = sorted(e["guest"].get("keygen", 0.0) for e in encs)
            same = all(a.structure() == b.structure() for e in encs
                       for a, b in zip(e["model"].trees, plain["model"].trees))
            label = "" if args.he_scheme == ["paillier"] else f" [{scheme}: the 'paillier' columns below]"
            report(name + (" [quick: smaller]" if quick else "") + label, enc, plain)
            print(f"  same trees with and without encryption: {same}; load average now: {os.getloadavg()[0]:.2f}")
            print_bytes(enc, scheme)
            if args.phases:
                print_phases(enc)
            rows.append((name.split(" ")[0] + ("" if scheme == "paillier" else f" {scheme}"), enc, plain))
    if args.plot and rows:
        plot(rows, args.plot, bits)
    if not quick:
        record_bytes_rows(rows, scen)


def _wire_module():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _report
    import _wire

    return _report, _wire


def print_bytes(enc: dict, scheme: str) -> None:
    """Bytes each party sent / received per tree (payload + framing, as over gRPC with TLS)."""
    _, _wire = _wire_module()
    print(f"  bytes per tree ({scheme}): {_wire.line(enc['wire'], 1 / enc['trees'])}")


def record_bytes_rows(rows, scen) -> None:
    """The ``secureboost_a`` / ``secureboost_b`` rows of docs/benchmarks.json (``_ou`` appended for the
    Okamoto-Uchiyama runs), with bytes per tree."""
    _report, _wire = _wire_module()
    names = {name.split(" ")[0]: name for name, _, _ in scen}
    for tag, enc, plain in rows:
        tag, _, scheme = tag.partition(" ")
        key = "secureboost_" + tag.strip("()") + ("_" + scheme if scheme else "")
        fe = float(np.mean(enc["further"])) if enc["further"] else enc["first"]
        fp = float(np.mean(plain["further"])) if plain["further"] else plain["first"]
        cpu = enc["cpu"] / enc["trees"]
        keygen = enc["guest"].get("keygen", 0.0)
        first = f"first tree {enc['first']:.1f} s (key generation {keygen:.2f} s and encryption included)"
        if len(enc.get("firsts", [])) > 1:
            f, k = enc["firsts"], enc["keygens"]
            first = (f"first tree {np.median(f):.2f} s, median of {len(f)} runs ({f[0]:.2f}–{f[-1]:.2f} s; key "
                     f"generation {np.median(k):.2f} s median ({k[0]:.2f}–{k[-1]:.2f} s) and encryption included)")
        _report.record(key, {
            "what": (f"SecureBoost {names[tag]}{', Okamoto-Uchiyama 2048-bit' if scheme == 'ou' else ''} "
                     f"(`secureboost.py --only {tag.strip('()')}{' --he-scheme ou' if scheme else ''}`)"),
            "ours": f"{first}, further trees {fe:.1f} s; {cpu:.1f} CPU-s per tree",
            "baseline": f"plaintext {fp:.2f} s", "ratio": f"{enc['first'] / plain['first']:,.0f}×, {fe / fp:,.0f}×",
            "bytes": _wire.cell(enc["wire"], 1 / enc["trees"], "tree")})


def plot(rows, path: str, bits: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels, vals, colors = [], [], []
    for tag, enc, plain in rows:
        tag = tag if " " in tag else f"{tag} paillier"  # rows name only the non-default scheme
        cpu = enc["cpu"] / enc["trees"] / (os.cpu_count() or 1)
        further = float(np.mean(enc["further"])) if enc["further"] else enc["first"]
        for lab, v, c in ((f"{tag} first tree", enc["first"], "tab:red"),
                          (f"{tag} further tree", further, "tab:orange"),
                          (f"{tag} CPU-s/cores", cpu, "tab:purple"),
                          (f"{tag} plaintext", float(np.mean(plain["further"] or [plain["first"]])), "tab:green")):
            labels.append(lab)
            vals.append(v)
            colors.append(c)
    ax.barh(labels[::-1], vals[::-1], color=colors[::-1])
    for i, v in enumerate(vals[::-1]):
        ax.text(v, i, f" {v:.1f} s", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(f"seconds per tree ({bits}-bit keys, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    ax.set_title("vertical SecureBoost: (a) 10k x (10+10) depth 5, (b) 100k x (30+300) depth 3", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
