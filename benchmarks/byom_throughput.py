#!/usr/bin/env python3
"""FL throughput in client-samples per second: secureflhv's horizontal FL with secure aggregation against
Flower's simulation of the same model and data with SecAgg+, in the same run (issue 37).

    .venv/bin/python benchmarks/byom_throughput.py --quick      # smoke run, nothing recorded
    .venv/bin/python benchmarks/byom_throughput.py              # recorded run (row ``byom_throughput``)
    .venv/bin/python benchmarks/byom_throughput.py --clients 10 --rounds 2 --train-rows 2000 --no-record

Workload (``byom_models.py``, shared by both sides): ``--train-rows`` rows of Fashion-MNIST's training set
split over ``--clients`` clients by Dirichlet(``--beta``) over labels; FedAvg, every client in every round,
``--epochs`` local epochs of SGD (batch ``--batch-size``, ``--lr``, ``--momentum``, weight decay 1e-5),
weighted by rows; the final global model scored on ``--test-rows`` rows of the test set.

secureflhv (:func:`secureflhv_figures`): :class:`~secureflhv.horizontal.fl.HorizontalServer` and one
:class:`~secureflhv.horizontal.fl.HorizontalClient` per client as threads of this process over
:class:`~secureflhv.transport.InProcessNetwork` with certificate identities (as over mutual TLS, no sockets),
aggregation ``secagg`` (Bonawitz et al., CCS 2017, actively secure: signed keys and the consistency check,
the library's default clip / precision / threshold) and ``plain`` (the server sees every update) as the
baseline; one torch thread per operation. The model comes through the user-model path
(``params.model.factory``: ``byom_models:cnn`` or ``byom_models:resnet8``, :mod:`secureflhv.horizontal.user_model`),
so ResNet-8's batch-norm statistics are aggregated with its parameters, as Flower sends them.

Flower (:func:`flower_figures`): ``flower_side.py`` in Flower's own virtualenv (``benchmarks/flower_env.sh``
makes ``.venv-flower``; flwr pins protobuf < 7, secureflhv needs >= 7), Ray simulation runtime, SecAgg+
(``SecAggPlusWorkflow`` + ``secaggplus_mod``, semi-honest) and without secure aggregation. Without that
virtualenv the output says "Flower not measured (...)", never a figure from elsewhere.

What is timed, both sides: the FL rounds only (broadcast, local training, aggregation; secureflhv's round
also its metrics exchange, which is empty here: clients hold no test rows). Not timed: process / Ray
start-up, building the parties, one throwaway training step per process (first-call costs), the final
scoring. client-samples/s = Σ_clients rows × epochs × rounds / seconds of the rounds. Both sides use both
cores: Flower as ``--cpus`` Ray actors of one torch thread, secureflhv as client threads of one torch thread.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import byom_models  # noqa: E402

FLOWER_VENV = ROOT / ".venv-flower"
NOT_MEASURED = "Flower not measured"
SECUREFLHV_MODELS = ("cnn", "resnet8")


def secureflhv_figures(n_clients: int, rounds: int, *, epochs: int = 1, batch_size: int = 32, lr: float = 0.03,
                       momentum: float = 0.9, train_rows: int = 2000, test_rows: int = 2000, beta: float = 0.5,
                       seed: int = 0, model: str = "cnn", kinds=("secagg", "plain")) -> dict:
    """secureflhv's horizontal FedAvg on the benchmark's workload, for each aggregation kind in ``kinds``.

    ``HorizontalServer`` / ``HorizontalClient`` threads over an ``InProcessNetwork`` with certificate identities,
    the user's model ``byom_models:<model>`` through the user-model path (``UserModelSpec``, its factory seeded
    by the job's seed) on the same rows as flat float32 (n, 784). ValueError for another ``model``.

    Returns ``{kind: {"client_samples_per_s", "wall_s" (sum of the rounds' seconds at the server),
    "round_s" (list), "samples", "rounds", "accuracy" (final global model on the test rows), "clipped" (update
    coordinates clipped to the aggregation's clip range, all rounds; 0 for plain)}}``.
    Raises RuntimeError naming the party when a role fails.
    """
    if model not in SECUREFLHV_MODELS:
        raise ValueError(f"secureflhv side runs {SECUREFLHV_MODELS}, not {model!r}")
    import torch

    from secureflhv.horizontal.models import build_model
    from secureflhv.horizontal.user_model import UserModelSpec

    torch.set_num_threads(1)
    shards, test = byom_models.workload(n_clients, train_rows, test_rows, beta, seed)
    spec = UserModelSpec(factory=f"byom_models:{model}", path=BENCH, kwargs={"n_classes": 10}, n_classes=10)
    byom_models.warm_up(build_model(spec), *shards[0], batch_size)
    ids = [f"client{i:02d}" for i in range(n_clients)]
    out = {}
    with tempfile.TemporaryDirectory() as certs:
        from secureflhv.transport.certs import generate_certificates

        generate_certificates(certs, ["server", *ids])
        for kind in kinds:
            out[kind] = _secureflhv_run(kind, spec, shards, test, ids, certs, rounds, epochs, batch_size, lr,
                                        momentum, seed)
    return out


def _secureflhv_run(kind, spec, shards, test, ids, certs, rounds, epochs, batch_size, lr, momentum, seed) -> dict:
    """One FL job of aggregation ``kind`` as threads; its figures (see :func:`secureflhv_figures`)."""
    from secureflhv.horizontal.fl import FLConfig, HorizontalClient, HorizontalServer
    from secureflhv.horizontal.models import build_model, set_flat
    from secureflhv.horizontal.strategies import LocalTrainConfig
    from secureflhv.horizontal.strategy_registry import make_strategy
    from secureflhv.secagg import AggregationConfig
    from secureflhv.transport.inprocess import InProcessNetwork

    net = InProcessNetwork(f"byom-{kind}", ["server", *ids], deadline=600, cert_dir=certs)
    cfg = FLConfig(rounds=rounds, seed=seed, local=LocalTrainConfig(epochs=epochs, batch_size=batch_size, lr=lr,
                                                                    momentum=momentum),
                   aggregation=AggregationConfig(kind=kind, job_clients=ids), round_timeout_s=600)
    server = HorizontalServer(net.transport("server"), ids, spec, make_strategy("fedavg"), cfg)
    roles = {"server": server.run}
    for pid, (X, y) in zip(ids, shards):
        roles[pid] = HorizontalClient(net.transport(pid), "server", X, y, X[:0], y[:0], spec, make_strategy("fedavg"),
                                      cfg).run
    errors: dict[str, BaseException] = {}

    def play(pid):
        try:
            roles[pid]()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[pid] = exc
            net.take_down(pid)

    threads = [threading.Thread(target=play, args=(pid,), daemon=True) for pid in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3600)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"secureflhv {kind}: " + ("; ".join(f"{p}: {e!r}" for p, e in errors.items()) or "hung"))
    secs = [rec.seconds for rec in server.history]
    final = build_model(spec)
    set_flat(final, server.global_vec)
    samples = sum(len(y) for _, y in shards) * epochs * rounds
    clipped = sum(int(rec.aggregation.get("model", {}).get("n_clipped") or 0) for rec in server.history)
    return {"client_samples_per_s": samples / sum(secs), "wall_s": sum(secs), "round_s": secs, "samples": samples,
            "rounds": rounds, "accuracy": _accuracy(final, *test), "clipped": clipped}


def _accuracy(model, X, y) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(X[i:i + 1000])).argmax(1) for i in range(0, len(y), 1000)])
    return float((pred.numpy() == y).mean())


def flower_python(given: str | None = None) -> str | None:
    """Flower's interpreter: ``given``, else $SECUREFLHV_FLOWER_PYTHON, else ``.venv-flower/bin/python`` when it
    exists; None otherwise."""
    given = given or os.environ.get("SECUREFLHV_FLOWER_PYTHON")
    if given:
        return given
    venv = FLOWER_VENV / "bin" / "python"
    return str(venv) if venv.exists() else None


def flower_unavailable(python: str | None) -> str | None:
    """Why Flower cannot be measured with ``python`` ("Flower not measured (...)"), or None when it can."""
    if python is None:
        return f"{NOT_MEASURED} (no {FLOWER_VENV}: run benchmarks/flower_env.sh)"
    try:
        done = subprocess.run([python, "-c", "import flwr, ray, torch"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{NOT_MEASURED} ({python}: {exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"{NOT_MEASURED} ({python} cannot import flwr[simulation] and torch: {last})"
    return None


def flower_figures(n_clients: int, rounds: int, *, epochs: int = 1, batch_size: int = 32, lr: float = 0.03,
                   momentum: float = 0.9, train_rows: int = 2000, test_rows: int = 2000, beta: float = 0.5,
                   seed: int = 0, model: str = "cnn", cpus: int | None = None, python: str | None = None,
                   timeout_s: float = 3600) -> dict | None:
    """Flower's FedAvg on the same workload, SecAgg+ and plain, run by ``flower_side.py`` in Flower's venv.

    Returns its JSON (``{"flwr", "ray", "model", ..., "plain": figures, "secaggplus": figures}``, figures as
    :func:`secureflhv_figures`' plus ``warmup_s`` and ``simulation_s``), or None when no Flower interpreter
    is found or it cannot import flwr (the reason: :func:`flower_unavailable`). Raises RuntimeError with the
    tail of its stderr when the simulation itself fails or runs past ``timeout_s``.
    """
    python = flower_python(python)
    if flower_unavailable(python) is not None:
        return None
    cmd = [python, str(BENCH / "flower_side.py"), "--model", model, "--clients", str(n_clients),
           "--rounds", str(rounds), "--epochs", str(epochs), "--batch-size", str(batch_size), "--lr", str(lr),
           "--momentum", str(momentum), "--train-rows", str(train_rows), "--test-rows", str(test_rows),
           "--beta", str(beta), "--seed", str(seed), "--cpus", str(cpus or os.cpu_count())]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"flower_side.py ran past {timeout_s} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"flower_side.py exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(lines[-1])


def _line(name: str, f: dict) -> str:
    return (f"{name}: {f['client_samples_per_s']:,.0f} client-samples/s ({f['samples']:,} samples in "
            f"{f['wall_s']:.2f} s over {f['rounds']} rounds: {', '.join(f'{s:.2f}' for s in f['round_s'])} s; "
            f"final accuracy {f['accuracy']:.3f})")


def _ratio(a: dict | None, b: dict | None) -> str:
    return f"{a['client_samples_per_s'] / b['client_samples_per_s']:.2f}×" if a and b else "n/a"


def report(ours: dict | None, fl: dict | None, ours_reason: str, fl_reason: str) -> tuple[list[str], dict]:
    """Printable lines and the recorded row's cells (ours, baseline, ratio) from both sides' figures; a side
    that is None is shown by its reason."""
    lines, cells = [], {}
    if ours:
        lines += [_line("secureflhv secagg", ours["secagg"]), _line("secureflhv plain ", ours["plain"]),
                  f"secureflhv secagg / plain: {_ratio(ours['secagg'], ours['plain'])} of the throughput"]
        cells["ours"] = (f"secagg {ours['secagg']['client_samples_per_s']:,.0f} client-samples/s (accuracy "
                         f"{ours['secagg']['accuracy']:.3f}); plain {ours['plain']['client_samples_per_s']:,.0f}")
    else:
        lines.append(ours_reason)
        cells["ours"] = ours_reason
    if fl:
        tag = f"Flower {fl['flwr']} (Ray {fl['ray']} simulation, {fl['cpus']} actors)"
        lines += [_line(f"{tag} SecAgg+", fl["secaggplus"]), _line(f"{tag} plain  ", fl["plain"]),
                  f"Flower SecAgg+ / plain: {_ratio(fl['secaggplus'], fl['plain'])} of the throughput; start-up "
                  f"not timed: {fl['plain']['simulation_s'] - fl['plain']['wall_s']:.1f} s per simulation"]
        cells["baseline"] = (f"{tag}: SecAgg+ {fl['secaggplus']['client_samples_per_s']:,.0f} client-samples/s "
                             f"(accuracy {fl['secaggplus']['accuracy']:.3f}); plain "
                             f"{fl['plain']['client_samples_per_s']:,.0f}")
    else:
        lines.append(fl_reason)
        cells["baseline"] = fl_reason
    if ours and fl:
        lines.append(f"secureflhv secagg / Flower SecAgg+: {_ratio(ours['secagg'], fl['secaggplus'])}; "
                     f"secureflhv plain / Flower plain: {_ratio(ours['plain'], fl['plain'])}")
    cells["ratio"] = (f"secagg / SecAgg+ {_ratio(ours and ours['secagg'], fl and fl['secaggplus'])}; "
                      f"plain / plain {_ratio(ours and ours['plain'], fl and fl['plain'])}")
    return lines, cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=SECUREFLHV_MODELS, default="resnet8",
                    help="the user's model on both sides (byom_models.py): ResNet-8 with batch norm, or a small CNN")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1, help="local epochs per round")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--train-rows", type=int, default=3000, help="Fashion-MNIST training rows over all clients")
    ap.add_argument("--test-rows", type=int, default=2000, help="held-out rows scoring the final model")
    ap.add_argument("--beta", type=float, default=0.5, help="Dirichlet concentration of the label split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flower-python", help="interpreter with flwr[simulation] and torch (default: "
                                            "$SECUREFLHV_FLOWER_PYTHON, else .venv-flower/bin/python)")
    ap.add_argument("--no-flower", action="store_true", help="do not measure Flower")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round, 500 train / 500 test rows, nothing recorded")
    ap.add_argument("--no-record", action="store_true", help="print the figures, record nothing")
    ap.add_argument("--json", metavar="PATH", help="also write both sides' figures to PATH")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.train_rows, a.test_rows = 1, 500, 500
    kw = dict(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, momentum=a.momentum, train_rows=a.train_rows,
              test_rows=a.test_rows, beta=a.beta, seed=a.seed, model=a.model)
    shards, _ = byom_models.workload(a.clients, a.train_rows, a.test_rows, a.beta, a.seed)
    sizes = sorted(len(y) for _, y in shards)
    load0 = os.getloadavg()[0]
    print(f"{a.model} on Fashion-MNIST: {a.clients} clients (rows min / median / max {sizes[0]} / "
          f"{sizes[len(sizes) // 2]} / {sizes[-1]}, Dirichlet {a.beta}), {a.rounds} rounds × {a.epochs} epoch(s), "
          f"batch {a.batch_size}, lr {a.lr}, momentum {a.momentum}; {os.cpu_count()} CPUs, load average {load0:.1f}",
          flush=True)
    ours, why_not = secureflhv_figures(a.clients, a.rounds, **kw), ""
    fl = None
    if a.no_flower:
        why_fl = f"{NOT_MEASURED} (--no-flower)"
    else:
        why_fl = flower_unavailable(flower_python(a.flower_python))
        fl = None if why_fl else flower_figures(a.clients, a.rounds, python=a.flower_python, **kw)
    lines, cells = report(ours, fl, why_not, why_fl or "")
    print("\n".join(lines), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"secureflhv": ours, "flower": fl, "flower_reason": why_fl}, indent=1))
    if not (a.quick or a.no_record):
        import _report

        _report.record("byom_throughput", {
            "what": f"FL throughput with secure aggregation (ours: secagg, Flower: SecAgg+), FedAvg of {a.model} on "
                    f"Fashion-MNIST, {a.clients} clients (Dirichlet {a.beta}) × {a.train_rows:,} rows in all, "
                    f"{a.rounds} rounds × {a.epochs} epoch, batch {a.batch_size}, in-process "
                    f"simulation on {os.cpu_count()} cores, load average {load0:.1f} / {os.getloadavg()[0]:.1f} "
                    f"(start / end) (`byom_throughput.py`)", **cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
