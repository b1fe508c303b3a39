#!/usr/bin/env python3
"""The complete grid: every horizontal strategy × every horizontal partition, through secure aggregation.

Strategies (secureflhv/horizontal/strategy_registry.py): FedAvg, FedProx, SCAFFOLD, FedNova, FedAvg with client
contribution normalisation (``fedavg+ccn``, temperature ``--temperature``), IFCA (``--clusters`` k), FedPer, and
MultiConfederated learning (``multiconfederated``, column MC: decentralised peers, no server and no secure
aggregation, run by :func:`run_mc`; its accuracy is the mean of the peers' personal models on the test rows).
Partitions: NIID-Bench's (Li, Diao, Chen, He, ICDE 2022) iid, #C=1/2/3, Dir(0.5)/Dir(0.1), quantity skew,
feature noise, FCUBE, natural ids, plus label noise, temporal, mixed label+quantity and mixed label+feature-noise
skew (``PARTITIONS``): every scheme of :func:`secureflhv.data.available_schemes` has a row (``SCHEMES_NA`` would
name a scheme left out, with the reason; none is). Two grids (``GRIDS``): Fashion-MNIST with NIID-Bench's simple
CNN, and a tabular set (scikit-learn digits) with NIID-Bench's MLP; a partition whose column a grid's data lacks
runs on a substitute set (natural ids: Palmer Penguins by island; temporal: Statlog Shuttle's stream order, and
penguins by study year; FCUBE: NIID-Bench's FCUBE data) or is reported n/a with the reason. Penguins has 3
islands and 3 years, so its rows run with 3 parties (one island or one year each: ``DATA_PARTIES``).

Every run: ``--parties`` clients (threads) and a server over the in-process transport (same protocol code as
over gRPC), updates aggregated with Bonawitz et al. secure aggregation (``kind: secagg``); the clients of a
round train as one batch (``--train batched``, :mod:`secureflhv.horizontal.batched`: vmap over stacked client
parameters, same maths as the per-client loop; ``--device cuda`` when torch sees a GPU). Each party holds out
``--local-test`` of its rows: the worst party's accuracy on its own rows is reported beside the global
accuracy. Baseline per data set (same run): the same model trained centrally on the pooled rows for
``rounds × local epochs`` epochs (NIID-Bench's "all_in"). ``--seeds 0,1,2``: mean ± std per cell.

The defaults are far smaller than NIID-Bench's (1,500 Fashion-MNIST rows, 4 rounds × 4 epochs, batch 16):
the whole grid has to run in about an hour on 2 shared cores; docs/niid_accuracy.md states the settings.

Resumable: every finished run (and each baseline) is appended to ``niid_accuracy.cells.jsonl`` in the output
folder; started again with the same settings, the grid skips what is there. Runs are keyed by seed, so one
process per seed (``--seeds 1 --rotate 4``: starting at another partition, so a grid cut short by the clock still
covers every partition) can share a results file after ``cat``. ``--render-only`` writes the report from the
results file without running anything (cells that miss seeds say so); ``--report-only JSON`` re-renders from a
saved ``niid_accuracy.json``. Writes ``niid_accuracy.md``, ``niid_accuracy.json`` and ``img/niid_accuracy.png``
into ``--out-dir`` (default docs/; ``--quick``: a temp folder).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import _wire  # noqa: E402  (bytes per party beside the time)

PARTITIONS = [  # (label, scheme, params) — NIID-Bench's settings, plus the survey's label noise, mixed, temporal
    ("iid", "iid", {}),
    ("#C=1", "label_quantity", {"k": 1}),
    ("#C=2", "label_quantity", {"k": 2}),
    ("#C=3", "label_quantity", {"k": 3}),
    ("Dir(0.5)", "label_dirichlet", {"beta": 0.5}),
    ("Dir(0.1)", "label_dirichlet", {"beta": 0.1}),
    ("quantity Dir(0.5)", "quantity_dirichlet", {"beta": 0.5}),
    ("noise 0.1", "feature_noise", {"sigma": 0.1}),
    ("label noise 0.3", "label_noise", {"flip": 0.3}),
    ("mixed Dir(0.5)+quantity", "label_dirichlet+quantity_dirichlet", {"beta": 0.5, "beta_quantity": 0.5}),
    ("mixed Dir(0.5)+noise", "label_dirichlet+feature_noise", {"beta": 0.5, "sigma": 0.1}),
    ("natural ids", "feature_natural", {}),
    ("temporal", "temporal", {}),
    ("temporal (year)", "temporal", {}),
    ("FCUBE", "feature_synthetic", {}),
]
SCHEMES_NA: dict[str, str] = {}  # a scheme of secureflhv.data with no row above -> why (printed and reported)
DATA_PARTIES = {"penguins": 3}  # data sets whose natural id / time has fewer values than --parties: 3 islands, 3 years
# The two grids: (name, data set, model). A partition whose column the grid's data lacks runs on the data set
# named in ``substitutes`` (its own centralised baseline), or is reported n/a with the reason.
GRIDS = {
    "fmnist": {"title": "Fashion-MNIST, simple CNN", "short": "Fashion-MNIST", "data": "fmnist", "model": "cnn",
               "substitutes": {}, "na": {"natural ids": "Fashion-MNIST has no natural id (NIID-Bench uses "
                                                        "FEMNIST writers)",
                                         "temporal": "Fashion-MNIST has no time column",
                                         "temporal (year)": "Fashion-MNIST has no time column",
                                         "FCUBE": "FCUBE is a 3-feature synthetic set (see the tabular grid)"}},
    "tabular": {"title": "tabular (scikit-learn digits, 64 columns), MLP 32-16-8", "short": "tabular", "data": "digits",
                "model": "mlp", "substitutes": {"temporal": "shuttle", "FCUBE": "fcube", "natural ids": "penguins",
                                                "temporal (year)": "penguins"},
                "na": {}},
}
DATA_TITLES = {"fmnist": "Fashion-MNIST", "digits": "digits", "shuttle": "Statlog Shuttle (river; time = stream "
               "position)", "fcube": "FCUBE (NIID-Bench's synthetic set, 3 features, 2 classes)",
               "penguins": "Palmer Penguins (its 333 complete rows, 6 features; natural id = island, time = study "
                           "year: 3 parties, one island or one year each)"}
STRATEGIES = [("FedAvg", "fedavg"), ("FedProx", "fedprox"), ("SCAFFOLD", "scaffold"), ("FedNova", "fednova"),
              # the non-IID remedies (issue 14): contribution normalisation on FedAvg, IFCA, FedPer
              ("FedAvg+CCN", "fedavg+ccn"), ("IFCA", "ifca"), ("FedPer", "fedper"),
              # MultiConfederated learning (decentralised, no server, no secure aggregation): run_mc below
              ("MC", "multiconfederated")]
DEFAULT_STRATEGIES = ",".join(s for _, s in STRATEGIES)


def run_parties(net, parties, wire_out: dict | None = None, keep_up=()) -> list:
    """Run each ``(party_id, fn)`` in its own thread over ``net`` and wait for all; returns their errors.

    A party that fails is printed and taken off the network at once (the others stop sending to it),
    except those in ``keep_up`` (the server: its failure ends the run anyway). Wire statistics go to
    ``wire_out`` when given."""
    errors = []

    def guard(pid, fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            print(f"  {pid} failed: {type(exc).__name__}: {exc}", flush=True)
            errors.append(exc)
            if pid not in keep_up:
                net.take_down(pid)

    threads = [threading.Thread(target=guard, args=party) for party in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if wire_out is not None:
        wire_out.update(net.wire_stats())
    return errors


def run_fl(shards, spec, strategy, fl_cfg, mu, deadline=900.0, *, tests=None, temperature=1.0, clusters=2,
           wire_out: dict | None = None, trainer=None):
    """One FL run: server + one thread per client over InProcessNetwork; returns the server.

    ``strategy``: a registry name, or ``<name>+ccn`` for it with client contribution normalisation
    (temperature ``temperature``); ``tests``: each client's own test split (X, y), for the worst client;
    ``wire_out``, if given, receives ``{party: wire_stats()}`` (bytes per peer and tag); ``trainer``: a
    :class:`~secureflhv.horizontal.batched.BatchedTrainer` that trains the clients of a round as one batch
    (same maths as the per-client loop), or None for the loop."""
    import dataclasses

    from secureflhv.horizontal.fl import HorizontalClient, HorizontalServer
    from secureflhv.horizontal.strategy_registry import make_strategy
    from secureflhv.transport.inprocess import InProcessNetwork

    if strategy.endswith("+ccn"):
        strategy = strategy[:-len("+ccn")]
        fl_cfg = dataclasses.replace(fl_cfg, contribution_temperature=temperature)
    ids = [f"party-{i}" for i in range(len(shards))]
    net = InProcessNetwork("niid-bench", ["server", *ids], deadline=deadline)
    server = HorizontalServer(net.transport("server"), ids, spec, make_strategy(strategy, mu=mu, clusters=clusters),
                              fl_cfg)
    tests = tests or [(X[:0], y[:0]) for X, y in shards]
    clients = [HorizontalClient(net.transport(pid), "server", X, y, *te, spec,
                                make_strategy(strategy, mu=mu, clusters=clusters), fl_cfg)
               for pid, (X, y), te in zip(ids, shards, tests)]
    if trainer is not None:
        for c in clients:
            c.strategy.trainer = trainer.handle()
    errors = run_parties(net, [*zip(ids, (c.run for c in clients)), ("server", server.run)], wire_out,
                         keep_up=("server",))
    if server.history and len(server.history) == fl_cfg.rounds:
        return server  # clients that dropped out are reported above; the run completed without them
    raise RuntimeError(f"FL run failed: {errors[-1]!r}" if errors else "FL run failed")


def run_mc(shards, spec, local, rounds: int, seed: int, test_X, test_y, *, tests=None, deadline=900.0,
           wire_out: dict | None = None) -> dict:
    """One MultiConfederated run (Duchesne et al. 2024): one peer per shard, each in its own thread over an
    InProcessNetwork (the protocol code of a gRPC run), default hyperparameters of
    :class:`~secureflhv.horizontal.mc_rules.MultiConfederated`; no server, no secure aggregation.

    Returns ``accuracy`` — the mean over the peers of their personal model's (best of the peer's pool on its
    own training rows) accuracy on the common test set (``test_X`` (n, features) float32, ``test_y`` ints) —,
    ``worst_client`` (lowest peer's personal-model accuracy on its own rows ``tests``, NaN without any),
    ``personal_accuracy`` per peer, ``pool`` (peer 0's final pool ids) and ``hyperparameters``.
    Raises RuntimeError naming the first peer that failed."""
    from secureflhv.horizontal.mc_peer import MultiConfederatedPeer
    from secureflhv.horizontal.models import build_model, evaluate, set_flat
    from secureflhv.horizontal.mc_rules import MultiConfederated
    from secureflhv.transport.inprocess import InProcessNetwork

    strategy = MultiConfederated()
    cfg = strategy.config(rounds=rounds, seed=seed, local=local, round_timeout_s=deadline, send_timeout_s=60.0)
    ids = [f"party-{i}" for i in range(len(shards))]
    net = InProcessNetwork("niid-bench-mc", ids, deadline=deadline)
    tests = tests or [(X[:0], y[:0]) for X, y in shards]
    peers = [MultiConfederatedPeer(net.transport(pid), ids, X, y, *te, spec, cfg)
             for pid, (X, y), te in zip(ids, shards, tests)]
    errors = run_parties(net, [(p.party_id, p.run) for p in peers], wire_out)
    if errors or any(len(p.history) != rounds for p in peers):
        raise RuntimeError(f"MultiConfederated run failed: {errors[0]!r}" if errors else "MultiConfederated run failed")
    model = build_model(spec)
    personal = []
    for p in peers:
        set_flat(model, p.personal_model)
        personal.append(evaluate(model, test_X, test_y)["accuracy"])
    own = [p.history[-1].test_accuracy for p in peers if p.history[-1].test_n > 0]
    return {"accuracy": float(np.mean(personal)), "worst_client": float(min(own)) if own else float("nan"),
            "personal_accuracy": personal, "pool": peers[0].history[-1].pool,
            "hyperparameters": strategy.hyperparameters()}


def centralised(ds, spec, local, epochs, seed, device=None):
    """NIID-Bench's "all_in" baseline: the same model trained on the pooled rows for ``epochs`` epochs."""
    from secureflhv.horizontal.batched import TrainRequest, batched_local_sgd
    from secureflhv.horizontal.models import build_model
    from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd

    model = build_model(spec, seed=seed)
    cfg = LocalTrainConfig(epochs=epochs, batch_size=local.batch_size, lr=local.lr, momentum=local.momentum,
                           weight_decay=local.weight_decay)
    if device not in (None, "cpu"):
        batched_local_sgd([TrainRequest(model, ds.X, ds.y, cfg, batch_rng(seed, 0, "centralised"))], device)
    else:
        local_sgd(model, ds.X, ds.y, cfg, batch_rng(seed, 0, "centralised"))
    return model


def load_grid_data(name: str, rows: int, test_rows: int, seed: int):
    """(train, test) Datasets of ``name`` with float32 features in a unit range: ``rows`` / ``test_rows``
    random rows (all when the set is smaller; at most a fifth of a bundled set's rows are test rows); digits
    scaled by 1/16, shuttle and penguins (its complete rows) standardised on their train rows."""
    from secureflhv.data import Dataset, load_dataset

    rng = np.random.default_rng(seed)
    if name == "fmnist":
        train, test = load_dataset("fmnist"), load_dataset("fmnist_test")
    elif name == "fcube":
        train, test = load_dataset("fcube", seed=seed), load_dataset("fcube_test", seed=seed)
    else:
        full = load_dataset(name)
        if name == "penguins":  # the MLP takes no NaN: the 11 rows missing a measurement or the sex are dropped
            full = full.subset(np.flatnonzero(~np.isnan(full.X).any(axis=1)))
        perm = rng.permutation(len(full))
        n_test = min(test_rows, len(full) // 5)
        train, test = full.subset(np.sort(perm[n_test:])), full.subset(np.sort(perm[:n_test]))
    train = train.subset(np.sort(rng.choice(len(train), min(rows, len(train)), replace=False)))
    test = test.subset(np.sort(rng.choice(len(test), min(test_rows, len(test)), replace=False)))
    if name == "digits":
        train.X, test.X = train.X / 16.0, test.X / 16.0
    if name in ("shuttle", "penguins"):
        mu, sd = train.X.mean(0), train.X.std(0) + 1e-9
        train.X, test.X = (train.X - mu) / sd, (test.X - mu) / sd
    for d in (train, test):
        d.X = np.asarray(d.X, dtype=np.float32)
    assert isinstance(train, Dataset)
    return train, test


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: few rows, 1 round, 1 epoch")
    ap.add_argument("--grids", default="fmnist,tabular", help="comma-separated, of " + ",".join(GRIDS))
    ap.add_argument("--rows", type=int, help="Fashion-MNIST training rows sampled (default 1500; quick 600)")
    ap.add_argument("--test-rows", type=int, help="test rows per data set (default 1000; quick 500)")
    ap.add_argument("--tabular-rows", type=int, default=3000, help="training rows of the tabular sets (at most)")
    ap.add_argument("--rounds", type=int, help="communication rounds (default 4; quick 1)")
    ap.add_argument("--epochs", type=int, help="local epochs (default 4; quick 1)")
    ap.add_argument("--tabular-epochs", type=int, help="local epochs of the tabular grid (default 10; quick 1)")
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--mu", type=float, default=0.01, help="FedProx proximal weight")
    ap.add_argument("--clip", type=float, default=1.0, help="secure aggregation clip range of model updates")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampled rows and the baseline")
    ap.add_argument("--seeds", default=None,
                    help="comma-separated seeds of partitions and FL runs; cells report mean ± std (default: --seed)")
    ap.add_argument("--local-test", type=float, default=0.2,
                    help="share of each party's rows held out as its own test split (worst-client column when > 0)")
    ap.add_argument("--temperature", type=float, default=1.0, help="T of contribution normalisation (+ccn)")
    ap.add_argument("--clusters", type=int, default=2, help="IFCA's k")
    ap.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                    help="comma-separated, of " + ",".join(s for _, s in STRATEGIES))
    ap.add_argument("--partitions", default=",".join(p for p, _, _ in PARTITIONS),
                    help="comma-separated partition labels")
    ap.add_argument("--train", choices=("batched", "loop"), default="batched",
                    help="clients' local training: batched with vmap (same maths) or one client after another")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where batched training runs")
    ap.add_argument("--out-dir", type=Path, help="where the Markdown and PNG go (default: docs/, quick: temp dir)")
    ap.add_argument("--rotate", type=int, default=0,
                    help="start at the n-th partition (one process per seed, each rotated: a grid cut short by the "
                         "clock still has every partition)")
    ap.add_argument("--reverse", action="store_true", help="walk the (rotated) partitions backwards")
    ap.add_argument("--processes", default="one process",
                    help="how the grid was run, for the report (e.g. 'four processes: one per Fashion-MNIST seed ...')")
    ap.add_argument("--mc-processes", default="",
                    help="how MC's column was run, for the report, when it ran apart from the rest of the grid")
    ap.add_argument("--render-only", action="store_true",
                    help="run nothing: write the report from the finished runs in the results file (a grid cut short)")
    ap.add_argument("--report-only", type=Path, metavar="JSON",
                    help="re-render the Markdown and PNG from a niid_accuracy.json of an earlier run")
    args = ap.parse_args(argv)
    if args.report_only:
        saved = json.loads(args.report_only.read_text())
        write_report(args.out_dir or ROOT / "docs", saved["grids"], saved["settings"])
        return 0
    from secureflhv.horizontal.batched import BatchedTrainer, resolve_device

    try:
        resolve_device(args.device)
    except ValueError as exc:
        ap.error(str(exc))
    if args.device != "cpu" and args.train == "loop":
        ap.error("--device other than cpu trains through the batched trainer: drop --train loop")
    rows = args.rows or (600 if args.quick else 1500)
    test_rows = args.test_rows or (500 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 4)
    epochs = args.epochs or (1 if args.quick else 4)
    tab_epochs = args.tabular_epochs or (1 if args.quick else 10)

    import torch

    from secureflhv.data import partition
    from secureflhv.horizontal.fl import FLConfig
    from secureflhv.horizontal.models import ModelSpec, build_model, evaluate, set_flat
    from secureflhv.horizontal.strategies import LocalTrainConfig
    from secureflhv.runtime.job.data_prep import local_split
    from secureflhv.secagg import AggregationConfig

    torch.set_num_threads(1)  # the client threads share the cores
    strategies = [(n, s) for n, s in STRATEGIES if s in args.strategies.split(",")]
    partitions = [p for p in PARTITIONS if p[0] in args.partitions.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    grids = [g for g in GRIDS if g in args.grids.split(",")]
    for scheme, why in scheme_coverage()[1].items():
        print(f"{scheme}: n/a: {why}", flush=True)
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="niid_quick_")) if args.quick else ROOT / "docs")
    settings = dict(rows=rows, test_rows=test_rows, tabular_rows=args.tabular_rows, rounds=rounds, epochs=epochs,
                    tabular_epochs=tab_epochs, parties=args.parties, batch_size=args.batch_size, lr=args.lr,
                    momentum=args.momentum, mu=args.mu, clip=args.clip, seed=args.seed, quick=args.quick,
                    seeds=seeds, local_test=args.local_test, temperature=args.temperature, clusters=args.clusters)
    cells_path = out_dir / "niid_accuracy.cells.jsonl"  # one line per finished run: a crashed grid resumes
    out_dir.mkdir(parents=True, exist_ok=True)
    done = {}
    if cells_path.exists():
        for line in cells_path.read_text().splitlines():
            cell = json.loads(line)
            if _same_settings(cell.get("settings"), settings):
                key = ("baseline", cell["grid"], cell["data"]) if cell.get("baseline") else \
                    (cell["grid"], cell["partition"], cell["strategy"], cell["seed"])
                done[key] = cell
        print(f"resuming: {len(done)} finished runs in {cells_path}", flush=True)
    trainer = BatchedTrainer(args.device) if args.train == "batched" else None
    t_grid = time.perf_counter()
    data_cache, out = {}, {}
    baselines = {(c["grid"], c["data"]): c for c in done.values() if c.get("baseline")}
    plan = []  # (grid, partition, data set); seeds outermost below, so a grid cut short has whole seeds
    for gname in grids:
        grid = GRIDS[gname]
        out[gname] = {"title": grid["title"], "model": grid["model"], "data": grid["data"], "na": {},
                      "data_of": {}, "parties_of": {}, "results": {}, "baselines": {}, "not_run": []}
        for plabel, scheme, pparams in partitions:
            if plabel in grid["na"]:
                out[gname]["na"][plabel] = grid["na"][plabel]
            else:
                out[gname]["data_of"][plabel] = grid["substitutes"].get(plabel, grid["data"])
                n_parties = min(args.parties, DATA_PARTIES.get(out[gname]["data_of"][plabel], args.parties))
                if n_parties != args.parties:
                    out[gname]["parties_of"][plabel] = n_parties
                plan.append((gname, plabel, scheme, pparams, out[gname]["data_of"][plabel]))

    def setup(gname, dname):
        """(train, test, spec, local config, baseline accuracy) of a grid's data set; baseline once, logged."""
        grid = GRIDS[gname]
        ep = epochs if grid["model"] == "cnn" else tab_epochs
        local = LocalTrainConfig(epochs=ep, batch_size=args.batch_size, lr=args.lr, momentum=args.momentum)
        if dname not in data_cache:
            data_cache[dname] = load_grid_data(dname, rows if dname == "fmnist" else args.tabular_rows, test_rows,
                                               args.seed)
        ds, te = data_cache[dname]
        n_classes = int(max(ds.y.max(), te.y.max()) + 1)
        spec = (ModelSpec(name="cnn", n_features=784, n_classes=10) if grid["model"] == "cnn"
                else ModelSpec(name="mlp", n_features=ds.X.shape[1], n_classes=n_classes))
        if (gname, dname) not in baselines:
            t0 = time.perf_counter()
            base = evaluate(centralised(ds, spec, local, rounds * ep, args.seed, args.device), te.X, te.y)["accuracy"]
            cell = {"baseline": True, "grid": gname, "data": dname, "settings": settings, "accuracy": base,
                    "seconds": time.perf_counter() - t0, "train_rows": len(ds.y), "test_rows": len(te.y),
                    "n_classes": n_classes, "epochs": ep}
            baselines[(gname, dname)] = cell
            with cells_path.open("a") as f:
                f.write(json.dumps(cell) + "\n")
            print(f"[{gname}] {dname}: {len(ds.y)} training rows, {len(te.y)} test rows; baseline (centralised, "
                  f"{rounds * ep} epochs) accuracy {base:.4f} in {cell['seconds']:.1f}s", flush=True)
        return ds, te, spec, local, baselines[(gname, dname)]["accuracy"]

    order = plan[args.rotate % len(plan):] + plan[:args.rotate % len(plan)] if plan else plan
    if args.reverse:  # a second process on the same seed works from the other end (stop it where they meet)
        order = order[::-1]
    for seed in ([] if args.render_only else seeds):
        for gname, plabel, scheme, pparams, dname in order:
            if all((gname, plabel, sname, seed) in done for sname, _ in strategies):
                continue
            ds, te, spec, local, base_acc = setup(gname, dname)
            fl_cfg = FLConfig(rounds=rounds, fraction=1.0, seed=seed, local=local,
                              aggregation=AggregationConfig(kind="secagg", clip=args.clip, seed=seed,
                                                            input_timeout_s=240, stage_timeout_s=60),
                              round_timeout_s=600)
            n_parties = out[gname]["parties_of"].get(plabel, args.parties)
            part = partition(scheme, ds, n_parties, seed=seed, **pparams)
            shards, tests = [], []
            for i in range(n_parties):
                sd = part.party_data(ds, i)
                split = local_split(len(sd.y), args.local_test, seed, f"party-{i}")
                X, y = sd.X.astype(np.float32), np.asarray(sd.y)
                shards.append((X[split.train], y[split.train]))
                tests.append((X[split.test], y[split.test]))
            for sname, strategy in strategies:
                if (gname, plabel, sname, seed) in done:
                    continue
                t0 = time.perf_counter()
                wire = {}
                cell = {"grid": gname, "partition": plabel, "strategy": sname, "seed": seed,
                        "settings": settings, "data": dname, "sizes": part.sizes.tolist()}
                if strategy == "multiconfederated":  # peer to peer: its own runner, no secure aggregation
                    try:
                        mc = run_mc(shards, spec, local, rounds, seed, te.X, te.y, tests=tests, wire_out=wire)
                    except RuntimeError as exc:
                        cell.update(accuracy=float("nan"), worst_client=float("nan"), n_clipped=0, error=str(exc))
                        print(f"[{gname}] {plabel:>18} {sname:>10} seed {seed}: FAILED ({exc})", flush=True)
                    else:
                        cell.update(mc, n_clipped=0, dropped=[])
                        print(f"[{gname}] {plabel:>18} {sname:>10} seed {seed}: accuracy {cell['accuracy']:.4f} "
                              f"(mean of the peers' personal models; {cell['accuracy'] / base_acc:.2f}x baseline), "
                              f"worst client {cell['worst_client']:.4f}, {time.perf_counter() - t0:.1f}s; bytes: "
                              f"{_wire.hub_and_spokes(wire)}", flush=True)
                    cell["seconds"] = time.perf_counter() - t0
                    done[(gname, plabel, sname, seed)] = cell
                    cell["at"] = time.time()
                    with cells_path.open("a") as f:
                        f.write(json.dumps(cell, default=str) + "\n")
                    continue
                try:
                    server = run_fl(shards, spec, strategy, fl_cfg, args.mu, tests=tests,
                                    temperature=args.temperature, clusters=args.clusters, wire_out=wire,
                                    trainer=trainer)
                except RuntimeError as exc:  # e.g. every client diverged: report it, go on with the grid
                    cell.update(accuracy=float("nan"), worst_client=float("nan"), n_clipped=0, error=str(exc),
                                seconds=time.perf_counter() - t0)
                    print(f"[{gname}] {plabel:>18} {sname:>10} seed {seed}: FAILED ({exc})", flush=True)
                else:
                    model = build_model(spec)
                    set_flat(model, server.global_vec)
                    last = server.history[-1]
                    cell.update(accuracy=evaluate(model, te.X, te.y)["accuracy"],
                                worst_client=last.worst_client_accuracy,
                                n_clipped=sum(r.aggregation.get("model", {}).get("n_clipped", 0)
                                              for r in server.history),
                                dropped=sorted({c for r in server.history for c in r.dropped}),
                                seconds=time.perf_counter() - t0)
                    print(f"[{gname}] {plabel:>18} {sname:>10} seed {seed}: accuracy {cell['accuracy']:.4f} "
                          f"({cell['accuracy'] / base_acc:.2f}x baseline), worst client "
                          f"{cell['worst_client']:.4f}, {cell['n_clipped']} clipped, {cell['seconds']:.1f}s; "
                          f"bytes: {_wire.hub_and_spokes(wire)}", flush=True)
                done[(gname, plabel, sname, seed)] = cell
                cell["at"] = time.time()  # wall clock: the grid's wall time spans resumed sessions
                with cells_path.open("a") as f:
                    f.write(json.dumps(cell, default=str) + "\n")
    for gname, plabel, _, _, dname in plan:  # cells over the seeds that finished (all, unless cut short)
        b = baselines.get((gname, dname))
        cells = {s: [done[k] for sd in seeds if (k := (gname, plabel, s, sd)) in done] for s, _ in strategies}
        if b is None or not any(cells.values()):  # planned but nothing finished: listed as "not run", not dropped
            out[gname]["not_run"].append(plabel)
            continue
        out[gname]["baselines"][dname] = {k: b[k] for k in ("accuracy", "seconds", "train_rows", "test_rows",
                                                             "n_classes", "epochs")}
        # a strategy with no finished run in this row (e.g. the clock ran out) is reported "not run"
        out[gname]["results"][plabel] = {s: summarise(c) if c else dict(NOT_RUN) for s, c in cells.items()}
    # MC's column ran in sessions of its own (after the rest of the grid): its wall time is reported apart
    runs = [c for c in done.values() if not c.get("baseline") and "at" in c and c["strategy"] != "MC"]
    mc_runs = [c for c in done.values() if not c.get("baseline") and "at" in c and c["strategy"] == "MC"]

    wall = busy_seconds
    settings = dict(settings, grid_wall_s=wall(runs), session_seconds=time.perf_counter() - t_grid,
                    run_seconds=sum(c["seconds"] for c in runs), mc_wall_s=wall(mc_runs),
                    mc_run_seconds=sum(c["seconds"] for c in mc_runs), mc_runs=len(mc_runs),
                    train=args.train, device=args.device, schemes_na=scheme_coverage()[1],
                    strategies=[n for n, _ in strategies],
                    processes=args.processes, mc_processes=args.mc_processes)
    if trainer is not None and trainer.seconds:
        settings["batched_samples_per_s"] = trainer.samples / trainer.seconds
    write_report(out_dir, out, settings)
    return 0


