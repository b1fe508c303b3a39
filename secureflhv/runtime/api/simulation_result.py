"""What :func:`secureflhv.simulate` returns: the run's per-round history, the final model, each client's
metrics, the output folder, and a plot of the task metric per round.

Everything is read back from what the parties wrote under ``<output_dir>/<party id>/`` (``metrics.json``,
the signed model bundle ``model/``), the same files a deployment leaves, so a result describes exactly
what a ``secureflhv run`` of the job would have left there.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..job.job_file import JobConfig

__all__ = ["SimulationResult"]

# metrics a plot draws by default, first present first (horizontal FL's record fields, vertical jobs' history)
PLOT_METRICS = ("test_accuracy", "r2", "accuracy", "test_loss", "train_loss", "loss")
_UNSET = object()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _records(doc: dict) -> list[dict]:
    """Per-step records of a party's ``metrics.json``: its ``rounds`` (horizontal FL, MultiConfederated), else
    its ``history`` of equal-length lists (vertical jobs: ``loss`` per epoch) as one record per epoch."""
    rounds = doc.get("rounds")
    if isinstance(rounds, list):
        return [r if isinstance(r, dict) else {"value": r} for r in rounds]
    history = doc.get("history")
    if isinstance(history, dict):
        series = {k: v for k, v in history.items() if isinstance(v, list)}
        n = max((len(v) for v in series.values()), default=0)
        return [{"epoch": i + 1, **{k: v[i] for k, v in series.items() if len(v) == n}} for i in range(n)]
    return []


def _value(record: dict, metric: str) -> float:
    """``record[metric]``, also looked up in its ``test_metrics`` (a regression head's r2, rmse); NaN if absent."""
    v = record.get(metric, (record.get("test_metrics") or {}).get(metric))
    return float(v) if isinstance(v, (int, float)) and v is not None else float("nan")


class SimulationResult:
    """The outcome of a simulated job.

    Attributes:
        job: the :class:`~secureflhv.runtime.api.job_builder.Job` that ran.
        config: the JobConfig the parties ran (with the simulation's certificates and overrides).
        output_dir: ``job.output_dir`` resolved; party ``p`` wrote ``output_dir / p``.
        history: the main party's per-round records (:attr:`main_party`: the server of a horizontal job, else
            the guest, else the first party): horizontal FL's ``metrics.json`` ``rounds`` (round, survivors,
            ``test_accuracy`` over the clients' local test rows, ``train_loss``, ``client_accuracy``, ...),
            or a vertical job's epochs (``{"epoch", "loss", ...}``); [] when the algorithm has no rounds.
        client_metrics: {data party id (guest, hosts): its per-round records} (horizontal FL: each client's
            local test metrics per round; a party without rounds: its whole ``metrics.json``, or {}).
        results: {party id: what its algorithm's ``run`` returned} (horizontal FL's server: the last record).
        ca: PEM bytes of the CA that signed the parties' bundles (pass it to :func:`secureflhv.load_model`).
        seconds: wall-clock time of the run (the protocol, without the preflight).
        wire: {party id: its transport's byte counts} (:meth:`~secureflhv.transport.Transport.wire_stats`).
    """

    def __init__(self, job, config: JobConfig, results: dict[str, Any], *, ca: bytes, seconds: float, wire: dict):
        self.job, self.config, self.results = job, config, dict(results)
        self.ca, self.seconds, self.wire = ca, seconds, wire
        self.output_dir: Path = config.resolve(config.job.output_dir)
        self.history: list[dict] = _records(self.metrics_of(self.main_party))
        self.client_metrics: dict[str, Any] = {}
        for party in config.parties:
            if party.role != "server":
                doc = self.metrics_of(party.id)
                self.client_metrics[party.id] = _records(doc) if isinstance(doc.get("rounds"), list) else doc
        self._model = _UNSET

    @property
    def main_party(self) -> str:
        """The party whose records are :attr:`history` and whose bundle is :attr:`model`: the server of a
        horizontal job, else the guest (vertical), else the first party (peers)."""
        cfg = self.config
        if self.job.spec.family == "horizontal" and cfg.server is not None:
            return cfg.server.id
        guests = cfg.by_role("guest")
        return (guests[0] if guests and self.job.spec.family == "vertical" else cfg.parties[0]).id

    def metrics_of(self, party: str) -> dict:
        """Party ``party``'s ``metrics.json`` ({} when it wrote none)."""
        return _read_json(self.output_dir / party / "metrics.json")

    @property
    def metrics(self) -> dict:
        """The main party's final metrics: ``final`` of its ``metrics.json`` (horizontal FL: the last round's
        record), else its ``metrics`` (vertical jobs: train / test metrics of the task)."""
        doc = self.metrics_of(self.main_party)
        return doc.get("final") or doc.get("metrics") or {}

    def load_model(self, party: str | None = None):
        """Party ``party``'s (default :attr:`main_party`'s) verified model bundle as a
        :class:`~secureflhv.runtime.store.loaded_model.LoadedModel` (``predict`` / ``predict_proba`` where
        the algorithm scores locally). ModelBundleError when it wrote none or it does not verify."""
        from ..store.model_api import load_model

        party = party or self.main_party
        return load_model(self.output_dir / party, ca=self.ca, expect_party=party, expect_job=self.config.job.id)

    @property
    def model(self):
        """The final model: for a bundle holding a torch model (horizontal FL, MultiConfederated) the
        ``torch.nn.Module`` rebuilt from the main party's bundle (its architecture and
        ``model.safetensors``, in inference mode); for other bundles their
        :class:`~secureflhv.runtime.store.loaded_model.LoadedModel` (trees: ``predict``; a vertical
        model: its guest part, scored by a prediction job); None when the main party wrote no bundle."""
        if self._model is _UNSET:
            self._model = None
            if (self.output_dir / self.main_party / "model").is_dir():
                loaded = self.load_model()
                self._model = _torch_module(loaded) or loaded
        return self._model

    # ------------------------------------------------------------------ plots and text
    def _metric(self, metric: str | None) -> str:
        if metric is not None:
            return metric
        for name in PLOT_METRICS:
            if any(math.isfinite(_value(r, name)) for r in self.history):
                return name
        raise ValueError(f"no per-round metric to plot in the history of {self.main_party} (fields: "
                         f"{sorted(self.history[0]) if self.history else 'no rounds'})")

    def plot(self, path=None, *, metric: str | None = None):
        """A matplotlib figure of ``metric`` per round (default: the first of :data:`PLOT_METRICS` in the
        history: test accuracy over the clients' local test rows, R² for regression, else the loss), and
        the worst client's accuracy when the history has it. Drawn with the Agg canvas (no pyplot state,
        no window); ``path``: also saved there (PNG, or the suffix's format). Returns the Figure.
        ValueError when the history has no such metric."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        metric = self._metric(metric)
        step = "round" if any("round" in r for r in self.history) else "epoch"
        xs = [r.get(step, i + 1) for i, r in enumerate(self.history)]
        fig = Figure(figsize=(6, 4), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot(xs, [_value(r, metric) for r in self.history], marker="o", markersize=3, label=metric)
        if metric == "test_accuracy" and any(math.isfinite(_value(r, "worst_client_accuracy")) for r in self.history):
            ax.plot(xs, [_value(r, "worst_client_accuracy") for r in self.history], marker="o", markersize=3,
                    label="worst client")
            ax.legend()
        ax.set(title=f"job {self.config.job.id} ({self.job.spec.name}), {self.main_party}", xlabel=step,
               ylabel=metric)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path)
        return fig

    def __repr__(self) -> str:
        cfg = self.config
        steps = f"{len(self.history)} {'rounds' if any('round' in r for r in self.history) else 'epochs'}"
        final = ""
        try:
            metric = self._metric(None)
            final = f"; final {metric} {_value(self.history[-1], metric):.4f}"
        except ValueError:
            pass
        data = [p.id for p in cfg.parties if p.role != "server"]
        return (f"SimulationResult(job {cfg.job.id!r} ({self.job.spec.name}), {steps} in {self.seconds:.1f}s"
                f"{final}; parties {', '.join(data)}{' + ' + cfg.server.id if cfg.server else ''}; "
                f"output {self.output_dir})")


def _torch_module(loaded):
    """The torch model of a bundle with ``model.safetensors`` and its architecture in ``config.model``
    (inference mode), or None for other bundles."""
    bundle = loaded.bundle
    if "model.safetensors" not in bundle.files or not isinstance((bundle.manifest.get("config") or {}).get("model"),
                                                                    dict):
        return None
    import numpy as np
    import torch

    from ...horizontal.models import ModelSpec, build_model

    doc = bundle.manifest["config"]["model"]
    if "factory" in doc:  # a user's model (params.model.factory): rebuilt through its factory, as load_model does
        from ...horizontal.user_model import UserModelSpec

        net = build_model(UserModelSpec(**doc))
    else:
        net = build_model(ModelSpec(**doc))
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in bundle.file("model.safetensors").items()},
                        strict=True)
    net.train(False)  # inference mode
    return net
