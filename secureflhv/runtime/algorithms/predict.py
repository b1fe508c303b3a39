"""Prediction as a job (``job.algorithm: predict``): score new rows with the bundles a training job saved.

The same party processes as training (gRPC + mutual TLS, the same certificates) meet again; each data
party reads its own bundle from ``<params.model_dir>/<party id>/model/``
(:mod:`secureflhv.runtime.store.model_bundle`), checks that it is signed by this party's certificate under
this job's CA (``security.ca``: required), that it belongs to this party (id and role), to the
training job ``params.model_job_id`` (when given: set it, so every party is sure to load the same
model), and that this job's data parties
are the model's, then scores its new table as the bundle's algorithm says (its registry entry,
:mod:`secureflhv.runtime.job.spec`: a federated ``predict`` protocol, or a ``local_model``):

* ``vertical_lr``: PSI aligns the new ids; each party applies its saved standardisation; the guest
  asks the hosts for their partial scores ``u_h = X_h w_h`` of the aligned rows
  (:mod:`secureflhv.vertical.prediction`, ``vlr.pred_req`` / ``vlr.pred``) and adds its own
  ``X_g w_g + b``. A model trained in arbiter mode keeps the hosts' scores from the guest here too:
  the training job's server takes part (it reads its own config-only bundle), sends a fresh public
  key, the hosts send ``[[u_h]]`` under it, the guest adds its part, masks the total with a uniform
  random value and has the server decrypt it (:mod:`secureflhv.vertical.lr_scores`); the scores equal
  the training job's held-out ones bit for bit (same fixed-point encoding).
* ``vertical_nn``: the guest sends its setup (config, hosts, rows: each host checks them against its own
  bundle), each host sends a fresh Paillier public key, then per chunk of rows the hosts run their
  bottom models and the interactive layer's encrypted exchange (``vnn.pred_*``), and the guest
  finishes the forward pass (top model).
* ``secureboost_vertical``: the guest routes every row through the trees, asking the owning host
  which way a row goes at each host split (``sb.route`` / ``sb.routed``: record id and rows in, a
  left/right bit per row out); hosts never reveal thresholds, the guest's splits stay at the guest.
* every algorithm whose bundle scores locally (``horizontal``, ``secureboost_horizontal``: the global
  model; ``multiconfederated``: each peer's personal model): each client scores its own new rows
  (nothing is sent) and writes its own ``predictions.csv``. Without the federation,
  :func:`secureflhv.load_model` does the same in a notebook.

Example job file (``secureflhv run predict.yaml``; parties, addresses and certificates as in training,
data pointing at the new tables)::

    job: {id: breast-vlr-scoring, algorithm: predict, output_dir: scored}
    security: {ca: certs/ca.pem}
    parties: ...                      # guest and hosts of the training job (and its server: arbiter mode)
    params: {model_dir: out, model_job_id: breast-vlr}

Every data party's new table needs its id column (``data.id_column``) and the model's feature columns
(taken by name; other columns are ignored). The guest (horizontal models: every client) writes
``<output_dir>/<party>/predictions.csv`` — ``id``, ``score`` (P(y=1); multi-class:
``p0 .. pC-1``; regression: the value) and ``label`` when ``data.label_column`` is set — and
``metrics.json`` (rows scored, ids without a partner, AUC / accuracy when labels are given).

What each role learns: as in the in-job prediction of the algorithm (PSI: the common ids and the set
sizes; vertical LR two-party: the guest learns each host's partial score of every aligned row;
arbiter mode: the guest learns each row's total score only, the server the number of rows per
request only; the hosts learn which rows are scored). A server takes no part except in arbiter mode.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ...data import load_table
from ...data.tabular import Preprocessor
from ...data.woe import WOEEncoder
from ...transport import Transport
from ..store.artifacts import write_json
from ..job.data_prep import align_by_psi, read_party_bundle
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..job.spec import JOBS, JobSpec
from ..store.loaded_model import LoadedModel
from ..store.model_bundle import ModelBundle, certificate_sha256

log = logging.getLogger("secureflhv.job")


class ModelDirParams(BaseModel):
    """Where a job that uses a trained model finds each party's bundle (``predict``, ``scorecard``)."""

    # gaps are filled by the bundle's saved preprocessing; a model without one (trees) refuses NaN itself
    accepts_missing_values: ClassVar[bool] = True

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: Path = Field(description="the training job's output_dir: party P reads <model_dir>/P/model/")
    model_job_id: str | None = Field(default=None, description="the training job's id; every party's bundle "
                                                               "must carry it (recommended)")