def busy_seconds(runs) -> float:
    """Wall time during which at least one of ``runs`` was going: the length of the union of their
    [at - seconds, at] intervals (a grid resumed days later does not count the days in between); NaN if none."""
    total, end = 0.0, float("-inf")
    for a, b in sorted((c["at"] - c["seconds"], c["at"]) for c in runs):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total if runs else float("nan")


def scheme_coverage() -> tuple[dict, dict]:
    """({scheme: [partition labels of its rows]}, {scheme: why it has no row}) over
    :func:`secureflhv.data.available_schemes`; a scheme in neither raises ValueError (the grid would drop it
    silently)."""
    from secureflhv.data import available_schemes

    rows = {s: [label for label, scheme, _ in PARTITIONS if scheme == s] for s in available_schemes()}
    na = {s: SCHEMES_NA[s] for s in available_schemes() if s in SCHEMES_NA}
    missing = [s for s, labels in rows.items() if not labels and s not in na]
    if missing:
        raise ValueError(f"schemes with no row in PARTITIONS and no reason in SCHEMES_NA: {missing}")
    return {s: labels for s, labels in rows.items() if labels}, na


def _same_settings(a: dict | None, b: dict) -> bool:
    """Whether a saved run's settings are this grid's (seeds aside: runs are keyed by seed, so grids over
    other seeds — e.g. one process per seed — share their finished runs)."""
    return a is not None and {k: v for k, v in a.items() if k != "seeds"} == {k: v for k, v in b.items()
                                                                              if k != "seeds"}


