"""What a :class:`JobSpec` is, and the table of them: the one description of an algorithm.

A spec says what ``job.algorithm: NAME`` means: its family (which roles a job needs), the pydantic
model of its ``params``, an optional check of the whole job, the function that runs one party, how a
prediction job scores new rows with its model bundles, whether a bundle scores on one machine
(:func:`secureflhv.load_model`), and what task a bundle's outputs are. Config validation, the CLI
(``secureflhv validate / party / run``), the prediction job, ``load_model`` and the registry table of
``docs/architecture.md`` read :data:`JOBS`; :mod:`secureflhv.runtime.job.registry` fills it with the
built-in algorithms, and :func:`register_job` adds one (docs/architecture.md, "Adding an algorithm").

This module imports no algorithm, so the prediction job (itself a registered algorithm) can read the
table without an import cycle.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Protocol

import numpy as np
from pydantic import BaseModel

from ...transport import Transport
from .job_file import JobConfig, JobConfigError, PartySpec, validate_params

if TYPE_CHECKING:
    from ..store.model_bundle import ModelBundle

Family = Literal["vertical", "horizontal", "peer"]


class RunFn(Protocol):
    """A job module's ``run``: one party's role, returning its metrics (``resume``: ``--resume`` was given;
    jobs without checkpoints ignore it)."""

    def __call__(self, cfg: JobConfig, party: PartySpec, transport: Transport, params: BaseModel, *,
                 resume: bool = False) -> dict: ...


CheckFn = Callable[[JobConfig, BaseModel], None]
# (cfg, party, transport, prediction params, this party's verified bundle) -> the guest's metrics
PredictFn = Callable[[JobConfig, PartySpec, Transport, BaseModel, "ModelBundle"], dict]
# (bundle, task) -> score(X): X (n, n_inputs) float64 model inputs -> (n,) or (n, C) float64
ScorerFn = Callable[["ModelBundle", str], Callable[[np.ndarray], np.ndarray]]
# (bundle config, bundle extra) -> "binary" | "multiclass" | "regression"
TaskFn = Callable[[dict, dict], str]


@dataclass(frozen=True)
class JobSpec:
    """One algorithm of the registry.

    Attributes:
        name: the value of ``job.algorithm``.
        family: ``vertical`` (one guest with the labels, hosts with features, optional server) or
            ``horizontal`` (clients with rows, one server that aggregates) or ``peer`` (decentralised: clients
            with rows and no server; every party talks to every other, and any failure stops the job).
        summary: what it trains, one line for ``secureflhv validate`` and the docs table.
        params: the pydantic model of ``params``; a field ``insecure_test_key`` (Paillier jobs) is set
            from ``security.insecure_test_keys``, never from ``params``.
        run: runs one party's role, ``run(cfg, party, transport, params, *, resume) -> metrics``.
        check: optional check of the job as a whole (e.g. "arbiter mode needs a server");
            raises JobConfigError naming the field.
        roles: optional rule on the parties' roles replacing the family's (``predict``; required for
            the ``peer`` family, which has no common rule).
        predict: the federated prediction protocol of this algorithm's bundles (the prediction job runs it
            at each data party); None when a bundle scores locally or the algorithm has no prediction.
        local_model: rebuilds a bundle's model on one machine, ``local_model(bundle, task) -> score``;
            set when every party holds the whole model. Such a bundle scores in ``load_model`` and, each
            party on its own rows, in the prediction job.
        task: the task of a bundle that does not record one, from its ``config`` and ``extra`` (None:
            ``config.task`` / ``n_classes``, see :func:`secureflhv.runtime.store.loaded_model.config_task`).
        trains: whether the job trains a model that a prediction scores (False: a data job, such as
            ``feature_binning`` or ``vertical_statistics``, or one that uses a trained model, such as
            ``predict`` or ``scorecard``).
        data_factories: whether a party's data may be a user dataset (``parties[i].data.factory``) instead of a
            table (horizontal FL); other algorithms refuse it.
    """

    name: str
    family: Family
    summary: str
    params: type[BaseModel]
    run: RunFn
    check: CheckFn | None = None
    roles: Callable[[JobConfig], None] | None = None
    predict: PredictFn | None = None
    local_model: ScorerFn | None = None
    task: TaskFn | None = None
    trains: bool = True
    data_factories: bool = False

    def __post_init__(self) -> None:
        if self.family not in ("vertical", "horizontal", "peer"):
            raise ValueError(f"{self.name}: family must be vertical, horizontal or peer, got {self.family!r}")
        if self.roles is None and self.family not in FAMILY_RULES:
            raise ValueError(f"{self.name}: a {self.family} algorithm states its role rule (roles=...)")
        if self.trains and not (self.predict is not None or self.local_model is not None):
            raise ValueError(f"{self.name}: a job that trains a model says how its bundles are scored "
                             f"(predict= or local_model=), or sets trains=False")
        if self.predict is not None and self.local_model is not None:
            raise ValueError(f"{self.name}: a bundle either scores locally or through a prediction protocol")

    @property
    def scores_locally(self) -> bool:
        """Whether a bundle holds the whole model, so that one party scores rows with it alone."""
        return self.local_model is not None

    @property
    def predictable(self) -> bool:
        """Whether a prediction job accepts this algorithm's bundles."""
        return self.predict is not None or self.scores_locally

    @property
    def module(self) -> str:
        """The dotted name of the job module (the module of :attr:`run`)."""
        return getattr(self.run, "__module__", "") or ""

    def validate(self, cfg: JobConfig) -> BaseModel:
        """The job's validated params, after the family's role rules and :attr:`check`.

        Raises JobConfigError naming the field (``parties: ...``, ``params.<field>: ...``).
        """
        for p in cfg.parties:
            if p.data is not None and p.data.factory is not None and not self.data_factories:
                raise JobConfigError(f"{cfg.where(p, 'data.factory')}: {self.name} reads tables (data.path); a "
                                     f"dataset factory is for algorithm 'horizontal'")
        (self.roles or FAMILY_RULES[self.family])(cfg)
        params = validate_params(self.params, cfg, paillier="insecure_test_key" in self.params.model_fields)
        if self.check is not None:
            self.check(cfg, params)
        return params


