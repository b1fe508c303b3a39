"""Horizontal SecureBoost as a job (``algorithm: secureboost_horizontal``): server + clients.

Each client loads its own rows (:func:`secureflhv.runtime.job.data_prep.load_party_table`) and splits them
with the job's seed; histograms go through secure aggregation (:mod:`secureflhv.tree.horizontal`). The
server writes ``model.xgboost.json`` (loadable by ``xgboost.Booster``); each client writes ``metrics.json``
on its own test rows. The server and every client write the global trees as a model bundle
(``model/``: ``model.json`` and ``model.xgboost.json``).

``params``: :class:`secureflhv.tree.params.SecureBoostParams` fields plus ``test_fraction``,
``split_seed``, ``validation_fraction``, ``aggregation`` ("secagg" | "plain_quantised" | "plain"),
``feature_ranges`` (public [lo, hi] per feature), ``range_source`` ("federated", the default: without
public ranges the global ranges come from the federated preprocessing's range sketch, one secure
aggregation of counts per log-magnitude bucket, :mod:`secureflhv.runtime.job.fed_prep`, so no client
reveals its min/max; "clients": each client sends its min/max to the server) and
``threshold`` (t: a count or a fraction of the clients; default ceil(2n/3); must be > n/2 and >= 2):
the job goes on without clients that drop out while at least t remain (the launcher tolerates a
failing client; the server rebuilds the boosting round the client was lost in, see
:mod:`secureflhv.tree.horizontal`).

``dp`` (:class:`secureflhv.tree.tree_privacy.TreeDPParams`): record-level distributed Skellam noise on every sum
(binning, each level's histograms, each round's validation loss; :mod:`secureflhv.tree.tree_privacy`). Needs
``feature_ranges``, ``aggregation: secagg`` (``plain`` refused; ``plain_quantised`` only for tests) and a
classification objective; a validation loss is released each round when ``validation_fraction`` > 0. The (ε, δ)
record: the server's ``metrics.json`` (``privacy`` and ``rounds[i].privacy``), every bundle's
``extra.privacy`` (a client's: its own bound, every release it submitted at the planned variance).

Checkpoints (:mod:`secureflhv.runtime.store.checkpoint`): every party saves its state after each boosting round
under ``<output_dir>/<party>/checkpoints/step-<rounds done>/`` (what is stored:
:mod:`secureflhv.tree.horizontal`). At start-up (clients: after loading their data) all parties agree on
a step (:mod:`secureflhv.runtime.store.resume`); with ``--resume`` they continue after it, and the finished
trees equal an uninterrupted run's exactly. What a peer learns from the agreement: which rounds the others
completed, nothing else.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from ...transport import Transport
from ...secagg import AggregationConfig, AggregationConfigError
from ...tree.horizontal import (HorizontalSecureBoostClient, HorizontalSecureBoostServer, job_threshold,
                                tree_aggregation_config)
from ...tree.model import model_to_dict
from ...tree.tree_privacy import TreeDP, TreeDPParams
from ...tree.xgb_export import save_xgboost_json, to_xgboost_json
from ..job import fed_prep
from ..store.artifacts import write_json
from ..job.data_prep import load_party_table, split_rows
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import save_job_bundle
from ..observe.reports import evaluate_split, objective_metrics, objective_task, save_task_plots
from ..store.resume import role_lifecycle
from .secureboost_vertical import SecureBoostSplitParams, tree_params


class HorizontalSecureBoostJobParams(SecureBoostSplitParams):
    """Vertical SecureBoost's ``params`` plus how histograms are aggregated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregation: Literal["secagg", "plain_quantised", "plain"] = "secagg"
    feature_ranges: list[tuple[float, float]] | None = None
    range_source: Literal["federated", "clients"] = Field(
        default="federated", description="without feature_ranges: the federated range sketch (the server learns "
                                         "pooled bucket counts only) or each client's min/max (revealed)")
    threshold: int | float | None = Field(default=None, gt=0, description="clients that must remain (t): a count "
                                          "or a fraction of the clients; default: the smallest t with "
                                          "max_colluders < 2t − n")
    max_colluders: int = Field(default=1, ge=0, description="clients that may collude with a malicious server "
                               "(Bonawitz et al. 2017, Thm 6.5: n_C < 2t − n)")
    min_clients: int = Field(default=3, ge=2, description="fewest clients a histogram sum may hold; 2 is an explicit "
                             "opt-in (each then learns the other's histograms) and needs max_colluders 0")
    dp: TreeDPParams | None = Field(default=None, description="record-level DP: distributed Skellam noise on every "
                                    "sum (secureflhv.tree.tree_privacy)")


def aggregation_config(cfg: JobConfig, params: HorizontalSecureBoostJobParams) -> AggregationConfig:
    """The job's histogram aggregation settings (:func:`tree_aggregation_config`; timeouts: the job deadline;
    the job's clients as the only allowed participants)."""
    threshold = {} if params.threshold is None else {"threshold": params.threshold}
    return tree_aggregation_config(params.aggregation, stage_timeout_s=cfg.job.deadline_s,
                                   input_timeout_s=cfg.job.deadline_s, max_colluders=params.max_colluders,
                                   min_clients=params.min_clients, job_clients=tuple(c.id for c in cfg.clients),
                                   **threshold)


def check(cfg: JobConfig, params: HorizontalSecureBoostJobParams) -> None:
    """The threshold fits the job's clients (n_C < 2t − n, enough clients); JobConfigError names the field."""
    try:
        agg = job_threshold(aggregation_config(cfg, params), [c.id for c in cfg.clients])
    except AggregationConfigError as exc:
        raise JobConfigError(f"params.{exc.field}: {exc}") from None
    if params.dp is not None:
        _check_dp(params, agg)


