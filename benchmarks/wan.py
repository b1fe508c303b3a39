"""Each family on loopback and across a WAN: seconds, bytes per party, and the share of time spent on the network.

Families (small jobs, real party processes over gRPC + mutual TLS in both settings):

* vertical LR: server + guest + host-1, breast cancer (569 rows), ``--epochs`` epochs, batch 128;
* horizontal FL with secure aggregation (Bonawitz): server + 3 clients, 600 rows x 16 features,
  10 classes (label-Dirichlet(0.5) shards), MLP, FedAvg, ``--rounds`` rounds;
* vertical SecureBoost: guest + host-1, breast cancer, ``--trees`` trees of depth 3.

Settings: ``loopback`` = every party on 127.0.0.1 (``secureflhv party`` each, watched like the WAN
runs; no launcher in between); ``wan`` = every party on its
own network host of the WAN test bed (tests/wan/netbed.py: 40 ms each way through a delaying relay,
100 Mbit/s per link with tbf; needs root). Paillier keys are ``--key-bits`` (default 1024: test-only
keys, to keep the run short on 2 cores; pass 2048 for deployment figures).

Figures per run: ``job_s`` = the longest party's own running time (its "finished in" line: from its
start, after the interpreter's imports, to its end: meeting, data preparation, protocol, artifacts);
``wall_s`` = first process started to last process exited. Each setting runs ``--repeat`` times
(interleaved, default 3) and the fastest run is reported (the machine is shared). ``network share`` = (job_s(wan) -
job_s(loopback)) / job_s(wan): the compute is identical in both settings (same job, same seed), so
the difference is time spent waiting on the network (latency and bandwidth). Bytes per party are
read from each party's ``metrics.json`` (``wire`` -> ``total``: sent and received, payload + framing)
where the runtime reports them, else "not measured".

Writes docs/wan.json and the results table of docs/wan.md (between its result markers).

    python benchmarks/wan.py                 # all three families, loopback and WAN
    python benchmarks/wan.py --quick         # fewer epochs / rounds / trees
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "wan"))

import netbed  # noqa: E402
from wan_harness import run_local, run_on_bed  # noqa: E402

from secureflhv.data import Dataset, partition, write_shards  # noqa: E402
from secureflhv.runtime.job.demo import breast_cancer_tables, vertical_parties, write_job  # noqa: E402

DOC_JSON = ROOT / "docs" / "wan.json"
DOC_MD = ROOT / "docs" / "wan.md"
BEGIN, END = "<!-- wan-results -->", "<!-- /wan-results -->"
_FINISHED = re.compile(r"(\S+) finished in ([0-9.]+)s")


# ---------------------------------------------------------------------------------- jobs
def vertical_lr(work: Path, args) -> Path:
    guest_csv, host_csvs = breast_cancer_tables(work / "data", 1, seed=3, scheme="random")
    params = {"mode": "arbiter", "epochs": args.epochs, "batch_size": 128, "learning_rate": 0.15,
              "key_bits": args.key_bits, "early_stopping": False, "test_fraction": 0.25, "split_seed": 5, "seed": 7}
    parties = vertical_parties(guest_csv, host_csvs, server=True, id_column="id", label_column="label")
    return write_job(work / "job", "wan-bench-vlr", "vertical_lr", parties, params, deadline_s=300,
                     insecure_test_keys=args.key_bits < 2048)


def horizontal_secagg(work: Path, args) -> Path:
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1.5, (10, 16))
    y = rng.integers(0, 10, 600)
    ds = Dataset((centres[y] + rng.normal(0, 0.7, (600, 16))).astype(np.float32), y, name="blobs")
    shards = write_shards(ds, partition("label_dirichlet", ds, 3, seed=1, beta=0.5), work / "data", fmt="npz")
    params = {"strategy": "fedavg", "model": {"name": "mlp", "n_features": 16, "n_classes": 10},
              "rounds": args.rounds, "local_epochs": 2, "batch_size": 32, "learning_rate": 0.1, "momentum": 0.9, "seed": 3,
              "test_fraction": 0.2, "aggregation": {"kind": "secagg", "clip": 1.0, "seed": 11}}
    parties = [{"id": "server", "role": "server"}]
    parties += [{"id": f"client-{i}", "role": "guest" if i == 1 else "host", "data": {"path": str(s)}}
                for i, s in enumerate(shards, 1)]
    return write_job(work / "job", "wan-bench-hfl", "horizontal", parties, params, deadline_s=300)


def secureboost_vertical(work: Path, args) -> Path:
    guest_csv, host_csvs = breast_cancer_tables(work / "data", 1, seed=3, scheme="random")
    params = {"n_trees": args.trees, "max_depth": 3, "learning_rate": 0.3, "max_bin": 16, "key_bits": args.key_bits,
              "shuffle_seed": 1, "test_fraction": 0.3, "split_seed": 5}
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    return write_job(work / "job", "wan-bench-sb", "secureboost_vertical", parties, params, deadline_s=300,
                     insecure_test_keys=args.key_bits < 2048)


FAMILIES = {"vertical LR": vertical_lr, "horizontal FL + secure aggregation": horizontal_secagg,
            "vertical SecureBoost": secureboost_vertical}


# ---------------------------------------------------------------------------------- runs
def wire_bytes(out: Path, party: str) -> dict | None:
    """{"sent", "received"} bytes (payload + framing) from ``metrics.json["wire"]``, or None if not reported."""
    try:
        wire = json.loads((out / party / "metrics.json").read_text()).get("wire")
    except (OSError, ValueError):
        return None
    total = (wire or {}).get("total") or (wire or {}).get("totals")
    if not isinstance(total, dict) or "sent" not in total:
        return None
    return {d: int(total.get(d, 0)) + int(total.get(f"{d}_framing", 0)) for d in ("sent", "received")}


def summarise(job: Path, out: Path, finished: dict[str, float], wall: float) -> dict:
    parties = [p["id"] for p in yaml.safe_load(job.read_text())["parties"]]
    missing = [p for p in parties if p not in finished]
    if missing:
        raise RuntimeError(f"{job}: no 'finished' line from {missing}")
    return {"job_s": round(max(finished.values()), 2), "wall_s": round(wall, 2),
            "party_s": {p: finished[p] for p in parties},
            "bytes": {p: wire_bytes(out, p) for p in parties}}


def run_loopback(job: Path) -> dict:
    start = time.monotonic()
    runs = run_local(job, timeout=1200)
    wall = time.monotonic() - start
    return _summarise_runs(job, job.parent / "out", runs, wall, "loopback")


def _summarise_runs(job: Path, out: Path, runs: dict, wall: float, setting: str) -> dict:
    bad = {p: r.text[-2000:] for p, r in runs.items() if r.code != 0}
    if bad:
        raise RuntimeError(f"{setting} run of {job} failed: {bad}")
    finished = {m.group(1): float(m.group(2)) for r in runs.values() for m in _FINISHED.finditer(r.text)}
    return summarise(job, out, finished, wall)


def run_wan(job: Path, work: Path) -> dict:
    ids = [p["id"] for p in yaml.safe_load(job.read_text())["parties"]]
    with netbed.NetBed(ids) as bed:
        wan_job = bed.adopt_job(job, work)
        start = time.monotonic()
        runs = run_on_bed(bed, wan_job, timeout=1200)
        wall = time.monotonic() - start
    return _summarise_runs(job, work / "out", runs, wall, "WAN")


def best(runs: list[dict]) -> dict:
    """The fastest of repeated runs (the least disturbed by other load), with every sample's job seconds."""
    fastest = min(runs, key=lambda r: r["job_s"])
    return {**fastest, "samples_job_s": [r["job_s"] for r in runs]}