NOT_RUN = {"accuracy": float("nan"), "accuracy_std": float("nan"), "worst_client": float("nan"),
           "worst_client_std": float("nan"), "seconds": float("nan"), "n_clipped": 0, "dropped": [], "sizes": [],
           "seeds": [], "not_run": True}


def summarise(cells: list[dict]) -> dict:
    """One table cell from its runs (one per seed): means and standard deviations over the seeds."""
    acc = np.array([c["accuracy"] for c in cells], dtype=float)
    worst = np.array([c.get("worst_client", float("nan")) for c in cells], dtype=float)

    def stat(a, f):
        return float(f(a)) if np.isfinite(a).any() else float("nan")
    out = {"accuracy": stat(acc, np.nanmean), "accuracy_std": stat(acc, np.nanstd),
           "worst_client": stat(worst, np.nanmean), "worst_client_std": stat(worst, np.nanstd),
           "seconds": float(np.mean([c["seconds"] for c in cells])),
           "n_clipped": int(sum(c.get("n_clipped", 0) for c in cells)),
           "dropped": sorted({d for c in cells for d in c.get("dropped", [])}),
           "sizes": cells[0]["sizes"], "seeds": [c["seed"] for c in cells]}
    if any("pool" in c for c in cells):  # MC: its peers' final pool per run (forks are ids with "@")
        out["pools"] = [c.get("pool", []) for c in cells]
    errors = [c["error"] for c in cells if "error" in c]
    if errors:
        out["error"] = errors[0]
    return out


