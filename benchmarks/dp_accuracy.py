#!/usr/bin/env python3
"""Accuracy, time and bytes of client-level DP in horizontal FedAvg: central vs distributed noise (issue 38).

What runs. Fashion-MNIST (Debian's IDX files), its 60,000 training rows split IID (``--split dirichlet``:
label-Dirichlet(``--beta``)) among ``--clients`` simulated clients (default 100), every party in this process
(:func:`secureflhv.simulate`: the real protocol over the in-process transport, one thread per party). The model is
multinomial logistic regression on the 784 pixels (``hidden: []``: 7,850 parameters), which makes 100 clients x
several rounds affordable on 2 cores. FedAvg, every client in every round, ``--local-epochs`` of SGD.

The grid (``params.dp`` with ``target_epsilon`` calibration, δ = ``--delta``, clip ``--clip-norm``):

- no DP (ε = ∞), the reference;
- ``placement: central``: the server adds N(0, (zC)²) to the unmasked sum, z calibrated for ε over the rounds;
- ``placement: distributed``: each client clips, rotates, scales by 1/γ, rounds and adds its Skellam noise share in
  a ring of ``bits`` bits per coordinate (Kairouz, Liu, Steinke, ICML 2021; Agarwal, Kairouz, Liu, NeurIPS 2021),
  for each of ``--bits``;

at each ε of ``--epsilons``. The accuracy sweep aggregates with ``kind: plain_quantised`` (secure aggregation's
integer encoding and ring without the masks): the distributed mechanism's arithmetic is the same as under
``secagg`` (tests/horizontal/test_dp_distributed.py checks the two end bit for bit with seeded noise), and
``secagg`` with 100 clients in one process costs minutes per round. The sweep uses aggregation threshold
``--threshold`` (default 1.0, t = n: no client drops out in a simulation, so each client adds μ/(n − c), the least
that carries the target μ; the library's default t ≈ n/2 tolerates dropouts by having each client add about twice
that, and a round then records a smaller ε than the target: ``--threshold`` 0 keeps the job's default).

Cost of DP. With ``kind: secagg`` (Bonawitz et al. masks, certificate identities) on ``--cost-clients`` clients
for ``--cost-rounds`` rounds, the same job without DP, with central DP and with distributed DP at each of
``--bits``: seconds per round (the server's round records: median over the rounds after the first) and bytes per
client per round (what each client sent + received over the run, framing included, mean over the clients,
divided by the rounds; the one-time rendezvous and layout agreement are in it).

Reported per cell (placement, ε, bits): the final global model's accuracy on the 10,000 Fashion-MNIST test rows
(mean ± sd over ``--seeds``), the ε and δ the server's last round record holds, z (central) or γ, bits per
coordinate incl. the Hadamard padding, the noise's std on the sum (model units), and the distributed − central
gap at each ε. Writes ``dp_accuracy.json``, ``dp_accuracy.md`` and ``img/dp_accuracy.png`` into ``--out-dir``
(default docs/; ``--quick``: a temp folder unless given).

Record-level DP-SGD (``--record``, or ``--record-only JSON`` to run only it and merge it into a saved
dp_accuracy.json). ``--record-silos`` silos (default 10) hold ``--record-rows`` training rows split IID; the same
softmax regression, FedAvg over ``--record-kind`` (default ``secagg``); each silo runs ``params.record_dp``
(Abadi et al., CCS 2016, Algorithm 1, through Opacus: Poisson sampling with q = batch / n_local, per-record clip
``--record-clip-norm``, Gaussian noise on every step) with ``target_epsilon`` ∈ ``--record-epsilons`` at δ =
``--delta``, and once without DP. Reported per ε: the final model's test accuracy (mean ± sd over
``--record-seeds``), each silo's own recorded ε (its ``metrics.json`` ``record_epsilon`` after the last round; its
bundle's ``extra.privacy`` for z, q and steps), the max over silos, z, q, steps, seconds per round with and
without DP. ``--record-placements`` adds the distributed placement (``params.record_dp.placement: distributed``):
``--record-dgd-rounds`` rounds of one full-batch DP-GD step at ``--record-dgd-lr``, Skellam noise shares inside
secure aggregation, at the same ε, C and δ, with its own clip-only reference; reported beside local DP-SGD at each
ε, with the server's recorded ε and the noise on the gradient sum and on the record count. Adds ``record`` to the
JSON, a section to the Markdown and ``img/dp_accuracy_record.png``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COMMAND = "python benchmarks/dp_accuracy.py"
MODEL = {"name": "mlp", "n_features": 784, "n_classes": 10, "hidden": []}  # softmax regression


def _machine() -> str:
    import torch

    from _report import cpu_model  # benchmarks/ is the script's folder

    return (f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), {cpu_model()}; Python "
            f"{platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}")


def eps_label(eps: float) -> str:
    return "∞" if math.isinf(eps) else f"{eps:g}"


def cell_key(placement: str, eps: float, bits: int | None) -> str:
    """``none|inf|-``, ``central|4|-``, ``distributed|4|18``: the JSON's key of one grid cell."""
    return f"{placement}|{'inf' if math.isinf(eps) else f'{eps:g}'}|{bits if bits else '-'}"


def grid(epsilons: list[float], bits: list[int]) -> list[tuple[str, float, int | None]]:
    """(placement, ε, bits) of every cell: no DP once, central and distributed at each finite ε."""
    cells = [("none", math.inf, None)]
    for eps in epsilons:
        if math.isinf(eps):
            continue
        cells.append(("central", eps, None))
        cells += [("distributed", eps, b) for b in bits]
    return cells


# ------------------------------------------------------------------------------------------------- setup
class Workspace:
    """One folder per seed: the clients' ``.npz`` shards (written once) and one set of certificates (so that
    :func:`secureflhv.simulate` does not generate 101 of them per run)."""

    def __init__(self, root: Path, train, n_clients: int, split: str, beta: float, seed: int):
        from secureflhv.data import partition, write_shards
        from secureflhv.transport.certs import generate_certificates

        self.root = root / f"seed{seed}-{split}-{n_clients}"
        self.ids = [f"client-{i:03d}" for i in range(n_clients)]
        scheme, kw = ("iid", {}) if split == "iid" else ("label_dirichlet", {"beta": beta})
        part = partition(scheme, train, n_clients, seed=seed, **kw)
        self.sizes = part.sizes.tolist()
        self.shards = write_shards(train, part, self.root / "data", fmt="npz")
        generate_certificates(self.root / "certs", ["server", *self.ids], overwrite=True)

    def clients(self, n: int | None = None) -> dict[str, str]:
        ids = self.ids[:n] if n else self.ids
        return {c: str(p) for c, p in zip(ids, self.shards)}


def job_params(args, placement: str, eps: float, bits: int | None, kind: str, rounds: int, seed: int,
               threshold: float | None) -> dict:
    """The job's ``params``: FedAvg of softmax regression, ``params.dp`` per the cell."""
    agg = {"kind": kind, "clip": 1.0, "stage_timeout_s": 120, "input_timeout_s": 600}
    if threshold:
        agg["threshold"] = threshold
    params = {"strategy": "fedavg", "model": MODEL, "rounds": rounds, "local_epochs": args.local_epochs,
              "batch_size": args.batch_size, "learning_rate": args.lr, "momentum": 0.0, "seed": seed,
              "test_fraction": 0.0, "aggregation": agg}
    if placement != "none":
        dp = {"placement": placement, "clip_norm": args.clip_norm, "target_epsilon": eps, "delta": args.delta}
        if placement == "distributed":
            dp["bits"] = bits
        params["dp"] = dp
    return params


