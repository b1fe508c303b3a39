"""Federated WOE binning and IV: seconds and bytes per host feature with Paillier, against the same protocol
without encryption and a centralised numpy computation, all in the same run.

What runs (``secureflhv/vertical/woe_binning.py``): the guest holds the binary labels, one host holds
``--features`` columns, cut into ``--bins`` quantile bins plus a missing-value bin
(:func:`secureflhv.data.woe.column_edges`). The guest encrypts each row's (non-event, event) indicator
pair under its Paillier key (``--key-bits``, 2048 by default: a real key, no test key) and sends them; the host
sums them per column and bin (cumulative, compressed) and sends the sums back; the guest decrypts, checks
them, and computes every column's WOE and IV (:func:`secureflhv.data.woe.woe_iv`); it then tells the host
which columns are selected (IV >= 0.02). Guest and host run as threads over the in-process transport and
share the machine's Paillier worker pool (``SECUREFLHV_WORKERS``, default all cores), started before the
timers as a party's runtime starts it when its job starts.

Baselines, measured in the same run on the same data and bins:

* ``identity``: the same protocol, same messages and rounds, with encryption replaced by identity (both
  roles' ``backend="identity"``: the host sees the labels in plaintext);
* centralised: one party holding labels and columns computes the same per-bin counts (``np.bincount``)
  and IV with numpy; the cost of privacy is the ratio to it.

The per-bin counts the guest decrypts must equal the centralised counts exactly, and the IVs too (checked
and printed; a mismatch exits with status 1).

Printed: key generation, guest encryption, host histograms (and the compression of their sums), guest
decryption + WOE/IV, total wall time and CPU seconds (this process and its workers), bytes on the wire each
way (payload + framing as gRPC with TLS would add, ``secureflhv.transport.wire``), and per feature:
seconds / feature and bytes / feature. The guest's encrypted labels (guest -> host) do not depend on the
number of features; the host's sums (host -> guest) grow with features x bins. The phases overlap (the
host decodes part k while the guest encrypts part k + 1), so they need not add up to the total.

FATE reference (published, other hardware, not re-measured here): FATE's performance page
https://github.com/FederatedAI/FATE/blob/master/doc/2.0/fate/performance.md lists Hetero-Feature-Binning
at 1m08s on FATE-v2.0.0 and 1m45s on FATE-v1.11.4, with guest 100,000 x 30 and host 100,000 x 300
features, on 2 machines (Intel Xeon Platinum 8255C @ 2.50GHz, 32 cores, 128 GB; 16 cores used on each;
1 Gb LAN). FATE's binning component defaults to quantile binning with ``n_bins=10`` (this benchmark's
``--bins`` default) and its time includes FATE's job scheduling, both parties' quantile summaries and the
guest's own 30 features. The guest's local binning of ``--guest-features`` columns (30 by default, plain
numpy: it needs no protocol) is therefore timed here too and added to the FATE-comparable total.

    .venv/bin/python benchmarks/woe_binning.py               # 100,000 rows x 300 host features, 10 bins,
                                                             # 2048-bit Paillier; recorded in docs/benchmarks.json
    .venv/bin/python benchmarks/woe_binning.py --quick       # 5,000 x 20, 1024-bit test key, nothing recorded
    .venv/bin/python benchmarks/woe_binning.py --rows 100000 --features 60 --no-record
    .venv/bin/python benchmarks/woe_binning.py --he-scheme ou   # Okamoto-Uchiyama instead of Paillier

A full run (not ``--quick``, not ``--no-record``) records the row ``woe_binning`` (``woe_binning_ou``) in
docs/benchmarks.json / docs/benchmarks.md (``benchmarks/_report.py``); then run
``benchmarks/update_readme.py`` to refresh the README's table.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's secureflhv, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _wire  # noqa: E402
from secureboost import cpu_seconds  # noqa: E402  CPU seconds of this process and its Paillier workers

FATE_URL = "https://github.com/FederatedAI/FATE/blob/master/doc/2.0/fate/performance.md"
FATE_SECONDS = {"FATE-v2.0.0": 68.0, "FATE-v1.11.4": 105.0}
FATE_SETUP = ("guest 100,000 x 30 + host 100,000 x 300 features, 2 machines x 16 cores used (Xeon Platinum 8255C), "
              "1 Gb LAN, default 10 quantile bins; other hardware, not re-measured here")
FATE_SHAPE = (100_000, 300)  # rows, host features
FATE_GUEST_FEATURES = 30
IV_SELECT = 0.02  # the conventional "useless below" IV threshold (Siddiqi): columns kept by the decision


# ---------------------------------------------------------------------------------------------- data
def make_data(n: int, d_host: int, d_guest: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Xh, Xg, y)``: host columns Xh (n, d_host) float64 (normal; every 7th an integer code of 5 values,
    every 10th with 2% NaN), guest columns Xg (n, d_guest) float64 (normal) and labels y (n,) int64 0/1
    from a noisy logistic rule over the first host and guest columns. Synthetic, seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    Xh = rng.normal(size=(n, d_host))
    for j in range(0, d_host, 7):
        Xh[:, j] = rng.integers(0, 5, n)
    Xg = rng.normal(size=(n, d_guest))
    k = min(d_host, 10)
    logit = Xh[:, :k] @ rng.normal(0, 0.5, k) + (Xg[:, :5] @ rng.normal(0, 0.5, min(d_guest, 5)) if d_guest else 0)
    y = (rng.random(n) < 1 / (1 + np.exp(-(logit - 1.0)))).astype(np.int64)
    for j in range(0, d_host, 10):
        Xh[rng.random(n) < 0.02, j] = np.nan
    return Xh, Xg, y


# ------------------------------------------------------------------------------------ timed backend
class _Timed:
    """Delegates every attribute to ``inner``; the calls of ``names`` add their wall seconds to ``acc``."""

    def __init__(self, inner, acc: dict, names: set[str], wrap=None):
        self.__dict__.update(_inner=inner, _acc=acc, _names=names, _wrap=wrap or {})

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr) or (name not in self._names and name not in self._wrap):
            return attr
        acc, wrap = self._acc, self._wrap.get(name)

        def call(*a, **kw):
            t = time.perf_counter()
            try:
                out = attr(*a, **kw)
            finally:
                if name in self._names:
                    acc[name] += time.perf_counter() - t
            return wrap(out) if wrap else out
        return call


SUMS_OPS = {"encrypt", "decrypt", "histogram", "select", "collect"}


def timed_backend(role, acc: dict) -> None:
    """Replace ``role.he`` by a proxy timing key generation and the PairSums operations into ``acc``."""
    role.he = _Timed(role.he, acc, {"generate_keypair"},
                     wrap={"pair_sums": lambda sums: _Timed(sums, acc, SUMS_OPS)})


# ---------------------------------------------------------------------------------------- the runs
def host_bins(X: np.ndarray, n_bins: int) -> list:
    """One :class:`secureflhv.data.woe.ColumnBins` per column of ``X`` (n, d) float64 (NaN = missing), named
    ``x0``, ``x1``, ...: ``n_bins`` quantile value bins plus a missing-value bin (local, the same in every run)."""
    from secureflhv.data.woe import ColumnBins, column_edges

    return [ColumnBins(f"x{j}", column_edges(X[:, j], "quantile", n_bins)) for j in range(X.shape[1])]


def iv_of(counts: list[np.ndarray]) -> np.ndarray:
    """(d,) float64 IV of each column from its (bins, 2) integer [non-event, event] counts
    (:func:`secureflhv.data.woe.woe_iv`, default adjustment)."""
    from secureflhv.data.woe import woe_iv

    return np.array([woe_iv(c[:, 1], c[:, 0])[1] for c in counts])


def run_federated(X, y, bins, n_bins: int, backend: str, key_bits: int) -> dict:
    """One guest and one host in threads over the in-process transport: keygen, encrypted passes, IV, decisions.

    ``X`` (n, d) float64 host columns, ``y`` (n,) int64 0/1 labels, ``bins`` (:func:`host_bins`, d of them),
    ``backend`` ``"paillier"``, ``"ou"`` or ``"identity"``; keys under 2048 bits are insecure test keys.
    Returns seconds (``total``, ``protocol``, ``keygen``, ``encrypt``, ``decrypt``, ``histogram``, ...), CPU
    seconds (``cpu``), bytes (``g2h``, ``h2g``, ``by_tag``, ``wire``), the decrypted ``counts`` and ``iv``.
    Re-raises the host's error; RuntimeError when the host's selection differs from the guest's."""
    from secureflhv.transport import InProcessNetwork
    from secureflhv.vertical import woe_binning as wb

    test_key = key_bits < 2048
    net = InProcessNetwork(f"woe-bench-{backend}", ["guest", "host"], deadline=3600)
    acc: dict = defaultdict(float)
    t0, c0 = time.perf_counter(), cpu_seconds()
    host = wb.BinningHost(net.transport("host"), "guest", bins, X, max_bins=n_bins, insecure_test_key=test_key,
                          backend=backend)
    index_s = time.perf_counter() - t0
    guest = wb.BinningGuest(net.transport("guest"), ["host"], y, 2, max_features=len(bins), max_bins=n_bins,
                            key_bits=key_bits, insecure_test_key=test_key, backend=backend)
    guest_acc: dict = defaultdict(float)
    timed_backend(guest, guest_acc)
    timed_backend(host, acc)
    out, errors = {}, []

    def serve():
        try:
            out["host"] = host.run()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    t1 = time.perf_counter()
    counts = guest.host_counts()["host"]
    t2 = time.perf_counter()
    iv = iv_of(counts.counts)
    woe_s = time.perf_counter() - t2
    selected = [bool(v >= IV_SELECT) for v in iv]
    guest.send_decisions({"host": wb.HostDecision([np.ones(b.n_bins - 2, bool) for b in bins], selected, None)})
    th.join(3600)
    total, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if errors:
        raise errors[0]
    if out["host"].selected != selected:
        raise RuntimeError(f"the host's selection {out['host'].selected} differs from the guest's {selected}")
    wire = net.wire_stats()
    g = wire["guest"]["host"]
    return {"backend": backend, "total": total, "cpu": cpu, "protocol": t2 - t1, "index": index_s,
            "keygen": guest_acc["generate_keypair"], "encrypt": guest_acc["encrypt"],
            "decrypt": guest_acc["decrypt"], "woe_iv": woe_s, "histogram": acc["histogram"],
            "compress": acc["select"] + acc["collect"],
            "g2h": g["sent"] + g["sent_framing"], "h2g": g["received"] + g["received_framing"],
            "by_tag": {t: (c["sent"] + c["sent_framing"], c["received"] + c["received_framing"])
                       for t, c in g["by_tag"].items()},
            "wire": wire, "counts": counts.counts, "iv": iv}