def _best(row: dict, names, tol: float = 0.0005) -> str:
    """The most accurate strategy, or ``A = B`` when several are within ``tol`` of the best."""
    acc = {s: row[s]["accuracy"] if np.isfinite(row[s]["accuracy"]) else -1.0 for s in names}
    top = max(acc.values())
    tied = [s for s in names if acc[s] >= top - tol]
    return "all tied" if len(tied) == len(names) > 1 else " = ".join(tied)


def _pm(cell: dict, key: str) -> str:
    """`` ± x.x`` (percentage points) when the cell averages several seeds."""
    return f" ± {cell[key] * 100:.1f}" if len(cell.get("seeds", [])) > 1 and np.isfinite(cell.get(key, np.nan)) else ""


def _short(cell: dict, n_seeds: int, row: dict) -> str:
    """`` [k/n seeds]`` for a cell with fewer seeds than the grid's, when the row's cells differ in seeds
    (when they all have the same k, the row's label says it once)."""
    k = len(cell.get("seeds", []))
    return f" [{k}/{n_seeds} seeds]" if 0 < k < n_seeds and len(_seed_counts(row)) > 1 else ""


def _seed_counts(row: dict) -> set:
    return {len(c.get("seeds", [])) for c in row.values() if not c.get("not_run")}


