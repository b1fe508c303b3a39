"""Vertical logistic regression as a job: prepare data, train, predict, save.

Data parties first run the shared preparation (:func:`secureflhv.runtime.job.data_prep.prepare_vertical`:
load, PSI, split, standardise); the server (arbiter mode's Paillier key holder) holds no data and takes
part only in training. Then training (:mod:`secureflhv.vertical.lr`) and federated prediction of the
training and test rows: the hosts send partial scores, the guest computes the predictions and the metrics
of ``params.task`` (:func:`secureflhv.data.metrics.task_metrics`): ``binary`` (default; P(y=1): AUC, KS,
accuracy, ...), ``multiclass`` (labels 0..K-1, K = largest label + 1 over all aligned rows; class
probabilities: accuracy, macro-F1, log loss) or ``regression`` (the value: RMSE, MAE, R²). In arbiter
mode the hosts' scores reach the guest only encrypted and the server decrypts the guest's masked totals
(:mod:`secureflhv.vertical.lr_scores`), then writes a config-only bundle for later prediction jobs.

Artifacts (:mod:`secureflhv.runtime.store.artifacts`): at the guest ``metrics.json``, ``predictions.csv``,
``split.json`` and ``loss.png``. Every party writes its model bundle (:mod:`secureflhv.runtime.store.model_bundle`): ``weights.npy`` (float64, the party's features in
``feature_names`` order; multiclass (features, K)), at the guest ``intercept.npy`` (multiclass (K,));
the standardisation state; the config (with ``task``). A prediction job
(:mod:`secureflhv.runtime.algorithms.predict`) scores new rows with them.

Checkpoints (:mod:`secureflhv.runtime.store.checkpoint`): every party saves its training state after each
epoch under ``<output_dir>/<party>/checkpoints/`` (step = epochs done). At start-up (after PSI) the
parties agree on a step (:mod:`secureflhv.runtime.store.resume`); with ``--resume`` they continue after it,
and the finished model equals an uninterrupted run's.
"""
from __future__ import annotations

import numpy as np
from pydantic import ConfigDict

from ...crypto.homomorphic.key_prefetch import prefetch_keypair
from ...data.metrics import task_metrics
from ...transport import Transport
from ...vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost
from ..job.data_prep import StandardisedSplitParams, ChainedInputParams, bundle_fields, prepare_vertical
from ..store.model_bundle import save_job_bundle
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..process.progress import emit_progress
from ..observe.reports import evaluate_split, log_summary, save_guest_reports
from ..store.resume import role_lifecycle


class VerticalLRJobParams(VerticalLRConfig, StandardisedSplitParams, ChainedInputParams):
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


def _n_classes(y: np.ndarray, task: str) -> int | None:
    """K of a multiclass job: largest label + 1 over every aligned row (so a class absent from the
    training rows still has its column). JobConfigError naming ``params.task`` for labels that are
    not class ids."""
    if task != "multiclass":
        return None
    y = np.asarray(y, dtype=np.float64)
    if not (y.size and np.all(np.isfinite(y)) and np.all(y == np.round(y)) and y.min() >= 0):
        raise JobConfigError("params.task: 'multiclass' needs labels that are class ids 0..K-1 "
                             "(data.label_column); use task: regression for real-valued targets")
    return int(y.max()) + 1


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: VerticalLRJobParams, *,
        resume: bool = False) -> dict:
    """Run this party's role of a vertical LR job; return the guest's metrics (others: ``{}``).

    Raises JobConfigError for bad data, TransportError when a peer fails or goes silent.
    """
    out_dir = cfg.output_dir(party.id)
    host_ids = [h.id for h in cfg.hosts]
    arbiter_id = cfg.server.id if params.mode == "arbiter" else None
    config = VerticalLRConfig(**params.model_dump(include=set(VerticalLRConfig.model_fields)))
    # the key holder's key is generated while the data parties run PSI and split (OU at 2048 bits: 0.3-5 s)
    holder = "server" if params.mode == "arbiter" else "guest"
    keys = prefetch_keypair(config.he_scheme, config.key_bits, config.insecure_test_key) \
        if party.role == holder else None

    if party.role == "server":
        arbiter = VerticalLRArbiter(transport, cfg.guest.id, host_ids, config, keypair=keys,
                                    **role_lifecycle(cfg, party, transport, resume))
        arbiter.fit()
        arbiter.serve_predictions()  # the held-out scores: decrypts the guest's masked totals
        save_job_bundle(cfg, party, files={}, config=config.model_dump(mode="json"))  # for a prediction job
        return {}

    data = prepare_vertical(cfg, party, transport, params, standardize=params.standardize, preprocess=True)
    X, train = data.X, data.train
    if party.role == "host":
        host = VerticalLRHost(transport, cfg.guest.id, host_ids, X[train], config, arbiter_id,
                              **role_lifecycle(cfg, party, transport, resume))
        host.fit()
        host.serve_predictions(X)  # the guest asks for training and test rows by index
        save_job_bundle(cfg, party, files={"weights.npy": host.weights}, **bundle_fields(data, config),
                        public_key=host.public_key)
        return {}

    try:
        guest = VerticalLRGuest(transport, host_ids, X[train], data.y[train], config, arbiter_id, keypair=keys,
                                on_epoch=lambda e, loss: emit_progress("epochs", e + 1, params.epochs,
                                                                      f"loss {loss:.5f}", {"loss": loss}),
                                n_classes=_n_classes(data.y, params.task),
                                **role_lifecycle(cfg, party, transport, resume))
    except ValueError as exc:
        raise JobConfigError(f"params.task {params.task!r} and data.label_column of {party.id!r}: {exc}") from None
    result = guest.fit()
    metrics, p_test = evaluate_split(data.y, data.split, lambda rows: guest.predict_proba(X, rows=rows),
                                     lambda y, p: task_metrics(y, p, params.task))
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds, "stopped_early": result.stopped_early,
               "best_epoch": result.best_epoch + 1}
    plot = save_guest_reports(out_dir, cfg, data, metrics, history, p_test, "vertical LR",
                              loss_label="training Taylor loss (mean over the epoch's batches)"
                              if params.task != "regression" else "training squared loss / 2 (mean over batches)",
                              task=params.task)
    intercept = None if guest.intercept is None else np.asarray(guest.intercept, dtype=np.float64)
    files = {"weights.npy": guest.weights}
    if intercept is not None:
        files["intercept.npy"] = intercept
    save_job_bundle(cfg, party, files=files, metrics=metrics, **bundle_fields(data, config),
                    public_key=guest.public_key, task=params.task)
    log_summary(party.id, metrics, result.losses, plot)
    return metrics