def run_centralised(X, y, bins) -> dict:
    """One party with labels and columns: bin index, per-bin counts by class (np.bincount) and IV.
    ``X`` (n, d) float64, ``y`` (n,) int64 0/1, ``bins`` d :class:`ColumnBins`; returns ``total`` seconds,
    ``counts`` (d (bins, 2) int64 [non-event, event] arrays) and ``iv`` ((d,) float64)."""
    t0 = time.perf_counter()
    counts = []
    for j, b in enumerate(bins):
        idx = b.index(X[:, j])
        counts.append(np.bincount(idx * 2 + y, minlength=2 * b.n_bins).reshape(b.n_bins, 2))
    iv = iv_of(counts)
    return {"total": time.perf_counter() - t0, "counts": counts, "iv": iv}


def guest_local(Xg, y, n_bins: int) -> float:
    """Seconds for the guest's own columns ``Xg`` (n, d_guest): quantile cuts, counts and IV in plaintext
    (no protocol; 0 columns: about 0 s)."""
    t0 = time.perf_counter()
    if Xg.shape[1]:
        run_centralised(Xg, y, host_bins(Xg, n_bins))
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ output
def fate_shape(args) -> bool:
    """Whether this run has the shape of FATE's published run (rows, host and guest features)."""
    return (args.rows, args.features, args.guest_features) == (*FATE_SHAPE, FATE_GUEST_FEATURES)