class PredictJobParams(ModelDirParams):
    """The job file's ``params`` for ``algorithm: predict``."""

    batch_rows: int = Field(default=10_000, ge=1, description="rows per prediction request to the hosts")


def roles(cfg: JobConfig) -> None:
    """At most one guest and at least one data party; a server may be listed (it does nothing)."""
    kinds = [p.role for p in cfg.parties]
    if kinds.count("guest") > 1:
        raise JobConfigError(f"parties: a prediction job has at most one guest, found {kinds.count('guest')}")
    if not cfg.clients:
        raise JobConfigError("parties: a prediction job needs the data parties (guest / hosts) of the model")


def check(cfg: JobConfig, params: ModelDirParams) -> None:
    """Verify, before anyone starts, every party's bundle that is on this machine (on a party's own
    machine: its own; with ``secureflhv run``: all). A party whose bundle folder is absent here is
    checked when it starts. Raises JobConfigError naming ``params.model_dir``, the party and the field."""
    for party in [*cfg.clients, *([cfg.server] if cfg.server is not None else [])]:
        if (cfg.resolve(params.model_dir) / party.id / "model").is_dir():
            load_party_bundle(cfg, party, params)


def load_party_bundle(cfg: JobConfig, party: PartySpec, params: ModelDirParams) -> ModelBundle:
    """This party's verified bundle; JobConfigError naming ``params.model_dir`` / the mismatching field."""
    bundle = read_party_bundle(cfg, party, "model_dir", params.model_dir, expect_job=params.model_job_id,
                               expect_role=party.role)
    _check_federation(cfg, party, bundle)
    return bundle


def _check_federation(cfg: JobConfig, party: PartySpec, bundle: ModelBundle) -> None:
    """(Vertical models) exactly the model's data parties in their roles (read_bundle checked the CA)."""
    where = f"params.model_dir (party {party.id!r}): {bundle.path}"
    spec = JOBS.get(bundle.algorithm)
    if spec is None or spec.family != "vertical":
        return
    want = {p["id"]: p["role"] for p in bundle.manifest.get("peers", []) if p.get("role") in ("guest", "host")}
    have = {p.id: p.role for p in cfg.clients if p.id != party.id}
    if want != have:
        raise JobConfigError(f"{where}: peers: the model was trained with {want}, this job's other data parties "
                             f"are {have}; a vertical model needs every one of its parties")
    arbiter = model_arbiter(bundle)
    if arbiter is not None and party.role != "server" and (cfg.server is None or cfg.server.id != arbiter):
        raise JobConfigError(f"{where}: config.mode: the model was trained in arbiter mode with server {arbiter!r}; "
                             f"its prediction job needs that party (role: server), found "
                             f"{None if cfg.server is None else cfg.server.id!r}: the hosts' scores reach the "
                             f"guest only encrypted under its key")
    for peer in bundle.manifest.get("peers", []):
        now = certificate_sha256(cfg.resolve(cfg.party(peer["id"]).cert)) if peer["id"] in have else None
        if now and peer.get("cert_sha256") and now != peer["cert_sha256"]:
            log.warning("%s: %s's certificate differs from the one at training (renewed?); the job CA "
                        "authenticates it", party.id, peer["id"])


def load_new_rows(cfg: JobConfig, party: PartySpec, bundle: ModelBundle):
    """This party's new table with the model's feature columns in the model's order (ids as strings).

    Raises JobConfigError naming ``parties[i].data`` for a missing file or column.
    """
    spec = party.data
    state = bundle.manifest.get("preprocessing") or {}
    names = list(state.get("input_features") or bundle.feature_names)
    if spec.feature_columns is not None and list(spec.feature_columns) != names:
        raise JobConfigError(f"{cfg.where(party, 'data.feature_columns')}: {spec.feature_columns} differ from the "
                             f"model's features {names} (omit feature_columns to use the model's)")
    try:
        return load_table(cfg.resolve(spec.path), id_column=spec.id_column, label_column=spec.label_column,
                          feature_columns=names, schema=spec.table_schema or state.get("schema"), predicting=True)
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc} (the model uses features {names})") from None


