#!/usr/bin/env python3
"""Split neural network (hetero NN) between separate guest and host processes over gRPC with mutual TLS.

The guest holds the label and some columns, each host the others; ids differ between the parties so
PSI has real work. The interactive layer is protected with each host's own Paillier key (Zhang et al.
2020, FATE Hetero-NN v1; see ``secureflhv.vertical.split_nn``). The script writes the party tables, a
CA with one certificate per party and the job file into a work folder, starts every party as its own
process with the launcher, and compares the federated model's held-out quality with the centralised
torch model of the same split architecture (same initial weights, rows, batches) trained on the
joined table.

Datasets: ``breast_cancer`` (569 x 30, scikit-learn) and ``shuttle`` (river's Statlog Shuttle,
49,097 x 9, binary "anomaly" label; ``--rows`` subsamples it because every mini-batch costs Paillier
operations: about 2 s per 64 rows with 2048-bit keys on 2 busy cores, see ``benchmarks/split_nn.py``).

Expected run time: about 3 minutes on 2 cores with the defaults (breast cancer, 4 epochs, 2048-bit
keys). Everything is written under ``runs/vertical_nn_demo/`` in the repository (``--work-dir`` to change).

Examples::

    python examples/vertical_nn.py                                   # breast cancer, 1 host, 2048-bit keys
    python examples/vertical_nn.py --dataset shuttle --rows 3000 --key-bits 1024
    python examples/vertical_nn.py --hosts 2 --scheme random --epochs 5
    python examples/vertical_nn.py --label-dp-epsilon 4              # label DP against the hosts, ε = 4
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from _common import add_run_arguments, example_parser, launch, start


def centralised_baseline(work: Path, job_params: dict, n_hosts: int) -> dict:
    """The same split architecture trained in one place with torch on the joined table, same split."""
    from secureflhv.runtime.observe.reports import classification_metrics
    from secureflhv.vertical.split_nn import CentralisedSplitNN, SplitNNConfig

    split = json.loads((work / "out" / "guest" / "split.json").read_text())
    data = work / "data"
    guest = pd.read_csv(data / "guest.csv", dtype={"id": str}).set_index("id")
    hosts = [pd.read_csv(data / f"host_{i}.csv", dtype={"id": str}).set_index("id") for i in range(1, n_hosts + 1)]
    y_all = guest.pop("label")
    parts = [guest] + hosts
    train_ids, test_ids = split["train"], split["test"]
    mats = []
    for t in parts:  # each party standardises its own columns with its training rows, as in the job
        tr, te = t.loc[train_ids].to_numpy(float), t.loc[test_ids].to_numpy(float)
        mu, sd = tr.mean(0), tr.std(0)
        sd[sd == 0] = 1.0
        mats.append(((tr - mu) / sd, (te - mu) / sd))
    y_tr, y_te = y_all.loc[train_ids].to_numpy().astype(int), y_all.loc[test_ids].to_numpy().astype(int)
    fields = set(SplitNNConfig.model_fields)
    # no keys here; no label DP either (the centralised model is the non-private reference)
    cfg = SplitNNConfig(**{k: v for k, v in job_params.items() if k in fields and k not in ("key_bits", "label_dp")})
    n_classes = cfg.n_classes or max(2, int(y_all.max()) + 1)
    model = CentralisedSplitNN.create(cfg, mats[0][0].shape[1], [m[0].shape[1] for m in mats[1:]], n_classes,
                                      seed=cfg.init_seed)
    model.fit(mats[0][0], [m[0] for m in mats[1:]], y_tr)
    p = model.predict_proba(mats[0][1], [m[1] for m in mats[1:]])
    return classification_metrics(y_te, p)


def main(argv=None) -> int:
    ap = example_parser(__doc__, "vertical_nn_demo", "tables", "about 3 min on 2 cores")
    ap.add_argument("--dataset", choices=["breast_cancer", "shuttle"], default="breast_cancer")
    ap.add_argument("--rows", type=int, default=None,
                    help="random subsample of the dataset (default: all of breast cancer, 3000 of shuttle)")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--scheme", choices=["even", "random", "overlap"], default="even",
                    help="how columns are split (secureflhv.data.vertical_split)")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (below 2048 only for tests)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=0.01, help="Adam step of bottom and top models")
    ap.add_argument("--interactive-lr", type=float, default=0.1, help="SGD step of the interactive layer")
    ap.add_argument("--bottom", type=int, default=4, help="bottom-model output width (interactive input)")
    ap.add_argument("--units", type=int, default=4, help="interactive layer width")
    ap.add_argument("--label-dp-epsilon", type=float, default=None,
                    help="label DP against the hosts: the target ε (δ = 1e-5, clip 1) over all epochs; "
                         "default off (the hosts' gradients then leak label information)")
    add_run_arguments(ap, timeout_s=3600)
    args = ap.parse_args(argv)

    from rich.table import Table

    from secureflhv.data import load_shuttle, load_sklearn
    from secureflhv.runtime.job.demo import write_vertical_nn_job

    console, work = start(args.work_dir)
    ds = load_sklearn("breast_cancer") if args.dataset == "breast_cancer" else load_shuttle()
    rows = args.rows if args.rows is not None else (None if args.dataset == "breast_cancer" else 3000)
    if rows is not None and rows < len(ds.y):
        ds = ds.subset(np.sort(np.random.default_rng(args.seed).choice(len(ds.y), rows, replace=False)))
    params = {"epochs": args.epochs, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "interactive_lr": args.interactive_lr, "host_bottom": [16, args.bottom],
              "guest_bottom": [16, args.bottom], "interactive_units": args.units, "key_bits": args.key_bits,
              "test_fraction": 0.3, "split_seed": args.seed, "seed": args.seed, "init_seed": args.seed}
    if args.label_dp_epsilon is not None:
        # both datasets are binary; label DP needs the class count in the job, not inferred from the labels
        params.update(n_classes=2, label_dp={"clip_norm": 1.0, "target_epsilon": args.label_dp_epsilon})
    shared = {"shared_fraction": 0.2} if args.scheme == "overlap" else {}
    if shared:
        console.print("note: --scheme overlap shares 20% of the columns between all parties")
    job_path = write_vertical_nn_job(work, None, None, params, dataset=ds, n_hosts=args.hosts, seed=args.seed,
                                     scheme=args.scheme if not shared else "random",
                                     insecure_test_keys=args.key_bits < 2048)
    rc, metrics = launch(job_path, work, console, party="guest", timeout_s=args.timeout,
                         intro=f"{args.dataset}: {len(ds.y)} rows; ",
                         parties=f"{1 + args.hosts} parties over gRPC with mutual TLS")
    if rc != 0:
        return rc
    fed = metrics["metrics"]["test"]
    base = centralised_baseline(work, params, args.hosts)
    table = Table(title=f"{args.dataset}: held-out results ({fed['n']} rows, PSI aligned "
                        f"{metrics['psi_common_ids']} ids, {args.epochs} epochs)")
    for col in ("model", "AUC", "accuracy", "s/epoch"):
        table.add_column(col)
    secs = metrics["history"]["epoch_seconds"]
    privacy = metrics.get("privacy")
    dp = f", label DP ε {privacy['epsilon']:.3g} at δ {privacy['delta']:g}" if privacy else ""
    table.add_row(f"federated split NN (Paillier {args.key_bits} bits{dp})", f"{fed.get('auc', float('nan')):.4f}",
                  f"{fed['accuracy']:.4f}", f"{np.mean(secs):.1f}")
    table.add_row("centralised torch, same architecture", f"{base.get('auc', float('nan')):.4f}",
                  f"{base['accuracy']:.4f}", "")
    console.print(table)
    console.print(f"training-loss plot: {work / 'out' / 'guest' / 'loss.png'}; "
                  f"checkpoints: {work / 'out' / '<party>' / 'checkpoints'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
