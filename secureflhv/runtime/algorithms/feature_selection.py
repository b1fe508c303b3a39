"""Feature selection by a fitted vertical model's importance, as a job (``feature_selection``).

The model is a trained ``vertical_lr`` or ``secureboost_vertical`` job's bundles (``params.model_dir``).
Importance of a model input (:mod:`secureflhv.vertical.selection` says what travels):
    LR: |w_j| * std_j, std_j the standard deviation of input j over this job's rows at its party (after
        the model's own preprocessing; multiclass: the sum over classes of |w_jk| * std_j);
    SecureBoost: the total split gain of the column over every tree (XGBoost's ``total_gain``); a host's
        columns are known to the guest only by anonymous labels.
The guest ranks every party's inputs together and keeps those with at least ``min_share`` of the total
importance, then at most ``top_k``; an input derived from a table column (``woe(x)``, ``x=cat``,
``x=missing``) keeps that column. Each party writes its choice to ``selection.csv`` and a bundle
(``extra["selected"]``: its kept table columns); a vertical job with ``params.select_from`` naming this
job's ``output_dir`` reads only those columns, in training and in prediction.
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field

from ...transport import Transport
from ...vertical.selection import receive_importance, receive_keep, send_importance, send_keep
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import ModelBundle, save_job_bundle
from .predict import ModelDirParams, load_new_rows, load_party_bundle, model_inputs

log = logging.getLogger("secureflhv.job")


class FeatureSelectionJobParams(ModelDirParams):
    """``params`` of ``algorithm: feature_selection`` (``docs/parameters.md``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_share: float = Field(default=0.0, ge=0, lt=1, description="keep inputs with at least this share of the "
                                                                  "total importance")
    top_k: int | None = Field(default=None, ge=1, description="then keep at most the k most important inputs")
    max_features: int = Field(default=10_000, ge=1, description="most inputs a host may announce")
    seed: int | None = Field(default=None, description="seed of a SecureBoost host's anonymous column labels "
                                                       "(tests); None: OS randomness")


def source_column(name: str, columns: list[str]) -> str:
    """The table column a model input comes from: itself, ``x`` of ``woe(x)`` / ``bin(x)``, or of a
    one-hot / missing-indicator input ``x=...``. ValueError when none of ``columns`` matches."""
    if name in columns:
        return name
    for kind in ("woe(", "bin("):
        if name.startswith(kind) and name.endswith(")") and name[len(kind):-1] in columns:
            return name[len(kind):-1]
    head = name.rsplit("=", 1)[0]
    if head in columns:
        return head
    raise ValueError(f"model input {name!r} comes from none of the table's columns {columns}")


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: FeatureSelectionJobParams, *,
        resume: bool = False) -> dict:
    """This party's part; returns the guest's summary (importance per input, kept), others ``{}``.

    Raises JobConfigError for a bundle of another algorithm (naming ``params.model_dir``).
    """
    if party.role == "server":
        return {}  # an arbiter-mode LR's key holder has no features
    bundle = load_party_bundle(cfg, party, params)
    if bundle.algorithm not in ("vertical_lr", "secureboost_vertical"):
        raise JobConfigError(f"params.model_dir (party {party.id!r}): {bundle.path}: feature_selection takes a "
                             f"vertical_lr or secureboost_vertical model, not {bundle.algorithm}")
    names = list(bundle.feature_names)
    lr = bundle.algorithm == "vertical_lr"
    if party.role == "host":
        if lr:
            send_importance(transport, cfg.guest.id, len(names), importance=_lr_importance(cfg, party, bundle))
            keep = receive_keep(transport, cfg.guest.id, len(names))
        else:
            labels = np.random.default_rng(params.seed).permutation(len(names))  # column j -> label[j]
            records = bundle.file("split_table.json")
            send_importance(transport, cfg.guest.id, len(names), groups=labels[[int(r[0]) for r in records]])
            keep = receive_keep(transport, cfg.guest.id, len(names))[labels]
        return _save(cfg, party, bundle, names, keep, None)
    model = None if lr else _tree_model(bundle)
    own = _lr_importance(cfg, party, bundle) if lr else _tree_gain(model, party.id, len(names))
    rows = [(party.id, n, float(v)) for n, v in zip(names, own)]
    hosts = {}
    for h in cfg.hosts:
        if lr:
            n, imp = receive_importance(transport, h.id, params.max_features)
        else:
            gains = _record_gains(model, h.id)
            n, groups = receive_importance(transport, h.id, params.max_features,
                                           min_records=max(gains, default=-1) + 1)
            imp = np.zeros(n)
            np.add.at(imp, groups[list(gains)], list(gains.values()))
        hosts[h.id] = n
        rows += [(h.id, f"{h.id}:{i}" if not lr else f"{h.id}:input {i}", float(v)) for i, v in enumerate(imp)]
    kept = _choose([v for _, _, v in rows], params)
    offset = len(names)
    for h in cfg.hosts:
        send_keep(transport, h.id, kept[offset:offset + hosts[h.id]])
        offset += hosts[h.id]
    table = pd.DataFrame(rows, columns=["party", "input", "importance"]).assign(kept=kept)
    out = cfg.output_dir(party.id)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "importance.csv", index=False)
    return _save(cfg, party, bundle, names, kept[:len(names)], table)


