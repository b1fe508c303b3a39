#!/usr/bin/env python3
"""The main job: vertical logistic regression between separate party processes over gRPC with mutual TLS.

With no arguments it uses scikit-learn's breast-cancer data (FATE's "breast" example): the guest holds
the label and half of the features, one host holds the other half, and each party's id column has
rows the other lacks, so PSI has real work to do. It writes the party tables, a CA with one
certificate per party and the job file into a work folder, starts server (Paillier key holder),
guest and host as separate processes with ``secureflhv run``, and finally compares the federated
model's held-out AUC and accuracy with scikit-learn's centralised LogisticRegression on the same
rows.

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


def centralised_baseline(work: Path, guest_csv: Path, host_csvs: list[Path], args, l2: float) -> dict:
    """scikit-learn LogisticRegression on the joined table, same train/test ids as the federated run."""
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
    # sklearn's C is the inverse of the summed (not averaged) penalty: C = 1 / (l2 * n)
    C = 1.0 / (l2 * len(train)) if l2 > 0 else 1e6
    clf = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(train), y[table.index.get_indexer(train.index)])
    p = clf.predict_proba(scaler.transform(test))[:, 1]
    y_test = y[table.index.get_indexer(test.index)]
    return {"auc": roc_auc_score(y_test, p), "accuracy": accuracy_score(y_test, p >= 0.5), "n": len(test)}


def main(argv=None) -> int:
    ap = example_parser(__doc__, "vertical_lr_demo", "tables")
    ap.add_argument("--hosts", type=int, default=1, help="number of hosts (demo data only)")
    ap.add_argument("--mode", choices=["arbiter", "two_party"], default="arbiter",
                    help="arbiter: a server holds the Paillier key; two_party: the guest holds it")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (below 2048 only for tests)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--learning-rate", type=float, default=0.15)
    ap.add_argument("--l2", type=float, default=0.001, help="L2 penalty (on the mean loss)")
    ap.add_argument("--guest-csv", type=Path, help="your guest table (id, features, label)")
    ap.add_argument("--host-csv", type=Path, action="append", help="a host table (id, features); repeatable")
    ap.add_argument("--id-column", default="id")
    ap.add_argument("--label-column", default="label")
    add_run_arguments(ap, timeout_s=1800)
    args = ap.parse_args(argv)
    if bool(args.guest_csv) != bool(args.host_csv):
        ap.error("give both --guest-csv and at least one --host-csv, or neither (demo data)")

    from rich.table import Table

    from secureflhv.runtime.demo import breast_cancer_tables, write_vertical_lr_job

    console, work = start(args.work_dir)
    if args.guest_csv:
        guest_csv, host_csvs = args.guest_csv, list(args.host_csv)
    else:
        guest_csv, host_csvs = breast_cancer_tables(work / "data", args.hosts, args.seed)
    params = {"epochs": args.epochs, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "l2": args.l2, "key_bits": args.key_bits, "test_fraction": 0.3, "split_seed": args.seed,
              "seed": args.seed}
    job_path = write_vertical_lr_job(work, guest_csv, host_csvs, params, mode=args.mode, id_column=args.id_column,
                                     label_column=args.label_column, insecure_test_keys=args.key_bits < 2048)
    rc, metrics = launch(job_path, work, console, party="guest", timeout_s=args.timeout,
                         parties=f"{1 + len(host_csvs) + (args.mode == 'arbiter')} parties over gRPC with mutual TLS")
    if rc != 0:
        return rc
    fed = metrics["metrics"]["test"]
    base = centralised_baseline(work, guest_csv, host_csvs, args, args.l2)
    table = Table(title=f"held-out results ({fed['n']} rows, PSI aligned {metrics['psi_common_ids']} ids)")
    for col in ("model", "AUC", "accuracy"):
        table.add_column(col)
    table.add_row("federated vertical LR (Paillier)", f"{fed['auc']:.4f}", f"{fed['accuracy']:.4f}")
    table.add_row("centralised scikit-learn LogisticRegression", f"{base['auc']:.4f}", f"{base['accuracy']:.4f}")
    console.print(table)
    console.print(f"training-loss plot: {work / 'out' / 'guest' / 'loss.png'}")
    console.print(f"models: {', '.join(str(p) for p in sorted((work / 'out').glob('*/model.json')))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