def report(res: dict, args, bits: int) -> None:
    """Print the figures of :func:`main`'s ``res`` (times in s, bytes in kB / MB) and FATE's published ones."""
    enc, plain, cen = res["enc"], res["plain"], res["central"]
    d, n = args.features, args.rows
    scheme = args.he_scheme
    print(f"\n== federated WOE binning + IV: {n:,} rows x {d} host features, {args.bins} quantile bins "
          f"(+ missing), {bits}-bit {scheme}{' [quick]' if args.quick else ''}")
    print(f"  host's quantile cuts (local, the same in every run): {res['edges']:.2f} s "
          f"({res['edges'] / d * 1e3:.2f} ms/feature)")
    print(f"  {scheme}: total {enc['total']:.2f} s wall, {enc['cpu']:.1f} CPU-s (this process and its workers; on an "
          f"idle machine with {os.cpu_count()} cores: >= {enc['cpu'] / (os.cpu_count() or 1):.1f} s)")
    print(f"    key generation {enc['keygen']:.2f} s | guest encryption {enc['encrypt']:.2f} s "
          f"({n / max(enc['encrypt'], 1e-9):,.0f} rows/s) | host bin index {enc['index']:.2f} s | host histograms "
          f"{enc['histogram']:.2f} s + compression {enc['compress']:.2f} s | guest decryption {enc['decrypt']:.2f} s"
          f" + WOE/IV {enc['woe_iv']:.3f} s")
    print(f"    bytes: guest -> host {_wire.mb(enc['g2h'])} (encrypted labels: independent of the features), "
          f"host -> guest {_wire.mb(enc['h2g'])}")
    print("    by message (guest sent, received): " + "; ".join(
        f"{t} {_wire.mb(s)}, {_wire.mb(r)}" for t, (s, r) in sorted(enc["by_tag"].items())))
    print(f"    per feature: {enc['total'] / d:.3f} s/feature ({enc['cpu'] / d:.2f} CPU-s), "
          f"{(enc['g2h'] + enc['h2g']) / d / 1e3:.1f} kB/feature both ways "
          f"(host -> guest {enc['h2g'] / d / 1e3:.2f} kB/feature; guest -> host {enc['g2h'] / d / 1e3:.1f} "
          f"kB/feature amortised)")
    print(f"  identity (same protocol, no encryption): total {plain['total']:.2f} s, {plain['cpu']:.1f} CPU-s; "
          f"bytes guest -> host {_wire.mb(plain['g2h'])}, host -> guest {_wire.mb(plain['h2g'])}; "
          f"{plain['total'] / d * 1e3:.2f} ms/feature")
    print(f"  centralised numpy (bin index, np.bincount, IV): {cen['total']:.2f} s, "
          f"{cen['total'] / d * 1e3:.2f} ms/feature")
    print(f"  ratio: {scheme} / identity {enc['total'] / plain['total']:,.1f}x, {scheme} / centralised "
          f"{enc['total'] / cen['total']:,.0f}x; identity / centralised {plain['total'] / cen['total']:,.1f}x; "
          f"bytes {scheme} / identity {(enc['g2h'] + enc['h2g']) / (plain['g2h'] + plain['h2g']):,.1f}x")
    print(f"  counts equal the centralised counts: {scheme} {res['counts_equal']['enc']}, identity "
          f"{res['counts_equal']['plain']}; IV equal: {res['iv_equal']}; columns with IV >= {IV_SELECT}: "
          f"{int(np.sum(cen['iv'] >= IV_SELECT))} of {d}")
    fate = res["fate_total"]
    print(f"  FATE-comparable total (host cuts + {scheme} run + guest's {args.guest_features} local columns "
          f"{res['guest_local']:.2f} s): {fate:.1f} s on {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"  FATE's published figure ({FATE_URL}): Hetero-Feature-Binning "
          + ", ".join(f"{k} {v:.0f} s" for k, v in FATE_SECONDS.items()) + f"; {FATE_SETUP}.")
    if fate_shape(args):
        print("  same shape as FATE's: ours / FATE " + ", ".join(f"{k} {fate / v:.2f}x" for k, v in FATE_SECONDS.items())
              + " (their 32 cores, job scheduling and LAN against our 2 cores in one process)")
    else:
        print(f"  (shape differs from FATE's {FATE_SHAPE[0]:,} x {FATE_SHAPE[1]} + {FATE_GUEST_FEATURES}: "
              "no ratio to it)")


