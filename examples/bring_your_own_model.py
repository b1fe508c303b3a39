#!/usr/bin/env python3
"""Bring your own model: ten hospitals train their own ResNet-8 (batch norm) on their own PNG folders, as separate
party processes over gRPC with mutual TLS and secure aggregation, with FedAvg and with FedBN, next to the same
network trained centrally.

The consortium's code is ``examples/byom/models.py`` (the ResNet-8 and its training / evaluation loops, plain
torch). The job names it (``params.model: {factory: "models:resnet8", path: examples/byom, n_classes: 10}``,
``params.train`` / ``params.evaluate``); each hospital's data is the library's image-folder loader
(``data.factory: secureflhv.data.torch_datasets:image_folder`` with the consortium's class list: a hospital may
lack classes); every party imports its own copy, no code travels. The script

1. writes Fashion-MNIST (Xiao, Rasul, Vollgraf 2017; Debian's IDX files, via
   :func:`secureflhv.data.torch_datasets.fashion_mnist` and :func:`~secureflhv.data.torch_datasets.write_image_folder`)
   once as PNG folders, one per class: ``--rows`` training rows and ``--test-rows`` held-out test rows, drawn with
   ``--seed`` (skipped when the work folder already holds the same draw);
2. splits the training rows among ``--clients`` hospitals by label, Dirichlet(``--beta``)
   (:func:`secureflhv.data.partition`, ``label_dirichlet``; NIID-Bench's ``noniid-labeldir``), and gives each
   hospital its own PNG folder (``clients/hospital-NN/<class>/``); the test rows stay apart;
3. writes two jobs with :class:`secureflhv.Job` (``job.yaml`` and a CA + one certificate per party under
   ``fedavg/`` and ``fedbn/``): server + hospitals, secure aggregation (Bonawitz et al. 2017) with
   ``aggregation.seed`` set, FedAvg with the batch-norm statistics aggregated (``buffers: aggregate``) and FedBN
   (Li et al., ICLR 2021: ``buffers: local``, every batch-norm tensor stays at its hospital); runs each with
   ``secureflhv run`` as a subprocess (one process per party, gRPC + mTLS on loopback);
4. trains the same network centrally in plain torch on the pooled hospital rows (same initialisation, SGD
   settings and rounds x local epochs passes), and scores all three on the same held-out test rows: the FedAvg
   server's global model and, for FedBN (which has no global batch-norm statistics), each hospital's own model,
   reporting their mean; the federated models are loaded from their signed bundles with
   :func:`secureflhv.load_model` (checked against the job's CA);
5. runs the FedAvg job again in this process with :func:`secureflhv.simulate` and says whether its global model
   equals the process run's bit for bit.

It prints a table (accuracy, rounds, wall seconds) and writes ``results.json`` in the work folder. Every party,
the simulation and the centralised run use one torch thread (``OMP_NUM_THREADS=1``), so the process run and the
simulation compute the same floating-point operations.

Expected run time with the defaults (6,000 training rows, 2,000 test rows, 10 hospitals, 10 rounds of 1 local
epoch, learning rate 0.01): about 5 minutes on 2 cores; ``--quick`` (1,200 rows, 3 hospitals, 3 rounds): under a
minute.

Examples::

    python examples/bring_your_own_model.py
    python examples/bring_your_own_model.py --rows 20000 --rounds 20 --beta 0.1
    python examples/bring_your_own_model.py --quick --work-dir /tmp/byom
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import ROOT

BYOM = Path(__file__).resolve().parent / "byom"  # the consortium's code (installed at every hospital)
# Fashion-MNIST's classes as folder names, in label order (the official names hold a '/', and do not sort in order)
CLASS_DIRS = ["t-shirt-top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
              "ankle-boot"]
QUICK = {"rows": 1200, "test_rows": 500, "clients": 3, "rounds": 3, "local_epochs": 1, "lr": 0.02}


def parse_args(argv=None) -> argparse.Namespace:
    summary = __doc__.split("\n\n")[0] + " Expected run time: about 5 min on 2 cores (--quick: under a minute)."
    ap = argparse.ArgumentParser(description=summary, epilog="See the module docstring for more.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=ROOT / "examples" / "out" / "byom",
                    help="folder for the PNG folders, the jobs (certificates, job.yaml, outputs) and results.json")
    ap.add_argument("--rows", type=int, default=6000, help="Fashion-MNIST training rows drawn (of 60,000)")
    ap.add_argument("--test-rows", type=int, default=2000, help="held-out test rows drawn (of 10,000)")
    ap.add_argument("--clients", type=int, default=10, help="hospitals")
    ap.add_argument("--beta", type=float, default=0.3, help="Dirichlet concentration of the label split")
    ap.add_argument("--rounds", type=int, default=10, help="federated rounds (the centralised run: rounds x "
                                                          "local epochs passes)")
    ap.add_argument("--local-epochs", type=int, default=1, help="passes over a hospital's rows per round")
    ap.add_argument("--batch-size", type=int, default=32, help="SGD batch (everywhere)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    ap.add_argument("--weight-decay", type=float, default=1e-5, help="SGD L2 weight decay")
    ap.add_argument("--clip", type=float, default=4.0, help="secure aggregation's clip range per coordinate")
    ap.add_argument("--seed", type=int, default=0, help="data draw, split, initial model, batches, aggregation")
    ap.add_argument("--fmnist-dir", default=None, help="folder of the IDX files (default: Debian's "
                                                       "/usr/share/datasets/fashion-mnist or $SECUREFLHV_FMNIST_DIR)")
    ap.add_argument("--timeout", type=float, default=900, help="stop a job's parties after this many seconds")
    ap.add_argument("--no-simulate", action="store_true", help="skip step 5 (secureflhv.simulate)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run for the tests: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in
                                                                   QUICK.items()) + " (explicit flags win)")
    args = ap.parse_args(argv)
    if args.quick:
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    return args


# ------------------------------------------------------------------------------------------------ 1. PNG folders
def write_fmnist(work: Path, args) -> Path:
    """``work/fmnist/{train,test}/<class>/*.png`` for the draw of ``args`` (kept when already written)."""
    from secureflhv.data.torch_datasets import fashion_mnist, write_image_folder

    root = work / "fmnist"
    stamp = {"rows": args.rows, "test_rows": args.test_rows, "seed": args.seed}
    marker = root / "written.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        print(f"1. Fashion-MNIST PNG folders already written: {root}")
        return root
    shutil.rmtree(root, ignore_errors=True)
    for i, (split, n) in enumerate((("train", args.rows), ("test", args.test_rows))):
        ds = fashion_mnist(split, root=args.fmnist_dir)
        pick = np.sort(np.random.default_rng([args.seed, i]).choice(len(ds), n, replace=False))
        pixels = np.rint(ds.X[pick].numpy()[:, 0] * 255).astype(np.uint8)  # back to the file's bytes
        write_image_folder(pixels, ds.targets[pick], root / split, CLASS_DIRS)
    marker.write_text(json.dumps(stamp))
    print(f"1. wrote {args.rows} training and {args.test_rows} test images of Fashion-MNIST as PNG folders: {root}")
    return root


# ------------------------------------------------------------------------------------------------ 2. hospitals
def split_hospitals(work: Path, train_root: Path, args) -> dict:
    """Each hospital's own PNG folder ``work/clients/<id>/<class>/`` from a label-Dirichlet split of the
    training images; returns {hospital id: {rows, labels (count per class)}}."""
    from secureflhv.data import partition
    from secureflhv.data.torch_datasets import image_folder

    pooled = image_folder(train_root, grayscale=True, classes=CLASS_DIRS)  # lists the files, reads none
    part = partition("label_dirichlet", pooled.targets, args.clients, seed=args.seed, beta=args.beta)
    out = work / "clients"
    shutil.rmtree(out, ignore_errors=True)
    hospitals = {}
    for i, rows in enumerate(part.indices, 1):
        hid = f"hospital-{i:02d}"
        for r in rows:
            src, label = pooled.samples[r]
            dst = out / hid / CLASS_DIRS[label] / Path(src).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)  # the same bytes, no copy
            except OSError:
                shutil.copyfile(src, dst)
        hospitals[hid] = {"rows": len(rows), "labels": np.bincount(pooled.targets[rows], minlength=10).tolist()}
    held = [sum(c > 0 for c in h["labels"]) for h in hospitals.values()]
    print(f"2. split {len(pooled)} training images among {args.clients} hospitals by label, Dirichlet({args.beta}): "
          f"rows {[h['rows'] for h in hospitals.values()]}, classes held {held}; own folders in {out}")
    return hospitals


# ------------------------------------------------------------------------------------------------ 3. the jobs
def job_params(args, buffers: str) -> dict:
    """The ``params`` of the job: the consortium's model and loops, FedAvg, secure aggregation."""
    code = str(BYOM)
    return {"model": {"factory": "models:resnet8", "path": code, "kwargs": {"n_classes": 10, "in_channels": 1},
                      "n_classes": 10, "buffers": buffers},
            "train": {"factory": "models:train", "path": code},
            "evaluate": {"factory": "models:evaluate", "path": code},
            "strategy": "fedavg", "rounds": args.rounds, "local_epochs": args.local_epochs,
            "batch_size": args.batch_size, "learning_rate": args.lr, "momentum": args.momentum,
            "weight_decay": args.weight_decay, "seed": args.seed, "device": "cpu",
            "test_fraction": 0.0,  # every hospital trains on all its rows (the centralised run pools the same rows)
            "aggregation": {"kind": "secagg", "clip": args.clip, "seed": args.seed + 1}}


def write_job(work: Path, name: str, hospitals: dict, args, buffers: str) -> Path:
    """``work/<name>/job.yaml`` and its certificates (:meth:`secureflhv.Job.write`); returns the job file."""
    import secureflhv

    clients = {hid: {"factory": "secureflhv.data.torch_datasets:image_folder",
                     "kwargs": {"root": f"clients/{hid}", "grayscale": True, "classes": CLASS_DIRS}}
               for hid in hospitals}
    job = secureflhv.Job.horizontal(clients=clients, params=job_params(args, buffers), job_id=f"byom-{name}",
                                    output_dir="out", deadline_s=max(300.0, args.timeout / 2), base_dir=work)
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    return job.write(folder)


def party_env() -> dict:
    """The parties' environment: one torch thread each (the consortium's code is found through the job's
    ``params.model.path``)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_job(job_path: Path, args) -> float:
    """``secureflhv run job.yaml`` (every party its own process); the wall seconds. Exits on failure, showing
    the end of the parties' log (``run.log`` next to the job file)."""
    log = job_path.parent / "run.log"
    started = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "secureflhv", "run", str(job_path), "--timeout", str(args.timeout)],
                            cwd=job_path.parent, env=party_env(), stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - started
    if rc != 0:
        print(log.read_text()[-4000:])
        raise SystemExit(f"secureflhv run {job_path} failed (exit {rc}); the parties' log: {log}")
    return seconds


def server_record(folder: Path) -> dict:
    """Rounds run, per-round training loss and clipped coordinates, from the server's ``metrics.json``."""
    rounds = json.loads((folder / "out" / "server" / "metrics.json").read_text())["rounds"]
    clipped = sum(p.get("n_clipped", 0) for r in rounds for p in r.get("aggregation", {}).values())
    return {"rounds": len(rounds), "train_loss": [round(r["train_loss"], 4) for r in rounds], "clipped": clipped}


# ------------------------------------------------------------------------------------------------ 4. scoring
def read_pngs(roots) -> tuple[np.ndarray, np.ndarray]:
    """The images under each ``root/<class>/*.png`` of ``roots`` as (float32 (n, 1, 28, 28) in [0, 1], int64 (n,)
    class ids), read with Pillow (the centralised run's own reader: pooled hospital folders, the test folder)."""
    from PIL import Image

    xs, ys = [], []
    for root in roots:
        for label, name in enumerate(CLASS_DIRS):
            for f in sorted((Path(root) / name).glob("*.png")):
                with Image.open(f) as im:
                    xs.append(np.asarray(im.convert("L"), dtype=np.uint8))
                ys.append(label)
    return np.stack(xs)[:, None].astype(np.float32) / np.float32(255), np.asarray(ys, dtype=np.int64)


def accuracy(predict, X: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    """Share of ``y`` that ``predict`` (float32 images -> class ids) gets right, in batches."""
    pred = np.concatenate([predict(X[i:i + batch]) for i in range(0, len(y), batch)])
    return float(np.mean(pred == y))


def centralised(X: np.ndarray, y: np.ndarray, X_test: np.ndarray, y_test: np.ndarray, args) -> dict:
    """The consortium's ResNet-8 trained in one place on the pooled rows, in plain torch: the job's initial
    model (torch seeded with the job's seed), SGD with its settings, rounds x local epochs passes in batches
    of ``batch_size``; its test accuracy and wall seconds."""
    import torch
    from torch.nn import functional as F

    import models

    started = time.monotonic()
    torch.manual_seed(args.seed)
    net = models.resnet8(10, 1)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    rng, Xt, yt = np.random.default_rng(args.seed), torch.from_numpy(X), torch.from_numpy(y)
    epochs = args.rounds * args.local_epochs
    net.train()
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(y)))
        for i in range(0, len(y), args.batch_size):
            rows = order[i:i + args.batch_size]
            opt.zero_grad()
            F.cross_entropy(net(Xt[rows]), yt[rows]).backward()
            opt.step()
    net.train(False)

    def predict(xb):
        with torch.no_grad():
            return net(torch.from_numpy(xb)).argmax(1).numpy()

    return {"accuracy": accuracy(predict, X_test, y_test), "epochs": epochs,
            "seconds": round(time.monotonic() - started, 1)}


def federated_accuracy(party_dir: Path, ca: Path, X_test, y_test) -> float:
    """Test accuracy of the model in ``party_dir``'s signed bundle (:func:`secureflhv.load_model`, verified
    against the job's CA; the ResNet-8 is rebuilt through its factory)."""
    import secureflhv

    return accuracy(secureflhv.load_model(party_dir, ca=ca).predict, X_test, y_test)


# ------------------------------------------------------------------------------------------------ 5. simulate
def simulate_equal(job_path: Path, args) -> dict | None:
    """The job of ``job_path`` run in this process (:func:`secureflhv.simulate`, output ``simulated/`` next to
    it): whether its global model equals the process run's bit for bit. None when the API is not there."""
    try:
        import secureflhv

        simulate, Job = secureflhv.simulate, secureflhv.Job
    except (ImportError, AttributeError) as exc:
        print(f"5. secureflhv.simulate is not available ({exc}); skipped")
        return None
    folder = job_path.parent
    started = time.monotonic()
    simulate(Job.from_yaml(job_path), progress=False, output_dir=folder / "simulated", timeout_s=args.timeout)
    seconds = time.monotonic() - started
    with np.load(folder / "out" / "server" / "global_model.npz") as a, \
            np.load(folder / "simulated" / "server" / "global_model.npz") as b:
        same = sorted(a.files) == sorted(b.files) and all(
            a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a.files)
        return {"equal": bool(same), "tensors": len(a.files), "seconds": round(seconds, 1)}


# ------------------------------------------------------------------------------------------------ report
def report(res: dict, work: Path) -> None:
    """The table, and ``work/results.json``."""
    c, a, b = res["centralised"], res["fedavg"], res["fedbn"]
    rows = [("centralised (pooled rows, plain torch)", c["accuracy"], f"{c['epochs']} epochs", c["seconds"]),
            ("FedAvg, buffers: aggregate (server's model)", a["accuracy"], f"{a['rounds']} x {res['local_epochs']}",
             a["seconds"]),
            (f"FedBN, buffers: local (mean of {len(b['client_accuracy'])} hospitals' own models)", b["accuracy"],
             f"{b['rounds']} x {res['local_epochs']}", b["seconds"])]
    print(f"\nheld-out test accuracy ({res['test_rows']} Fashion-MNIST test rows, the same for all three):")
    print(f"  {'model':58s} {'accuracy':>8s} {'rounds x epochs':>16s} {'wall s':>7s}")
    for name, acc, steps, secs in rows:
        print(f"  {name:58s} {acc:8.4f} {steps:>16s} {secs:7.1f}")
    accs = b["client_accuracy"].values()
    print(f"  FedBN per hospital: min {min(accs):.4f}, max {max(accs):.4f} (each hospital's own batch-norm layers "
          f"on the common test rows; FedBN has no global batch-norm statistics)")
    sim = res.get("simulate")
    if sim is not None:
        print(f"  secureflhv.simulate(FedAvg job) == secureflhv run processes, bit for bit: {sim['equal']} "
              f"({sim['tensors']} tensors; simulation {sim['seconds']:.1f} s)")
    (work / "results.json").write_text(json.dumps(res, indent=2))
    print(f"results: {work / 'results.json'}")


def run_federated(work: Path, hospitals: dict, args, X_test, y_test) -> dict:
    """Steps 3-4 for both jobs: write, run as processes, score. {fedavg: ..., fedbn: ...}."""
    out = {}
    for name, buffers in (("fedavg", "aggregate"), ("fedbn", "local")):
        job_path = write_job(work, name, hospitals, args, buffers)
        print(f"3. {name}: server + {len(hospitals)} hospitals as processes over gRPC + mutual TLS, secure "
              f"aggregation, buffers: {buffers}; job {job_path}")
        seconds = run_job(job_path, args)
        ca, res = job_path.parent / "certs" / "ca.pem", server_record(job_path.parent)
        if buffers == "aggregate":
            res["accuracy"] = federated_accuracy(job_path.parent / "out" / "server", ca, X_test, y_test)
        else:  # no global batch-norm statistics: each hospital's own model on the common test rows
            res["client_accuracy"] = {hid: federated_accuracy(job_path.parent / "out" / hid, ca, X_test, y_test)
                                      for hid in hospitals}
            res["accuracy"] = float(np.mean(list(res["client_accuracy"].values())))
        res["seconds"] = round(seconds, 1)
        print(f"   {res['rounds']} rounds in {seconds:.1f} s, training loss per round {res['train_loss']}, "
              f"test accuracy {res['accuracy']:.4f}")
        out[name] = {**res, "job": str(job_path)}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)  # as every party process (OMP_NUM_THREADS=1): the simulation then matches bit for bit
    sys.path.insert(0, str(BYOM))  # the consortium's code, installed here as at every hospital
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("*\n")  # generated files: never committed
    started = time.monotonic()
    fmnist = write_fmnist(work, args)
    hospitals = split_hospitals(work, fmnist / "train", args)
    X_test, y_test = read_pngs([fmnist / "test"])
    res = {"rows": args.rows, "test_rows": len(y_test), "clients": args.clients, "beta": args.beta,
           "rounds": args.rounds, "local_epochs": args.local_epochs, "batch_size": args.batch_size, "lr": args.lr,
           "momentum": args.momentum, "seed": args.seed, "hospitals": hospitals}
    res.update(run_federated(work, hospitals, args, X_test, y_test))
    X, y = read_pngs([work / "clients" / hid for hid in hospitals])
    print(f"4. centralised: the same ResNet-8 on the {len(y)} pooled hospital rows, "
          f"{args.rounds * args.local_epochs} epochs")
    res["centralised"] = centralised(X, y, X_test, y_test, args)
    if not args.no_simulate:
        print("5. the FedAvg job again, every party in this process (secureflhv.simulate)")
        res["simulate"] = simulate_equal(Path(res["fedavg"]["job"]), args)
    res["chance"] = 1 / 10
    res["wall_seconds"] = round(time.monotonic() - started, 1)
    report(res, work)
    print(f"total wall time {res['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
