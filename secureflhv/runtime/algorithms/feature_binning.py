"""Federated feature binning with WOE and IV, and feature selection, as a job (``feature_binning``).

Every data party bins its own columns on the training rows (:mod:`secureflhv.data.woe`); the guest
learns each host column's per-bin label counts through :mod:`secureflhv.vertical.woe_binning` (Paillier,
the guest's key), computes WOE and IV for every column, selects columns by IV, and tells each host its
kept cuts (``monotonic``), its selected columns and, with ``send_woe``, its bins' WOE. What each role
learns: that module's docstring and ``docs/security.md``.

Artifacts: at the guest ``iv.csv`` (party, column, bins, IV, selected; multiclass: IV per class, the
column's IV their maximum), ``bins.csv`` (per column and bin: label, rows, events, non-events, WOE;
a host's bins are labelled by index, the guest never learns their cuts) and ``iv.png``. Every party
writes its bundle: its selected columns' cuts and, where known, WOE (``extra["woe_encoder"]``,
:class:`~secureflhv.data.woe.WOEEncoder`). A vertical LR, split NN or SecureBoost job whose
``params.woe_from`` names this job's ``output_dir`` keeps those columns and encodes them (WOE; a host
without its WOE: the bin index) before its own preprocessing, in training and in prediction.
"""
from __future__ import annotations

import logging
from typing import ClassVar, Literal

import numpy as np
from pydantic import ConfigDict, Field

from ...data.woe import ColumnBins, WOEEncoder, bin_label_counts, column_edges, monotonic_groups, woe_iv
from ...params.he import HEKeyParams
from ...transport import Transport
from ...vertical.woe_binning import BinningGuest, BinningHost, HostDecision
from ..job.data_prep import SplitParams, prepare_vertical
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import save_job_bundle

log = logging.getLogger("secureflhv.job")


