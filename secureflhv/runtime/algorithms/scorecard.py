"""A credit scorecard from a vertical LR trained on WOE features, as a job (``scorecard``).

The model is a ``vertical_lr`` job's bundles (``params.model_dir``) trained with ``params.woe_from``
(:mod:`secureflhv.runtime.algorithms.feature_binning`), binary. Each data party turns its own part of
the model into points per bin (:func:`secureflhv.data.scorecard_points.scorecard_points`, PDO scaling:
``score = offset - factor * logit``, factor = pdo / ln 2, offset = base_score - factor * ln(base_odds)):
for feature j and bin b, points = -factor * w_j * x_jb, where x_jb is the bin's WOE after the LR job's
own preprocessing (its standardisation), so that a row's points add up to the model's score exactly
(``round_points``: each bin rounded, totals within half a point per feature). The guest adds the base
points (from the intercept). Then the parties score this job's rows (the data sections, aligned by
PSI): each host sends the guest its points total per row (:mod:`secureflhv.vertical.score_totals`), and
the guest writes ``scores.csv`` and,
with labels, KS, AUC and the lift and gain tables and plots (:mod:`secureflhv.data.credit_metrics`).

What each role learns: every party's points table stays at that party (``scorecard.csv``); the guest
learns each host's points total per row, i.e. its part of the score (as in a two-party vertical LR
prediction), and the PSI sizes; a host learns the number of rows scored. A host's totals are checked
for shape and finiteness only: a host can shift its own part of the score, as in LR prediction.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field

from ...data.credit_metrics import ks_table, lift_gain_table, plot_ks, plot_lift_gain
from ...data.scorecard_points import points_table, scaling, scorecard_points, score_rows
from ...data.metrics import task_metrics
from ...data.tabular import Preprocessor
from ...data.woe import WOEEncoder
from ...transport import Transport
from ...vertical.score_totals import gather_totals, send_totals
from ..job.data_prep import align_by_psi
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.artifacts import write_json
from .predict import ModelDirParams, load_new_rows, load_party_bundle

log = logging.getLogger("secureflhv.job")


class ScorecardJobParams(ModelDirParams):
    """``params`` of ``algorithm: scorecard``: the LR model's folder and the scaling (``docs/parameters.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pdo: float = Field(default=20.0, gt=0, description="points to double the good:bad odds")
    base_score: float = Field(default=600.0, description="the score at good:bad odds base_odds")
    base_odds: float = Field(default=50.0, gt=0, description="good:bad odds at base_score")
    round_points: bool = Field(default=False, description="round each bin's points to an integer")


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: ScorecardJobParams, *,
        resume: bool = False) -> dict:
    """This party's points table, then the scores of its rows; returns the guest's metrics (others ``{}``).

    Raises JobConfigError for a bundle that is not a binary WOE vertical LR (naming ``params.model_dir``).
    """
    if party.role == "server":
        return {}  # an arbiter-mode model's key holder has no features: nothing to score
    bundle = load_party_bundle(cfg, party, params)
    where = f"params.model_dir (party {party.id!r}): {bundle.path}"
    state = bundle.manifest.get("preprocessing") or {}
    if bundle.algorithm != "vertical_lr" or not state.get("woe") or (bundle.manifest.get("task") or "binary") != \
            "binary":
        raise JobConfigError(f"{where}: a scorecard needs a binary vertical_lr model trained with params.woe_from "
                             f"(WOE features); this is a {bundle.algorithm} bundle")
    encoder = WOEEncoder.from_dict(state["woe"])
    if encoder.woe is None:
        raise JobConfigError(f"{where}: this party's features were encoded by bin index (the binning job sent no "
                             f"WOE: set send_woe: true there); a scorecard needs WOE")
    weights = np.asarray(bundle.file("weights.npy"), dtype=np.float64)
    inputs = _bin_inputs(encoder, state, where)
    names = [b.name for b in encoder.bins]
    intercept = bundle.files.get("intercept.npy") if party.role == "guest" else None
    base, points = scorecard_points(dict(zip(names, weights.tolist())),
                                    None if intercept is None else float(np.asarray(intercept).reshape(-1)[0]),
                                    dict(zip(names, inputs)), pdo=params.pdo, base_score=params.base_score,
                                    base_odds=params.base_odds, round_points=params.round_points)
    out = cfg.output_dir(party.id)
    out.mkdir(parents=True, exist_ok=True)
    table = points_table(dict(zip(names, weights.tolist())), dict(zip(names, inputs)), points,
                         bin_labels={b.name: b.labels() for b in encoder.bins},
                         base_points=base if party.role == "guest" else None)
    table.to_csv(out / "scorecard.csv", index=False)
    raw = load_new_rows(cfg, party, bundle)
    psi = align_by_psi(cfg, party, transport, raw)
    X = np.asarray(raw.X, dtype=np.float64)[psi.rows]
    own = score_rows({b.name: b.index(X[:, encoder.columns.index(b.name)]) for b in encoder.bins}, points)
    if party.role == "host":
        send_totals(transport, cfg.guest.id, own)
        log.info("%s: points table of %d features in %s; sent %d row totals", party.id, len(names), out, len(own))
        return {}
    total = base + own + sum(gather_totals(transport, [h.id for h in cfg.hosts], len(own)).values())
    y = None if raw.y is None else np.asarray(raw.y)[psi.rows]
    return _guest_reports(cfg, party, params, np.asarray(psi.ids), total, y, out)