def grid_tables(g: dict, names, n_seeds: int = 1) -> str:
    """The accuracy table (mean ± std over seeds, ratio to the row's centralised baseline) and the worst-party
    table of one grid, in Markdown; partitions the grid cannot run are listed as n/a with the reason."""
    res = g["results"]
    head = "| partition | data | " + " | ".join(names) + " | best |\n|---|---|" + "---:|" * len(names) + "---|\n"
    lines = []
    for plabel, row in res.items():
        base = g["baselines"][g["data_of"][plabel]]["accuracy"]
        cells = ["not run" if row[s].get("not_run") else
                 f"{row[s]['accuracy'] * 100:.1f}{_pm(row[s], 'accuracy_std')} ({row[s]['accuracy'] / base:.2f}×)"
                 + _short(row[s], n_seeds, row) if np.isfinite(row[s]["accuracy"]) else "failed (diverged)" for s in names]
        ks = _seed_counts(row)
        k = min(ks, default=0)
        label = plabel if k >= n_seeds or len(ks) > 1 else f"{plabel} ({k} of {n_seeds} seeds)"  # a grid cut short says so
        data = g["data_of"][plabel] + (f" ({n} parties)" if (n := g.get("parties_of", {}).get(plabel)) else "")
        lines.append(f"| {label} | {data} | " + " | ".join(cells) + f" | {_best(row, names)} |")
    for plabel, why in g["na"].items():
        lines.append(f"| {plabel} | – | " + " | ".join("n/a" for _ in names) + f" | {why} |")
    for plabel in g.get("not_run", []):
        lines.append(f"| {plabel} | {g['data_of'][plabel]} | " + " | ".join("not run" for _ in names)
                     + " | no finished run (the grid was cut short) |")
    table = head + "\n".join(lines) + "\n"
    clipped = sum(row[s]["n_clipped"] for row in res.values() for s in names)
    table += (f"\nSecure aggregation clipped {clipped:,} model-update coordinates to ±clip in all runs of this grid "
              "(the server learns only the count; IFCA's per-cluster parts are not counted).\n")
    worst = [(p, row) for p, row in res.items()
             if any(np.isfinite(row[s].get("worst_client", float("nan"))) for s in names)]
    if worst:
        table += ("\nWorst party (accuracy, %, of the final round's model on each party's own held-out rows, lowest "
                  "party; IFCA: the cluster model with the party's lowest training loss, FedPer: the global base with "
                  "the party's own head; under quantity skew a small party's split has few rows, so its figure is "
                  "coarse):\n\n| partition | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names)
                  + "\n" + "\n".join(f"| {p} | " + " | ".join(
                      "not run" if row[s].get("not_run") else
                      f"{row[s]['worst_client'] * 100:.1f}{_pm(row[s], 'worst_client_std')}" + _short(row[s], n_seeds, row)
                      if np.isfinite(row[s].get("worst_client", float("nan"))) else "–" for s in names) + " |"
                      for p, row in worst) + "\n")
    return table