class FeatureBinningJobParams(HEKeyParams, SplitParams):
    """``params`` of ``algorithm: feature_binning`` (every field: ``docs/parameters.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    accepts_missing_values: ClassVar[bool] = True  # missing values take their own bin

    method: Literal["quantile", "equal_width", "monotonic"] = Field(
        default="quantile", description="how each party cuts its columns (monotonic: quantile fine bins merged "
                                        "by the guest until event rates are monotone; binary labels)")
    max_bins: int = Field(default=10, ge=2, le=254, description="value bins per column (monotonic: fine bins); "
                                                                "missing values take one more")
    min_bin_fraction: float = Field(default=0.05, ge=0, lt=0.5,
                                    description="monotonic: merge bins holding fewer of the training rows")
    iv_threshold: float | None = Field(default=0.02, ge=0, description="select columns with IV >= this")
    top_k: int | None = Field(default=None, ge=1, description="select at most the k columns of highest IV "
                                                              "(after iv_threshold)")
    send_woe: bool = Field(default=False, description="send each host its bins' WOE so it can WOE-encode its "
                                                      "columns (reveals label statistics: docs/security.md)")
    min_woe_rows: int = Field(default=20, ge=1, description="send_woe: bins with fewer rows get WOE 0")
    max_features: int = Field(default=10_000, ge=1, description="most columns a host may bin (bounds its message)")
    adjustment: float = Field(default=0.5, gt=0, le=1, description="added to a bin's counts lacking events or "
                                                                   "non-events (WOE stays finite)")


def check(cfg: JobConfig, params: FeatureBinningJobParams) -> None:
    """A server has no part in binning."""
    if cfg.server is not None:
        raise JobConfigError("parties: feature_binning runs between the guest and the hosts; remove the server")


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: FeatureBinningJobParams, *,
        resume: bool = False) -> dict:
    """This party's part; returns the guest's summary (columns, selected, IV per column), others ``{}``.

    Raises JobConfigError for labels that are not class ids, BinningError when a peer fails or lies.
    """
    data = prepare_vertical(cfg, party, transport, params)
    X = np.asarray(data.X[data.train], dtype=np.float64)
    method = "quantile" if params.method == "monotonic" else params.method
    bins = [ColumnBins(name, column_edges(X[:, j], method, params.max_bins))
            for j, name in enumerate(data.feature_names)]
    if party.role == "host":
        decision = BinningHost(transport, cfg.guest.id, bins, X, max_bins=params.max_bins,
                               insecure_test_key=params.insecure_test_key, backend=params.he_scheme).run()
        final = [b.merged(k) for b, k in zip(bins, decision.keep_cuts)]
        _save(cfg, party, data.feature_names, final, decision.selected, decision.woe)
        return {}
    return _guest(cfg, party, transport, params, data, X, bins)


def _labels(y: np.ndarray, where: str) -> tuple[np.ndarray, int]:
    y = np.asarray(y, dtype=np.float64)
    if not (y.size and np.all(y == np.round(y)) and y.min() >= 0):
        raise JobConfigError(f"{where}: feature_binning needs class ids 0..K-1 (binary: 1 = event)")
    k = int(y.max()) + 1
    if k < 2:
        raise JobConfigError(f"{where}: the training rows hold one class only; WOE needs events and non-events")
    return y.astype(np.int64), k


def _guest(cfg: JobConfig, party: PartySpec, transport: Transport, params: FeatureBinningJobParams, data,
           X: np.ndarray, bins: list[ColumnBins]) -> dict:
    y, k = _labels(data.y[data.train], cfg.where(party, "data.label_column"))
    if params.method == "monotonic" and k != 2:
        raise JobConfigError("params.method: monotonic merging needs binary labels")
    guest = BinningGuest(transport, [h.id for h in cfg.hosts], y, k, max_features=params.max_features,
                         max_bins=params.max_bins, key_bits=params.key_bits,
                         insecure_test_key=params.insecure_test_key, backend=params.he_scheme)
    hosts = guest.host_counts()
    rows = [_Column(party.id, b, bin_label_counts(b.index(X[:, j]), y, b.n_bins, k)) for j, b in enumerate(bins)]
    for h, got in hosts.items():  # a host's cuts stay there: its bins are known here by index only
        rows += [_Column(h, ColumnBins(name, np.arange(1, len(c) - 1, dtype=np.float64)), c)
                 for name, c in zip(got.names, got.counts)]
    min_rows = int(np.ceil(params.min_bin_fraction * len(y)))
    for col in rows:
        col.finish(params, min_rows)
    _select(rows, params)
    guest.send_decisions({h: _decision([c for c in rows if c.party == h], params) for h in hosts})
    own = [c for c in rows if c.party == party.id]
    _save(cfg, party, data.feature_names, [c.bins for c in own], [c.selected for c in own],
          [c.woe for c in own] if k == 2 else None)
    return _reports(cfg, party, rows, params, k)


class _Column:
    """One column as the guest sees it: its party, bins and per-bin class counts; after :meth:`finish`
    its final bins (monotonic merging), WOE (binary) and IV (multiclass: the largest one-vs-rest IV)."""

    def __init__(self, party: str, bins: ColumnBins, counts: np.ndarray):
        self.party, self.bins, self.counts = party, bins, np.asarray(counts, dtype=np.int64)
        self.keep = np.ones(bins.n_bins - 2, dtype=bool)
        self.woe: np.ndarray | None = None
        self.iv_per_class: list[float] = []
        self.selected = False

    @property
    def iv(self) -> float:
        """The column's IV (NaN when no class has both events and non-events)."""
        finite = [v for v in self.iv_per_class if np.isfinite(v)]
        return max(finite) if finite else float("nan")

    def finish(self, params: FeatureBinningJobParams, min_rows: int) -> None:
        """Merge (monotonic) and compute WOE and IV."""
        if params.method == "monotonic":
            value = self.counts[:-1]
            self.keep = monotonic_groups(value[:, 1], value.sum(axis=1), min_rows)
            groups = np.split(np.arange(len(value)), np.flatnonzero(self.keep) + 1)
            self.counts = np.vstack([value[g].sum(axis=0) for g in groups] + [self.counts[-1:]])
            self.bins = self.bins.merged(self.keep)
        total = self.counts.sum(axis=1)
        woes = []
        for c in range(self.counts.shape[1]):
            events = self.counts[:, c]
            if events.sum() == 0 or events.sum() == total.sum():
                self.iv_per_class.append(float("nan"))
                woes.append(None)
                continue
            w, iv = woe_iv(events, total - events, params.adjustment)
            self.iv_per_class.append(iv)
            woes.append(w)
        if self.counts.shape[1] == 2:
            self.woe, self.iv_per_class = woes[1], self.iv_per_class[1:]  # binary: class 1 is the event