def model_inputs(X: np.ndarray, bundle: ModelBundle) -> np.ndarray:
    """The training job's preprocessing (WOE encoding, impute, one-hot, standardise), refitted from nothing: the saved
    state is applied as it is. Raises ValueError on a malformed state."""
    saved = bundle.manifest.get("preprocessing") or {}
    if saved.get("woe"):  # a feature_binning job's selection and encoding first (params.woe_from)
        X = WOEEncoder.from_dict(saved["woe"]).transform(X)
    if saved.get("preprocessor"):
        return Preprocessor.from_dict(saved["preprocessor"]).transform(X)
    state = saved.get("standardisation")
    if not state:
        return X
    return (X - np.asarray(state["mean"], dtype=np.float64)) / np.asarray(state["std"], dtype=np.float64)


def aligned_rows(cfg: JobConfig, party: PartySpec, transport: Transport, bundle: ModelBundle):
    """(X float64 preprocessed, ids, y or None, own row count) of the rows PSI found at every data party."""
    table = load_new_rows(cfg, party, bundle)
    psi = align_by_psi(cfg, party, transport, table)
    X = model_inputs(np.asarray(table.X, dtype=np.float64)[psi.rows], bundle)
    y = None if table.y is None else np.asarray(table.y)[psi.rows]
    return X, np.asarray(psi.ids), y, table.n_rows


def model_arbiter(bundle: ModelBundle) -> str | None:
    """The training job's server of a vertical LR model trained in arbiter mode, else None."""
    if bundle.algorithm != "vertical_lr" or bundle.config.get("mode") != "arbiter":
        return None
    if bundle.role == "server":
        return bundle.party_id
    return next((p["id"] for p in bundle.manifest.get("peers", []) if p.get("role") == "server"), None)


def model_hosts(bundle: ModelBundle) -> list[str]:
    """The hosts in the training job's order (the guest's bundle lists its peers in job-file order)."""
    return [p["id"] for p in bundle.manifest.get("peers", []) if p.get("role") == "host"]