def _check_dp(params: HorizontalSecureBoostJobParams, agg: AggregationConfig) -> None:
    """JobConfigError naming the field when ``params.dp`` cannot hold (the roles refuse the same at start)."""
    if params.aggregation == "plain":
        raise JobConfigError("params.aggregation: params.dp needs secagg (plain shows the server every client's "
                             "histograms with only that client's share of the noise)")
    if params.feature_ranges is None:
        raise JobConfigError("params.feature_ranges: params.dp needs public feature ranges (a client's min/max or "
                             "the range sketch reveals extreme values, which one row decides)")
    try:
        TreeDP.of(_dp_of(params), tree_params(params), len(params.feature_ranges), int(agg.threshold),
                  int(agg.max_colluders))
    except ValueError as exc:
        msg = str(exc)
        raise JobConfigError(msg if msg.startswith("params.") else f"params.dp: {msg}") from None


def _dp_of(params: HorizontalSecureBoostJobParams) -> TreeDPParams | None:
    """``params.dp`` with ``validation`` set by the job: a loss is released per round iff there are validation rows."""
    if params.dp is None:
        return None
    return params.dp.model_copy(update={"validation": params.validation_fraction > 0})


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: HorizontalSecureBoostJobParams, *,
        resume: bool = False) -> dict:
    """Run this party's role; returns a client's metrics (the server: ``{}``)."""
    algo = tree_params(params)
    agg = aggregation_config(cfg, params)
    out_dir = cfg.output_dir(party.id)
    client_ids = [c.id for c in cfg.clients]
    federated = params.feature_ranges is None and params.range_source == "federated"
    dp = _dp_of(params)
    if party.role == "server":
        ranges, prep = params.feature_ranges, None
        if federated:   # aggregation round 0: before the trees' rounds (1, 2, ...)
            stats = fed_prep.run_server(cfg, party, transport, agg, moments=False, first_round=0)
            ranges, prep = _ranges_of(stats), fed_prep.bundle_state(stats, None)
        server = HorizontalSecureBoostServer(transport, client_ids, algo, aggregation=agg, feature_ranges=ranges,
                                             dp=dp, **role_lifecycle(cfg, party, transport, resume))
        model = server.fit()
        out_dir.mkdir(parents=True, exist_ok=True)
        save_xgboost_json(model, out_dir / "model.xgboost.json")
        if server.privacy is not None:
            write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "privacy": server.privacy,
                                                  "rounds": [{"round": h["round"], "privacy": h}
                                                             for h in server.privacy_history]})
        _save_bundle(cfg, party, model, params, None, {}, prep, server.privacy)
        return {}
    table = load_party_table(cfg, party, require_label=True)
    X, y = np.asarray(table.X, dtype=np.float64), table.y
    split = split_rows(len(y), params.test_fraction, params.split_seed, params.validation_fraction)
    prep = None
    if federated:   # trees bin raw values and category codes: every column is numeric to the sketch
        stats = fed_prep.run_client(cfg, party, transport, agg, X[split.train], table.feature_names, {},
                                    moments=False, first_round=0)
        prep = fed_prep.bundle_state(stats, None)
    client = HorizontalSecureBoostClient(transport, cfg.server.id, client_ids, X[split.train], y[split.train], algo,
                                         X_val=split.validation(X), y_val=split.validation(y),
                                         aggregation=agg, send_ranges=params.feature_ranges is None and not federated,
                                         dp=dp, **role_lifecycle(cfg, party, transport, resume))
    model = client.fit()
    metrics, p_test = evaluate_split(y, split, lambda rows: model.predict(X[rows]),
                                     lambda y_, p_: objective_metrics(y_, p_, algo.objective))
    write_json(out_dir / "metrics.json", {"job_id": cfg.job.id, "metrics": metrics,
                                          **({} if client.privacy is None else {"privacy": client.privacy})})
    if p_test is not None:
        save_task_plots(out_dir, y[split.test], p_test, objective_task(algo.objective),
                        f"horizontal SecureBoost, job {cfg.job.id}, {party.id} local test rows")
    _save_bundle(cfg, party, model, params, list(table.feature_names), metrics, prep, client.privacy)
    return metrics


def _ranges_of(stats) -> list[tuple[float, float]]:
    """The trees' (lo, hi) per feature from the range sketch (a column with no value anywhere: (0, 0))."""
    c = stats.counts
    return [(float(lo), float(hi)) if c.present[n] else (0.0, 0.0)
            for n, lo, hi in zip(stats.spec.numeric, c.lo, c.hi)]


def _save_bundle(cfg: JobConfig, party: PartySpec, model, params, feature_names, metrics: dict,
                 prep: dict | None = None, privacy: dict | None = None) -> None:
    """The global model as a bundle: ``model.json`` (every split known) and ``model.xgboost.json``; with the
    federated range sketch, its pooled statistics (``preprocessing.federated_statistics``); under DP the (ε, δ)
    record in ``extra.privacy``."""
    import json

    save_job_bundle(cfg, party, files={"model.json": model_to_dict(model),
                                       "model.xgboost.json": json.dumps(to_xgboost_json(model))},
                    feature_names=feature_names, config=params.model_dump(mode="json"), metrics=metrics,
                    task=objective_task(params.objective), preprocessing=prep,
                    extra=None if privacy is None else {"privacy": privacy})