def test_accuracy(model, test) -> float:
    """Accuracy of the global model (a torch module) on the test rows."""
    import torch

    with torch.no_grad():
        pred = model(torch.from_numpy(test.X)).argmax(1).numpy()
    return float(np.mean(pred == test.y))


def client_bytes(wire: dict) -> float:
    """Mean over the clients of the bytes each sent + received (payload + framing) over the run."""
    from secureflhv.transport.wire import totals

    per = []
    for party, stats in wire.items():
        if party != "server":
            t = totals(stats)
            per.append(t["sent"] + t["sent_framing"] + t["received"] + t["received_framing"])
    return float(np.mean(per)) if per else float("nan")


def run_cell(ws: Workspace, test, args, placement: str, eps: float, bits: int | None, *, kind: str, rounds: int,
             seed: int, threshold: float | None, n_clients: int | None = None, tag: str = "acc") -> dict:
    """One simulated job; its accuracy on ``test``, the last round's privacy record, time and bytes."""
    import secureflhv

    params = job_params(args, placement, eps, bits, kind, rounds, seed, threshold)
    name = f"{tag}-{placement}-{eps_label(eps).replace('∞', 'inf')}-{bits or 0}-{kind}"
    job = secureflhv.Job.horizontal(clients=ws.clients(n_clients), params=params, job_id="dp-accuracy",
                                    output_dir=str(ws.root / "out" / name), certs=ws.root / "certs",
                                    deadline_s=900, base_dir=ws.root)
    started = time.perf_counter()
    result = secureflhv.simulate(job, progress=False)
    wall = time.perf_counter() - started
    hist = result.history
    secs = [float(r["seconds"]) for r in hist]
    priv = hist[-1].get("privacy") or {}
    keep = ("epsilon", "delta", "mechanism", "placement", "noise_multiplier", "clip_norm", "bits",
            "bits_per_coordinate", "gamma", "noise_std", "variance", "variance_carried", "variance_accounted",
            "survivors", "max_colluders", "wrap_probability")
    return {"accuracy": test_accuracy(result.model, test), "rounds_run": len(hist),
            "round_seconds": secs, "median_round_s": statistics.median(secs[1:] or secs), "wall_s": wall,
            "bytes_per_client_per_round": client_bytes(result.wire) / max(1, len(hist)),
            "privacy": {k: priv[k] for k in keep if k in priv},
            "k_bits": (hist[-1].get("aggregation") or {}).get("model", {}).get("k_bits")}


def noise_figures(priv: dict) -> dict:
    """The noise on one round's sum in model units: central z·C; distributed γ·√(variance carried) and, with the
    conditional rounding's variance (at most 1/4 per client and coordinate, integer units), its upper bound."""
    if priv.get("placement") == "central":
        std = priv["noise_multiplier"] * priv["clip_norm"]
        return {"noise_std_sum": std, "noise_std_sum_with_rounding": std}
    if priv.get("placement") == "distributed":
        g, n = priv["gamma"], priv.get("survivors", 0)
        return {"noise_std_sum": g * math.sqrt(priv["variance_carried"]),
                "noise_std_sum_with_rounding": g * math.sqrt(priv["variance_carried"] + n / 4)}
    return {}


def summarise(runs: list[dict]) -> dict:
    """Mean ± sd of the accuracy over the seeds; the privacy figures of the first seed (the same plan)."""
    accs = [r["accuracy"] for r in runs]
    out = {"accuracy_mean": float(np.mean(accs)), "accuracy_sd": float(np.std(accs, ddof=1)) if len(accs) > 1
           else 0.0, "accuracy": accs, "seeds": [r["seed"] for r in runs],
           "median_round_s": float(np.median([r["median_round_s"] for r in runs])),
           "bytes_per_client_per_round": float(np.mean([r["bytes_per_client_per_round"] for r in runs])),
           "rounds_run": runs[0]["rounds_run"], "privacy": runs[0]["privacy"], "k_bits": runs[0]["k_bits"]}
    out["epsilon_recorded_max"] = max((r["privacy"].get("epsilon", 0.0) for r in runs), default=0.0)
    out.update(noise_figures(runs[0]["privacy"]))
    return out


def gaps(cells: dict, epsilons: list[float], bits: list[int]) -> dict:
    """distributed − central accuracy (points) at each finite ε and bits."""
    out = {}
    for eps in epsilons:
        central = cells.get(cell_key("central", eps, None))
        if central is None:
            continue
        for b in bits:
            dist = cells.get(cell_key("distributed", eps, b))
            if dist is not None:
                out[cell_key("distributed", eps, b)] = 100 * (dist["accuracy_mean"] - central["accuracy_mean"])
    return out


def measure_cost(ws: Workspace, test, args, bits: list[int], seed: int) -> dict:
    """Seconds per round and bytes per client per round under ``secagg``: no DP, central, distributed per bits
    (``--cost-clients`` clients, ``--cost-rounds`` rounds, ε = the largest finite one of ``--epsilons``)."""
    eps = max(e for e in args.epsilons if not math.isinf(e))
    out = {}
    for placement, b in [("none", None), ("central", None)] + [("distributed", x) for x in bits]:
        e = math.inf if placement == "none" else eps
        print(f"[cost] secagg, {args.cost_clients} clients, {placement} bits={b or '-'} ε={eps_label(e)} ...",
              flush=True)
        r = run_cell(ws, test, args, placement, e, b, kind="secagg", rounds=args.cost_rounds, seed=seed,
                     threshold=None, n_clients=args.cost_clients, tag="cost")
        out[cell_key(placement, e, b)] = r
        print(f"   {r['median_round_s']:.2f} s/round, {r['bytes_per_client_per_round'] / 1e3:.1f} kB per client "
              f"per round, accuracy {r['accuracy']:.4f}, ε {r['privacy'].get('epsilon', math.inf):.3f}", flush=True)
    return out