def _lr_importance(cfg: JobConfig, party: PartySpec, bundle: ModelBundle) -> np.ndarray:
    """|w_j| * std_j of this party's model inputs over this job's rows (multiclass: summed over classes)."""
    raw = load_new_rows(cfg, party, bundle)
    X = model_inputs(np.asarray(raw.X, dtype=np.float64), bundle)
    w = np.abs(np.asarray(bundle.file("weights.npy"), dtype=np.float64)).reshape(X.shape[1], -1).sum(axis=1)
    return w * X.std(axis=0)


def _tree_model(bundle: ModelBundle):
    from ...tree.model import model_from_dict

    return model_from_dict(bundle.file("model.json"))


def _tree_gain(model, guest_id: str, n: int) -> np.ndarray:
    """float64 (n,): total split gain per guest column over every tree of ``model`` (a BoostedModel)."""
    out = np.zeros(n)
    for tree in model.trees:
        for node in tree.nodes.values():
            if not node.leaf and node.owner == guest_id:
                out[node.feature] += node.gain
    return out


def _record_gains(model, host: str) -> dict[int, float]:
    """Total split gain per split record of ``host`` over every tree of ``model`` (a BoostedModel)."""
    gains: dict[int, float] = {}
    for tree in model.trees:
        for node in tree.nodes.values():
            if not node.leaf and node.owner == host:
                gains[node.record] = gains.get(node.record, 0.0) + node.gain
    return gains


def _choose(values: list[float], params: FeatureSelectionJobParams) -> np.ndarray:
    """bool per input: share of the total >= min_share, then the top_k largest (ties: job order)."""
    v = np.asarray(values, dtype=np.float64)
    total = v.sum()
    keep = (v / total >= params.min_share) & (v > 0) if total > 0 else np.zeros(len(v), bool)
    if params.top_k is not None and keep.sum() > params.top_k:
        order = sorted(np.flatnonzero(keep), key=lambda i: -v[i])
        keep[:] = False
        keep[order[:params.top_k]] = True
    return keep


def _save(cfg: JobConfig, party: PartySpec, bundle: ModelBundle, names: list[str], keep: np.ndarray,
          table: pd.DataFrame | None) -> dict:
    """This party's kept table columns: ``selection.csv`` and a bundle (``extra["selected"]``)."""
    state = bundle.manifest.get("preprocessing") or {}
    columns = list(state.get("input_features") or names)
    kept_inputs = [n for n, k in zip(names, keep) if k]
    selected = [c for c in columns if any(source_column(n, columns) == c for n in kept_inputs)]
    out = cfg.output_dir(party.id)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"column": columns, "kept": [c in selected for c in columns]}).to_csv(out / "selection.csv",
                                                                                       index=False)
    save_job_bundle(cfg, party, files={}, feature_names=columns, extra={"selected": selected,
                                                                        "model_algorithm": bundle.algorithm})
    log.info("%s: keeps %d of its %d columns: %s", party.id, len(selected), len(columns), ", ".join(selected))
    if table is None:
        return {}
    return {"inputs": len(table), "kept": [f"{p}:{n}" for p, n, k in zip(table.party, table.input, table.kept) if k]}
