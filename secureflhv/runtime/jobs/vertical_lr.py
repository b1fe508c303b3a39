"""Vertical logistic regression as a job: prepare data, train, predict, save.

Data parties first run the shared preparation (:func:`secureflhv.runtime.data_prep.prepare_vertical`:
load, PSI, split, standardise); the server (arbiter mode's Paillier key holder) holds no data. Then
training (:mod:`secureflhv.vertical.lr`) and federated prediction of the training and test rows: the
hosts send partial scores, the guest computes probabilities, AUC and accuracy. In arbiter mode the
hosts' scores reach the guest only encrypted and the server decrypts the guest's masked totals
(:mod:`secureflhv.vertical.lr_scores`), then writes a config-only bundle for later prediction jobs.

Artifacts (:mod:`secureflhv.runtime.artifacts`): every party's ``model.json``; at the guest also
``metrics.json``, ``predictions.csv``, ``split.json`` and ``loss.png``. Guest and hosts also write their
model bundle (:mod:`secureflhv.runtime.model_bundle`): ``weights.npy`` (float64, the party's features in
``feature_names`` order), at the guest ``intercept.npy``; the standardisation state; the config. A
prediction job (:mod:`secureflhv.runtime.jobs.predict`) scores new rows with them.

Checkpoints (:mod:`secureflhv.runtime.checkpoint`): every party saves its training state after each
epoch under ``<output_dir>/<party>/checkpoints/`` (step = epochs done). At start-up (after PSI) the
parties agree on a step (:mod:`secureflhv.runtime.resume`); with ``--resume`` they continue after it,
and the finished model equals an uninterrupted run's.
"""
from __future__ import annotations

import numpy as np
from pydantic import ConfigDict

from ...transport import Transport
from ...vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost
from ..artifacts import save_model
from ..data_prep import StandardisedSplitParams, prepare_vertical, preprocessing_state
from ..model_bundle import save_job_bundle
from ..job_file import JobConfig, JobConfigError, PartySpec
from ..progress import emit_progress
from ..reports import classification_metrics, evaluate_split, log_summary, save_guest_reports
from ..resume import attach_checkpoints


class VerticalLRJobParams(VerticalLRConfig, StandardisedSplitParams):
    """The job file's ``params`` for ``algorithm: vertical_lr``: :class:`VerticalLRConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``. Every field, its
    default and meaning: ``docs/parameters.md``. The model saved is the one :class:`VerticalLRConfig`'s
    ``restore_best`` names (default: the epoch of lowest training loss; ``metrics.json`` history
    ``best_epoch``, 1-based).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def check(cfg: JobConfig, params: VerticalLRJobParams) -> None:
    """Arbiter mode needs a server (the key holder); two-party mode must not have one."""
    if params.mode == "arbiter" and cfg.server is None:
        raise JobConfigError("params.mode: 'arbiter' needs a party with role: server (the key holder)")
    if params.mode == "two_party" and cfg.server is not None:
        raise JobConfigError("params.mode: 'two_party' runs without a server; remove it or use mode: arbiter")


def _bundle_fields(data, config: VerticalLRConfig) -> dict:
    return {"feature_names": data.feature_names, "config": config.model_dump(mode="json"),
            "preprocessing": preprocessing_state(data)}


def _scores(guest: VerticalLRGuest, X: np.ndarray, rows) -> np.ndarray:
    """P(y=1) of ``rows``, in requests of at most the training row count (the arbiter's bound)."""
    rows, step = np.asarray(rows), guest.X.shape[0]
    return np.concatenate([np.zeros(0)] + [guest.predict_proba(X, rows=rows[i:i + step])
                                           for i in range(0, len(rows), step)])


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: VerticalLRJobParams) -> dict:
    """Run this party's role of a vertical LR job; return the guest's metrics (others: ``{}``).

    Raises JobConfigError for bad data, TransportError when a peer fails or goes silent.
    """
    out_dir = cfg.output_dir(party.id)
    host_ids = [h.id for h in cfg.hosts]
    arbiter_id = cfg.server.id if params.mode == "arbiter" else None
    config = VerticalLRConfig(**params.model_dump(exclude=set(StandardisedSplitParams.model_fields)))

    def save(model: dict, meta: dict) -> None:
        save_model(out_dir, job_id=cfg.job.id, party_id=party.id, role=party.role, algorithm="vertical_lr",
                   model=model, metadata=meta)

    if party.role == "server":
        arbiter = VerticalLRArbiter(transport, cfg.guest.id, host_ids, config)
        attach_checkpoints(cfg, party, transport, arbiter)
        arbiter.fit()
        arbiter.serve_predictions()  # the held-out scores: decrypts the guest's masked totals
        save({}, {"params": params.model_dump(mode="json")})
        save_job_bundle(cfg, party, files={}, config=config.model_dump(mode="json"))  # for a prediction job
        return {}

    data = prepare_vertical(cfg, party, transport, params, standardize=params.standardize, preprocess=True)
    X, train = data.X, data.train
    if party.role == "host":
        host = attach_checkpoints(cfg, party, transport,
                                  VerticalLRHost(transport, cfg.guest.id, host_ids, X[train], config, arbiter_id))
        host.fit()
        host.serve_predictions(X)  # the guest asks for training and test rows by index
        save({"weights": dict(zip(data.feature_names, host.weights))}, data.meta)
        save_job_bundle(cfg, party, files={"weights.npy": host.weights}, **_bundle_fields(data, config),
                        public_key=host.public_key)
        return {}

    guest = VerticalLRGuest(transport, host_ids, X[train], data.y[train], config, arbiter_id,
                            on_epoch=lambda e, loss: emit_progress("epochs", e + 1, params.epochs, f"loss {loss:.5f}",
                                                                  {"loss": loss}))
    result = attach_checkpoints(cfg, party, transport, guest).fit()
    metrics, p_test = evaluate_split(data.y, data.split, lambda rows: _scores(guest, X, rows),
                                     classification_metrics)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds, "stopped_early": result.stopped_early,
               "best_epoch": result.best_epoch + 1}
    plot = save_guest_reports(out_dir, cfg, data, metrics, history, p_test, "vertical LR",
                              loss_label="training Taylor loss (mean over the epoch's batches)")
    save({"weights": dict(zip(data.feature_names, guest.weights)), "intercept": guest.intercept},
         {**data.meta, "metrics": metrics})
    files = {"weights.npy": guest.weights}
    if guest.intercept is not None:
        files["intercept.npy"] = np.array(guest.intercept, dtype=np.float64)
    save_job_bundle(cfg, party, files=files, metrics=metrics, **_bundle_fields(data, config),
                    public_key=guest.public_key)
    log_summary(party.id, metrics, result.losses, plot)
    return metrics