def _bin_inputs(encoder: WOEEncoder, state: dict, where: str) -> list[np.ndarray]:
    """Per kept feature, each bin's LR input: its WOE after the LR job's preprocessing (per column)."""
    width = max(b.n_bins for b in encoder.bins)
    M = np.column_stack([np.pad(w, (0, width - len(w)), mode="edge") for w in encoder.woe])
    if state.get("preprocessor"):
        M = Preprocessor.from_dict(state["preprocessor"]).transform(M)
    elif state.get("standardisation"):
        s = state["standardisation"]
        M = (M - np.asarray(s["mean"], dtype=np.float64)) / np.asarray(s["std"], dtype=np.float64)
    if M.shape[1] != len(encoder.bins):
        raise JobConfigError(f"{where}: the LR job's preprocessing adds columns (missing_indicator?): a scorecard "
                             f"needs one input per WOE feature")
    return [M[:b.n_bins, j] for j, b in enumerate(encoder.bins)]


def _guest_reports(cfg: JobConfig, party: PartySpec, params: ScorecardJobParams, ids: np.ndarray,
                   score: np.ndarray, y, out) -> dict:
    """scores.csv and, with labels, KS / AUC / lift: P(bad) from the score (its inverse scaling)."""
    factor, offset = scaling(params.pdo, params.base_score, params.base_odds)
    p_bad = 1.0 / (1.0 + np.exp(-(offset - score) / factor))
    frame = pd.DataFrame({"id": ids, "score": score, "p_bad": p_bad})
    metrics: dict = {"rows_scored": int(len(ids)), "pdo": params.pdo, "base_score": params.base_score,
                     "base_odds": params.base_odds}
    if y is not None and len(np.unique(y)) == 2:
        frame["label"] = y
        metrics.update({k: v for k, v in task_metrics(y, p_bad, "binary").items() if isinstance(v, (int, float))})
        ks_table(y, p_bad).to_csv(out / "ks_table.csv", index=False)
        lift_gain_table(y, p_bad).to_csv(out / "lift_gain.csv", index=False)
        plot_ks(y, p_bad, out / "ks.png", title="scorecard: KS")
        plot_lift_gain(y, p_bad, out / "lift_gain.png", title="scorecard: lift and gain")
    frame.to_csv(out / "scores.csv", index=False, float_format="%.17g")
    write_json(out / "metrics.json", {"metrics": metrics})
    shown = {k: round(v, 4) if isinstance(v, float) and math.isfinite(v) else v for k, v in metrics.items()}
    log.info("%s: scored %d rows: %s", party.id, len(ids), shown)
    return metrics
