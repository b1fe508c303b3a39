"""Secure aggregation vs plain aggregation: seconds per round, 10 clients x 1,000,000 float32 parameters,
server and clients as separate processes over loopback gRPC (mutual TLS by default, --insecure for
plaintext), plus the server's unmasking time with 30% of the clients dropped before their masked input.

    .venv/bin/python benchmarks/secagg.py            # full run
    .venv/bin/python benchmarks/secagg.py --quick    # smoke run (small vectors, 1 round)

Per-round time is measured at the server (from aggregate() call to result), rounds run back to back,
the first (connection set-up) round is excluded from the median. Plain = the same clipping and
quantisation as secagg, the same words on the wire (uint32 when k <= 32), no masks (``plain_quantised``:
the server sees every update), so the two compare like with like; secagg = Bonawitz et al.
(secureflhv.secagg).

Flower, same run: its SecAgg+ (``SecAggPlusWorkflow``, semi-honest) and Flower without secure aggregation,
same clients, vector size and rounds, in Flower's simulation runtime (``_flower_secagg.py``: virtual
SuperNodes on Ray, no TLS), each Flower ratio beside ours. Flower pins an older protobuf than secureflhv,
so it runs in its own interpreter: ``--flower-python`` (or ``SECUREFLHV_FLOWER_PYTHON``; default: this
interpreter when it can import ``flwr``), e.g. a venv made with ``pip install "flwr[simulation]"``.
Without one the output says "Flower not measured (flwr not installed)", never a figure from elsewhere.
Beside the time: bytes per round the server and each client sent / received (payload + framing, counted
by each party's gRPC transport, all rounds averaged). The full run is recorded in docs/benchmarks.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from secureflhv.runtime.job.demo import free_ports  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402
import _wire  # noqa: E402

BASELINE = "plain_quantised"  # same quantised words as secagg, no masks
FLOWER = "Flower not measured (flwr not installed)"


def flower_python(given: str | None) -> str | None:
    """The interpreter that runs Flower: ``given``, else $SECUREFLHV_FLOWER_PYTHON, else this one if it
    can import flwr, else None."""
    if given or os.environ.get("SECUREFLHV_FLOWER_PYTHON"):
        return given or os.environ["SECUREFLHV_FLOWER_PYTHON"]
    return sys.executable if importlib.util.find_spec("flwr") is not None else None


def measure_flower(python: str | None, clients: int, dim: int, rounds: int, threshold: float) -> tuple[dict | None, str]:
    """Flower's plain and SecAgg+ seconds per round (median after the first round) and a one-line summary;
    ``(None, reason)`` when Flower could not be measured."""
    if python is None:
        return None, FLOWER
    cmd = [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_flower_secagg.py"),
           "--clients", str(clients), "--dim", str(dim), "--rounds", str(rounds), "--threshold", str(threshold)]
    done = None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        res = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        tail = done.stderr[-500:].strip() if done is not None else ""
        return None, f"Flower not measured ({python}: {type(exc).__name__}: {exc}; {tail})"
    med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in res.items() if k != "flwr"}
    med["flwr"] = res["flwr"]
    return med, (f"Flower {res['flwr']} (simulation runtime, no TLS): SecAgg+ {med['secaggplus']:.2f} s/round, "
                 f"without secure aggregation {med['plain']:.2f} s/round, "
                 f"{med['secaggplus'] / med['plain']:.1f}×")


def _transport(pid, addrs, cert_dir):
    from secureflhv.transport.certs import load_party_credentials
    from secureflhv.transport.grpc_transport import GrpcTransport
    tls = load_party_credentials(cert_dir, pid) if cert_dir else None
    return GrpcTransport(pid, "bench-secagg", addrs[pid], addrs, tls=tls, insecure=tls is None, deadline=300)


def client_proc(pid, addrs, cert_dir, cfg_kw, rounds, participants, dim, stall, q):
    from secureflhv.secagg import AggregationConfig, make_aggregation
    cfg = AggregationConfig(**cfg_kw)
    tr = _transport(pid, addrs, cert_dir)
    base, _ = make_aggregation(cfg)

    class Client(base):
        def _on_stage(self, stage):
            if stall and stage == 2:
                q.put(("stalled", pid))
                time.sleep(3600)

    cli = Client(tr, "server", cfg)
    x = np.random.default_rng(abs(hash(pid)) % 2**32).normal(0, 0.1, dim).astype(np.float32)
    try:
        for r in rounds:
            tr.recv("server", "bench.go", r, timeout=600)  # the FL round broadcast, minus the model
            cli.submit(r, participants, x, 100.0)
    except Exception as exc:  # noqa: BLE001
        q.put(("client_error", pid, repr(exc)))
    time.sleep(1.0)
    tr.close()
    q.put(("wire", pid, tr.wire_stats()))


def server_proc(addrs, cert_dir, cfg_kw, rounds, participants, dim, q):
    from secureflhv.secagg import AggregationConfig, make_server
    cfg = AggregationConfig(**cfg_kw)
    tr = _transport("server", addrs, cert_dir)
    server = make_server(tr, cfg)
    try:
        for r in rounds:
            t0 = time.perf_counter()
            for c in participants:  # start the round: every client begins now (as after FL's broadcast)
                tr.send(c, "bench.go", b"go", round=r)
            res = server.aggregate(r, participants, dim)
            q.put(("round", r, time.perf_counter() - t0, dict(getattr(server, "last_timings", {})),
                   len(res.survivors), res.k_bits))
    except Exception as exc:  # noqa: BLE001
        q.put(("server_error", repr(exc)))
    q.put(("server_done",))
    time.sleep(1.0)
    tr.close()
    q.put(("wire", "server", tr.wire_stats()))


def run(kind, n_clients, dim, n_rounds, cert_dir, stall=0, stage_timeout=60.0):
    """Run ``n_rounds`` rounds; return the server's per-round events and ``{party: wire_stats()}`` (all rounds)."""
    ids = [f"client{i:02d}" for i in range(n_clients)]
    addrs = {p: f"127.0.0.1:{port}" for p, port in zip(["server", *ids], free_ports(n_clients + 1))}
    cfg_kw = dict(kind=kind, seed=1, clip=1.0, precision_bits=16, max_weight=1000.0, threshold=0.6,
                  stage_timeout_s=stage_timeout, input_timeout_s=120.0)
    rounds = list(range(1, n_rounds + 1))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=server_proc, args=(addrs, cert_dir, cfg_kw, rounds, ids, dim, q))]
    procs += [ctx.Process(target=client_proc, args=(c, addrs, cert_dir, cfg_kw, rounds, ids, dim, i < stall, q))
              for i, c in enumerate(ids)]
    for p in procs:
        p.start()
    out, wire = [], {}
    try:
        while True:
            ev = q.get(timeout=600)
            if ev[0] == "round":
                out.append(ev)
            elif ev[0] in ("server_error", "client_error"):
                raise RuntimeError(f"{kind}: {ev}")
            elif ev[0] == "wire":
                wire[ev[1]] = ev[2]
            elif ev[0] == "server_done":
                break
        _collect_wire(q, wire, n_clients + 1)
    finally:
        for p in procs:
            p.join(timeout=5 if p is procs[0] else 3)
            if p.is_alive():
                p.kill()
    return out, wire