# ------------------------------------------------------------------------------------------------- report
def plot(doc: dict, path: Path) -> None:
    """Accuracy against ε (log x), one line per placement / bits, the no-DP level as a horizontal line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    cells, s = doc["cells"], doc["settings"]
    eps = [e for e in s["epsilons"] if not math.isinf(e)]
    fig = Figure(figsize=(6.4, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lines = [("central", None, "central (Gaussian)")] + [("distributed", b, f"distributed, {b} bits")
                                                          for b in s["bits"]]
    for placement, b, label in lines:
        pts = [(e, cells[cell_key(placement, e, b)]) for e in eps if cell_key(placement, e, b) in cells]
        if pts:
            ax.errorbar([e for e, _ in pts], [100 * c["accuracy_mean"] for _, c in pts],
                        yerr=[100 * c["accuracy_sd"] for _, c in pts], marker="o", markersize=4, capsize=3,
                        label=label)
    none = cells.get(cell_key("none", math.inf, None))
    if none:
        ax.axhline(100 * none["accuracy_mean"], color="k", linestyle="--", linewidth=1, label="no DP (ε = ∞)")
    ax.set_xscale("log")
    ax.set_xticks(eps)
    ax.set_xticklabels([eps_label(e) for e in eps])
    ax.xaxis.set_minor_formatter(NullFormatter())  # no "3×10^0" between the ε ticks
    ax.set(xlabel=f"ε (δ = {s['delta']:g}, {s['rounds']} rounds)", ylabel="test accuracy (%)",
           title=f"Fashion-MNIST, softmax regression, {s['clients']} clients, client-level DP")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def _acc(c: dict) -> str:
    return f"{100 * c['accuracy_mean']:.2f} ± {100 * c['accuracy_sd']:.2f}"


def markdown(doc: dict) -> str:
    s, cells = doc["settings"], doc["cells"]
    eps = [e for e in s["epsilons"] if not math.isinf(e)]
    none = cells[cell_key("none", math.inf, None)]
    head = [
        "# Client-level DP: accuracy, time and bytes (central vs distributed noise)\n",
        f"Generated by `benchmarks/dp_accuracy.py` on {doc['date']}; do not edit by hand. Command:\n",
        f"```\n{doc['command']}\n```\n",
        f"Machine: {doc['machine']}. Whole run: {doc['seconds'] / 60:.1f} min.\n",
        "## Setting\n",
        f"- Fashion-MNIST (Debian's IDX files): {s['rows']:,} training rows split {s['split_text']} among "
        f"**{s['clients']} clients** (simulated in one process by `secureflhv.simulate`, the real protocol over the "
        f"in-process transport); accuracy of the final global model on **{s['test_rows']:,} test rows**.",
        f"- Model: multinomial logistic regression on the 784 pixels (`model: {{name: mlp, hidden: []}}`, "
        f"7,850 parameters). FedAvg, every client every round, {s['rounds']} rounds, {s['local_epochs']} local "
        f"epoch(s) of SGD (batch {s['batch_size']}, learning rate {s['lr']}, no momentum).",
        f"- `params.dp`: clip_norm C = {s['clip_norm']}, δ = {s['delta']:g}, `target_epsilon` = ε (calibrated by "
        f"every party for the {s['rounds']} rounds), RDP accountant, no amplification by sampling. Central: the "
        f"server adds N(0, (zC)²) to the unmasked sum. Distributed: Skellam shares inside the ring of `bits` bits "
        f"per coordinate.",
        f"- Accuracy sweep: `aggregation.kind: {s['sweep_kind']}` (secure aggregation's encoding and ring, no "
        f"masks: the distributed mechanism's arithmetic is the same as under `secagg`, which "
        f"tests/horizontal/test_dp_distributed.py checks bit for bit with seeded noise), threshold "
        f"{s['threshold_text']}.",
        f"- Seeds {', '.join(map(str, s['seeds']))} (partition, initial model, SGD order); the DP noise is drawn "
        f"from OS entropy. Cells give mean ± sd over the seeds.\n",
        "## Accuracy\n",
        f"No DP (ε = ∞): **{_acc(none)} %**.\n",
        "![accuracy against ε](img/dp_accuracy.png)\n",
        "| placement | bits | " + " | ".join(f"ε = {eps_label(e)}" for e in eps) + " |",
        "|---|---|" + "---|" * len(eps),
    ]
    rows = [("central", None)] + [("distributed", b) for b in s["bits"]]
    for placement, b in rows:
        vals = [_acc(cells[cell_key(placement, e, b)]) if cell_key(placement, e, b) in cells else "—" for e in eps]
        head.append(f"| {placement} | {b or '—'} | " + " | ".join(vals) + " |")
    head += ["", "Gap distributed − central (accuracy points, mean over seeds):\n",
             "| bits | " + " | ".join(f"ε = {eps_label(e)}" for e in eps) + " |", "|---|" + "---|" * len(eps)]
    for b in s["bits"]:
        vals = [f"{doc['gaps'][cell_key('distributed', e, b)]:+.2f}" if cell_key("distributed", e, b) in doc["gaps"]
                else "—" for e in eps]
        head.append(f"| {b} | " + " | ".join(vals) + " |")
    head += mechanism_table(doc, rows, eps)
    head += ["", doc.get("gap_text", ""), ""]
    return "\n".join(head) + "\n" + cost_markdown(doc) + "\n" + record_markdown(doc)


def mechanism_table(doc: dict, rows: list, eps: list[float]) -> list[str]:
    """Markdown lines: ε recorded, z or γ, bits per coordinate and the noise on the sum, per cell."""
    cells = doc["cells"]
    head: list[str] = []
    head += ["", "## The mechanisms' figures (last round's record, first seed)\n",
             "ε and δ as the server's last round record holds them. z: central's noise multiplier. γ: model units "
             "per integer step; bits/coord: bits on the wire per model coordinate, the Hadamard padding of "
             "7,850 to 8,192 included; noise std: the per-coordinate noise on a round's sum in model units (central: "
             "zC; distributed: γ·√(variance the survivors carried), then with the conditional rounding's at most "
             "1/4 per client added).\n",
             "| placement | bits | ε target | ε recorded | δ | z | γ | bits/coord | noise std on the sum | "
             "with rounding | accounted / target variance |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for placement, b in rows:
        for e in eps:
            c = cells.get(cell_key(placement, e, b))
            if c is None:
                continue
            p = c["privacy"]
            ratio = (f"{p['variance_accounted'] / p['variance']:.3f}" if "variance_accounted" in p else "—")
            head.append(f"| {placement} | {b or '—'} | {eps_label(e)} | {c['epsilon_recorded_max']:.3f} | "
                        f"{p.get('delta', 0):g} | {p['noise_multiplier']:.3f} |" if placement == "central" else
                        f"| {placement} | {b} | {eps_label(e)} | {c['epsilon_recorded_max']:.3f} | "
                        f"{p.get('delta', 0):g} | — |")
            if placement == "central":
                head[-1] += (f" — | {c['k_bits']} (secure aggregation's fixed point, no rotation) | "
                             f"{c['noise_std_sum']:.4f} | {c['noise_std_sum_with_rounding']:.4f} | — |")
            else:
                head[-1] += (f" {p['gamma']:.3g} | {p['bits_per_coordinate']:.2f} | {c['noise_std_sum']:.4f} | "
                             f"{c['noise_std_sum_with_rounding']:.4f} | {ratio} |")
    return head


def cost_markdown(doc: dict) -> str:
    s, cost = doc["settings"], doc.get("cost") or {}
    if not cost:
        return ""
    base = cost.get(cell_key("none", math.inf, None))
    lines = ["## Time and bytes: the cost of DP under secure aggregation\n",
             f"Measured with `aggregation.kind: secagg` (Bonawitz et al. masks, certificate identities, the "
             f"job's default threshold) on {s['cost_clients']} of the clients for {s['cost_rounds']} rounds, seed "
             f"{s['seeds'][0]}, ε = {eps_label(s['cost_epsilon'])} where DP is on. Seconds per round: the server's "
             f"round records (`rounds[i].seconds`: selection to the new global model, local training included), "
             f"median over the rounds after the first. Bytes: what each client sent plus received over the whole "
             f"run (payload + framing, counted by the in-process transport as gRPC would frame it; rendezvous and "
             f"layout agreement included), mean over the clients, divided by the rounds. All parties share the "
             f"machine's cores, so the seconds are a simulation's, not a deployment's.\n",
             *([f"The cost runs were re-run alone ({doc['cost_rerun']}), the sweep kept from the run above.\n"]
               if doc.get("cost_rerun") else []),
             "| DP | bits | s / round | vs no DP | kB per client per round | vs no DP | ε recorded | accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for key, c in cost.items():
        placement, _, bits = key.split("|")
        t_ratio = c["median_round_s"] / base["median_round_s"] if base else float("nan")
        b_ratio = c["bytes_per_client_per_round"] / base["bytes_per_client_per_round"] if base else float("nan")
        eps = c["privacy"].get("epsilon")
        lines.append(f"| {placement} | {bits if bits != '-' else '—'} | {c['median_round_s']:.2f} | "
                     f"{t_ratio:.2f}× | {c['bytes_per_client_per_round'] / 1e3:.1f} | {b_ratio:.2f}× | "
                     f"{'∞' if eps is None else f'{eps:.3f}'} | {100 * c['accuracy']:.2f} % |")
    sweep = doc["cells"]
    ks = sorted({(c["k_bits"], c["bytes_per_client_per_round"]) for c in cost.values()}, key=lambda t: t[0] or 0)
    lines += ["", "The ring bits k of each run: " + ", ".join(
        f"{k.split('|')[0]}{' ' + k.split('|')[2] + ' bits' if k.split('|')[2] != '-' else ''}: k = {c['k_bits']}"
        for k, c in cost.items()) + ". Secure aggregation sends a masked input in the smallest machine word "
        "holding the ring (`qp.word_dtype`: 16-bit words for k ≤ 16, 32-bit for k ≤ 32, else 64-bit), not packed "
        "to exactly k bits: the distributed placement's 16-bit ring sends 2 bytes a coordinate, its 18 and 20 bits "
        "4, and no DP (whose fixed-point sum needs k > 32) 8; the rotation pads 7,850 coordinates to 8,192. The key "
        "agreement and the shares do not depend on the model." if ks else ""]
    lines += ["", f"In the accuracy sweep ({s['clients']} clients, `{s['sweep_kind']}`, no masks) the server's median "
                  f"seconds per round were: " + "; ".join(
                      f"{k.split('|')[0]}{' ' + k.split('|')[2] + ' bits' if k.split('|')[2] != '-' else ''} "
                      f"ε={k.split('|')[1]}: {c['median_round_s']:.2f}" for k, c in sweep.items()) + "."]
    return "\n".join(lines) + "\n"


def gap_text(doc: dict) -> str:
    """Where the distributed − central gap comes from, in the run's own figures."""
    s, cells = doc["settings"], doc["cells"]
    out = []
    for b in s["bits"]:
        ratios = []
        for e in s["epsilons"]:
            c, d = cells.get(cell_key("central", e, None)), cells.get(cell_key("distributed", e, b))
            if c and d:
                ratios.append(d["noise_std_sum_with_rounding"] / c["noise_std_sum"])
        if ratios:
            out.append(f"{b} bits: the distributed sum's noise std (rounding included) is "
                       f"{min(ratios):.3f}–{max(ratios):.3f}× central's at the same ε")
    sd = max((c["accuracy_sd"] for c in cells.values()), default=0.0)
    return ("Why the gap: " + "; ".join(out) + f". The largest sd across seeds is {100 * sd:.2f} points; a gap "
            "smaller than that is noise. Kairouz, Liu, Steinke (ICML 2021) report distributed within about one "
            "point of central at 16–18 bits." if out else "")


