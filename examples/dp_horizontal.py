#!/usr/bin/env python3
"""Differential privacy with the noise added by the clients inside secure aggregation, over real party processes
(gRPC with mutual TLS): client-level DP-FedAvg (default) or record-level DP-GD (``--level record``).

The script

1. splits a small data set (default scikit-learn's breast cancer table, 30 features, standardised with the
   training rows' statistics; ``--dataset digits`` or ``fmnist`` for a Fashion-MNIST subset) among ``--clients``
   clients (IID) and writes one ``.npz`` shard each;
2. creates a CA and one certificate per party and the job file ``job.yaml``: FedAvg of multinomial logistic
   regression, ``aggregation.kind: secagg`` (Bonawitz et al. masks), and ``params.dp`` with
   ``placement: distributed``: each client clips its model delta to L2 norm ``--clip-norm``, rotates it, scales
   and rounds it into a ring of ``--bits`` bits per coordinate and adds its share of Skellam noise before
   masking (Kairouz, Liu, Steinke, ICML 2021; Agarwal, Kairouz, Liu, NeurIPS 2021), so no party, the server
   included, sees an un-noised sum; the noise is calibrated by every party for ``--epsilon`` over the rounds.
   With ``--level record``: ``params.record_dp`` with ``placement: distributed`` instead: each round every client
   sends the sum of its per-record gradients, each clipped to ``--clip-norm``, with its Skellam share, and the
   server takes one DP-GD step (``--lr``); ε then protects any one record of any client;
3. starts the server and the clients as separate processes (the launcher, as ``secureflhv run``);
4. prints, per round, the ε the server's record holds; then the final (ε, δ) beside the global model's accuracy
   on held-out test rows, the client's own bound, and the path of the server's signed bundle whose
   ``manifest.json`` holds the privacy record (``extra.privacy``).

With 5 clients a client-level guarantee costs accuracy: the noise on the mean update is z·C / 5 per coordinate,
so a small model (few coordinates) and a moderate ε are used. The ε recorded is below the target: with the
default threshold (t of n may survive, one may collude) each client adds μ/(t − c), so that any allowed set of
survivors still carries μ, and when all survive the sum carries more (docs/privacy.md).

Expected run time: about 1 min on 2 cores (``--quick``: 2 rounds, about 45 s), mostly process start-up.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from _common import add_run_arguments, example_parser, launch, start


def prepare_data(args):
    """(train Dataset, test Dataset, model dict): a fifth of the rows held out; tables standardised."""
    from secureflhv.data import load_dataset

    rng = np.random.default_rng(args.seed)
    if args.dataset == "fmnist":
        train, test = load_dataset("fmnist"), load_dataset("fmnist_test")
        train = train.subset(np.sort(rng.choice(len(train), min(args.rows, len(train)), replace=False)))
        test = test.subset(np.sort(rng.choice(len(test), min(args.rows // 4, len(test)), replace=False)))
    else:
        ds = load_dataset(args.dataset)
        perm = rng.permutation(len(ds))
        n_test = len(ds) // 5
        train, test = ds.subset(np.sort(perm[n_test:])), ds.subset(np.sort(perm[:n_test]))
        mu, sd = train.X.mean(0), train.X.std(0)
        sd[sd == 0] = 1
        train.X = ((train.X - mu) / sd).astype(np.float32)
        test.X = ((test.X - mu) / sd).astype(np.float32)
    n_classes = int(max(train.y.max(), test.y.max())) + 1
    return train, test, {"name": "mlp", "n_features": int(train.X.shape[1]), "n_classes": n_classes, "hidden": []}


def report(console, work: Path, test, metrics: dict, target: float, rounds: int) -> None:
    """Print ε per round, the final (ε, δ) beside the held-out accuracy, and the bundle; write summary.json."""
    from secureflhv.horizontal.models import ModelSpec, build_model, evaluate, flatten_named, set_flat
    from secureflhv.runtime.store.model_bundle import read_bundle

    unit = "record" if metrics["rounds"][0]["privacy"].get("unit") == "record" else "client"
    for r in metrics["rounds"]:
        p = r["privacy"]
        console.print(f"round {r['round']}: {len(r['survivors'])} survivors, ε = {p['epsilon']:.3f} "
                      f"(δ = {p['delta']:g}), gamma {p['gamma']:.3g}, {p['bits']} bits, noise std on the sum "
                      f"{p['noise_std']:.4f}")

    out = work / "out" / "server"
    bundle = read_bundle(out, ca=work / "certs" / "ca.pem", expect_party="server")
    net = build_model(ModelSpec(**bundle.config["model"]))
    set_flat(net, flatten_named(net, bundle.file("model.safetensors")))
    acc = evaluate(net, test.X, test.y)["accuracy"]
    priv = bundle.manifest["extra"]["privacy"]
    own = json.loads((work / "out" / "client-1" / "model" / "manifest.json").read_text())["extra"]["privacy"]
    console.print(f"final: test accuracy {acc:.4f} on {len(test)} held-out rows at ε = {priv['epsilon']:.3f}, "
                  f"δ = {priv['delta']:g} (target ε {target:g}; {priv['mechanism']} noise, "
                  f"placement {priv['placement']}, {priv['rounds']} rounds, one {unit} protected)")
    console.print(f"client-1's own bound (every round it received counted as released): ε = {own['epsilon']:.3f}")
    console.print(f"bundle: {out / 'model'} (privacy record: {out / 'model' / 'manifest.json'}, extra.privacy)")
    np.savez(work / "test_rows.npz", X=test.X, y=test.y)  # for checking the accuracy independently
    (work / "summary.json").write_text(json.dumps({"accuracy": acc, "test_rows": len(test), "privacy": priv,
                                                   "client_privacy": own, "target_epsilon": target,
                                                   "bundle": str(out / "model"), "rounds": rounds}, indent=1))


def main(argv=None) -> int:
    ap = example_parser(__doc__, "dp_horizontal_demo", "shards", "about 1 min on 2 cores (--quick: about 45 s)")
    ap.add_argument("--quick", action="store_true", help="2 rounds (a smoke run)")
    ap.add_argument("--dataset", default="breast_cancer", choices=["breast_cancer", "digits", "fmnist"])
    ap.add_argument("--rows", type=int, default=3000, help="fmnist: training rows sampled (a quarter as test rows)")
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=None, help="FedAvg rounds (default 8; --quick 2)")
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default 0.1; --level record: 2.0, the "
                                                          "server's DP-GD step)")
    ap.add_argument("--level", choices=["client", "record"], default="client",
                    help="client: DP-FedAvg (params.dp); record: DP-GD (params.record_dp, placement distributed)")
    ap.add_argument("--epsilon", type=float, default=8.0, help="target ε over all rounds")
    ap.add_argument("--delta", type=float, default=1e-5, help="δ; must be below 1 / clients")
    ap.add_argument("--clip-norm", type=float, default=1.0, help="C: L2 clip of a client's update per round "
                                                                 "(--level record: of one record's gradient)")
    ap.add_argument("--bits", type=int, default=None, help="ring bits per coordinate of the secure sum (client "
                                                          "level: 8..24, default 16; record level: 16..52, default 32)")
    add_run_arguments(ap, timeout_s=600)
    args = ap.parse_args(argv)
    record = args.level == "record"
    rounds = args.rounds or (2 if args.quick else 20 if record else 8)
    lr = args.lr or (2.0 if record else 0.1)

    from secureflhv.data import partition, write_shards
    from secureflhv.runtime.job.demo import write_job

    console, work = start(args.work_dir)
    train, test, model = prepare_data(args)
    part = partition("iid", train, args.clients, seed=args.seed)
    shards = write_shards(train, part, work / "data", fmt="npz")
    console.print(f"{args.dataset}: {len(train)} training rows in {args.clients} shards of sizes "
                  f"{part.sizes.tolist()}; {len(test)} held-out test rows")
    dp = {"placement": "distributed", "clip_norm": args.clip_norm, "target_epsilon": args.epsilon,
          "delta": args.delta, "bits": args.bits or (32 if record else 16)}
    params = {"strategy": "fedavg", "model": model, "rounds": rounds, "local_epochs": args.local_epochs,
              "batch_size": args.batch_size, "learning_rate": lr, "seed": args.seed, "test_fraction": 0.0,
              "aggregation": {"kind": "secagg"}, "record_dp" if record else "dp": dp}
    parties = [{"id": "server", "role": "server"}]
    parties += [{"id": f"client-{i}", "role": "host",
                 "data": {"path": str(Path(s).relative_to(work)), "label_column": "y"}}
                for i, s in enumerate(shards, 1)]
    job_path = write_job(work, "dp-horizontal-demo", "horizontal", parties, params, deadline_s=300)
    rc, metrics = launch(job_path, work, console, party="server", timeout_s=args.timeout,
                         intro=f"params.{'record_dp' if record else 'dp'}: {json.dumps(dp)}\n",
                         parties=f"server + {args.clients} clients over gRPC with mutual TLS, secure aggregation")
    if rc != 0:
        return rc
    report(console, work, test, metrics, args.epsilon, rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