def plot(out_path: Path, grids: dict, names, settings) -> None:
    """One bar panel per grid: mean accuracy per partition and strategy, std as error bars, baselines dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(grids), 1, figsize=(12, 4.2 * len(grids)), dpi=100, squeeze=False)
    for ax, (gname, g) in zip(axes[:, 0], grids.items()):
        parts = list(g["results"])
        width = 0.84 / len(names)
        x = np.arange(len(parts))
        for j, s in enumerate(names):
            ax.bar(x + (j - (len(names) - 1) / 2) * width, [g["results"][p][s]["accuracy"] * 100 for p in parts],
                   width, yerr=[g["results"][p][s]["accuracy_std"] * 100 for p in parts],
                   label=s + (" (no secure agg.)" if s == "MC" else ""), capsize=1.5,
                   error_kw={"lw": 0.6})
        base = [g["baselines"][g["data_of"][p]]["accuracy"] * 100 for p in parts]
        ax.scatter(x, base, marker="_", s=900, color="k", zorder=3, label="centralised baseline")
        ax.set_xticks(x, parts, rotation=18, fontsize=8)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{g['title']}: {settings['parties']} parties, {settings['rounds']} rounds, secure aggregation, "
                     f"mean ± std over {len(settings['seeds'])} seeds", fontsize=10)
        ax.set_ylim(0, 115)
        ax.set_yticks(range(0, 101, 20))
        ax.legend(fontsize=7, ncol=8, loc="upper center")
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def write_report(out_dir: Path, grids: dict, settings: dict) -> None:
    """Write niid_accuracy.md, niid_accuracy.json and img/niid_accuracy.png into ``out_dir``."""
    out_dir = Path(out_dir)
    (out_dir / "img").mkdir(parents=True, exist_ok=True)
    names = settings.get("strategies") or [n for n, _ in STRATEGIES]
    (out_dir / "niid_accuracy.json").write_text(json.dumps({"settings": settings, "grids": grids}, indent=1) + "\n")
    plot(out_dir / "img" / "niid_accuracy.png", grids, names, settings)
    st = settings
    sections = []
    for gname, g in grids.items():
        bases = "; ".join(f"{DATA_TITLES.get(d, d)}: {b['train_rows']:,} training rows, {b['test_rows']:,} test rows, "
                          f"**{b['accuracy']:.1%}** after {st['rounds'] * b['epochs']} epochs ({b['seconds']:.0f} s)"
                          for d, b in g["baselines"].items())
        sections.append(f"### {g['title']}\n\nCentralised baselines (same model, pooled rows, same number of "
                        f"epochs as a party trains in all rounds): {bases}.\n\n" + grid_tables(g, names, len(st["seeds"])))
    mc_note = ("\nAll columns but MC (MultiConfederated learning, decentralised) go through secure aggregation; "
               "MC's peers see each other's models in the clear, by the paper's design (see Settings).\n"
               if "MC" in names else "")
    mc_note += "".join(f"\nn/a: `{s}` (a partition scheme of secureflhv.data): {why}\n"
                       for s, why in st.get("schemes_na", {}).items())
    doc = f"""# Test accuracy under non-IID partitions, through secure aggregation

Produced by `python benchmarks/niid_accuracy.py --seeds {",".join(map(str, st["seeds"]))}` (`--help` for options).
{mc_note}
{chr(10).join(sections)}
![accuracy per partition and algorithm](img/niid_accuracy.png)

{CONFIG_AND_COMPARISON.format(**_context(grids, names, st))}"""
    (out_dir / "niid_accuracy.md").write_text(doc)
    print(f"wrote {out_dir / 'niid_accuracy.md'}, {out_dir / 'niid_accuracy.json'} and "
          f"{out_dir / 'img' / 'niid_accuracy.png'}")


CONFIG_AND_COMPARISON = """\
## Settings (much smaller than NIID-Bench's: read the ratios, not the absolute accuracies)

| setting | NIID-Bench (Fashion-MNIST) | here |
|---|---|---|
| training rows | 60,000 | Fashion-MNIST: {rows:,} random rows (1/{fmnist_fraction}); digits: all {digits_rows}; shuttle, FCUBE: {tabular_rows:,} |
| test rows | 10,000 | {test_rows:,} random test rows (digits: {digits_test}) |
| parties, sampling | 10, all each round | {parties}{parties_note}, all each round |
| rounds × local epochs | 50 × 10 | {rounds} × {epochs} (CNN), {rounds} × {tabular_epochs} (MLP) |
| local SGD | batch 64, lr 0.01, momentum 0.9 | batch {batch_size}, lr {lr}, momentum {momentum}, weight decay 1e-5 |
| local steps per party | ≈ 94 per epoch, ≈ 47,000 in all | Fashion-MNIST ≈ {steps_fmnist} in all |
| FedProx mu | 0.01 | {mu} |
| aggregation | plaintext | Bonawitz et al. secure aggregation (`kind: secagg`, clip {clip}); MC: none (peer to peer, in the clear) |
| seeds | – | {seeds} (partition, initial model and batch order per seed) |