def record(res: dict, args, bits: int, docs: Path | None = None) -> None:
    """The ``woe_binning`` (``woe_binning_ou``) row of docs/benchmarks.json (``docs``: another folder)."""
    import _report

    enc, plain, cen = res["enc"], res["plain"], res["central"]
    d, n = args.features, args.rows
    scheme = "Paillier" if args.he_scheme == "paillier" else "Okamoto-Uchiyama"
    same = fate_shape(args)
    fate = ("FATE published " + " / ".join(f"{v:.0f} s ({k.removeprefix('FATE-')})" for k, v in FATE_SECONDS.items())
            + f" for guest {FATE_SHAPE[0]:,} x {FATE_GUEST_FEATURES} + host {FATE_SHAPE[0]:,} x {FATE_SHAPE[1]} on "
            f"2 x 16 cores, other hardware ({FATE_URL})")
    _report.record("woe_binning" + ("" if args.he_scheme == "paillier" else "_ou"), {
        "what": (f"federated WOE binning + IV, {n:,} rows x {d} host features, {args.bins} quantile bins, {scheme} "
                 f"{bits}-bit (`woe_binning.py{'' if args.he_scheme == 'paillier' else ' --he-scheme ou'}`)"),
        "ours": (f"{enc['total']:.1f} s ({enc['total'] / d:.3f} s/feature; key generation {enc['keygen']:.2f} s, "
                 f"guest encryption {enc['encrypt']:.1f} s, host histograms {enc['histogram'] + enc['compress']:.1f} s, "
                 f"guest decryption + WOE/IV {enc['decrypt'] + enc['woe_iv']:.2f} s); {enc['cpu']:.0f} CPU-s; "
                 f"{(enc['g2h'] + enc['h2g']) / d / 1e3:.1f} kB/feature; with the host's cuts and the guest's "
                 f"{args.guest_features} local columns {res['fate_total']:.1f} s. Load average {res['load'][0]:.1f} / "
                 f"{res['load'][1]:.1f} (start / end) on {os.cpu_count()} cores"),
        "baseline": (f"identity (no encryption) {plain['total']:.2f} s; centralised numpy {cen['total']:.2f} s; "
                     + fate),
        "ratio": (f"{enc['total'] / plain['total']:,.0f}× identity, {enc['total'] / cen['total']:,.0f}× centralised"
                  + (f"; {res['fate_total'] / FATE_SECONDS['FATE-v2.0.0']:.2f}× FATE v2.0.0" if same else "")),
        "bytes": _wire.cell(enc["wire"])}, *([docs] if docs is not None else []))


