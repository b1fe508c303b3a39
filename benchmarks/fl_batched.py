#!/usr/bin/env python3
"""Client-samples per second of a simulated FL round's local training: the clients of one process
trained as one batch (``torch.func.vmap`` over stacked parameters, :mod:`secureflhv.horizontal.batched`)
against the plain per-client loop (:func:`~secureflhv.horizontal.strategies.local_sgd`), same run.

``--parties`` clients × ``--rows`` random rows each, one local epoch of SGD (batch ``--batch-size``, lr
0.02, momentum 0.9) from the same start, for NIID-Bench's MLP (64 features, 32-16-8) and its simple CNN
(28×28 images). Each mode runs twice and the second pass counts (warm caches); the largest difference
between the two modes' trained parameters is printed beside the speeds (it must be ~1e-7: same maths).
One torch thread (as in ``niid_accuracy.py``); the row states the machine's load average (other jobs
share the cores: under load both modes slow down, and the ratio is what counts). Records the row ``niid_batched`` in docs/benchmarks.md
unless ``--quick``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def measure(model_name: str, n_features: int, parties: int, rows: int, batch_size: int, device: str):
    """(batched client-samples/s, loop client-samples/s, max |batched − loop| of the trained parameters)."""
    from secureflhv.horizontal.batched import TrainRequest, batched_local_sgd
    from secureflhv.horizontal.models import ModelSpec, build_model, get_flat, set_flat
    from secureflhv.horizontal.strategies import LocalTrainConfig, batch_rng, local_sgd

    spec = ModelSpec(name=model_name, n_features=n_features, n_classes=10)
    cfg = LocalTrainConfig(epochs=1, batch_size=batch_size, lr=0.02, momentum=0.9)
    rng = np.random.default_rng(0)
    data = [(rng.random((rows, n_features), dtype=np.float32), rng.integers(0, 10, rows)) for _ in range(parties)]
    start = get_flat(build_model(spec, seed=0))
    speed, trained = {}, {}
    for mode in ("loop", "batched", "loop", "batched"):  # the second pass of each counts
        models = [build_model(spec) for _ in range(parties)]
        for m in models:
            set_flat(m, start)
        t0 = time.perf_counter()
        if mode == "loop":
            for k, (X, y) in enumerate(data):
                local_sgd(models[k], X, y, cfg, batch_rng(0, 1, f"party-{k}"))
        else:
            batched_local_sgd([TrainRequest(models[k], X, y, cfg, batch_rng(0, 1, f"party-{k}"))
                               for k, (X, y) in enumerate(data)], device)
        speed[mode] = parties * rows / (time.perf_counter() - t0)
        trained[mode] = [get_flat(m) for m in models]
    err = max(float(np.abs(a - b).max()) for a, b in zip(trained["loop"], trained["batched"]))
    return speed["batched"], speed["loop"], err


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--rows", type=int, default=400, help="rows per client")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (batched mode only; the loop stays on cpu)")
    ap.add_argument("--quick", action="store_true", help="few rows, nothing recorded")
    args = ap.parse_args(argv)
    import torch

    from secureflhv.horizontal.batched import resolve_device

    try:
        resolve_device(args.device)
    except ValueError as exc:
        ap.error(str(exc))
    torch.set_num_threads(1)
    rows = 48 if args.quick else args.rows
    import os

    load0 = os.getloadavg()[0]
    res = {}
    for name, n_features in (("mlp", 64), ("cnn", 784)):
        res[name] = measure(name, n_features, args.parties, rows, args.batch_size, args.device)
        b, lo, err = res[name]
        print(f"{name}: batched {b:,.0f} client-samples/s, loop {lo:,.0f}, ×{b / lo:.2f}; "
              f"max |batched − loop| = {err:.1e}", flush=True)
    if not args.quick:
        import _report

        (mb, ml, _), (cb, cl, _) = res["mlp"], res["cnn"]
        load1 = os.getloadavg()[0]
        _report.record("niid_batched", {
            "what": f"FL simulation: local SGD of {args.parties} clients × {rows} rows, batch {args.batch_size}, "
                    f"one thread, {args.device}, load average {load0:.1f} / {load1:.1f} (start / end) on "
                    f"{os.cpu_count()} cores (`fl_batched.py`)",
            "ours": f"batched (vmap): MLP {mb:,.0f}, CNN {cb:,.0f} client-samples/s",
            "baseline": f"per-client loop: MLP {ml:,.0f}, CNN {cl:,.0f} client-samples/s",
            "ratio": f"MLP ×{mb / ml:.1f}, CNN ×{cb / cl:.2f}"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
