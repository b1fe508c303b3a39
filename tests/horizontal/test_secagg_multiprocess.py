"""Secure aggregation with real party processes over gRPC + mutual TLS on loopback: one client is
killed (SIGKILL) mid-round after key set-up, and the round still yields the exact sum of the others."""
import multiprocessing as mp
import queue
import time

import numpy as np
import pytest

from secureflhv.crypto.quantise import EXTRA_COORDS, dequantise, quantise, rounding_rng
from secureflhv.secagg import AggregationConfig
from secureflhv.transport.certs import generate_certificates

from secureflhv.runtime.job.demo import free_ports

from secagg_procs import client_main, server_main


@pytest.mark.slow
def test_secagg_processes_tls_client_killed_mid_round(tmp_path):
    ids = [f"client{i}" for i in range(4)]
    generate_certificates(tmp_path, ["server", *ids])
    addrs = {p: f"127.0.0.1:{port}" for p, port in zip(["server", *ids], free_ports(5))}
    cfg_kw = dict(kind="secagg", seed=3, threshold=3, stage_timeout_s=5.0, input_timeout_s=30.0,
                  consistency_check=True)
    d, rid = 2000, 1
    rng = np.random.default_rng(0)
    xs = {c: rng.normal(0, 0.5, d) for c in ids}
    ws = {c: float(10 + i) for i, c in enumerate(ids)}
    victim = ids[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # The victim reports on a queue of its own: killing a process can leave a multiprocessing queue's
    # shared write lock held, which would silence everyone else on a shared queue.
    victim_q = ctx.Queue()
    server = ctx.Process(target=server_main, args=(addrs, str(tmp_path), cfg_kw, [rid], ids, d, q))
    clients = {c: ctx.Process(target=client_main, args=(c, addrs, str(tmp_path), cfg_kw, rid, ids, xs[c], ws[c],
                                                         2 if c == victim else None,
                                                         victim_q if c == victim else q)) for c in ids}
    server.start()
    for p in clients.values():
        p.start()
    events = []
    try:
        result = None
        deadline = time.monotonic() + 120
        while result is None and time.monotonic() < deadline:
            try:
                events.append(victim_q.get_nowait())
                clients[victim].kill()  # after AdvertiseKeys and ShareKeys, before its masked input
            except queue.Empty:
                pass
            try:
                ev = q.get(timeout=0.2)
            except queue.Empty:
                continue
            events.append(ev)
            if ev[0] in ("result", "server_error"):
                result = ev
        assert result is not None, f"no result within 120 s; events: {events}"
        assert result[0] == "result", result
        _, _, secs, total, weight, survivors, _ = result
        cfg = AggregationConfig(**cfg_kw)
        qp = cfg.quant_params(len(ids), d)
        acc = np.zeros(d + EXTRA_COORDS, dtype=np.uint64)
        alive = [c for c in ids if c != victim]
        for c in alive:
            acc += quantise(xs[c], ws[c], qp, rounding_rng(cfg.seed, rid, c))[0]
        exp_total, exp_weight, _ = dequantise(acc & qp.modulus_mask, qp)
        assert survivors == alive
        assert np.array_equal(total, exp_total) and weight == exp_weight
        assert ("stalled", victim) in events
    finally:
        for p in [server, *clients.values()]:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert clients[victim].exitcode != 0
    assert all(clients[c].exitcode == 0 for c in ids if c != victim)