def write_predictions(cfg: JobConfig, party: PartySpec, bundle: ModelBundle, ids, scores: np.ndarray, y,
                      own_rows: int, objective: str = "binary") -> dict:
    """``predictions.csv``, ``metrics.json`` and (with labels) the task's plots in this job's output folder;
    returns the metrics."""
    import pandas as pd

    from ...data.metrics import task_of
    from ..observe.reports import classification_metrics, objective_metrics, save_task_plots

    out = cfg.output_dir(party.id)
    out.mkdir(parents=True, exist_ok=True)
    cols = {"id": ids}
    if scores.ndim == 1:
        cols["score"] = scores
    else:
        cols.update({f"p{c}": scores[:, c] for c in range(scores.shape[1])})
    if y is not None:
        cols["label"] = y
    pd.DataFrame(cols).to_csv(out / "predictions.csv", index=False, float_format="%.17g")
    metrics = {"rows_scored": int(len(ids)), "own_rows": int(own_rows), "ids_without_partner": int(own_rows - len(ids))}
    if y is not None and len(ids):
        if objective == "regression":
            metrics.update(objective_metrics(np.asarray(y, float), scores, "regression"))
        else:
            metrics.update(classification_metrics(np.asarray(y).astype(np.int64), scores))
        task = task_of(scores, objective == "regression")
        save_task_plots(out, np.asarray(y, float) if task == "regression" else np.asarray(y).astype(np.int64), scores,
                        task, f"{bundle.algorithm}, job {cfg.job.id}, rows scored")
    write_json(out / "metrics.json", {"job_id": cfg.job.id, "model_job_id": bundle.job_id, "metrics": metrics})
    log.info("%s: scored %d rows (%d of this party's ids have no partner); %s", party.id, len(ids),
             own_rows - len(ids), ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
    return metrics


# ---------------------------------------------------------------------------------------------- predictors
def lr_role(cfg: JobConfig, party: PartySpec, transport: Transport, bundle: ModelBundle):
    """The guest's or a host's vertical LR prediction role from its ``bundle`` (arbiter mode: the hosts' scores
    travel encrypted under the server's key)."""
    from ...vertical.lr import VerticalLRConfig, VerticalLRGuest, VerticalLRHost

    config, arbiter, weights = VerticalLRConfig(**bundle.config), model_arbiter(bundle), bundle.file("weights.npy")
    if party.role == "host":
        return VerticalLRHost.from_model(transport, cfg.guest.id, [h.id for h in cfg.hosts], weights, config, arbiter)
    return VerticalLRGuest.from_model(transport, model_hosts(bundle), weights, bundle.files.get("intercept.npy"),
                                      config, arbiter)


def vertical_lr(cfg: JobConfig, party: PartySpec, transport: Transport, params: PredictJobParams,
                 bundle: ModelBundle) -> dict:
    """Vertical LR's prediction exchange from ``bundle``: the guest scores its new rows with the hosts' partial
    scores (encrypted under the arbiter's key in arbiter mode), hosts and arbiter serve; returns the guest's
    metrics (others ``{}``). JobConfigError for a bundle that does not fit the job.
    """
    X, ids, y, own = aligned_rows(cfg, party, transport, bundle)
    role = lr_role(cfg, party, transport, bundle)
    if party.role == "host":
        role.serve_predictions(X)
        return {}
    scores = _in_batches(len(ids), params.batch_rows, lambda rows: role.predict_proba(X, rows=rows))
    role.end_prediction()
    return write_predictions(cfg, party, bundle, ids, scores, y, own, role.config.task)


def secureboost_role(cfg: JobConfig, party: PartySpec, transport: Transport, bundle: ModelBundle, n_features: int):
    """The guest's (its model's trees) or a host's (its split table, features below ``n_features``) vertical
    SecureBoost prediction role from ``bundle``; JobConfigError naming the bundle file that does not fit."""
    from ...tree.model import model_from_dict
    from ...tree.params import SecureBoostParams
    from ...tree.vertical import SecureBoostGuest, SecureBoostHost

    where = f"params.model_dir (party {party.id!r}): {bundle.path}"
    if party.role == "host":
        records = bundle.file("split_table.json")
        if not all(isinstance(r, list) and len(r) in (3, 4) and 0 <= int(r[0]) < n_features for r in records):
            raise JobConfigError(f"{where}: files[split_table.json]: records must be [feature, bin, threshold, "
                                 f"default_left] with a feature index below {n_features}")
        return SecureBoostHost.from_records(transport, cfg.guest.id, records, SecureBoostParams(**bundle.config))
    try:
        return SecureBoostGuest.from_model(transport, model_hosts(bundle), model_from_dict(bundle.file("model.json")))
    except ValueError as exc:
        raise JobConfigError(f"{where}: files[model.json]: {exc}") from None


def secureboost_vertical(cfg: JobConfig, party: PartySpec, transport: Transport, params: PredictJobParams,
                          bundle: ModelBundle) -> dict:
    """Vertical SecureBoost's prediction exchange from ``bundle``: the guest routes its new rows through the
    trees, asking each host for the splits it owns (the host learns only which rows go left at its nodes);
    returns the guest's metrics (hosts ``{}``). JobConfigError for a bundle that does not fit the job.
    """
    from ...tree.params import transform

    X, ids, y, own = aligned_rows(cfg, party, transport, bundle)
    role = secureboost_role(cfg, party, transport, bundle, X.shape[1])
    if party.role == "host":
        role.serve_predictions(X)
        return {}
    # one routing pass over every row: the hosts check each request against their whole prediction set
    scores = transform(role.predict_margin(X), role.model.params)
    role.end_prediction()
    return write_predictions(cfg, party, bundle, ids, scores, y, own,
                             "regression" if role.model.params.objective == "regression" else "binary")


def split_nn_role(cfg: JobConfig, party: PartySpec, transport: Transport, bundle: ModelBundle, X: np.ndarray):
    """The guest's or a host's split NN prediction role from ``bundle``, set up for rows like ``X`` (its row count
    is the setup's; call ``start_prediction``); JobConfigError naming the bundle file that does not fit.

    User modules (the config's ``*_factory``) are rebuilt through the same factory (its ``path`` is absolute
    in a bundle; a relative one is taken against this job file's folder), then loaded with the bundle's
    ``state_dict`` arrays; JobConfigError naming the bundle's ``config`` field when the factory fails."""
    from ...params import FactoryError
    from ...vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost

    config = SplitNNConfig(**bundle.config).resolved(cfg.base_dir)
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in bundle.file("state.safetensors").items()}
    try:
        if party.role == "host":
            return SplitNNHost.from_state(transport, cfg.guest.id, [h.id for h in cfg.hosts], X, config, arrays)
        n_classes = bundle.extra["n_classes"]  # None: a regression model
        return SplitNNGuest.from_state(transport, model_hosts(bundle), X, None if n_classes is None else int(n_classes),
                                       config, arrays)
    except FactoryError as exc:  # the training job's params, saved as the bundle's config
        raise JobConfigError(f"params.model_dir (party {party.id!r}): {bundle.path}: config: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise JobConfigError(f"params.model_dir (party {party.id!r}): {bundle.path}: files[state.safetensors]: "
                             f"{exc}") from None