def _vertical_roles(cfg: JobConfig) -> None:
    roles = [p.role for p in cfg.parties]
    if roles.count("guest") != 1:
        raise JobConfigError(f"parties: a vertical job needs exactly one guest, found {roles.count('guest')}")
    if roles.count("host") < 1:
        raise JobConfigError("parties: a vertical job needs at least one host")
    if not cfg.guest.data.label_column:
        raise JobConfigError(f"{cfg.where(cfg.guest, 'data.label_column')}: the guest holds the labels; "
                             f"name its column")


def _horizontal_roles(cfg: JobConfig) -> None:
    if isinstance(cfg.params, dict) and cfg.params.get("strategy") == "multiconfederated":
        raise JobConfigError("params.strategy: multiconfederated is decentralised (no server): set "
                             "job.algorithm: multiconfederated and drop params.strategy")
    roles = [p.role for p in cfg.parties]
    if roles.count("guest") > 1:
        raise JobConfigError(f"parties: at most one guest, found {roles.count('guest')}")
    if roles.count("server") != 1:
        raise JobConfigError("parties: a horizontal job needs exactly one server (the aggregator)")
    if len(cfg.clients) < 2:
        raise JobConfigError("parties: a horizontal job needs at least two clients (guest/host)")


FAMILY_RULES: dict[str, Callable[[JobConfig], None]] = {"vertical": _vertical_roles,
                                                         "horizontal": _horizontal_roles}

class JobTable(MutableMapping):
    """``job.algorithm`` -> :class:`JobSpec`, in registration order. An entry may be a loader (a function
    returning the spec) that runs when the entry is first read: a built-in's job module, and what it imports
    (torch for the horizontal family), is imported only by the processes that run or inspect that algorithm."""

    def __init__(self) -> None:
        self._entries: dict[str, JobSpec | Callable[[], JobSpec]] = {}

    def add_loader(self, name: str, load: Callable[[], JobSpec]) -> None:
        """Register ``name`` to be built by ``load()`` on first read (a name already present is kept)."""
        self._entries.setdefault(name, load)

    def __getitem__(self, name: str) -> JobSpec:
        entry = self._entries[name]
        if not isinstance(entry, JobSpec):
            entry = self._entries[name] = entry()
        return entry

    def __setitem__(self, name: str, spec: JobSpec) -> None:
        self._entries[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self):
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries


JOBS = JobTable()
"""Every algorithm a job file can name: ``job.algorithm`` -> its spec (filled by
:mod:`secureflhv.runtime.job.registry`; read it through that module, which guarantees the built-ins)."""


def register_job(spec: JobSpec) -> JobSpec:
    """Add ``spec`` to :data:`JOBS`; returns it. ValueError when its name is taken."""
    if spec.name in JOBS:
        raise ValueError(f"job.algorithm {spec.name!r} is already registered")
    JOBS[spec.name] = spec
    return spec


def unregister_job(name: str) -> None:
    """Remove algorithm ``name`` from :data:`JOBS` (e.g. a test's toy algorithm); KeyError when absent."""
    del JOBS[name]


def job_spec(algorithm: str) -> JobSpec:
    """The registry entry of ``algorithm``; JobConfigError naming ``job.algorithm`` when unknown."""
    try:
        return JOBS[algorithm]
    except KeyError:
        raise JobConfigError(f"job.algorithm: unknown algorithm {algorithm!r}; choose one of {sorted(JOBS)}") \
            from None