# ------------------------------------------------------------------------------------------ record level
CLIP_ONLY_Z = 0.01  # the clip-only reference's noise multiplier: noise std 0.01·C / batch on the mean gradient


DGD = "dgd-"  # key prefix of the distributed DP-GD cells


def record_cell_key(eps: float | None, placement: str = "local") -> str:
    """``inf`` (no DP), ``clip`` (eps None: clipping with z = CLIP_ONLY_Z, no meaningful privacy) or ``4``: the
    JSON's key of one record-level cell; prefixed ``dgd-`` for the distributed placement (DP-GD)."""
    key = "clip" if eps is None else "inf" if math.isinf(eps) else f"{eps:g}"
    return key if placement == "local" else DGD + key


def record_order(key: str) -> tuple:
    """Local cells, then DP-GD's; finite ε ascending, then the clip-only reference, then no DP."""
    dgd, key = key.startswith(DGD), key.removeprefix(DGD)
    return (dgd, 1, 0.0) if key == "clip" else (dgd, 2, 0.0) if key == "inf" else (dgd, 0, float(key))


def record_params(args, eps: float | None, seed: int, placement: str = "local") -> dict:
    """The record-level job's ``params``: FedAvg of softmax regression, ``params.record_dp`` unless ε = ∞ (eps
    None: the clip-only reference, noise_multiplier CLIP_ONLY_Z). ``distributed``: DP-GD, one full-batch step a
    round for ``--record-dgd-rounds`` rounds at ``--record-dgd-lr`` (``batch_size``: per-record gradients at once)."""
    agg = {"kind": args.record_kind, "clip": 1.0, "stage_timeout_s": 120, "input_timeout_s": 600}
    dgd = placement == "distributed"
    params = {"strategy": "fedavg", "model": MODEL, "rounds": args.record_dgd_rounds if dgd else args.record_rounds,
              "local_epochs": args.local_epochs, "batch_size": 256 if dgd else args.record_batch_size,
              "learning_rate": args.record_dgd_lr if dgd else args.record_lr, "momentum": 0.0, "seed": seed,
              "test_fraction": 0.0, "aggregation": agg}
    if eps is None or not math.isinf(eps):
        noise = {"noise_multiplier": CLIP_ONLY_Z} if eps is None else {"target_epsilon": eps}
        params["record_dp"] = {"clip_norm": args.record_clip_norm, **noise, "delta": args.delta,
                               "accountant": "rdp" if dgd else args.record_accountant, "placement": placement}
    return params


def silo_records(out: Path, silos: list[str]) -> dict:
    """Each silo's own privacy record: ε after every round (its ``metrics.json``) and its bundle's
    ``extra.privacy`` (z, q, steps). Empty dicts without DP."""
    per = {}
    for silo in silos:
        metrics = json.loads((out / silo / "metrics.json").read_text())
        extra = json.loads((out / silo / "model" / "manifest.json").read_text()).get("extra") or {}
        priv = extra.get("privacy") or {}
        priv = priv.get("record_level", priv)
        per[silo] = {"n_train": metrics["n_train"],
                     "epsilon_per_round": [r.get("record_epsilon") for r in metrics["rounds"]],
                     **{k: priv[k] for k in ("epsilon", "delta", "noise_multiplier", "sample_rate", "steps",
                                             "accountant", "mechanism") if k in priv}}
    return per


def run_record_cell(ws: Workspace, test, args, eps: float | None, seed: int, placement: str = "local") -> dict:
    """One record-level job over ``--record-silos`` silos; accuracy, each silo's record (local) or the server's
    ε (distributed), seconds per round."""
    import warnings

    import secureflhv

    name = f"record-{record_cell_key(eps, placement)}-{args.record_kind}"
    out = ws.root / "out" / name
    job = secureflhv.Job.horizontal(clients=ws.clients(), params=record_params(args, eps, seed, placement),
                                    job_id="dp-accuracy-record", output_dir=str(out), certs=ws.root / "certs",
                                    deadline_s=900, base_dir=ws.root)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:  # Opacus's accountant notes, from every party's thread
        warnings.simplefilter("always")
        result = secureflhv.simulate(job, progress=False)
    wall = time.perf_counter() - started
    secs = [float(r["seconds"]) for r in result.history]
    notes = sorted({str(w.message) for w in caught if "alpha" in str(w.message)})
    return {"accuracy": test_accuracy(result.model, test), "rounds_run": len(result.history), "seed": seed,
            "round_seconds": secs, "median_round_s": statistics.median(secs[1:] or secs), "wall_s": wall,
            "bytes_per_client_per_round": client_bytes(result.wire) / max(1, len(secs)),
            "silos": silo_records(out, ws.ids), "accountant_notes": notes,
            "server_privacy": (result.history[-1].get("privacy") or {}) if result.history else {}}