# ---------------------------------------------------------------------------------- report
def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _mb(b: dict | None) -> str:
    return "not measured" if b is None else f"{_size(b['sent'])} / {_size(b['received'])}"


def table(results: dict) -> str:
    rows = ["| family | setting | job s | wall s | network share | bytes per party, sent / received |",
            "|---|---|---:|---:|---:|---|"]
    for fam, r in results.items():
        for setting in ("loopback", "wan"):
            if setting not in r:
                continue
            x = r[setting]
            share = f"{r['network_share'] * 100:.0f} %" if setting == "wan" and "network_share" in r else ""
            per = "; ".join(f"{p} {_mb(b)}" for p, b in x["bytes"].items())
            rows.append(f"| {fam} | {setting} | {x['job_s']:.1f} | {x['wall_s']:.1f} | {share} | {per} |")
    return "\n".join(rows)


def write_docs(doc: dict) -> None:
    DOC_JSON.write_text(json.dumps(doc, indent=2) + "\n")
    p = doc["profile"]
    block = (f"{BEGIN}\nMeasured {doc['date']} on {doc['machine']} (load average {doc['load_before']} before, "
             f"{doc['load_after']} after; other work on the machine shares its {os.cpu_count()} cores), "
             f"`python benchmarks/wan.py{' --quick' if doc['quick'] else ''} --repeat {doc['repeat']}` (fastest of "
             f"the repeats), WAN profile {p['delay_ms']:.0f} ms each "
             f"way, {p['rate_mbit']:.0f} Mbit/s per link, {doc['key_bits']}-bit Paillier keys"
             f"{' (test-only size)' if doc['key_bits'] < 2048 else ''}:\n\n{table(doc['results'])}\n{END}")
    text = DOC_MD.read_text() if DOC_MD.exists() else f"# WAN\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text += "\n" + block + "\n"
    DOC_MD.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 epoch / 2 rounds / 2 trees")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trees", type=int, default=3)
    ap.add_argument("--key-bits", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3, help="runs per setting; the fastest is reported")
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="only these (default: all)")
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/wan.*")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.rounds, args.trees = 1, 2, 2
    why = netbed.unavailable()
    if why:
        print(f"WAN runs skipped: {why}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = {}
    with tempfile.TemporaryDirectory(prefix="secureflhv-wan-bench-") as tmp:
        for fam in args.family or FAMILIES:
            work = Path(tmp) / re.sub(r"\W+", "-", fam)
            job = FAMILIES[fam](work, args)
            samples = {"loopback": [], "wan": []}
            for i in range(args.repeat):  # interleaved, so both settings see the same load
                samples["loopback"].append(run_loopback(job))
                if why is None:
                    samples["wan"].append(run_wan(job, work / f"wan-{i}"))
                print(f"{fam} #{i + 1}: " + ", ".join(f"{k} {v[-1]['job_s']:.1f} s" for k, v in samples.items() if v),
                      flush=True)
            r = results[fam] = {k: best(v) for k, v in samples.items() if v}
            if "wan" in r:
                r["network_share"] = round(max(0.0, 1 - r["loopback"]["job_s"] / r["wan"]["job_s"]), 3)
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{os.cpu_count()} cores, {os.uname().sysname} {os.uname().release}",
           "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
           "quick": args.quick, "repeat": args.repeat, "key_bits": args.key_bits,
           "profile": {"delay_ms": netbed.WAN_DELAY_S * 1000, "rate_mbit": netbed.WAN_RATE_MBIT},
           "results": results}
    print(table(results))
    if not args.no_docs:
        write_docs(doc)
        print(f"wrote {DOC_JSON.relative_to(ROOT)} and {DOC_MD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