def vertical_nn(cfg: JobConfig, party: PartySpec, transport: Transport, params: PredictJobParams,
                bundle: ModelBundle) -> dict:
    """Split NN's prediction exchange from ``bundle``: hosts send their bottom-model outputs through the
    interactive layer, the guest finishes the forward pass; returns the guest's metrics (hosts ``{}``).
    JobConfigError for a bundle that does not fit the job.
    """
    X, ids, y, own = aligned_rows(cfg, party, transport, bundle)
    role = split_nn_role(cfg, party, transport, bundle, X)
    role.start_prediction()
    if party.role == "host":
        role.serve_predictions(X)
        return {}
    scores = _in_batches(len(ids), params.batch_rows, lambda rows: role.predict_proba(X, rows=rows))
    role.end_prediction()
    return write_predictions(cfg, party, bundle, ids, scores, y, own,
                             "regression" if role.config.task == "regression" else "binary")


def score_locally(cfg: JobConfig, party: PartySpec, params: PredictJobParams, bundle: ModelBundle,
                  spec: JobSpec) -> dict:
    """A bundle that holds the whole model (``spec.local_model``: horizontal FL, horizontal SecureBoost,
    MultiConfederated): this party scores its own new rows, nothing is sent. Returns its metrics."""
    data = party.data
    names = list(bundle.feature_names) or data.feature_columns
    state = bundle.manifest.get("preprocessing") or {}
    try:   # with a federated preprocessor: raw columns, read with the training schema (category codes)
        table = load_table(cfg.resolve(data.path), id_column=data.id_column, label_column=data.label_column,
                           feature_columns=names, schema=data.table_schema or state.get("schema"),
                           predicting=bool(state.get("preprocessor")))
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None
    want = len(names) if state.get("preprocessor") else bundle.extra.get("n_features")
    if want is not None and table.n_features != want:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {table.n_features} feature columns, the model takes "
                             f"{want} (set data.feature_columns)")
    loaded = LoadedModel(bundle, spec)
    try:
        scores = loaded.predict_proba(np.asarray(table.X, dtype=np.float64))
    except ValueError as exc:
        raise JobConfigError(f"params.model_dir (party {party.id!r}): {bundle.path}: {exc}") from None
    regression = loaded.task == "regression"
    return write_predictions(cfg, party, bundle, np.asarray(table.ids), scores, table.y, table.n_rows,
                             "regression" if regression else "binary")


def _server(cfg: JobConfig, party: PartySpec, transport: Transport, params: PredictJobParams) -> dict:
    """The arbiter of a vertical LR model trained in arbiter mode decrypts the guest's masked total scores
    (at most ``params.batch_rows`` per request, the guest's request size); any other server does nothing."""
    from ...vertical.lr import VerticalLRArbiter, VerticalLRConfig

    if not (cfg.resolve(params.model_dir) / party.id / "model").is_dir():
        log.info("%s: no model bundle of this server; nothing to do", party.id)
        return {}
    bundle = load_party_bundle(cfg, party, params)
    if model_arbiter(bundle) is None:
        log.info("%s: the %s model needs no server; nothing to do", party.id, bundle.algorithm)
        return {}
    arbiter = VerticalLRArbiter(transport, cfg.guest.id, model_hosts(bundle), VerticalLRConfig(**bundle.config))
    served = arbiter.serve_predictions(max_rows=params.batch_rows)
    log.info("%s: decrypted %d masked score requests", party.id, served)
    return {}


