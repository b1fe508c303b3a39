"""The job registry: every algorithm a job file can name, in one place.

A :class:`JobSpec` says what ``job.algorithm: NAME`` means: its family (which roles a job needs), the
pydantic model of its ``params``, an optional extra check of the whole job, and the function that runs
one party. Config validation, ``secureflhv validate / party / run`` and the docs read the algorithm
list from :data:`JOBS`.

Adding an algorithm = one module under ``secureflhv/runtime/algorithms/`` (a params model and a ``run``
function; see ``docs/architecture.md``) + one line in :data:`JOBS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Protocol

from pydantic import BaseModel

from ...transport import Transport
from .job_file import JobConfig, JobConfigError, PartySpec, validate_params
from ..algorithms import (horizontal_fl, multiconfederated, predict, secureboost_horizontal,
                          secureboost_vertical, vertical_lr, vertical_nn)

Family = Literal["vertical", "horizontal", "peer"]


class RunFn(Protocol):
    """A job module's ``run``: one party's role, returning its metrics."""

    def __call__(self, cfg: JobConfig, party: PartySpec, transport: Transport, params: BaseModel, *,
                 resume: bool = False) -> dict: ...


CheckFn = Callable[[JobConfig, BaseModel], None]


@dataclass(frozen=True)
class JobSpec:
    """One algorithm of the registry.

    Attributes:
        name: the value of ``job.algorithm``.
        family: ``vertical`` (one guest with the labels, hosts with features, optional server) or
            ``horizontal`` (clients with rows, one server that aggregates) or ``peer`` (decentralised: clients
            with rows and no server; every party talks to every other, and any failure stops the job).
        summary: one line for ``secureflhv validate`` and the docs.
        params: the pydantic model of ``params``; a field ``insecure_test_key`` (Paillier jobs) is set
            from ``security.insecure_test_keys``, never from ``params``.
        run: runs one party's role, ``run(cfg, party, transport, params, *, resume) -> metrics`` (``resume``:
            ``--resume`` was given; jobs without checkpoints ignore it).
        check: optional check of the job as a whole (e.g. "arbiter mode needs a server");
            raises JobConfigError naming the field.
        roles: optional rule on the parties' roles replacing the family's (``predict``).
    """

    name: str
    family: Family
    summary: str
    params: type[BaseModel]
    run: RunFn
    check: CheckFn | None = None
    roles: Callable[[JobConfig], None] | None = None

    def validate(self, cfg: JobConfig) -> BaseModel:
        """The job's validated params, after the family's role rules and :attr:`check`.

        Raises JobConfigError naming the field (``parties: ...``, ``params.<field>: ...``).
        """
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
                                                         "horizontal": _horizontal_roles,
                                                         "peer": multiconfederated.roles}

JOBS: dict[str, JobSpec] = {spec.name: spec for spec in (
    JobSpec("vertical_lr", "vertical", "logistic regression, Paillier-encrypted gradients (Hardy et al. 2017)",
            vertical_lr.VerticalLRJobParams, vertical_lr.run, vertical_lr.check),
    JobSpec("vertical_nn", "vertical", "split neural network, Paillier interactive layer (Zhang et al. 2020)",
            vertical_nn.VerticalNNJobParams, vertical_nn.run, vertical_nn.check),
    JobSpec("secureboost_vertical", "vertical", "SecureBoost histogram GBDT, Paillier (Cheng et al. 2021)",
            secureboost_vertical.SecureBoostJobParams, secureboost_vertical.run),
    JobSpec("horizontal", "horizontal", "FedAvg / FedProx / SCAFFOLD / FedNova over secure aggregation",
            horizontal_fl.HorizontalJobParams, horizontal_fl.run, horizontal_fl.check),
    JobSpec("secureboost_horizontal", "horizontal", "histogram GBDT, histograms through secure aggregation",
            secureboost_horizontal.HorizontalSecureBoostJobParams, secureboost_horizontal.run,
            secureboost_horizontal.check),
    JobSpec("multiconfederated", "peer", "MultiConfederated learning, decentralised, no server (Duchesne et al. 2024)",
            multiconfederated.MultiConfederatedJobParams, multiconfederated.run, multiconfederated.check),
    # every party meets every other, as in a vertical job; the roles follow the trained model
    JobSpec("predict", "vertical", "score new rows with the model bundles of a trained job (see docs)",
            predict.PredictJobParams, predict.run, predict.check, roles=predict.roles),
)}


def job_spec(algorithm: str) -> JobSpec:
    """The registry entry of ``algorithm``; JobConfigError naming ``job.algorithm`` when unknown."""
    try:
        return JOBS[algorithm]
    except KeyError:
        raise JobConfigError(f"job.algorithm: unknown algorithm {algorithm!r}; choose one of {sorted(JOBS)}") \
            from None


def job_params(cfg: JobConfig) -> BaseModel:
    """The validated ``params`` of a job (see :meth:`JobSpec.validate`)."""
    return job_spec(cfg.job.algorithm).validate(cfg)