Why so small: the whole grid ({n_runs} FL runs of {parties} clients, each through secure aggregation but MC's) had to
finish in about an hour on 2 CPU cores shared with other jobs. It ran as {processes}; wall time {wall_min:.0f} min,
{run_min:.0f} min of FL runs in all (MC's column aside). {mc_timing} The clients' local training used the
batched trainer (`--train batched`: every client of a round in one `torch.func.vmap` call; same maths as the loop,
see `tests/horizontal/test_batched_training.py`; speed in docs/benchmarks.md, row `niid_batched`).

Other settings: contribution normalisation (CCN, Kundalwal et al. 2024) on FedAvg with temperature {temperature};
IFCA (Ghosh et al. 2020) with k = {clusters} clusters; FedPer (Arivazhagan et al. 2019) keeps the last linear
layer local. Each party holds out {local_test_pct} of its rows as its own test split: the worst-party table is the
lowest of those accuracies (what personalisation and clustering aim to raise); the main table is the global
model on the data set's test rows (IFCA: the cluster most clients chose in the last round; FedPer: the global
base with the server's untrained head, so its *global* accuracy is not its point — read its worst-party column).

MultiConfederated learning (**MC**, Duchesne, Zhang, Talhi 2024) is decentralised: no server and **no secure
aggregation** — by the paper's design every peer sees the other peers' trained models in the clear
(docs/security.md), so its column is not "through secure aggregation" like the others. Its peers run in-process
(one thread each, `run_mc`) on the same partition and held-out rows, with the same rounds, local epochs, batch,
lr and momentum, and the defaults of `MultiConfederated` ({mc_hparams}); each peer trains ⌈√|pool|⌉ models a round
(2 of the 4 initial models with 10 peers), so it takes about twice the local SGD steps of the others, with the
per-client loop (not the batched trainer: its seconds are not comparable). MC has no single global model: its
*global* accuracy is the **mean over the peers of their personal model's accuracy on the data set's test rows**
(personal model = the best of the peer's pool on its own training rows, the model the paper's peer would use);
its worst party is the lowest peer's personal-model accuracy on its own held-out rows, as for the others.

{comparison}
"""

NIID_BENCH_FMNIST = {"iid": 89.6, "Dir(0.5)": 88.1, "#C=1": 11.2, "#C=2": 77.3, "#C=3": 80.7}  # FedAvg, its Table


def _acc(g, p, s, key="accuracy"):
    try:
        return g["results"][p][s][key] * 100
    except KeyError:
        return float("nan")


def comparison(grids: dict, names, st) -> str:
    """The written comparison with NIID-Bench's Fashion-MNIST FedAvg figures and with the contribution-
    normalisation paper's reported gains, from the measured cells (every number below is from this run)."""
    out = ["## Comparison with NIID-Bench (Li, Diao, Chen, He, ICDE 2022), Fashion-MNIST, FedAvg\n"]
    fm = grids.get("fmnist")
    if not fm or not all(p in fm["results"] for p in NIID_BENCH_FMNIST):
        out.append("Not every one of NIID-Bench's five Fashion-MNIST settings (IID, Dir(0.5), #C=1/2/3) finished in "
                   "this run; no comparison.\n")
    else:
        base = next(iter(fm["baselines"].values()))["accuracy"] * 100
        rows = ["| partition | NIID-Bench FedAvg | here FedAvg | here / centralised baseline |", "|---|---:|---:|---:|"]
        for p, nb in NIID_BENCH_FMNIST.items():
            a = _acc(fm, p, "FedAvg")
            rows.append(f"| {p} | {nb:.1f}% | {a:.1f}% | {a / base:.2f} |")
        out.append("\n".join(rows) + f"\n\n(Our centralised baseline, on {st['rows']:,} rows and "
                   f"{st['rounds'] * st['epochs']} epochs, reaches {base:.1f}%.)\n")
        here = {p: _acc(fm, p, "FedAvg") for p in NIID_BENCH_FMNIST}
        order_nb = sorted(NIID_BENCH_FMNIST, key=NIID_BENCH_FMNIST.get)
        order_here = sorted(here, key=here.get)
        same = order_nb == order_here
        drop = {p: here["iid"] - here[p] for p in here if p != "iid"}
        drop_nb = {p: NIID_BENCH_FMNIST["iid"] - NIID_BENCH_FMNIST[p] for p in drop}
        below = [p for p in ("#C=1", "#C=2", "#C=3") if here[p] < here["Dir(0.5)"] - 1]
        out.append(
            f"**Where we agree.** #C=1 (one label per party) is near chance in both ({here['#C=1']:.1f}% here, 11.2% "
            "there): every local model learns to predict its one class, and their average predicts little. IID is "
            "the best of the five in both" + ("" if max(here, key=here.get) == "iid" else " (not here!)") + ", and "
            "label skew by #C=k costs more than Dir(0.5) " + (
                "for every k in both." if len(below) == 3 else
                f"there for every k, here for {', '.join(below) or 'no k'} (#C=3 and Dir(0.5) are within "
                "a point of each other here)." if "#C=3" not in below else f"here for {', '.join(below)}.") + "\n")
        if not same:
            out.append("The order of the five settings differs: ours " + " < ".join(order_here) + ", NIID-Bench's " +
                       " < ".join(order_nb) + ".\n")
        out.append(
            "**Where we do not, and why.** Absolute accuracies are far lower here (IID "
            f"{here['iid']:.1f}% vs 89.6%) because each party takes about {_steps(st)} local SGD steps in all "
            "instead of about 47,000 (1/40 of the rows, 4 instead of 50 rounds, fewer epochs): the centralised model "
            f"on the same rows and epochs reaches only {base:.1f}%. The *drops* from IID are also not NIID-Bench's: "
            + ", ".join(f"{p} {drop[p]:+.1f} pt here vs {drop_nb[p]:+.1f} pt there" for p in drop) +
            " (positive = lower than IID). A likely reason: with so few rounds, training is still in its fast early phase, where "
            "a skewed party's update is far from the global direction and an average of such updates moves slowly; "
            "NIID-Bench's 50 rounds give FedAvg time to recover most of the gap under mild skew such as Dir(0.5) "
            "and #C=3. Our Fashion-MNIST cells are also noisier (mean ± std over 3 seeds, each with its own "
            "partition).\n")
    qty = [(gn, _acc(g, "quantity Dir(0.5)", "FedAvg"), _acc(g, "iid", "FedAvg")) for gn, g in grids.items()
           if "iid" in g["results"] and "quantity Dir(0.5)" in g["results"]]
    qty = [x for x in qty if x[1] > x[2] + 2]
    if qty:
        out.append("**Short runs are step-limited.** Quantity skew beats IID for FedAvg in " + ", ".join(
            f"{GRIDS[gn]['short']} ({q:.1f}% vs {i:.1f}%)" for gn, q, i in qty) + ": with a fixed number of local "
            "epochs a large party takes many more SGD steps per round, and the sample-weighted average follows its "
            "better-trained model. In a long run (NIID-Bench) every party's model converges and quantity skew "
            "costs little either way; here the number of steps, not the skew, sets the accuracy.\n")
    out.append("## Comparison with client contribution normalisation (Kundalwal et al. 2024)\n")
    gains, stds = [], []
    for gname, g in grids.items():
        for p in ("Dir(0.5)", "Dir(0.1)"):
            if p in g["results"] and "FedAvg+CCN" in names:
                d = _acc(g, p, "FedAvg+CCN") - _acc(g, p, "FedAvg")
                cell = g["results"][p]["FedAvg+CCN"]
                sd = (f"CCN's std over {len(cell['seeds'])} seeds {cell['accuracy_std'] * 100:.1f} pt"
                      if len(cell["seeds"]) > 1 else "1 seed")
                gains.append((gname, p, d, sd))
                stds.append((gname, p, d, cell["accuracy_std"] * 100 if len(cell["seeds"]) > 1 else 0.0))
    if gains:
        txt = "; ".join(f"{GRIDS[gn]['short']} {p}: {d:+.1f} pt ({sd})"
                        for gn, p, d, sd in gains)
        big = [x for x in gains if x[2] >= 3]
        worse = [x for x in gains if x[2] < 0]
        verdict = ("We agree: every cell gains 3 points or more. " if len(big) == len(gains) else
                   "We see a gain of that size only in " + ", ".join(f"{GRIDS[gn]['short']} {p}"
                                                                    for gn, p, _, _ in big) + ". " if big else
                   "We do not see gains of that size. ")
        if not worse:
            verdict += (f"The direction agrees with the paper (CCN is at or above FedAvg in all {len(gains)} cells)"
                        + (", but every difference is within one standard deviation over the seeds, so this run "
                           "cannot confirm the size of the gain. " if all(abs(d) <= sdv for _, _, d, sdv in stds)
                           else ". "))
        else:
            verdict += f"CCN is below FedAvg in {len(worse)} of {len(gains)} of these cells. "
        out.append(
            "The paper reports that normalising client contributions raises the accuracy of the base algorithm by "
            f"3–9 points under Dir(0.1)–Dir(0.5). Here, FedAvg+CCN minus FedAvg: {txt}. " + verdict +
            "Likely reasons for smaller gains (not separately measured): the setting — {rounds} rounds, "
            "temperature T = {temperature} untuned, NIID-Bench's small models, not the paper's own rounds, models "
            "and T; and the mechanism — Λ_r = softmax_r(s_r/T) with s_r = Σ_p cos(z_r, z_p) favours the "
            "parties whose mean latent representation agrees with the others'; under label skew the parties that "
            "disagree are the ones holding the rare labels, so their updates get less weight, which can cost "
            "accuracy on exactly those classes when training is this short. The secure form itself is exact "
            "(tests/horizontal/test_contribution.py: the secure weights equal the paper's formula computed in "
            "the clear), so any difference is the setting, not the protocol.\n".format(**st))
    ifca_iid = [(gn, _acc(g, "iid", "IFCA"), _acc(g, "iid", "FedAvg")) for gn, g in grids.items()
                if "iid" in g["results"] and "IFCA" in names]
    ifca_iid = [x for x in ifca_iid if x[1] - x[2] > 5]
    if ifca_iid:
        out.append("IFCA beats FedAvg even under IID in " + ", ".join(
            f"{GRIDS[gn]['short']} ({a:.1f}% vs {b:.1f}%)" for gn, a, b in ifca_iid) +
            ": its k = {clusters} cluster models start from different initialisations and each party picks the "
            "one with the lower loss, so under IID it is in effect a best-of-{clusters} initialisation, which "
            "matters in a run this short (a likely reason, not separately measured).\n".format(**st))
    out.append("## The remedies for the worst party\n")
    lines = []
    for gname, g in grids.items():
        for p in g["results"]:
            if p == "iid":
                continue
            w = {s: _acc(g, p, s, "worst_client") for s in names}
            if not np.isfinite(w.get("FedAvg", np.nan)):
                continue
            best = max((s for s in names if np.isfinite(w[s]) and s != "MC"), key=lambda s: w[s])  # MC: below
            if best in ("IFCA", "FedPer") and w[best] - w["FedAvg"] >= 5:
                lines.append(f"{GRIDS[gname]['short']} {p}: {best} {w[best]:.1f}% vs FedAvg "
                             f"{w['FedAvg']:.1f}%")
    if lines:
        out.append("Personalisation and clustering do what they are for where the partition is skewed: the "
                   "worst party's accuracy on its own rows rises by 5 points or more with the remedy in " +
                   "; ".join(lines) + ". FedPer's global accuracy is low by design (the server's head is never "
                   "trained); its parties' accuracy is the measure.\n")
    else:
        out.append("In this short run neither IFCA nor FedPer raises the worst party's accuracy by 5 points or more "
                   "over FedAvg in any skewed partition.\n")
    if "MC" in names:
        out.append(mc_comparison(grids, names, st))
    return "\n".join(out)


def mc_comparison(grids: dict, names, st) -> str:
    """What MultiConfederated learning's column changes, from the measured cells (rows where it ran)."""
    ran, missing, up, down, worst_up, worst_down = [], [], [], [], [], []
    for gname, g in grids.items():
        for p, row in g["results"].items():
            label = f"{GRIDS[gname]['short']} {p}"
            mc = row.get("MC", NOT_RUN)
            if mc.get("not_run"):
                missing.append(label)
                continue
            ran.append(label)
            a, f = _acc(g, p, "MC"), _acc(g, p, "FedAvg")
            if a - f >= 5:
                up.append(f"{label} ({a:.1f}% vs {f:.1f}%)")
            elif f - a >= 5:
                down.append(f"{label} ({a:.1f}% vs {f:.1f}%)")
            if p == "iid":
                continue
            w = {s: _acc(g, p, s, "worst_client") for s in names}
            others = {s: v for s, v in w.items() if s != "MC" and np.isfinite(v)}
            if np.isfinite(w["MC"]) and others:
                top = max(others, key=others.get)
                if w["MC"] - others[top] >= 5:
                    worst_up.append(f"{label} ({w['MC']:.1f}% vs {top} {others[top]:.1f}%)")
                elif np.isfinite(w["FedAvg"]) and w["FedAvg"] - w["MC"] >= 5:
                    worst_down.append(f"{label} ({w['MC']:.1f}% vs FedAvg {w['FedAvg']:.1f}%)")
    out = ["## MultiConfederated learning (MC; no secure aggregation)\n"]
    if not ran:
        out.append("No MC run finished; its column is \"not run\" everywhere.\n")
        return "\n".join(out)
    partial = [f"{GRIDS[gn]['short']} {p} ({len(row['MC']['seeds'])})" for gn, g in grids.items()
               for p, row in g["results"].items()
               if not row.get("MC", NOT_RUN).get("not_run") and len(row["MC"]["seeds"]) < len(st["seeds"])]
    out.append(
        f"MC ran in {len(ran)} rows" + (f" (with fewer seeds in {', '.join(partial)})" if partial else "") +
        (f"; it did **not run** (the clock ran out) in {len(missing)}: {', '.join(missing)}" if missing else "") +
        ". Its accuracy is a different quantity from the other columns' (the mean of the peers' personal models, "
        "not one global model), each peer trains two or more models a round, and its peers see each other's models in "
        "the clear; read it as what a decentralised, non-private method reaches in the same budget of rounds (the "
        "tables' *best* column ranks it as it is).\n")
    pools = [pl for g in grids.values() for row in g["results"].values() for pl in row.get("MC", {}).get("pools", [])]
    forked = sum(any("@" in m for m in pl) for pl in pools)
    k0 = min(max(2, int(np.ceil(np.sqrt(st["parties"])))), 8)  # MCConfig.n_initial with the defaults
    merged = sum(len([m for m in pl if "@" not in m]) < k0 for pl in pools)
    out.append(f"Forks and merges: {forked} of {len(pools)} MC runs ended with a forked model in the pool, {merged} "
               f"with fewer than the {k0} initial models (a merge)." + (
                   f" With {st['parties']} peers and the default max_models 8, the fork rule can never fire (a round "
                   f"allows forks only while the models announced so far plus the peers are at most max_models: "
                   f"{k0} + {st['parties']} > 8), so here MC is the paper's selection of ⌈√|pool|⌉ of {k0} models by local "
                   "score and popularity with divergence-filtered aggregation, without group forks; a run with "
                   f"max_models ≥ {k0 + st['parties']} would let the peers fork (not run)." if forked == 0 and st["parties"] + k0 > 8
                   else "") + "\n")
    out.append("Accuracy on the test rows against FedAvg: " + (
        "MC is 5 points or more above in " + "; ".join(up) + " — likely (not separately measured) because each "
        "peer trains two models a round, so about twice FedAvg's SGD steps in a run that is step-limited, and keeps "
        "the best of several initialisations on its rows (as IFCA under IID). " if up
        else "MC is nowhere 5 points above. ") + (
        "It is 5 points or more below in " + "; ".join(down) + ". Likely reasons (not separately measured): "
        "each peer's personal model is chosen by accuracy on the peer's own rows, which under label skew favours "
        "a model fitted to the peer's few classes, and the common test set (every class) punishes that; under "
        "quantity skew the mean over peers counts a small peer's model (trained on few rows) as much as a large "
        "one's, while FedAvg's sample-weighted model follows the large parties' better-trained updates."
        + (" FCUBE's gap is not explained by either." if any(x.startswith("tabular FCUBE") for x in down) else "")
        if down else "It is nowhere 5 points below.") + "\n")
    out.append("Worst party: " + (
        "MC's worst peer is 5 points or more above the best of every secure strategy in " + "; ".join(worst_up) +
        " — this changes the worst-party conclusion above for those rows: the decentralised, non-private method "
        "serves its weakest party best there. " if worst_up else
        "MC's worst peer is nowhere 5 points above the best secure strategy, so it does not change the "
        "worst-party conclusion above. ") + (
        "It is 5 points or more below FedAvg's worst party in " + "; ".join(worst_down) + "." if worst_down else ""
    ) + "\n")
    return "\n".join(out)


def _steps(st) -> str:
    per_party = st["rows"] * (1 - st["local_test"]) / st["parties"]
    return f"{int(np.ceil(per_party / st['batch_size'])) * st['epochs'] * st['rounds']:,}"


def _context(grids, names, st) -> dict:
    digits = next((b for g in grids.values() for d, b in g["baselines"].items() if d == "digits"), None)
    n_runs = sum(len(c.get("seeds", [])) for g in grids.values() for row in g["results"].values()
                 for c in row.values())
    from secureflhv.horizontal.mc_rules import MultiConfederated
    mc_hparams = ", ".join(f"{k} {v}" for k, v in MultiConfederated().hyperparameters().items())
    return dict(st, local_test_pct=f"{st['local_test']:.0%}", seeds=", ".join(map(str, st["seeds"])),
                fmnist_fraction=round(60000 / st["rows"]), digits_rows=digits["train_rows"] if digits else "–",
                digits_test=digits["test_rows"] if digits else "–", steps_fmnist=_steps(st), n_runs=n_runs,
                mc_hparams=mc_hparams,
                parties_note="".join(sorted({f" ({d}: {n}, one island or one year each)" if d == "penguins" else
                                             f" ({d}: {n})" for g in grids.values()
                                             for p, n in g.get("parties_of", {}).items()
                                             for d in [g["data_of"][p]]})),
                processes=st.get("processes", "one process"), wall_min=st.get("grid_wall_s", float("nan")) / 60,
                run_min=st.get("run_seconds", float("nan")) / 60, comparison=comparison(grids, names, st),
                mc_timing=(f"MC's runs{' ran ' + st['mc_processes'] if st.get('mc_processes') else ''}: "
                           f"{st['mc_runs']} runs, wall time {st['mc_wall_s'] / 60:.0f} min, "
                           f"{st['mc_run_seconds'] / 60:.0f} min of runs." if st.get("mc_runs") else ""))


if __name__ == "__main__":
    raise SystemExit(main())
