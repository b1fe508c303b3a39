#!/usr/bin/env python3
"""SecureBoost on breast cancer, both layouts, every party its own process over gRPC with mutual TLS.

1. Vertical (``algorithm: secureboost_vertical``): a guest (labels + 10 columns) and two hosts (10
   columns each; ids differ between parties, so PSI has work), 2048-bit Paillier held by the guest;
   federated prediction of the held-out rows. Baseline: ``xgboost.XGBClassifier`` with the same
   trees, depth, learning rate, lambda and bins on the joined table, same training and held-out rows.
2. Horizontal (``algorithm: secureboost_horizontal``): a server and three clients (label-skewed
   Dirichlet(0.5) shards of the training rows), histograms summed by secure aggregation; the server
   exports XGBoost JSON, which ``xgboost.Booster`` scores on held-out rows no client holds. Baseline:
   the same XGBClassifier on the pooled training rows.

Expected run time: about 2 minutes on 2 cores (the vertical job's Paillier work dominates). Everything
is written under ``runs/secureboost_demo/`` in the repository (``--work-dir`` to change).

    python examples/secureboost.py [--trees 10] [--max-depth 4]
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from _common import add_run_arguments, example_parser, launch, start


def xgb_auc(X_train, y_train, X_test, y_test, params: dict) -> float:
    """Centralised XGBoost with the job's tree parameters (histogram method, same bins)."""
    from sklearn.metrics import roc_auc_score
    from xgboost import XGBClassifier

    clf = XGBClassifier(n_estimators=params["n_trees"], max_depth=params["max_depth"],
                        learning_rate=params["learning_rate"], reg_lambda=params["reg_lambda"],
                        max_bin=params["max_bin"], tree_method="hist", base_score=0.5)
    clf.fit(X_train, y_train)
    return float(roc_auc_score(y_test, clf.predict_proba(X_test)[:, 1]))


def vertical(work: Path, console, params: dict, args) -> tuple[float, float] | None:
    """Run the vertical job; return (federated test AUC, XGBoost test AUC on the same rows)."""
    from secureflhv.runtime.job.data_prep import split_rows
    from secureflhv.runtime.job.demo import vertical_parties, breast_cancer_tables, write_job

    guest_csv, host_csvs = breast_cancer_tables(work / "data", 2, args.seed)
    parties = vertical_parties(guest_csv, host_csvs, server=False, id_column="id", label_column="label")
    job = write_job(work, "secureboost-vertical-demo", "secureboost_vertical", parties, params, deadline_s=600,
                    insecure_test_keys=params["key_bits"] < 2048)
    rc, metrics = launch(job, work, console, party="guest", timeout_s=args.timeout, intro="vertical: ",
                         parties="guest + 2 hosts over gRPC with mutual TLS")
    if rc != 0:
        return None
    tables = [pd.read_csv(p, dtype={"id": str}).set_index("id") for p in [guest_csv, *host_csvs]]
    common = sorted(set.intersection(*(set(t.index) for t in tables)))  # the PSI result, in its order
    joined = tables[0].join(tables[1:], how="inner").loc[common]
    y = joined.pop("label").to_numpy().astype(int)
    split = split_rows(len(common), params["test_fraction"], params["split_seed"])
    X = joined.to_numpy(float)
    base = xgb_auc(X[split.train], y[split.train], X[split.test], y[split.test], params)
    return metrics["metrics"]["test"]["auc"], base


def horizontal(work: Path, console, params: dict, args) -> tuple[float, float] | None:
    """Run the horizontal job; return (exported model's AUC on held-out rows, pooled XGBoost's AUC)."""
    import xgboost as xgb
    from sklearn.metrics import roc_auc_score

    from secureflhv.data import load_sklearn, partition, write_shards
    from secureflhv.runtime.job.demo import write_job

    ds = load_sklearn("breast_cancer")
    perm = np.random.default_rng(args.seed).permutation(len(ds.y))
    n_test = int(round(0.3 * len(ds.y)))
    train, test = ds.subset(np.sort(perm[n_test:])), ds.subset(np.sort(perm[:n_test]))
    part = partition("label_dirichlet", train, 3, seed=args.seed, beta=0.5)
    shards = write_shards(train, part, work / "data", fmt="csv")  # with an id column, as the job reads it
    parties = [{"id": "server", "role": "server"}]
    parties += [{"id": f"client-{i}", "role": "host", "data": {"path": str(Path(s).relative_to(work)),
                                                               "label_column": "y"}}
                for i, s in enumerate(shards, 1)]
    job = write_job(work, "secureboost-horizontal-demo", "secureboost_horizontal", parties,
                    {**params, "aggregation": "secagg"}, deadline_s=600)
    rc, _ = launch(job, work, console, party="client-1", timeout_s=args.timeout,
                   intro=f"horizontal: client shard sizes {part.sizes.tolist()}; ",
                   parties="server + 3 clients over gRPC with mutual TLS, secure aggregation")
    if rc != 0:
        return None
    booster = xgb.Booster(model_file=str(work / "out" / "server" / "model.xgboost.json"))
    fed = float(roc_auc_score(test.y, booster.predict(xgb.DMatrix(test.X))))
    return fed, xgb_auc(train.X, train.y, test.X, test.y, params)


def main(argv=None) -> int:
    ap = example_parser(__doc__, "secureboost_demo", "tables and shards", "about 2 min on 2 cores")
    ap.add_argument("--trees", type=int, default=10, help="boosting rounds")
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=0.3)
    ap.add_argument("--max-bin", type=int, default=32, help="histogram bins per feature")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (below 2048 only for tests)")
    add_run_arguments(ap, timeout_s=1800)
    args = ap.parse_args(argv)

    from rich.table import Table

    console, work = start(args.work_dir)
    params = {"n_trees": args.trees, "max_depth": args.max_depth, "learning_rate": args.learning_rate,
              "reg_lambda": 1.0, "max_bin": args.max_bin, "test_fraction": 0.3, "split_seed": args.seed}
    v = vertical(work / "vertical", console, {**params, "key_bits": args.key_bits}, args)
    h = horizontal(work / "horizontal", console, params, args)
    table = Table(title="held-out AUC, federated SecureBoost against centralised XGBoost on the same rows")
    for col in ("layout", "federated", "centralised XGBoost"):
        table.add_column(col)
    for name, res in (("vertical (guest + 2 hosts, Paillier)", v), ("horizontal (3 clients, secure aggregation)", h)):
        table.add_row(name, *(("failed", "") if res is None else (f"{res[0]:.4f}", f"{res[1]:.4f}")))
    console.print(table)
    console.print(f"outputs: {work / 'vertical' / 'out'}, {work / 'horizontal' / 'out'}")
    return 0 if v is not None and h is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
