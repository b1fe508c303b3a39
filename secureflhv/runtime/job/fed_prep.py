"""The federated preprocessing step of horizontal jobs (``params.preprocessing``), before training.

Every client sends the summable statistics of its *training* rows through the job's aggregation
(secure aggregation by default; :mod:`secureflhv.fedstats.preprocessing`, whose docstring says what
the server learns: only pooled counts and sums) and every party gets the same
:class:`~secureflhv.fedstats.statistics.FederatedStatistics`:

* horizontal FL: each client builds the same global
  :class:`~secureflhv.data.tabular.Preprocessor` (mean imputation + standardisation with the global
  mean and variance, most-frequent imputation + one-hot over the schema's declared vocabularies,
  optional missing indicators) and trains on its output; ``params.model.n_features`` must be the
  output width. The preprocessor is saved in the model bundle (``preprocessing.preprocessor``), so
  :func:`secureflhv.load_model` applies it to raw rows.
* horizontal SecureBoost: round A only (counts and the log-magnitude range sketch); its global
  ranges replace the clients' revealed min/max as the trees' ``feature_ranges``, over which the
  trees' own grid-count sketch (:mod:`secureflhv.tree.binning`) places the bin edges. The sketch is
  thus two-level and mergeable by summation: log-magnitude bucket counts (ratio 2^(1/8)) give a range
  [lo, hi] holding every training value, then counts over ``sketch_bins`` equal cells of width
  w = (hi - lo) / sketch_bins. Error bound: each cut is the upper boundary of the cell holding the
  pooled order statistic of its target rank ceil(k N / max_bin), so 0 < cut - quantile <= w (up to
  float32 rounding of the grid; ``tests/tree/test_fed_sketch_bins.py``), where
  w <= (max - min + (2^(1/8) - 1) (|min| + |max|) + 2^-23) / sketch_bins (the pooled min and max).

Differential privacy (``params.preprocessing.dp``, :class:`~secureflhv.params.sum_privacy.SumDPParams`):
record-level DP of the pooled statistics by distributed Skellam noise inside secure aggregation
(:mod:`secureflhv.fedstats.stats_privacy`); it needs public ``ranges`` (the range sketch reveals each column's
extremes) and ``aggregation.kind: secagg`` (``plain_quantised`` for tests: it shows the server every client's
vector, noised by its share only). The (ε, δ) record is in the bundle's ``federated_statistics.privacy``.

Columns: the table's feature columns; categorical ones need declared categories (``data.schema``),
identical at every client (the server checks and names a client that differs).
"""
from __future__ import annotations

import logging

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...fedstats.statistics import FederatedStatistics, StatsError, StatsSpec
from ...data.tabular import Preprocessor
from ...fedstats.preprocessing import (FederatedStatsClient, FederatedStatsError, FederatedStatsServer,
                                      stats_aggregation_config)
from ...params.sum_privacy import SumDPParams
from ...secagg import AggregationConfig
from ...transport import Transport
from .job_file import JobConfig, JobConfigError, PartySpec

log = logging.getLogger("secureflhv.job")


class FederatedPreprocessingParams(BaseModel):
    """``params.preprocessing`` of a horizontal FL job (absent or null: no preprocessing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    standardize: bool = Field(default=True, description="standardise numeric columns (global mean / std)")
    missing_indicator: bool = Field(default=False, description="add '<column>=missing' for each column with a "
                                                               "missing cell at some client")
    ranges: list[tuple[float, float]] | None = Field(
        default=None, description="public (lo, hi) per numeric column, in column order: no range sketch is "
                                  "aggregated; values outside are clipped for the moments")

    dp: SumDPParams | None = Field(
        default=None, description="record-level DP of the pooled statistics (distributed Skellam noise); needs "
                                  "public ranges")

    @model_validator(mode="after")
    def _dp_needs_ranges(self) -> "FederatedPreprocessingParams":
        if self.dp is not None and self.ranges is None:
            raise ValueError("dp needs public ranges (params.preprocessing.ranges): the range sketch reveals each "
                             "column's extreme values, which one row decides and noise cannot hide")
        return self

    @field_validator("ranges")
    @classmethod
    def _finite_ranges(cls, v):
        for i, (lo, hi) in enumerate(v or []):
            if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise ValueError(f"range {i} is [{lo}, {hi}]: need finite lo < hi")
        return v


def spec_of(feature_names, categories: dict, *, ranges=None, moments: bool = True) -> StatsSpec:
    """The :class:`StatsSpec` of a table's columns (categorical: its vocabulary)."""
    return StatsSpec(tuple(feature_names), {k: tuple(v) for k, v in (categories or {}).items()},
                     None if ranges is None else tuple(tuple(r) for r in ranges), moments)