def summarise_record(runs: list[dict]) -> dict:
    """Mean ± sd of the accuracy over the seeds; ε, z, q and steps over every silo of every seed."""
    accs = [r["accuracy"] for r in runs]
    silos = [s for r in runs for s in r["silos"].values()] + [r["server_privacy"] for r in runs
                                                              if r.get("server_privacy", {}).get("epsilon")]

    def span(key):
        vals = [s[key] for s in silos if key in s]
        return [min(vals), max(vals)] if vals else None

    return {"accuracy_mean": float(np.mean(accs)),
            "accuracy_sd": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0, "accuracy": accs,
            "seeds": [r["seed"] for r in runs], "rounds_run": runs[0]["rounds_run"],
            "median_round_s": float(np.median([r["median_round_s"] for r in runs])),
            "first_round_s": float(np.median([r["round_seconds"][0] for r in runs])),
            "bytes_per_client_per_round": float(np.mean([r["bytes_per_client_per_round"] for r in runs])),
            "epsilon_recorded_max": span("epsilon")[1] if span("epsilon") else None,
            "epsilon_recorded_min": span("epsilon")[0] if span("epsilon") else None,
            "noise_multiplier": span("noise_multiplier"), "sample_rate": span("sample_rate"),
            "steps": span("steps"), "n_train": span("n_train"), "noise_std": span("noise_std"),
            "count_std": span("count_std"),
            "silos_first_seed": runs[0]["silos"],
            "accountant_notes": sorted({n for r in runs for n in r["accountant_notes"]})}


def record_settings(args) -> dict:
    return {"placements": args.record_placements, "dgd_rounds": args.record_dgd_rounds, "dgd_lr": args.record_dgd_lr,
            "silos": args.record_silos, "rows": args.record_rows, "test_rows": args.test_rows,
            "rounds": args.record_rounds, "local_epochs": args.local_epochs,
            "batch_size": args.record_batch_size, "lr": args.record_lr, "clip_norm": args.record_clip_norm,
            "delta": args.delta, "epsilons": args.record_epsilons, "seeds": args.record_seeds,
            "accountant": args.record_accountant, "kind": args.record_kind, "quick": args.quick,
            "clip_only_z": CLIP_ONLY_Z if args.record_clip_only else None}


def measure_record(args) -> dict:
    """The record-level section: no DP, then per placement of ``--record-placements`` a clip-only reference and
    each ε of ``--record-epsilons``, per seed."""
    started = time.perf_counter()
    train, test = load_data(args.record_rows, args.test_rows, 0)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dp_accuracy_record_"))
    runs: dict[str, list[dict]] = {}
    for seed in args.record_seeds:
        ws = Workspace(work / "record", train, args.record_silos, "iid", 0.5, seed)
        too_few = min(ws.sizes)
        if args.delta >= 1 / too_few:
            raise SystemExit(f"--delta {args.delta:g} is not below 1 / {too_few} (the smallest silo's rows)")
        clip = [None] if args.record_clip_only else []
        finite = [e for e in args.record_epsilons if not math.isinf(e)]
        cells = [("local", math.inf)] if any(math.isinf(e) for e in args.record_epsilons) else []
        cells += [(p, e) for p in args.record_placements for e in clip + finite]
        for placement, eps in cells:
            t0 = time.perf_counter()
            r = run_record_cell(ws, test, args, eps, seed, placement)
            key = record_cell_key(eps, placement)
            runs.setdefault(key, []).append(r)
            recorded = [s["epsilon"] for s in [*r["silos"].values(), r["server_privacy"]] if "epsilon" in s]
            eps_rec = max(recorded, default=math.inf)
            print(f"[record, seed {seed}] {key:9s} accuracy {r['accuracy']:.4f}  ε recorded "
                  f"(max) {eps_rec:.3f}  {r['median_round_s']:.2f} s/round  "
                  f"({time.perf_counter() - t0:.0f} s, {(time.perf_counter() - started) / 60:.1f} min so far)",
                  flush=True)
    return {"settings": record_settings(args), "cells": {k: summarise_record(v) for k, v in runs.items()},
            "seconds": time.perf_counter() - started}