def _collect_wire(q, wire: dict, parties: int, timeout: float = 20.0) -> None:
    """Read the parties' wire counts (sent after they close their transport) into ``wire``."""
    import queue

    end = time.monotonic() + timeout
    while len(wire) < parties and time.monotonic() < end:
        try:
            ev = q.get(timeout=max(end - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if ev[0] == "wire":
            wire[ev[1]] = ev[2]


def bytes_per_round(wire: dict, rounds: int) -> str:
    """Server's and mean client's bytes sent / received per round (payload + framing)."""
    return _wire.hub_and_spokes(wire, 1 / rounds, per="round")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--dim", type=int, default=1_000_000, help="float32 parameters per client")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per kind (the first is warm-up)")
    ap.add_argument("--insecure", action="store_true", help="plaintext gRPC instead of mutual TLS")
    ap.add_argument("--drop-fraction", type=float, default=0.3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 10,000 parameters, 2 rounds")
    ap.add_argument("--flower-python", help="interpreter with flwr[simulation] (default: $SECUREFLHV_FLOWER_PYTHON, "
                                            "or this one if it imports flwr)")
    ap.add_argument("--no-flower", action="store_true", help="do not measure Flower")
    a = ap.parse_args(argv)
    if a.quick:
        a.dim, a.rounds = 10_000, 2
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = None
        if not a.insecure:
            from secureflhv.transport.certs import generate_certificates
            generate_certificates(tmp, ["server", *[f"client{i:02d}" for i in range(a.clients)]])
            cert_dir = tmp
        mode = "insecure" if a.insecure else "mutual TLS"
        print(f"{a.clients} clients x {a.dim:,} float32 parameters, loopback gRPC ({mode}), keys: X25519 "
              f"(masks, share encryption), Ed25519 (consistency signatures), AES-256 (PRG, AES-GCM), "
              f"processes, {os.cpu_count()} CPUs, {a.rounds} rounds per kind (first = warm-up)")
        med, traffic = {}, {}
        for kind in (BASELINE, "secagg"):
            res, wire = run(kind, a.clients, a.dim, a.rounds, cert_dir)
            secs = [r[2] for r in res]
            med[kind] = statistics.median(secs[1:] if len(secs) > 1 else secs)
            extra = f" (k={res[-1][5]} bits)"
            print(f"  {kind:15s}: {med[kind]:.3f} s/round (all rounds: {', '.join(f'{s:.3f}' for s in secs)}){extra}")
            traffic[kind] = bytes_per_round(wire, a.rounds)
            print(f"           bytes: {traffic[kind]}")
            if kind == "secagg":
                res_k = res[-1][5]
                t = res[-1][3]
                print("           stages (last round): " + ", ".join(f"{k} {v:.3f}s" for k, v in t.items()))
                bounds = statistics.median(r[3]["bounds"] for r in res[1:] or res)
                print(f"           server-side bounds check of the unmasked sum (Σw, |Σ_i| <= Σw·clip, clipped "
                      f"count): {bounds * 1e3:.1f} ms/round, {100 * bounds / med[kind]:.2f}% of the round "
                      f"(without it: {med[kind] - bounds:.3f} s/round)")
        ratio = med["secagg"] / med[BASELINE]
        print(f"  ratio secagg / {BASELINE}: {ratio:.2f}x", flush=True)
        if a.no_flower:
            fl, flower = None, "Flower not measured (--no-flower)"
        else:
            fl, flower = measure_flower(flower_python(a.flower_python), a.clients, a.dim, a.rounds, 0.6)
        print(f"  {flower}", flush=True)
        n_drop = int(round(a.drop_fraction * a.clients))
        res, _ = run("secagg", a.clients, a.dim, 1, cert_dir, stall=n_drop, stage_timeout=10.0 if not a.quick else 3.0)
        t = res[-1][3]
        wait = 10.0 if not a.quick else 3.0
        print(f"  dropout: {n_drop} of {a.clients} clients dropped before MaskedInputCollection, "
              f"{res[-1][4]} survivors: server unmasking (reconstruction + mask removal) {t['unmask']:.3f} s; "
              f"whole round {res[-1][2]:.2f} s, of which the {wait:.0f} s stage deadline that detects the dropouts")
        if not a.quick:
            _report.record("secagg", {
                "what": (f"secure aggregation, actively secure (signed keys, consistency check; X25519, Ed25519, "
                         f"AES-256), {a.clients} clients "
                         f"× {a.dim:,} float32, {'plaintext gRPC' if a.insecure else 'TLS'} (`secagg.py`)"),
                "ours": f"{med['secagg']:.2f} s/round (of which the server-side bounds check {bounds * 1e3:.1f} ms); "
                        f"unmasking with {n_drop} of {a.clients} dropped: "
                        f"{t['unmask']:.2f} s (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)",
                "baseline": f"plain aggregation of the same quantised {res_k}-bit words (no masks) "
                            f"{med[BASELINE]:.2f} s/round; {flower}",
                "ratio": f"{ratio:.1f}×" + (f" (Flower, same run: {fl['secaggplus'] / fl['plain']:.1f}×)" if fl else ""),
                "bytes": f"secagg: {traffic['secagg']}; plain: {traffic[BASELINE]}"})


if __name__ == "__main__":
    main()
