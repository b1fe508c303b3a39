#!/usr/bin/env python3
"""The main job: vertical logistic regression between separate party processes over gRPC with mutual TLS.

With no arguments it uses scikit-learn's breast-cancer data (FATE's "breast" example): the guest holds
the label and half of the features, one host holds the other half, and each party's id column has
rows the other lacks, so PSI has real work to do. It writes the party tables, a CA with one
certificate per party and the job file into a work folder, starts server (Paillier key holder),
guest and host as separate processes with ``secureflhv run``, and finally compares the federated
model's held-out AUC and accuracy with scikit-learn's default LogisticRegression() (L2, C=1) on the
same rows, standardised the same way.

Expected run time: about 30 s on 2 cores (20 epochs of about 1 s with 2048-bit keys, plus key generation,
PSI and start-up). Everything is written under ``runs/vertical_lr_demo/`` in the repository
(``--work-dir`` to change). Every training parameter defaults to the job's default
(``docs/parameters.md``).

Your own data: ``--guest-csv g.csv --host-csv h1.csv [--host-csv h2.csv ...]`` with an id column and
(at the guest) a 0/1 label column.

Examples::

    python examples/vertical_lr.py                       # breast cancer, 1 host, 2048-bit keys
    python examples/vertical_lr.py --hosts 2 --epochs 20
    python examples/vertical_lr.py --mode two_party      # no server: the guest holds the key
    python examples/vertical_lr.py --guest-csv g.csv --host-csv h.csv --label-column y
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from _common import add_run_arguments, example_parser, launch, start
from secureflhv.vertical.lr import VerticalLRConfig


def centralised_baseline(work: Path, guest_csv: Path, host_csvs: list[Path], args) -> dict:
    """scikit-learn's default LogisticRegression (L2, C=1) on the joined table, same train/test ids and
    per-column standardisation (training rows' statistics) as the federated run."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.preprocessing import StandardScaler

    split = json.loads((work / "out" / "guest" / "split.json").read_text())
    table = pd.read_csv(guest_csv, dtype={args.id_column: str}).set_index(args.id_column)
    for h in host_csvs:
        table = table.join(pd.read_csv(h, dtype={args.id_column: str}).set_index(args.id_column), how="inner")
    y = table.pop(args.label_column).to_numpy()
    train, test = table.loc[split["train"]], table.loc[split["test"]]
    scaler = StandardScaler().fit(train)
    clf = LogisticRegression().fit(scaler.transform(train), y[table.index.get_indexer(train.index)])
    p = clf.predict_proba(scaler.transform(test))[:, 1]
    y_test = y[table.index.get_indexer(test.index)]
    return {"auc": roc_auc_score(y_test, p), "accuracy": accuracy_score(y_test, p >= 0.5), "n": len(test)}


def main(argv=None) -> int:
    ap = example_parser(__doc__, "vertical_lr_demo", "tables", "about 30 s on 2 cores")
    ap.add_argument("--hosts", type=int, default=1, help="number of hosts (demo data only)")
    ap.add_argument("--mode", choices=["arbiter", "two_party"], default="arbiter",
                    help="arbiter: a server holds the Paillier key; two_party: the guest holds it")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (below 2048 only for tests)")
    for name in ("epochs", "batch_size", "learning_rate", "lr_schedule", "momentum", "l2",
                 "early_stopping_rounds"):
        field = VerticalLRConfig.model_fields[name]
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(field.default), default=field.default,
                        help=field.description)
    ap.add_argument("--guest-csv", type=Path, help="your guest table (id, features, label)")
    ap.add_argument("--host-csv", type=Path, action="append", help="a host table (id, features); repeatable")
    ap.add_argument("--id-column", default="id")
    ap.add_argument("--label-column", default="label")
    add_run_arguments(ap, timeout_s=1800)
    args = ap.parse_args(argv)
    if bool(args.guest_csv) != bool(args.host_csv):
        ap.error("give both --guest-csv and at least one --host-csv, or neither (demo data)")

    from rich.table import Table

    from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job

    console, work = start(args.work_dir)
    if args.guest_csv:
        guest_csv, host_csvs = args.guest_csv, list(args.host_csv)
    else:
        guest_csv, host_csvs = breast_cancer_tables(work / "data", args.hosts, args.seed)
    params = {"epochs": args.epochs, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "lr_schedule": args.lr_schedule, "momentum": args.momentum, "l2": args.l2,
              "early_stopping_rounds": args.early_stopping_rounds, "key_bits": args.key_bits, "test_fraction": 0.3, "split_seed": args.seed,
              "seed": args.seed}
    job_path = write_vertical_lr_job(work, guest_csv, host_csvs, params, mode=args.mode, id_column=args.id_column,
                                     label_column=args.label_column, insecure_test_keys=args.key_bits < 2048)
    rc, metrics = launch(job_path, work, console, party="guest", timeout_s=args.timeout,
                         parties=f"{1 + len(host_csvs) + (args.mode == 'arbiter')} parties over gRPC with mutual TLS")
    if rc != 0:
        return rc
    fed = metrics["metrics"]["test"]
    base = centralised_baseline(work, guest_csv, host_csvs, args)
    table = Table(title=f"held-out results ({fed['n']} rows, PSI aligned {metrics['psi_common_ids']} ids)")
    for col in ("model", "AUC", "accuracy"):
        table.add_column(col)
    table.add_row("federated vertical LR (Paillier)", f"{fed['auc']:.4f}", f"{fed['accuracy']:.4f}")
    table.add_row("centralised scikit-learn LogisticRegression()", f"{base['auc']:.4f}", f"{base['accuracy']:.4f}")
    console.print(table)
    hist = metrics["history"]
    console.print(f"AUC gap to centralised: {base['auc'] - fed['auc']:+.4f}; trained {len(hist['loss'])} epochs, "
                  f"kept the weights after epoch {hist['best_epoch']} (lowest training loss)")
    console.print(f"training-loss plot: {work / 'out' / 'guest' / 'loss.png'}")
    console.print(f"model bundles: {', '.join(str(p.parent) for p in sorted((work / 'out').glob('*/model/manifest.json')))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
