"""Flower's side of the user-model throughput benchmark: FedAvg on Fashion-MNIST in Flower's simulation
runtime, with SecAgg+ and without, printing one JSON line of client-samples per second.

Runs INSIDE Flower's own virtualenv (``benchmarks/flower_env.sh`` makes ``.venv-flower``: flwr[simulation]
pins a protobuf older than secureflhv's), so it imports nothing from secureflhv: the models and the data
split come from ``byom_models.py`` beside it (plain torch + numpy). ``byom_throughput.py`` starts it.

Setting: ``--clients`` virtual SuperNodes on Ray (Flower's only simulation backend; ``--cpus`` actors of one
CPU each, one torch thread each), each holding its Dirichlet(``--beta``) shard of ``--train-rows`` rows;
``--rounds`` rounds of FedAvg with every client selected, ``--epochs`` local epochs of SGD (batch
``--batch-size``, ``--lr``, ``--momentum``, weight decay 1e-5, shuffled, last batch short: as secureflhv's
``local_sgd``), weighted by rows. Exchanged: every parameter and the floating-point batch-norm buffers
(running mean / variance; ``num_batches_tracked`` stays local), as secureflhv's user-model path with
``buffers: aggregate``. SecAgg+ (Bell, Bonawitz, Gascon, Lepoint, Raykova, CCS 2020) is Flower's
``SecAggPlusWorkflow`` + ``secaggplus_mod``: every client a neighbour of every other (``num_shares=1.0``),
60% of the shares to reconstruct, semi-honest (no signatures), Flower's quantisation (clip 8, 2^22 levels,
masks mod 2^32), ``max_weight`` = max(1000, largest shard) so that no weight overflows.

Timing: a round runs at the server from the strategy's ``configure_fit`` to its ``aggregate_fit`` (SecAgg+'s
four stages, the clients' training and the messages in between). ``wall_s`` = the sum over the rounds;
``client_samples_per_s`` = rows trained by all clients over all rounds (Σ shard × epochs × rounds) /
``wall_s``. Not timed: Ray's start-up and one untimed ``get_properties`` message to every node before round 1
(the nodes register, the actors start, each loads the data and
trains one throwaway batch to pay torch's first-call costs: ``warmup_s``), evaluation (none in the rounds; the final
global model is scored afterwards on ``--test-rows`` held-out rows: ``accuracy``).

    .venv-flower/bin/python benchmarks/flower_side.py --model cnn --clients 10 --rounds 2 --train-rows 2000
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)


def exchanged(model) -> list[str]:
    """Names of the state_dict entries that travel: parameters and floating-point buffers, in order."""
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def get_arrays(model) -> list:
    sd = model.state_dict()
    return [sd[k].detach().cpu().numpy().copy() for k in exchanged(model)]


def set_arrays(model, arrays) -> None:
    import torch

    sd = model.state_dict()
    model.load_state_dict({**sd, **{k: torch.as_tensor(a).to(sd[k].dtype) for k, a in zip(exchanged(model), arrays)}})


def local_train(model, X, y, epochs: int, batch_size: int, lr: float, momentum: float, seed: int) -> float:
    """SGD on (X, y) in place; returns the mean batch loss. Shuffled each epoch, last batch short."""
    import torch
    from torch.nn import functional as F

    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=1e-5)
    model.train()
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(len(yt), generator=gen)
        for start in range(0, len(yt), batch_size):
            idx = perm[start:start + batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(Xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return sum(losses) / len(losses)


def accuracy(model, X, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(X[i:i + 1000])).argmax(1) for i in range(0, len(y), 1000)])
    return float((pred.numpy() == y).mean())


def data_key(a) -> tuple:
    return (a.clients, a.train_rows, a.test_rows, a.beta, a.seed)


def client_app(kind: str, a):
    """Flower's ClientApp: one NumPyClient per message, on the node's shard; with ``secaggplus_mod`` for SecAgg+."""
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Context

    def client_fn(context: Context):
        sys.path.insert(0, BENCH)  # runs in a Ray actor: this function travels by value, byom_models by name
        import torch

        import byom_models as bm

        torch.set_num_threads(1)
        pid = int(context.node_config["partition-id"])
        X, y = bm.workload(*data_key(a))[0][pid]

        class Client(NumPyClient):
            def fit(self, parameters, config):
                model = bm.MODELS[a.model]()
                set_arrays(model, parameters)
                rnd = int(config["round"])  # each round its own batch order
                loss = local_train(model, X, y, a.epochs, a.batch_size, a.lr, a.momentum,
                                   a.seed * 7919 + rnd * 1009 + pid)
                return get_arrays(model), len(y), {"loss": loss}

            def get_properties(self, config):  # the untimed warm-up message
                bm.warm_up(bm.MODELS[a.model](), X, y, a.batch_size)
                return {"rows": len(y)}

        return Client().to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if kind == "secaggplus" else [])


def _warm_up(grid, a) -> None:
    """Wait for every node to register, then one untimed get_properties message to each."""
    from flwr.app import Message
    from flwr.common import GetPropertiesIns
    from flwr.compat.common.recorddict_compat import getpropertiesins_to_recorddict

    t0 = time.perf_counter()
    while len(nodes := list(grid.get_node_ids())) < a.clients:
        if time.perf_counter() - t0 > 120:
            raise RuntimeError(f"warm-up: {len(nodes)} of {a.clients} nodes registered after 120 s")
        time.sleep(0.05)
    msgs = [Message(getpropertiesins_to_recorddict(GetPropertiesIns(config={})), nid, "get_properties",
                    group_id="warmup") for nid in nodes]
    replies = list(grid.send_and_receive(msgs))
    if len(replies) != a.clients or any(m.has_error() for m in replies):
        raise RuntimeError(f"warm-up: {len(replies)} replies of {a.clients}, or an error among them")


def server_app(kind: str, a, start: list, max_weight: float, marks: dict):
    """Flower's ServerApp: warm-up, then FedAvg for ``a.rounds`` rounds (SecAgg+ as its fit workflow for
    ``secaggplus``); the times of each round and the final parameters go into ``marks``."""
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    class Timed(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            marks["rounds"][server_round] = [time.perf_counter()]
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            if failures or len(results) != a.clients:
                raise RuntimeError(f"round {server_round}: {len(results)} results, failures {failures!r}")
            out = super().aggregate_fit(server_round, results, failures)
            marks["rounds"][server_round].append(time.perf_counter())
            marks["final"] = out[0]
            return out

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        t0 = time.perf_counter()
        _warm_up(grid, a)
        marks["warmup_s"] = time.perf_counter() - t0
        strategy = Timed(fraction_fit=1.0, min_fit_clients=a.clients, min_available_clients=a.clients,
                         fraction_evaluate=0.0, min_evaluate_clients=0, on_fit_config_fn=lambda r: {"round": r},
                         initial_parameters=ndarrays_to_parameters(start))
        ctx = LegacyContext(context=context, config=ServerConfig(num_rounds=a.rounds), strategy=strategy)
        fit = None
        if kind == "secaggplus":
            fit = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=0.6, max_weight=max_weight)
        DefaultWorkflow(fit_workflow=fit)(grid, ctx)

    return app


def run(kind: str, a) -> dict:
    """One simulation of ``kind`` ("plain" | "secaggplus"); returns its figures (see the module docstring).
    Raises RuntimeError when a round misses a client or the simulation ends early."""
    import torch
    from flwr.common import parameters_to_ndarrays
    from flwr.simulation import run_simulation

    import byom_models

    shards, (X_test, y_test) = byom_models.workload(*data_key(a))
    torch.manual_seed(a.seed)
    start = get_arrays(byom_models.MODELS[a.model]())
    marks: dict = {"rounds": {}, "final": None}
    max_weight = float(max(1000, max(len(s[1]) for s in shards)))
    t_sim = time.perf_counter()
    run_simulation(server_app=server_app(kind, a, start, max_weight, marks), client_app=client_app(kind, a),
                   num_supernodes=a.clients,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": a.cpus}})
    total = time.perf_counter() - t_sim
    rounds = [t[1] - t[0] for _, t in sorted(marks["rounds"].items()) if len(t) == 2]
    if len(rounds) != a.rounds or marks["final"] is None:
        raise RuntimeError(f"{kind}: {len(rounds)} of {a.rounds} rounds completed")
    model = byom_models.MODELS[a.model]()
    set_arrays(model, parameters_to_ndarrays(marks["final"]))
    samples = sum(len(s[1]) for s in shards) * a.epochs * a.rounds
    return {"client_samples_per_s": samples / sum(rounds), "wall_s": sum(rounds), "round_s": rounds,
            "samples": samples, "rounds": a.rounds, "accuracy": accuracy(model, X_test, y_test),
            "warmup_s": marks.get("warmup_s"), "simulation_s": total}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("cnn", "resnet8"), default="resnet8")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--train-rows", type=int, default=2000,
                    help="rows of Fashion-MNIST's training set, split over the clients")
    ap.add_argument("--test-rows", type=int, default=2000, help="held-out rows (its test set) scoring the final model")
    ap.add_argument("--beta", type=float, default=0.5, help="Dirichlet concentration of the label split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="Ray CPUs = concurrent client actors")
    ap.add_argument("--modes", default="plain,secaggplus", help="comma-separated: plain, secaggplus")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    modes = [m for m in a.modes.split(",") if m]
    if not set(modes) <= {"plain", "secaggplus"}:
        raise SystemExit(f"unknown mode in --modes {a.modes!r}")
    logging.disable(logging.WARNING)
    import flwr
    import ray
    import torch

    torch.set_num_threads(1)
    res = {"flwr": flwr.__version__, "ray": ray.__version__, "torch": torch.__version__, "model": a.model,
           "clients": a.clients, "epochs": a.epochs, "batch_size": a.batch_size, "lr": a.lr,
           "train_rows": a.train_rows, "test_rows": a.test_rows, "cpus": a.cpus}
    for kind in modes:
        res[kind] = run(kind, a)
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