def _select(rows: list[_Column], params: FeatureBinningJobParams) -> None:
    """IV >= ``iv_threshold``, then the ``top_k`` highest (ties: job file order)."""
    ranked = sorted((c for c in rows if np.isfinite(c.iv)), key=lambda c: -c.iv)
    if params.iv_threshold is not None:
        ranked = [c for c in ranked if c.iv >= params.iv_threshold]
    for c in ranked[:params.top_k]:
        c.selected = True


def _decision(rows: list[_Column], params: FeatureBinningJobParams) -> HostDecision:
    """A host's answer: kept cuts, selection and, with ``send_woe``, WOE (0 in bins under ``min_woe_rows``)."""
    woe = None
    if params.send_woe and all(c.woe is not None for c in rows):
        woe = [np.where(c.counts.sum(axis=1) >= params.min_woe_rows, c.woe, 0.0) for c in rows]
    return HostDecision([c.keep for c in rows], [c.selected for c in rows], woe)


def _save(cfg: JobConfig, party: PartySpec, names: list[str], bins: list[ColumnBins], selected: list[bool],
          woe: list[np.ndarray] | None) -> None:
    """This party's bundle: the encoder of its selected columns (WOE where known, else bin indices) and the
    bins (and WOE) of all its columns."""
    keep = [i for i, s in enumerate(selected) if s]
    encoder = WOEEncoder(list(names), [bins[i] for i in keep], None if woe is None else [woe[i] for i in keep])
    every = WOEEncoder(list(names), bins, woe).to_dict()  # all columns, for reports and audits
    save_job_bundle(cfg, party, files={}, feature_names=list(names),
                    extra={"woe_encoder": encoder.to_dict(), "selected": [names[i] for i in keep], "bins": every})
    log.info("%s: %d of %d columns selected%s", party.id, len(keep), len(names),
             "" if woe is not None else " (encoded by bin index: no WOE known here)")


def _reports(cfg: JobConfig, party: PartySpec, rows: list[_Column], params: FeatureBinningJobParams, k: int) -> dict:
    """iv.csv, bins.csv and iv.png at the guest; the summary it returns."""
    import pandas as pd

    out = cfg.output_dir(party.id)
    out.mkdir(parents=True, exist_ok=True)
    iv = pd.DataFrame([{"party": c.party, "column": c.bins.name, "bins": c.bins.n_bins, "iv": c.iv,
                        **({f"iv_class_{i}": v for i, v in enumerate(c.iv_per_class)} if k > 2 else {}),
                        "selected": c.selected} for c in rows])
    iv.to_csv(out / "iv.csv", index=False)
    detail = []
    for c in rows:
        own = c.party == party.id  # a host's cuts stay at the host: its bins are labelled by index
        labels = c.bins.labels() if own else [f"bin {b}" for b in range(c.bins.n_bins - 1)] + ["missing"]
        for b, label in enumerate(labels):
            detail.append({"party": c.party, "column": c.bins.name, "bin": label, "rows": int(c.counts[b].sum()),
                           **{f"class_{i}": int(v) for i, v in enumerate(c.counts[b])},
                           "woe": float(c.woe[b]) if c.woe is not None else float("nan")})
    pd.DataFrame(detail).to_csv(out / "bins.csv", index=False)
    plot_iv(iv, out / "iv.png", params.iv_threshold)
    selected = [f"{c.party}:{c.bins.name}" for c in rows if c.selected]
    log.info("%s: IV of %d columns; selected %s", party.id, len(rows), ", ".join(selected) or "none")
    return {"columns": len(rows), "selected": selected,
            "iv": {f"{c.party}:{c.bins.name}": c.iv for c in rows}}


def plot_iv(iv, path, threshold: float | None):
    """Horizontal bars of each column's IV (``iv``: the iv.csv frame), selected columns coloured, the
    threshold dashed; saved as PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iv = iv.sort_values("iv", na_position="first")
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(iv) + 1.5))
    names = [f"{p}: {c}" for p, c in zip(iv["party"], iv["column"])]
    ax.barh(names, iv["iv"].fillna(0), color=["tab:blue" if s else "tab:gray" for s in iv["selected"]])
    if threshold is not None:
        ax.axvline(threshold, ls="--", c="k", label=f"IV threshold {threshold:g}")
        ax.legend(loc="lower right")
    ax.set(xlabel="information value (IV)", title="IV per column (blue: selected)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
