"""Vertical split neural network as a job: prepare data, train, predict, save.

Guest and hosts (no server) first run the shared preparation
(:func:`secureflhv.runtime.job.data_prep.prepare_vertical`: load, PSI, split, standardise), then training
(:mod:`secureflhv.vertical.split_nn`), then federated prediction of the training and test rows. Artifacts: every party's last
checkpoint; at the guest ``metrics.json``, ``predictions.csv``, ``split.json`` and ``loss.png``.
Guest and hosts write their model bundle (:mod:`secureflhv.runtime.store.model_bundle`):
``state.safetensors`` (float64 arrays of :meth:`state_arrays`: bottom / top torch ``state_dict`` entries,
interactive-layer shares), the standardisation state and the config, for the prediction job.

Label DP (``params.label_dp``, :mod:`secureflhv.vertical.label_dp`): ε(δ) against the hosts after every epoch in
the progress events and the guest's log, per epoch in ``metrics.json``'s ``history.epsilon``, and the final
guarantee (mechanism, C, z, δ, accountant) as ``privacy`` in ``metrics.json`` and in the guest bundle's
``extra.privacy``.

Labels at the guest must be integers 0..C-1 (C = 2: binary with AUC; C > 2: multi-class accuracy), or
with ``task: regression`` finite numbers (one output, MSE; RMSE / MAE / R² and ``predicted_vs_true.png``).

Checkpoints (:mod:`secureflhv.runtime.store.checkpoint`): guest and hosts save their training state after each
epoch under ``<output_dir>/<party>/checkpoints/step-<epochs done>/`` (what is stored: the split NN
module docstring). At start-up (after PSI) they agree on a step (:mod:`secureflhv.runtime.store.resume`); with
``--resume`` they continue after it, and the finished model equals an uninterrupted run's (to ~1e-12).
What a peer learns from the agreement: which epochs the others completed, nothing else.

User modules (``host_bottom_factory``, ``guest_bottom_factory``, ``top_factory``:
:mod:`secureflhv.vertical.split_modules`): each party imports the factories it builds at preflight (:meth:`VerticalNNJobParams.party_checks`) and again
at the start of ``run``, before PSI (a missing module stops it there); it builds and probes its modules on its
own preprocessed rows after PSI, before the first split NN message (their input width is known only then).
Each failure names the party and the field (a preflight finding, or JobConfigError in ``run``).
A factory's ``path`` is taken relative to the job file and saved absolute in the bundle's config.
"""
from __future__ import annotations

import contextlib

import numpy as np
from pydantic import ConfigDict

from ...crypto.homomorphic.key_prefetch import prefetch_keypair
from ...params import FactoryError
from ...transport import Transport
from ...vertical.split_nn import SplitNNConfig, SplitNNGuest, SplitNNHost
from ..job.data_prep import StandardisedSplitParams, ChainedInputParams, bundle_fields, prepare_vertical
from ..store.model_bundle import save_job_bundle
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..process.progress import emit_progress
from ..store.resume import role_lifecycle
from ..observe.reports import (classification_metrics, evaluate_split, log_summary, regression_metrics,
                               save_guest_reports)


class VerticalNNJobParams(SplitNNConfig, StandardisedSplitParams, ChainedInputParams):
    """The job file's ``params`` for ``algorithm: vertical_nn``: :class:`SplitNNConfig` plus the split.

    ``insecure_test_key`` is not set here: it follows ``security.insecure_test_keys``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def party_checks(self, cfg: JobConfig, party: PartySpec) -> list[tuple[str, str]]:
        """Preflight of the user modules ``party`` builds (:func:`factory_problems`): (job-file field, problem)."""
        return [(exc.field, exc.message) for exc in factory_problems(cfg, party, self.split_config(cfg))]

    def split_config(self, cfg: JobConfig) -> SplitNNConfig:
        """The :class:`SplitNNConfig` of these params, factory paths made absolute against the job file's folder."""
        return SplitNNConfig(**self.model_dump(include=set(SplitNNConfig.model_fields))).resolved(cfg.base_dir)


def check(cfg: JobConfig, params: VerticalNNJobParams) -> None:
    """Split NN runs between guest and hosts only."""
    if cfg.server is not None:
        raise JobConfigError("parties: vertical_nn runs between guest and hosts only; remove the server party")


@contextlib.contextmanager
def factory_errors():
    """A FactoryError of the block (user modules: it names the party and field) as a JobConfigError."""
    try:
        yield
    except FactoryError as exc:
        raise JobConfigError(str(exc)) from exc