def _in_batches(n: int, size: int, fn) -> np.ndarray:
    parts = [fn(np.arange(s, min(n, s + size))) for s in range(0, n, size)]
    return np.concatenate(parts) if parts else np.zeros(0)


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: PredictJobParams, *,
        resume: bool = False) -> dict:
    """Score this party's new rows with its saved bundle; returns the guest's metrics (others ``{}``).

    Raises JobConfigError for a missing, damaged or foreign bundle (naming the field) or bad data,
    TransportError when a peer fails or goes silent.
    """
    if party.role == "server":
        return _server(cfg, party, transport, params)
    bundle = load_party_bundle(cfg, party, params)
    spec = JOBS.get(bundle.algorithm)
    if spec is None or not spec.predictable:
        raise JobConfigError(f"params.model_dir (party {party.id!r}): {bundle.path}: algorithm "
                             f"{bundle.algorithm!r} has no prediction job; choose one of "
                             f"{sorted(n for n, s in JOBS.items() if s.predictable)}")
    log.info("%s: scoring with the %s model of job %r (%s)", party.id, bundle.algorithm, bundle.job_id, bundle.path)
    if spec.predict is None:  # the whole model is here: this party's own rows, nothing sent
        return score_locally(cfg, party, params, bundle, spec)
    return spec.predict(cfg, party, transport, params, bundle)


def write_predict_job(train_job: Path | str, path: Path | str, *, data: dict[str, Path | str],
                      job_id: str | None = None, output_dir: str = "predictions", model_dir: Path | str | None = None,
                      new_ports: bool = False) -> Path:
    """Write a prediction job file derived from a training job file; returns ``path``.

    Keeps the training job's parties, certificates and security settings; sets ``algorithm: predict``,
    ``params.model_dir`` (default: the training job's output_dir) and ``params.model_job_id`` (the
    training job's id), and points each party in ``data`` (party id -> new table) at its new rows.
    Relative paths (certificates, data, the default model_dir) are rewritten relative to the new file's
    folder, so the same file works on every party's machine with the same layout. ``new_ports``: fresh loopback ports.
    """
    import os

    import yaml

    train_job, path = Path(train_job).resolve(), Path(path).resolve()
    doc = yaml.safe_load(train_job.read_text(encoding="utf-8"))
    base = train_job.parent

    def moved(p) -> str:
        p = Path(p)
        return str(p if p.is_absolute() else Path(os.path.relpath(base / p, path.parent)))

    train_id, train_out = doc["job"]["id"], Path(doc["job"].get("output_dir", "out"))
    doc["job"] = {**doc["job"], "id": job_id or f"{train_id}-predict", "algorithm": "predict",
                  "output_dir": output_dir}
    for key in ("ca",):
        if doc.get("security", {}).get(key):
            doc["security"][key] = moved(doc["security"][key])
    unknown = set(data) - {p["id"] for p in doc["parties"]}
    if unknown:
        raise ValueError(f"data: {sorted(unknown)} are not parties of {train_job}")
    if new_ports:
        from ..job.demo import free_ports

        for p, port in zip(doc["parties"], free_ports(len(doc["parties"]))):
            p["address"] = f"127.0.0.1:{port}"
            p.pop("listen", None)
    for p in doc["parties"]:
        for key in ("cert", "key"):
            if p.get(key):
                p[key] = moved(p[key])
        if p.get("data"):
            p["data"] = {**p["data"], "path": str(Path(data[p["id"]]).resolve()) if p["id"] in data
                         else moved(p["data"]["path"])}
    doc["params"] = {"model_dir": moved(train_out) if model_dir is None else str(Path(model_dir).resolve()),
                     "model_job_id": train_id}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path

