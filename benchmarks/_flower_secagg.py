"""Flower's SecAgg+ and Flower without secure aggregation, seconds per round, for ``secagg.py``.

Runs in an interpreter that has ``flwr[simulation]`` (Flower's simulation runtime, on Ray): Flower pins a
protobuf older than secureflhv's, so the two need not share an environment and this file imports nothing
from secureflhv. ``secagg.py`` starts it (``--flower-python``) and reads one JSON line from its stdout:
``{"flwr": version, "plain": [s per round], "secaggplus": [s per round]}``.

Setting: ``--clients`` virtual SuperNodes, each returning a fixed float32 vector of ``--dim`` parameters
and weight 100 from ``fit`` (no training: the cost is the aggregation's), FedAvg, ``--rounds`` rounds,
no evaluation. A round is timed at the server, from the strategy's ``configure_fit`` to its
``aggregate_fit``. SecAgg+: ``SecAggPlusWorkflow`` with every client a neighbour of every other
(``num_shares=1.0``, as Bonawitz et al.'s complete graph) and ``--threshold`` of the shares to reconstruct,
Flower's defaults otherwise (clip 8, quantisation 2^22, masks mod 2^32); semi-honest (no signatures).

    /path/to/flower-venv/bin/python benchmarks/_flower_secagg.py --clients 10 --dim 1000000 --rounds 4
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time


def run(kind: str, clients: int, dim: int, rounds: int, threshold: float) -> list[float]:
    """Seconds per round of Flower's ``kind`` ("plain" | "secaggplus")."""
    import numpy as np
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.simulation import run_simulation

    times: dict[int, list[float]] = {}

    class Timed(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            times[server_round] = [time.perf_counter()]
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times[server_round].append(time.perf_counter())
            return out

    class Client(NumPyClient):
        def __init__(self, x):
            self.x = x

        def fit(self, parameters, config):
            return [self.x], 100, {}

    def client_fn(context: Context):
        seed = int(context.node_config.get("partition-id", 0))
        return Client(np.random.default_rng(seed).normal(0, 0.1, dim).astype(np.float32)).to_client()

    client_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if kind == "secaggplus" else [])
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = Timed(fraction_fit=1.0, min_fit_clients=clients, min_available_clients=clients,
                         fraction_evaluate=0.0, min_evaluate_clients=0,
                         initial_parameters=ndarrays_to_parameters([np.zeros(dim, dtype=np.float32)]))
        ctx = LegacyContext(context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
        fit = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=threshold) if kind == "secaggplus" else None
        DefaultWorkflow(fit_workflow=fit)(grid, ctx)

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=clients,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": os.cpu_count()}})
    return [t[1] - t[0] for _, t in sorted(times.items()) if len(t) == 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threshold", type=float, default=0.6, help="fraction of the shares to reconstruct")
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    import flwr

    res = {"flwr": flwr.__version__}
    for kind in ("plain", "secaggplus"):
        res[kind] = run(kind, a.clients, a.dim, a.rounds, a.threshold)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