def aggregation_for(base: AggregationConfig) -> AggregationConfig:
    """The job's aggregation (kind, threshold, timeouts, min_clients, max_colluders, the job's clients) with
    exact-integer quantisation."""
    return stats_aggregation_config(base.kind, threshold=base.threshold, min_clients=base.min_clients,
                                    max_colluders=base.max_colluders, job_clients=base.job_clients,
                                    consistency_check=base.consistency_check, stage_timeout_s=base.stage_timeout_s,
                                    input_timeout_s=base.input_timeout_s, seed=base.seed)


def check_dp(dp: SumDPParams | None, aggregation: AggregationConfig, field: str = "params.preprocessing.dp") -> None:
    """JobConfigError when DP of the sums cannot hold: ``plain`` aggregation shows the server every client's vector
    (``plain_quantised`` is let through, for tests, with a warning)."""
    if dp is None:
        return
    if aggregation.kind == "plain":
        raise JobConfigError(f"{field}: needs aggregation.kind secagg: under plain aggregation the server sees "
                             f"every client's statistics with only that client's share of the noise")
    if aggregation.kind != "secagg":
        log.warning("%s with aggregation kind %r: the server sees every client's vector (tests only)", field,
                    aggregation.kind)


def run_server(cfg: JobConfig, party: PartySpec, transport: Transport, aggregation: AggregationConfig, *,
               ranges=None, moments: bool = True, first_round: int = 1,
               dp: SumDPParams | None = None) -> FederatedStatistics:
    """The server's part; its spec's columns come from the clients (checked equal). ``dp``: record-level DP."""
    check_dp(dp, aggregation)
    server = FederatedStatsServer(transport, [c.id for c in cfg.clients], aggregation_for(aggregation),
                                  ranges=ranges, moments=moments, first_round=first_round,
                                  timeout_s=aggregation.input_timeout_s, dp=dp)
    try:
        stats = server.run()
    except StatsError as exc:   # e.g. public ranges that do not fit the clients' numeric columns
        raise JobConfigError(f"params: federated preprocessing: {exc}") from None
    log.info("%s: federated statistics over %d rows of %s", party.id, stats.counts.n_rows, stats.participants)
    return stats


def run_client(cfg: JobConfig, party: PartySpec, transport: Transport, aggregation: AggregationConfig,
               X: np.ndarray, feature_names, categories: dict, *, ranges=None, moments: bool = True,
               first_round: int = 1, dp: SumDPParams | None = None) -> FederatedStatistics:
    """A client's part on its training rows ``X`` (float64, NaN = missing, categorical codes); ``dp``:
    record-level DP (the server's settings).

    Raises JobConfigError (naming the party's data) when the table does not fit: ranges of the wrong
    length, a value the sketch cannot hold, a code outside the vocabulary; or naming ``params.preprocessing.dp``
    when the DP settings do not fit.
    """
    check_dp(dp, aggregation)
    try:
        spec = spec_of(feature_names, categories, ranges=ranges, moments=moments)
    except StatsError as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: federated preprocessing: {exc}") from None
    try:
        client = FederatedStatsClient(transport, cfg.server.id, [c.id for c in cfg.clients], spec,
                                      aggregation_for(aggregation), first_round=first_round, dp=dp)
    except FederatedStatsError as exc:
        raise JobConfigError(f"params.preprocessing.dp: {exc}") from None
    try:
        return client.run(X)
    except StatsError as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: federated preprocessing: {exc}") from None


def preprocessor_of(stats: FederatedStatistics, settings: FederatedPreprocessingParams, where: str) -> Preprocessor:
    """The global :class:`Preprocessor`; JobConfigError (prefixed ``where``) for an all-missing column."""
    try:
        return stats.preprocessor(standardize=settings.standardize, missing_indicator=settings.missing_indicator)
    except StatsError as exc:
        raise JobConfigError(f"{where}: {exc}") from None


def bundle_state(stats: FederatedStatistics, pre: Preprocessor | None, schema: dict | None = None) -> dict:
    """The bundle's ``preprocessing``: input columns, the schema they are read with (category codes),
    the preprocessor, and the pooled statistics."""
    return {"input_features": list(stats.spec.names), "schema": schema,
            "preprocessor": None if pre is None else pre.to_dict(), "federated_statistics": stats.to_dict()}
