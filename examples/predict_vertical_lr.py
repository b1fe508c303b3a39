#!/usr/bin/env python3
"""Use a trained vertical LR model: score new rows with a prediction job (three party processes, gRPC + mutual TLS).

Step 1 trains the main job's model (server, guest and host, as ``examples/vertical_lr.py``) on
scikit-learn's breast-cancer rows, except a fifth of the ids that are kept out of training entirely;
every party saves its part of the model as a bundle (``out/<party>/model/``). Step 2 writes a
prediction job (``job.algorithm: predict``, derived from the training job: same parties and
certificates, ``data`` pointing at the new tables, ``params.model_dir`` at the bundles) and runs it
with ``secureflhv run``: PSI aligns the new ids (a few are known to one party only), the host sends
its partial scores encrypted under the server's key, the server decrypts only the guest's masked
totals (arbiter mode), the guest writes ``predictions/guest/predictions.csv``. The script prints the AUC
of the predicted scores on those never-seen rows and the number of rows scored.

``--reuse runs/vertical_lr_demo`` skips training and scores the held-out rows (``split.json``) of a
finished ``examples/vertical_lr.py`` run with its bundles instead.

Expected run time: training as long as ``examples/vertical_lr.py`` (about 30 s on 2 idle cores) plus a
few seconds of scoring; measured 160 s with 2048-bit keys on 2 cores shared with other jobs (load 15).
Everything is written under ``runs/predict_vertical_lr/`` (``--work-dir`` to change).

Examples::

    python examples/predict_vertical_lr.py
    python examples/predict_vertical_lr.py --reuse runs/vertical_lr_demo
    python examples/predict_vertical_lr.py --key-bits 1024     # faster; test-size keys
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from _common import add_run_arguments, example_parser, start


def split_tables(guest_csv: Path, host_csv: Path, out: Path, seed: int) -> tuple[dict, dict]:
    """(training tables, scoring tables): a fifth of the guest's ids go to scoring only; the host's
    scoring table misses a few of them and holds a few ids the guest lacks, so PSI has work."""
    guest = pd.read_csv(guest_csv, dtype={"id": str})
    host = pd.read_csv(host_csv, dtype={"id": str})
    rng = np.random.default_rng([seed, 11])
    new = set(guest.id[rng.random(len(guest)) < 0.2])
    host_missing = set(sorted(new)[:3])
    tables = {"train": (guest[~guest.id.isin(new)], host[~host.id.isin(new)]),
              "score": (guest[guest.id.isin(new)], host[host.id.isin(new - host_missing)])}
    paths = {}
    for part, (g, h) in tables.items():
        (out / part).mkdir(parents=True, exist_ok=True)
        g.to_csv(out / part / "guest.csv", index=False, float_format="%.17g")
        h.to_csv(out / part / "host_1.csv", index=False, float_format="%.17g")
        paths[part] = {"guest": out / part / "guest.csv", "host-1": out / part / "host_1.csv"}
    return paths["train"], paths["score"]


def reuse_tables(demo: Path, out: Path) -> tuple[Path, dict]:
    """(the demo's job file, scoring tables of its held-out ids from the demo's own party tables)."""
    import yaml

    job = demo / "job.yaml"
    doc = yaml.safe_load(job.read_text())
    test_ids = set(json.loads((demo / "out" / "guest" / "split.json").read_text())["test"])
    out.mkdir(parents=True, exist_ok=True)
    data = {}
    for p in doc["parties"]:
        if p.get("data"):
            path = Path(p["data"]["path"])
            path = path if path.is_absolute() else demo / path
            t = pd.read_csv(path, dtype={p["data"].get("id_column", "id"): str})
            t[t[p["data"].get("id_column", "id")].isin(test_ids)].to_csv(out / f"{p['id']}.csv", index=False,
                                                                         float_format="%.17g")
            data[p["id"]] = out / f"{p['id']}.csv"
    return job, data


def main(argv=None) -> int:
    ap = example_parser(__doc__, "predict_vertical_lr", "tables", "about 40 s on 2 idle cores")
    ap.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (below 2048 only for tests)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--reuse", type=Path, help="a finished examples/vertical_lr.py work folder to score with")
    add_run_arguments(ap, timeout_s=1800)
    args = ap.parse_args(argv)

    from secureflhv.runtime.job.load import load_job
    from secureflhv.runtime.job.demo import breast_cancer_tables, write_vertical_lr_job
    from secureflhv.runtime.algorithms.predict import write_predict_job
    from secureflhv.runtime.process.launcher import Launcher

    console, work = start(args.work_dir)
    if args.reuse:
        train_job, score = reuse_tables(args.reuse.resolve(), work / "score")
        console.print(f"step 1: reusing the model of {train_job} (bundles in {args.reuse / 'out'})")
    else:
        guest_csv, host_csvs = breast_cancer_tables(work / "data", 1, args.seed)
        train, score = split_tables(guest_csv, host_csvs[0], work / "data", args.seed)
        params = {"epochs": args.epochs, "key_bits": args.key_bits, "test_fraction": 0.3,
                  "split_seed": args.seed, "seed": args.seed}
        train_job = write_vertical_lr_job(work / "train", train["guest"], [train["host-1"]], params,
                                          job_id="breast-vlr", insecure_test_keys=args.key_bits < 2048)
        console.print(f"step 1: training {train_job} (server, guest, host-1 over gRPC with mutual TLS)")
        rc = Launcher(train_job, load_job(train_job)).run(timeout_s=args.timeout)
        if rc != 0:
            console.print("training failed; see the party logs above", style="bold red")
            return rc
    predict_job = write_predict_job(train_job, work / "predict" / "job.yaml", data=score)
    console.print(f"step 2: scoring new rows with {predict_job} (algorithm: predict, the trained bundles)")
    rc = Launcher(predict_job, load_job(predict_job)).run(timeout_s=args.timeout)
    if rc != 0:
        console.print("the prediction job failed; see the party logs above", style="bold red")
        return rc
    out = work / "predict" / "predictions" / "guest"
    m = json.loads((out / "metrics.json").read_text())["metrics"]
    console.print(f"rows scored: {m['rows_scored']} (the guest's {m['own_rows']} new ids, "
                  f"{m['ids_without_partner']} without a partner at the host)")
    console.print(f"AUC of the predicted scores on rows never used in training: {m['auc']:.4f} "
                  f"(accuracy {m['accuracy']:.4f})")
    console.print(f"predictions: {out / 'predictions.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