def plot_record(doc: dict, path: Path) -> None:
    """Record-level accuracy against ε (log x), error bars over the seeds; no DP as a horizontal line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    rec = doc["record"]
    s, cells = rec["settings"], rec["cells"]
    fig = Figure(figsize=(6.4, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lines = (("local", "local DP-SGD at each silo (Opacus)", "tab:blue"),
             ("distributed", f"DP-GD, noise shares inside secure aggregation ({s.get('dgd_rounds')} rounds)",
              "tab:orange"))
    for placement, label, colour in lines:
        eps = [e for e in s["epsilons"] if not math.isinf(e) and record_cell_key(e, placement) in cells]
        if not eps:
            continue
        ax.errorbar(eps, [100 * cells[record_cell_key(e, placement)]["accuracy_mean"] for e in eps],
                    yerr=[100 * cells[record_cell_key(e, placement)]["accuracy_sd"] for e in eps], marker="o",
                    markersize=4, capsize=3, label=label, color=colour)
        ax.set_xscale("log")
        ax.set_xticks(eps)
        ax.set_xticklabels([eps_label(e) for e in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        clip = cells.get(record_cell_key(None, placement))
        if clip:
            ax.axhline(100 * clip["accuracy_mean"], color=colour, linestyle=":", linewidth=1,
                       label=f"{placement}: clipping only (C = {s['clip_norm']:g}, z = {s['clip_only_z']})")
    if "inf" in cells:
        ax.axhline(100 * cells["inf"]["accuracy_mean"], color="k", linestyle="--", linewidth=1,
                   label="no DP (ε = ∞)")
    ax.set_xlabel(f"record-level ε (δ = {s['delta']:g})")
    ax.set_ylabel(f"test accuracy (%), {s['test_rows']:,} rows")
    ax.set_title(f"Fashion-MNIST, {s['silos']} silos, softmax regression, {s['rounds']} rounds", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def _span(v, fmt: str) -> str:
    if not v:
        return "—"
    return format(v[0], fmt) if v[0] == v[1] else f"{format(v[0], fmt)}–{format(v[1], fmt)}"


def record_markdown(doc: dict) -> str:
    rec = doc.get("record")
    if not rec:
        return ""
    s, cells = rec["settings"], rec["cells"]
    lines = ["## Record-level DP: DP-SGD with local noise at each silo, DP-GD with the noise distributed\n",
             f"Run by `{rec['command']}` on {rec['date']} ({rec['seconds'] / 60:.1f} min; {rec['machine']}); "
             f"merged into this report.\n",
             "Two placements of record-level noise (docs/privacy.md). **Local**: each silo runs DP-SGD itself "
             "(`params.record_dp`, Opacus: Poisson sampling, per-record clipping, Gaussian noise on every local step). "
             "**Distributed**: `params.record_dp.placement: distributed`, one full-batch DP-GD step per round: each "
             "silo sends the sum of its per-record clipped gradients with a Skellam noise share inside secure "
             "aggregation, so the noise on the sum is added once for all silos instead of once per silo, but there "
             "is no amplification by subsampling and one step per round (the distributed variant of multi-step "
             "local DP-SGD has no sound sensitivity bound: docs/privacy.md).\n",
             f"- Fashion-MNIST: {s['rows']:,} training rows split IID among **{s['silos']} silos** (simulated by "
             f"`secureflhv.simulate`); accuracy of the final global model on {s['test_rows']:,} test rows.",
             f"- Model and training: softmax regression (7,850 parameters), FedAvg over "
             f"`aggregation.kind: {s['kind']}`, every silo every round, {s['rounds']} rounds, {s['local_epochs']} "
             f"local epoch(s), batch size {s['batch_size']} (DP: expected batch, q = {s['batch_size']} / n_local), "
             f"learning rate {s['lr']:g}, no momentum; the same settings without DP for ε = ∞.",
             f"- `params.record_dp`: clip_norm C = {s['clip_norm']:g} (per record), δ = {s['delta']:g}, "
             f"`target_epsilon` = ε (each silo calibrates its own z for its rounds × epochs × ⌊1/q⌋ steps), "
             f"accountant `{s['accountant']}`. Seeds {', '.join(map(str, s['seeds']))} (partition, initial model); "
             f"DP-SGD's sampling and noise and secure aggregation's stochastic rounding from OS entropy (a seed's run "
             f"is not bit-reproducible). ε recorded: each silo's own `record_epsilon` after the last "
             f"round (its `metrics.json`; its bundle's `extra.privacy` holds the same, with z, q and steps), max "
             f"over the silos and seeds.\n",
             "![record-level accuracy against ε](img/dp_accuracy_record.png)\n",
             "| ε target | accuracy % | vs no DP (points) | ε recorded, max over silos | z | q | steps per silo | "
             "noise std on a step's mean gradient, zC/B | s / round | time vs no DP | first round s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = cells.get("inf")
    for key, c in sorted(cells.items(), key=lambda kv: record_order(kv[0])):
        if key.startswith(DGD):
            continue
        eps_max = ("∞ (no DP)" if c["epsilon_recorded_max"] is None else f"{c['epsilon_recorded_max']:.3g} (no "
                   f"meaningful privacy)" if key == "clip" else f"{c['epsilon_recorded_max']:.3f}")
        d_acc = f"{100 * (c['accuracy_mean'] - base['accuracy_mean']):+.2f}" if base and key != "inf" else "—"
        t_ratio = f"{c['median_round_s'] / base['median_round_s']:.1f}×" if base else "—"
        label = {"inf": "∞ (no DP)", "clip": f"clip only (z = {s.get('clip_only_z')})"}.get(key, key)
        lines.append(f"| {label} | {_acc(c)} | {d_acc} | {eps_max} | "
                     f"{_span(c['noise_multiplier'], '.3f')} | {_span(c['sample_rate'], '.4f')} | "
                     f"{_span(c['steps'], 'd')} | {_noise_std(c, s)} | {c['median_round_s']:.2f} | {t_ratio} | "
                     f"{c['first_round_s']:.2f} |")
    lines += clip_text(cells, s)
    lines += ["", "s / round: the server's round records, median over the rounds after the first and over the seeds "
                  "(all parties share the machine's cores). The first round includes each silo's calibration of z "
                  "(Opacus's `get_noise_multiplier` bisection) and Opacus's setup.\n"]
    lines += dgd_markdown(cells, s)
    lines += record_silo_table(rec)
    by_note: dict[str, list[str]] = {}
    for k, c in sorted(cells.items(), key=lambda kv: record_order(kv[0])):
        for n in c["accountant_notes"]:
            by_note.setdefault(n, []).append("clip only" if k == "clip" else f"ε = {k}")
    notes = [f"\"{n}\" ({', '.join(where)})" for n, where in by_note.items()]
    if notes:
        lines += ["", "Warnings of Opacus's RDP accountant during the runs (from each silo's calibration of z, whose "
                      "bisection tries noise multipliers far from the final one, or from a round's ε; a recorded ε "
                      "is an upper bound either way, more orders could only tighten it): " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def dgd_markdown(cells: dict, s: dict) -> list[str]:
    """The distributed placement's table: DP-GD at each ε against local DP-SGD at the same ε and against no DP."""
    keys = [k for k in sorted(cells, key=record_order) if k.startswith(DGD)]
    if not keys:
        return []
    base = cells.get("inf")
    lines = ["", f"**Distributed placement (DP-GD)**: {s.get('dgd_rounds')} rounds of one full-batch step each, "
                 f"learning rate {s.get('dgd_lr'):g}, the same C = {s['clip_norm']:g} and δ; `target_epsilon` "
                 f"calibrates the Skellam noise for the job's rounds (every silo's share from the job file). ε "
                 f"recorded: the server's last round record (accounted at the honest survivors' variance) and each "
                 f"silo's own bound (every round at the nominal variance), the larger.\n",
             "| ε target | accuracy % | vs local DP-SGD at this ε (points) | vs no DP (points) | ε recorded | "
             "noise std on the gradient sum | noise std on the record count | s / round | kB per silo per round |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        c, local = cells[key], cells.get(key.removeprefix(DGD))
        vs_local = f"{100 * (c['accuracy_mean'] - local['accuracy_mean']):+.2f}" if local else "—"
        vs_base = f"{100 * (c['accuracy_mean'] - base['accuracy_mean']):+.2f}" if base else "—"
        label = (f"clip only (z = {s.get('clip_only_z')})" if key == DGD + "clip" else key.removeprefix(DGD))
        eps = c["epsilon_recorded_max"]
        lines.append(f"| {label} | {_acc(c)} | {vs_local} | {vs_base} | "
                     f"{'—' if eps is None else format(eps, '.3f')} | {_span(c.get('noise_std'), '.3g')} | "
                     f"{_span(c.get('count_std'), '.3g')} records | {c['median_round_s']:.2f} | "
                     f"{c['bytes_per_client_per_round'] / 1e3:.1f} |")
    return lines + [""]


def clip_text(cells: dict, s: dict) -> list[str]:
    """Where the accuracy goes: to the clipping (clip-only vs no DP) or to the noise (each ε vs clip-only)."""
    clip, base = cells.get("clip"), cells.get("inf")
    if not clip or not base:
        return []
    noise = [f"ε = {k}: {100 * (c['accuracy_mean'] - clip['accuracy_mean']):+.2f}"
             for k, c in sorted(cells.items(), key=lambda kv: record_order(kv[0]))
             if k not in ("clip", "inf") and not k.startswith(DGD)]
    sd = max(c["accuracy_sd"] for k, c in cells.items() if not k.startswith(DGD))
    return ["", f"Where the accuracy goes. The clip-only run (the same DP-SGD: C = {s['clip_norm']:g}, Poisson "
                f"sampling, expected-batch mean, but z = {s['clip_only_z']}) is "
                f"{100 * (clip['accuracy_mean'] - base['accuracy_mean']):+.2f} points from no DP: that is the "
                f"per-record clipping's share (clipping also shrinks the mean gradient, so the same learning rate "
                f"takes shorter steps). Each ε against clip-only, the noise's share: " + "; ".join(noise)
                + (f" points (the largest sd across seeds is {100 * sd:.2f} points)." if len(s["seeds"]) > 1 else
                   " points (one seed: no sd).") + " C and the learning rate are one setting for every cell, not "
                                                   "tuned per ε."]


def _noise_std(c: dict, s: dict) -> str:
    """Per-coordinate noise std on one step's mean gradient: z·C over the expected batch q·n = batch size."""
    z = c["noise_multiplier"]
    return "—" if not z else _span([v * s["clip_norm"] / s["batch_size"] for v in z], ".2e")


def record_silo_table(rec: dict) -> list[str]:
    """Each silo's recorded ε (first seed), one row per target."""
    cells = rec["cells"]
    keys = [k for k in sorted(cells, key=record_order) if k not in ("inf", "clip") and not k.startswith(DGD)]
    if not keys:
        return []
    silos = list(cells[keys[0]]["silos_first_seed"])
    lines = [f"Each silo's recorded ε after the last round (seed {rec['settings']['seeds'][0]}):\n",
             "| ε target | " + " | ".join(s.replace("client-", "silo ") for s in silos) + " |",
             "|---|" + "---|" * len(silos)]
    for k in keys:
        per = cells[k]["silos_first_seed"]
        lines.append(f"| {k} | " + " | ".join(f"{per[s]['epsilon']:.3f}" for s in silos) + " |")
    return lines


def rerun_record(args, argv=None) -> int:
    """``--record-only``: the record-level section alone, merged into a saved dp_accuracy.json, then re-render."""
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("secureflhv").setLevel(logging.ERROR)
    doc = json.loads(args.record_only.read_text())
    doc["record"] = record_section(args, argv)
    write_outputs(doc, args.out_dir or args.record_only.parent)
    return 0


def record_section(args, argv) -> dict:
    rec = measure_record(args)
    argv_text = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    rec.update({"date": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d}", "machine": _machine(),
                "command": f"{COMMAND} {argv_text}".strip()})
    return rec


