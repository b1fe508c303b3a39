"""The job-bound participant list and the server-side bounds with real party processes over gRPC + mutual
TLS on loopback: an unclipped client makes the server refuse the round as out of range (never a crash, and
the honest clients finish), and a client told that the server is a participant refuses, naming it."""
import multiprocessing as mp
import queue
import time

import numpy as np

from secureflhv.runtime.job.demo import free_ports
from secureflhv.transport.certs import generate_certificates

from secagg_procs import client_main, server_main


def _run(tmp_path, ids, participants_of, cfg_kw, d=500, unclipped=(), with_server=True):
    parties = ["server", *ids]
    generate_certificates(tmp_path, parties)
    addrs = {p: f"127.0.0.1:{port}" for p, port in zip(parties, free_ports(len(parties)))}
    rng = np.random.default_rng(1)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=client_main, args=(c, addrs, str(tmp_path), cfg_kw, 1, participants_of(c),
                                                   rng.normal(0, 0.5, d), 10.0, None, q, c in unclipped))
             for c in ids]
    if with_server:
        procs.append(ctx.Process(target=server_main, args=(addrs, str(tmp_path), cfg_kw, [1], ids, d, q)))
    for p in procs:
        p.start()
    events, deadline = [], time.monotonic() + 90
    try:
        while len(events) < len(procs) and time.monotonic() < deadline:
            try:
                events.append(q.get(timeout=0.2))
            except queue.Empty:
                pass
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert len(events) == len(procs), f"missing reports within 90 s: {events}"
    return events, procs


def test_processes_unclipped_client_round_refused_out_of_range(tmp_path):
    ids = ["client0", "client1", "client2"]
    cfg_kw = dict(kind="secagg", seed=2, stage_timeout_s=10.0, input_timeout_s=30.0, job_clients=tuple(ids))
    events, procs = _run(tmp_path, ids, lambda c: ids, cfg_kw, unclipped={"client1"})
    server = [e for e in events if e[0] in ("result", "server_error")]
    assert len(server) == 1 and server[0][0] == "server_error", events
    assert "OutOfRangeRound" in server[0][1] and "not clipped" in server[0][1]
    assert sorted(e[1] for e in events if e[0] == "client_done") == ids  # nobody crashed or hung
    assert all(p.exitcode == 0 for p in procs)


def test_processes_client_refuses_a_list_naming_the_server(tmp_path):
    ids = ["client0", "client1", "client2"]
    cfg_kw = dict(kind="secagg", seed=2, stage_timeout_s=5.0, input_timeout_s=10.0, job_clients=tuple(ids),
                  min_clients=2, max_colluders=0)
    events, procs = _run(tmp_path, ["client0"], lambda c: ["client0", "server"], cfg_kw, with_server=False)
    assert events[0][:2] == ("client_error", "client0"), events
    assert "names the aggregation server 'server'" in events[0][2]
