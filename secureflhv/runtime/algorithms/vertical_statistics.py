"""Cross-party statistics of a vertical job (``job.algorithm: vertical_statistics``): the Pearson correlation
between every guest and every host column under homomorphic encryption, and each party's own column report.

Data parties run the shared preparation (:func:`secureflhv.runtime.job.data_prep.prepare_vertical`: load,
PSI, split) without preprocessing: values stay raw, missing cells NaN. The statistics use the aligned rows:
all of them (``rows: all``, the default; ``test_fraction`` and ``split_seed`` are then unused) or only the
training rows of the seeded split (``rows: train``: the rows a vertical LR job with the same split settings
trains on). Then, at every data party:

* the column report of its own columns (local, nothing is sent;
  :func:`secureflhv.vertical.correlation.column_statistics`): per column rows, missing cells, distinct
  present values, mean, sample std (ddof 1, as pandas' ``describe``), min, the ``quantiles`` (linear
  interpolation, as pandas), max. Categorical columns (``data.schema``) get counts only, and take no part
  in the correlation.
* the correlation (:mod:`secureflhv.vertical.correlation`): the guest's numeric columns (with
  ``include_label``, its label column too) against each host's numeric columns. ``reveal_to: guest`` (the
  default): the guest learns every host's matrix; ``reveal_to: host``: each host learns its own matrix
  with the guest; the other party learns nothing of it. What each role learns, and why a learner with
  too many columns for the rows is refused (``min_rows_per_feature``): that module's docstring and
  docs/security.md.

The result equals :func:`numpy.corrcoef` of the joined table (with ``missing: mean`` each party's missing
cells replaced by its column mean over the rows used) to about 1e-12; NaN for a constant column.

Files, under ``<output_dir>/<party id>/`` (:mod:`secureflhv.runtime.store.artifacts`):

* ``statistics.json`` (every data party): job and party id, which rows and how many, the PSI sizes
  (``psi``: common ids, own ids, peers' set sizes), the quantile levels, the column report
  (``columns``: name -> statistics; non-finite values as null), and ``correlation``: ``reveal_to``,
  ``learned`` (whether this party holds a matrix), and at the learner per host the guest's and the host's
  column names and the matrix ``r`` (rows: guest columns; null for NaN), plus the names of the files below.
  ``rows`` is ``all`` or ``train``, ``n_rows`` how many rows that was.
* ``columns.csv`` (every data party): the column report, one row per column.
* ``correlation.csv`` and ``correlation.png`` (the learner only): the matrix, rows the guest's columns,
  columns ``<host id>/<host column>``; a heatmap of it (matplotlib; a plotting failure is logged, never
  fatal).

The job returns (the party's ``final`` status numbers) ``n_rows``, ``columns`` and ``learned`` (0/1).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from ...crypto.homomorphic.key_prefetch import prefetch_keypair
from ...data.schema import parse_schema
from ...transport import Transport
from ...vertical.correlation import (CorrelationConfig, CorrelationGuest, CorrelationHost, CorrelationRefused,
                                     CorrelationResult, column_statistics)
from ..job.data_prep import SplitParams, prepare_vertical
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.artifacts import plain_json, write_json

log = logging.getLogger("secureflhv.job")

MAX_QUANTILES = 99


class VerticalStatisticsJobParams(CorrelationConfig, SplitParams):
    """The job file's ``params`` for ``algorithm: vertical_statistics``: the correlation's settings
    (:class:`~secureflhv.vertical.correlation.CorrelationConfig`, with the homomorphic key and precision of
    :class:`~secureflhv.params.HEParams`), the split, and the report's.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``. Every field, its
    default and meaning: ``docs/parameters.md``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    accepts_missing_values: ClassVar[bool] = True  # missing cells are counted, and imputed or NaN (``missing``)

    rows: Literal["all", "train"] = Field(
        default="all", description="rows the statistics use: all aligned rows, or the training rows of the "
                                   "split (test_fraction, split_seed)")
    quantiles: list[float] = Field(default=[0.01, 0.25, 0.5, 0.75, 0.99],
                                   description="quantile levels of the column report, each in [0, 1]")
    include_label: bool = Field(default=False, description="the guest's label column takes part in the "
                                                           "correlation as one of its columns (the learner then "
                                                           "learns its correlation with the host columns)")

    @field_validator("quantiles")
    @classmethod
    def _levels(cls, v: list[float]) -> list[float]:
        if not 1 <= len(v) <= MAX_QUANTILES:
            raise ValueError(f"give 1 to {MAX_QUANTILES} levels, got {len(v)}")
        if any(not 0.0 <= q <= 1.0 for q in v):
            raise ValueError(f"every level must lie in [0, 1], got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"levels must be distinct, got {v}")
        return [float(q) for q in v]


def check(cfg: JobConfig, params: VerticalStatisticsJobParams) -> None:
    """The statistics run between the data parties: a job with a server is refused."""
    if cfg.server is not None:
        raise JobConfigError("parties: vertical_statistics runs between the guest and the hosts only; remove "
                             "the party with role: server")


def _categorical(party: PartySpec) -> set[str]:
    spec = party.data.table_schema if party.data is not None else None
    return set(parse_schema(spec).of_kind("categorical")) if spec else set()


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: VerticalStatisticsJobParams, *,
        resume: bool = False) -> dict:
    """Run this data party's part: the column report, then the correlation protocol; write the files
    (module docstring).

    ``resume`` is ignored (no checkpoints: the job is one pass). Returns ``{"n_rows", "columns", "learned"}``
    (ints: rows used, columns reported, 1 when this party holds a matrix). Raises JobConfigError for bad data
    or a refused learner (naming the field), TransportError when a peer fails or goes silent.
    """
    out_dir = cfg.output_dir(party.id)
    host_ids = [h.id for h in cfg.hosts]
    config = CorrelationConfig(**params.model_dump(include=set(CorrelationConfig.model_fields)))
    # the guest's key is generated while PSI runs
    keys = prefetch_keypair(config.he_scheme, config.key_bits, config.insecure_test_key) \
        if party.role == "guest" else None
    data = prepare_vertical(cfg, party, transport, params, preprocess=False)
    rows = data.train if params.rows == "train" else slice(None)  # all: a view, not a copy of the table
    X, names = np.asarray(data.X, dtype=np.float64)[rows], list(data.feature_names)
    n_rows = len(X)
    if party.role == "guest" and params.include_label:
        try:
            y = np.asarray(data.y, dtype=np.float64)[rows]
        except (TypeError, ValueError):
            raise JobConfigError(f"{cfg.where(party, 'data.label_column')}: params.include_label needs a numeric "
                                 f"label column") from None
        X, names = np.column_stack([X, y]), names + [str(party.data.label_column)]
    categorical = _categorical(party)
    report = column_statistics(X, names, params.quantiles, categorical=sorted(categorical & set(names)))
    numeric = [j for j, c in enumerate(names) if c not in categorical]
    if not numeric:
        raise JobConfigError(f"{cfg.where(party, 'data')}: no numeric column to correlate (every feature column "
                             f"is categorical in data.schema, or there is none); give this party a numeric column")
    Xn, numeric_names = X[:, numeric], [names[j] for j in numeric]
    log.info("%s: statistics of %d columns over %d rows (%s); correlating %d numeric columns", party.id,
             len(names), n_rows, params.rows, len(numeric))
    try:
        if party.role == "guest":
            role = CorrelationGuest(transport, host_ids, Xn, config, feature_names=numeric_names, keypair=keys)
        else:
            role = CorrelationHost(transport, cfg.guest.id, Xn, config, feature_names=numeric_names)
    except ValueError as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None
    try:
        result = role.run()
    except CorrelationRefused as exc:
        raise JobConfigError(f"params.min_rows_per_feature: {exc}") from None
    files = _save(out_dir, cfg, party, params, report, result, n_rows, data.meta.get("psi"))
    learned = bool(result.matrices)
    log.info("%s: statistics done: %s%s", party.id, files["statistics"],
             f", correlation {files['correlation_csv']}" if learned else " (the correlation went to the "
             f"{'guest' if params.reveal_to == 'guest' else 'hosts'})")
    return {"n_rows": n_rows, "columns": len(names), "learned": int(learned)}