# ------------------------------------------------------------------------------------------------- main
def record_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("record-level DP (local DP-SGD at each silo; distributed DP-GD inside secure "
                              "aggregation)")
    g.add_argument("--record", action="store_true", help="also run the record-level section after the client-level "
                                                         "one")
    g.add_argument("--record-only", type=Path, metavar="JSON", help="run only the record-level section and merge it "
                                                                    "into that saved dp_accuracy.json, then re-render")
    g.add_argument("--record-silos", type=int, help="silos (default 10; quick 4)")
    g.add_argument("--record-rows", type=int, help="training rows split IID among the silos (default all 60,000; "
                                                   "quick 2,000)")
    g.add_argument("--record-rounds", type=int, help="FedAvg rounds (default 10; quick 2)")
    g.add_argument("--record-batch-size", type=int, help="expected DP-SGD batch: q = batch / n_local (default 256; "
                                                         "quick 64)")
    g.add_argument("--record-lr", type=float, default=0.5, help="silos' SGD learning rate")
    g.add_argument("--record-clip-norm", type=float, default=1.0, help="C: L2 clip of one record's gradient")
    g.add_argument("--record-epsilons", help="comma-separated target ε of each silo, 'inf' = no DP (default "
                                             "1,2,4,8,inf; quick 4,inf); δ is --delta")
    g.add_argument("--record-accountant", choices=("rdp", "prv"), default="rdp")
    g.add_argument("--record-kind", choices=("secagg", "plain_quantised"), default="secagg",
                   help="aggregation of the record-level runs")
    g.add_argument("--record-seeds", help="comma-separated seeds (default: --seeds)")
    g.add_argument("--record-placements", default="local,distributed",
                   help="comma-separated: local (DP-SGD at each silo), distributed (DP-GD, Skellam shares)")
    g.add_argument("--record-dgd-rounds", type=int, help="rounds of distributed DP-GD, one full-batch step each "
                                                         "(default 40; quick 3)")
    g.add_argument("--record-dgd-lr", type=float, default=4.0, help="DP-GD's step size")
    g.add_argument("--no-record-clip-only", dest="record_clip_only", action="store_false",
                   help="skip the reference run with DP-SGD's clipping and sampling but noise multiplier "
                        f"{CLIP_ONLY_Z} (separates the accuracy lost to clipping from that lost to noise)")


def record_defaults(args: argparse.Namespace) -> None:
    """The record-level options not given: the full run's, or --quick's (4 silos on 2,000 rows, 2 rounds, ε 4)."""
    q = args.quick
    args.record = args.record or bool(args.record_only)
    args.record_silos = args.record_silos or (4 if q else 10)
    args.record_rows = args.record_rows or (2000 if q else 60000)
    args.record_rounds = args.record_rounds or (2 if q else 10)
    args.record_batch_size = args.record_batch_size or (64 if q else 256)
    args.record_epsilons = [float(x) for x in (args.record_epsilons or ("4,inf" if q else "1,2,4,8,inf")).split(",")]
    args.record_seeds = [int(x) for x in (args.record_seeds or ",".join(map(str, args.seeds))).split(",")]
    args.record_placements = [p for p in args.record_placements.split(",") if p]
    if set(args.record_placements) - {"local", "distributed"}:
        raise SystemExit(f"--record-placements: local and/or distributed, got {args.record_placements}")
    args.record_dgd_rounds = args.record_dgd_rounds or (3 if q else 40)


def parse_args(argv=None) -> argparse.Namespace:
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(prog="dp_accuracy.py", description=__doc__,
                                 epilog="Defaults shown are the full run's; --quick changes those not given.",
                                 formatter_class=Formatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 10 clients on 2,000 rows, 2 rounds, ε 4 and ∞, 16 bits, cost on 5 clients")
    ap.add_argument("--clients", type=int, help="simulated clients of the accuracy sweep (default 100; quick 10)")
    ap.add_argument("--rows", type=int, help="training rows used (default all 60,000; quick 2,000)")
    ap.add_argument("--test-rows", type=int, help="test rows scored (default all 10,000; quick 2,000)")
    ap.add_argument("--split", choices=("iid", "dirichlet"), default="iid", help="how the rows are split")
    ap.add_argument("--beta", type=float, default=0.5, help="label-Dirichlet concentration (--split dirichlet)")
    ap.add_argument("--rounds", type=int, help="FedAvg rounds (default 10; quick 2)")
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1, help="clients' SGD learning rate")
    ap.add_argument("--clip-norm", type=float, default=0.5, help="C: L2 clip of a client's update per round")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--epsilons", help="comma-separated target ε, 'inf' = no DP (default 1,2,4,8,inf; quick 4,inf)")
    ap.add_argument("--bits", help="comma-separated ring bits of the distributed placement (default 16,18,20; "
                                   "quick 16)")
    ap.add_argument("--seeds", help="comma-separated seeds: cells give mean ± sd (default 0; quick 0)")
    ap.add_argument("--threshold", type=float, default=1.0,
                    help="aggregation threshold of the sweep (fraction of the selected clients; 0 = the job's "
                         "default t ≈ n/2, which has every client add about twice the noise to tolerate dropouts)")
    ap.add_argument("--sweep-kind", choices=("plain_quantised", "secagg"), default="plain_quantised",
                    help="aggregation of the accuracy sweep")
    ap.add_argument("--cost-clients", type=int, help="clients of the secagg cost runs (default 20; quick 5)")
    ap.add_argument("--cost-rounds", type=int, help="rounds of the secagg cost runs (default 3; quick 2)")
    ap.add_argument("--no-cost", action="store_true", help="skip the secagg cost runs")
    ap.add_argument("--out-dir", type=Path, help="where dp_accuracy.{json,md} and img/ go (default docs/; quick: "
                                                 "a temp folder)")
    ap.add_argument("--work-dir", type=Path, help="shards, certificates, party outputs (default: a temp folder)")
    ap.add_argument("--report-only", type=Path, metavar="JSON", help="re-render the Markdown and PNG from a saved "
                                                                     "dp_accuracy.json; run nothing")
    ap.add_argument("--cost-only", type=Path, metavar="JSON", help="run only the secagg cost runs (with the saved "
                                                                   "run's settings) and replace them in that "
                                                                   "dp_accuracy.json, then re-render")
    record_arguments(ap)
    args = ap.parse_args(argv)
    q = args.quick
    args.clients = args.clients or (10 if q else 100)
    args.rows = args.rows or (2000 if q else 60000)
    args.test_rows = args.test_rows or (2000 if q else 10000)
    args.rounds = args.rounds or (2 if q else 10)
    args.epsilons = [float(x) for x in (args.epsilons or ("4,inf" if q else "1,2,4,8,inf")).split(",")]
    args.bits = [int(x) for x in (args.bits or ("16" if q else "16,18,20")).split(",")]
    args.seeds = [int(x) for x in (args.seeds or "0").split(",")]
    args.cost_clients = args.cost_clients or (5 if q else 20)
    args.cost_rounds = args.cost_rounds or (2 if q else 3)
    record_defaults(args)
    if args.clients * args.delta >= 1:
        ap.error("--delta must be below 1 / clients")
    return args