def main(argv=None) -> dict:
    """Run the benchmark; returns the figures ({"enc", "plain", "central", ...}) for tests."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 5,000 rows x 20 features, 1024-bit INSECURE test key, nothing recorded "
                         "(--rows / --features / --key-bits still override)")
    ap.add_argument("--rows", type=int, help="rows (default 100,000; --quick 5,000)")
    ap.add_argument("--features", type=int, help="host features (default 300; --quick 20)")
    ap.add_argument("--guest-features", type=int, default=None,
                    help="guest's own columns, binned locally for the FATE-comparable total (default 30; --quick 5)")
    ap.add_argument("--bins", type=int, default=10, help="value bins per column (default 10, FATE's default n_bins)")
    ap.add_argument("--key-bits", type=int, help="key size (default 2048; --quick 1024, a test key); "
                                                 "below 2048 bits the key is an insecure test key")
    ap.add_argument("--he-scheme", choices=["paillier", "ou"], default="paillier",
                    help="homomorphic scheme of the guest's key (default paillier; ou: Okamoto-Uchiyama)")
    ap.add_argument("--seed", type=int, default=0, help="data seed")
    ap.add_argument("--no-record", action="store_true", help="leave docs/benchmarks.json alone")
    args = ap.parse_args(argv)
    args.rows = args.rows or (5_000 if args.quick else FATE_SHAPE[0])
    args.features = args.features or (20 if args.quick else FATE_SHAPE[1])
    if args.guest_features is None:
        args.guest_features = 5 if args.quick else FATE_GUEST_FEATURES
    bits = args.key_bits or (1024 if args.quick else 2048)
    if args.rows < 10 or args.features < 1 or args.bins < 2 or args.guest_features < 0:
        ap.error("need --rows >= 10, --features >= 1, --bins >= 2, --guest-features >= 0")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("secureflhv").setLevel(logging.ERROR)  # test keys warn per object in --quick
    from secureflhv.compute import pool as paillier_pool
    from secureflhv.crypto.homomorphic.paillier import get_workers
    importlib.import_module("secureflhv.vertical.woe_binning")  # imported before the timers, not in them

    load0 = os.getloadavg()[0]
    print(f"woe binning benchmark: {bits}-bit {args.he_scheme}{' (INSECURE test key)' if bits < 2048 else ''}, "
          f"{get_workers()} worker processes, {os.cpu_count()} CPUs, load average before: {load0:.2f}")
    print(f"worker pool started before the timers: {paillier_pool.start(wait=True):.2f} s")
    Xh, Xg, y = make_data(args.rows, args.features, args.guest_features, args.seed)
    t0 = time.perf_counter()
    bins = host_bins(Xh, args.bins)
    edges = time.perf_counter() - t0
    central = run_centralised(Xh, y, bins)
    plain = run_federated(Xh, y, bins, args.bins, "identity", bits)
    enc = run_federated(Xh, y, bins, args.bins, args.he_scheme, bits)
    eq = {k: all(np.array_equal(a, b) for a, b in zip(r["counts"], central["counts"]))
          for k, r in (("enc", enc), ("plain", plain))}
    res = {"enc": enc, "plain": plain, "central": central, "edges": edges, "counts_equal": eq,
           "iv_equal": bool(np.array_equal(enc["iv"], central["iv"]) and np.array_equal(plain["iv"], central["iv"])),
           "guest_local": guest_local(Xg, y, args.bins), "args": args, "bits": bits}
    res["fate_total"] = edges + enc["total"] + res["guest_local"]
    res["load"] = (load0, os.getloadavg()[0])
    report(res, args, bits)
    if not all(eq.values()) or not res["iv_equal"]:
        print("ERROR: the federated counts or IVs differ from the centralised ones", file=sys.stderr)
        raise SystemExit(1)
    if not args.quick and not args.no_record:
        record(res, args, bits)
    return res


if __name__ == "__main__":
    main()