def correlation_frame(result: CorrelationResult):
    """The learner's matrices as one float64 DataFrame (p_g, sum of the hosts' p_h): rows the guest's columns,
    columns ``<host>/<column>`` in host order; NaN for an undefined column. ValueError (pandas) when
    ``result`` holds no matrix."""
    import pandas as pd

    parts = [pd.DataFrame(m.r, index=pd.Index(m.guest_names, name="guest column"),
                          columns=[f"{h}/{c}" for c in m.host_names]) for h, m in result.matrices.items()]
    return pd.concat(parts, axis=1)


def _save(out_dir: Path, cfg: JobConfig, party: PartySpec, params, report, result: CorrelationResult,
          n_rows: int, psi: dict | None) -> dict:
    """Write statistics.json and columns.csv, and at the learner correlation.csv / .png (module docstring);
    returns {file key: Path} of what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"statistics": out_dir / "statistics.json", "columns_csv": out_dir / "columns.csv"}
    report.to_csv(files["columns_csv"])
    corr = {"reveal_to": result.reveal_to, "learned": bool(result.matrices), "matrices": {}}
    if result.matrices:
        frame = correlation_frame(result)
        files["correlation_csv"] = out_dir / "correlation.csv"
        frame.to_csv(files["correlation_csv"])
        corr["csv"] = files["correlation_csv"].name
        png = heatmap(out_dir / "correlation.png", frame, f"Pearson correlation, job {cfg.job.id} ({party.id})")
        if png is not None:
            corr["heatmap"] = png.name
        corr["matrices"] = {h: {"guest_columns": m.guest_names, "host_columns": m.host_names, "r": m.r}
                            for h, m in result.matrices.items()}
    doc = {"job_id": cfg.job.id, "party_id": party.id, "role": party.role, "rows": params.rows, "n_rows": n_rows,
           "psi": psi, "quantiles": params.quantiles,
           "columns": report.to_dict(orient="index"),
           "correlation": corr}
    write_json(files["statistics"], plain_json(doc, nan_as_none=True))
    return files


def heatmap(path: Path, frame, title: str) -> Path | None:
    """A heatmap PNG of a correlation DataFrame (range -1..1, NaN grey, labels when they fit); the path, or
    None when matplotlib failed (logged: a missing picture must not fail the job)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows, cols = frame.shape
        fig, ax = plt.subplots(figsize=(min(2 + 0.35 * cols, 24), min(1.5 + 0.3 * rows, 24)), dpi=110)
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad="#bbbbbb")
        im = ax.imshow(np.ma.masked_invalid(frame.to_numpy(dtype=np.float64)), cmap=cmap, vmin=-1, vmax=1,
                       aspect="auto", interpolation="nearest")
        if cols <= 60:
            ax.set_xticks(range(cols), [str(c) for c in frame.columns], rotation=90, fontsize=7)
        if rows <= 60:
            ax.set_yticks(range(rows), [str(c) for c in frame.index], fontsize=7)
        ax.set_xlabel("host columns")
        ax.set_ylabel("guest columns")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, label="Pearson r")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return Path(path)
    except Exception as exc:  # noqa: BLE001 - matplotlib raises many types
        log.warning("could not draw the correlation heatmap %s: %s", path, exc)
        return None