def load_data(rows: int, test_rows: int, seed: int):
    """Fashion-MNIST train / test as float32 in [0, 1]; ``rows`` / ``test_rows`` sampled when fewer than all."""
    from secureflhv.data import load_dataset

    rng = np.random.default_rng(seed)
    train, test = load_dataset("fmnist"), load_dataset("fmnist_test")
    if rows < len(train):
        train = train.subset(np.sort(rng.choice(len(train), rows, replace=False)))
    if test_rows < len(test):
        test = test.subset(np.sort(rng.choice(len(test), test_rows, replace=False)))
    return train, test


def settings_of(args) -> dict:
    split = "IID" if args.split == "iid" else f"by label-Dirichlet({args.beta:g})"
    thr = (f"{args.threshold:g} (t = n: no dropouts in a simulation, so each client adds μ/(n − c), the least "
           f"that carries the target)" if args.threshold else "the job's default (t ≈ n/2)")
    return {"quick": args.quick, "clients": args.clients, "rows": args.rows, "test_rows": args.test_rows,
            "split": args.split, "beta": args.beta, "split_text": split, "rounds": args.rounds,
            "local_epochs": args.local_epochs, "batch_size": args.batch_size, "lr": args.lr,
            "clip_norm": args.clip_norm, "delta": args.delta, "epsilons": args.epsilons, "bits": args.bits,
            "seeds": args.seeds, "threshold": args.threshold, "threshold_text": thr, "sweep_kind": args.sweep_kind,
            "cost_clients": args.cost_clients, "cost_rounds": args.cost_rounds,
            "cost_epsilon": max((e for e in args.epsilons if not math.isinf(e)), default=math.inf),
            "model": "multinomial logistic regression (784 -> 10, 7,850 parameters)"}


def write_outputs(doc: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "dp_accuracy.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    plot(doc, out_dir / "img" / "dp_accuracy.png")
    if doc.get("record"):
        plot_record(doc, out_dir / "img" / "dp_accuracy_record.png")
    (out_dir / "dp_accuracy.md").write_text(markdown(doc))
    print(f"wrote {out_dir / 'dp_accuracy.json'}, {out_dir / 'dp_accuracy.md'}, {out_dir / 'img/dp_accuracy.png'}"
          + (f", {out_dir / 'img/dp_accuracy_record.png'}" if doc.get("record") else ""))


def rerun_cost(args) -> int:
    """``--cost-only``: the secagg cost runs again (e.g. after a wire-format change), the sweep kept as saved."""
    import torch

    torch.set_num_threads(1)
    doc = json.loads(args.cost_only.read_text())
    s = doc["settings"]
    for k, v in s.items():  # the saved run's settings (rows, clip, learning rate, ...), not this call's defaults
        if hasattr(args, k) and k not in ("epsilons", "bits", "seeds"):
            setattr(args, k, v)
    args.epsilons = [s["cost_epsilon"]]
    train, test = load_data(args.rows, args.test_rows, 0)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dp_accuracy_cost_"))
    ws = Workspace(work, train, args.clients, args.split, args.beta, s["seeds"][0])
    doc["cost"] = measure_cost(ws, test, args, s["bits"], s["seeds"][0])
    doc["cost_rerun"] = f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d}: {COMMAND} --cost-only {args.cost_only}"
    write_outputs(doc, args.out_dir or args.cost_only.parent)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report_only:
        doc = json.loads(args.report_only.read_text())
        write_outputs(doc, args.out_dir or ROOT / "docs")
        return 0
    if args.cost_only:
        return rerun_cost(args)
    if args.record_only:
        return rerun_record(args, argv)
    import logging

    import torch

    torch.set_num_threads(1)  # the parties' threads share the cores
    logging.getLogger("secureflhv").setLevel(logging.ERROR)  # 100 clients x rounds of INFO lines otherwise
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="dp_accuracy_quick_")) if args.quick else ROOT / "docs")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dp_accuracy_work_"))
    started = time.perf_counter()
    train, test = load_data(args.rows, args.test_rows, 0)
    cells_of = grid(args.epsilons, args.bits)
    runs: dict[str, list[dict]] = {}
    cost, spaces = {}, {}
    for seed in args.seeds:
        ws = spaces[seed] = Workspace(work, train, args.clients, args.split, args.beta, seed)
        for placement, eps, bits in cells_of:
            t0 = time.perf_counter()
            r = run_cell(ws, test, args, placement, eps, bits, kind=args.sweep_kind, rounds=args.rounds, seed=seed,
                         threshold=args.threshold or None)
            r["seed"] = seed
            runs.setdefault(cell_key(placement, eps, bits), []).append(r)
            print(f"[seed {seed}] {placement:11s} ε={eps_label(eps):3s} bits={bits or '-':2} accuracy "
                  f"{r['accuracy']:.4f}  ε recorded {r['privacy'].get('epsilon', math.inf):.3f}  "
                  f"{r['median_round_s']:.2f} s/round  ({time.perf_counter() - t0:.0f} s, "
                  f"{(time.perf_counter() - started) / 60:.1f} min so far)", flush=True)
    if not args.no_cost:
        cost = measure_cost(spaces[args.seeds[0]], test, args, args.bits, args.seeds[0])
    cells = {k: summarise(v) for k, v in runs.items()}
    argv_text = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    doc = {"date": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d}", "machine": _machine(),
           "command": f"{COMMAND} {argv_text}".strip(), "settings": settings_of(args), "cells": cells,
           "gaps": gaps(cells, args.epsilons, args.bits), "cost": cost,
           "seconds": time.perf_counter() - started}
    doc["gap_text"] = gap_text(doc)
    if args.record:
        doc["record"] = record_section(args, argv)
    write_outputs(doc, out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