def factory_problems(cfg: JobConfig, party: PartySpec, config: SplitNNConfig) -> list[FactoryError]:
    """Each factory ``party`` builds (its role's ``*_factory``) that cannot be imported or is not callable, as a
    FactoryError naming the party and ``params.<field>.factory``. Only imports: the modules are built and probed
    when the party's rows are ready (their input width is known after PSI and preprocessing)."""
    problems = []
    for name, ref in config.user_factories(party.role):
        try:
            ref.resolve(f"params.{name}.factory")
        except FactoryError as exc:
            problems.append(exc.at(party.id))
    return problems


def user_module_config(cfg: JobConfig, party: PartySpec, params: VerticalNNJobParams) -> SplitNNConfig:
    """The split NN config of ``params`` (:meth:`VerticalNNJobParams.split_config`) after checking, before any
    message, that the factories ``party`` builds import. JobConfigError naming the party and
    ``params.<field>.factory`` otherwise."""
    config = params.split_config(cfg)
    problems = factory_problems(cfg, party, config)
    if problems:
        raise JobConfigError("; ".join(str(p) for p in problems))
    return config


def run(cfg: JobConfig, party: PartySpec, transport: Transport, params: VerticalNNJobParams, *,
        resume: bool = False) -> dict:
    """Run this party's role of a vertical NN job; return the guest's metrics (hosts: ``{}``).

    Raises JobConfigError for bad data or a user module that cannot be built or has the wrong shape
    (naming the party and field), TransportError when a peer fails or goes silent.
    """
    out_dir = cfg.output_dir(party.id)
    host_ids = [h.id for h in cfg.hosts]
    config = user_module_config(cfg, party, params)
    # each host's key is generated while PSI and the split run (OU at 2048 bits: 0.3-5 s)
    keys = prefetch_keypair(config.he_scheme, config.key_bits, config.insecure_test_key) \
        if party.role == "host" else None
    data = prepare_vertical(cfg, party, transport, params, standardize=params.standardize, preprocess=True)
    X, train = data.X, data.train

    if party.role == "host":
        with factory_errors():
            host = SplitNNHost(transport, cfg.guest.id, host_ids, X[train], config, keypair=keys,
                               **role_lifecycle(cfg, party, transport, resume))
        host.fit()
        host.serve_predictions(X)
        save_job_bundle(cfg, party, files={"state.safetensors": host.state_arrays()}, **bundle_fields(data, config))
        return {}

    regression = config.task == "regression"
    if regression:
        if not np.issubdtype(np.asarray(data.y).dtype, np.number) or not np.all(np.isfinite(data.y)):
            raise JobConfigError(f"{cfg.where(party, 'data.label_column')}: regression targets must be finite numbers")
        data.y = np.asarray(data.y, dtype=np.float64)
    elif not np.all(np.equal(np.mod(data.y, 1), 0)) or np.min(data.y) < 0:
        raise JobConfigError(f"{cfg.where(party, 'data.label_column')}: labels must be integers 0..C-1")
    else:
        data.y = data.y.astype(np.int64)
    with factory_errors():
        guest = SplitNNGuest(transport, host_ids, X[train], data.y[train], config,
                             on_epoch=lambda epoch, loss: _epoch_progress(guest, params, epoch, loss),
                             **role_lifecycle(cfg, party, transport, resume))
    result = guest.fit()
    metrics, p_test = evaluate_split(data.y, data.split, lambda rows: guest.predict_proba(X, rows=rows),
                                     regression_metrics if regression else classification_metrics)
    guest.end_prediction()
    history = {"loss": result.losses, "epoch_seconds": result.epoch_seconds}
    privacy = {"privacy": result.privacy} if result.privacy is not None else {}
    if result.privacy is not None:  # label DP: ε(δ) against the hosts after each epoch
        history["epsilon"] = result.epsilons
    task = "regression" if regression else ("binary" if guest.n_classes == 2 else "multiclass")
    plot = save_guest_reports(out_dir, cfg, data, metrics, history, p_test, "vertical NN",
                              loss_label=("training MSE of the standardised target" if regression else
                                          "training cross-entropy") + " (mean over the epoch's batches)",
                              n_classes=guest.n_classes, task=task, **privacy)
    save_job_bundle(cfg, party, files={"state.safetensors": guest.state_arrays()}, metrics=metrics,
                    extra={"n_classes": guest.n_classes, **privacy}, task=task, **bundle_fields(data, config))
    log_summary(party.id, metrics, result.losses, plot)
    return metrics


def _epoch_progress(guest: SplitNNGuest, params: VerticalNNJobParams, epoch: int, loss: float) -> None:
    """The guest's progress event after ``epoch`` (0-based): the loss, and with label DP ε against the hosts."""
    eps = guest.label_dp_epsilon
    emit_progress("epochs", epoch + 1, params.epochs, f"loss {loss:.5f}" + (f", ε {eps:.3g}" if eps is not None
                                                                            else ""),
                  {"loss": loss, **({"ε": eps} if eps is not None else {})})
