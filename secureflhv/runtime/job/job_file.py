"""The job file's schema: one YAML (or JSON) document that names the job, every party and the algorithm.

This module checks the file's structure, whatever the algorithm; :mod:`secureflhv.runtime.job.load`
adds the checks that depend on the algorithm (its family's roles, its ``params``) from the registry.
Validated with pydantic; every error names the offending field as a dotted path
(``parties[2].data.id_column``) and the file, so a user can fix it without reading code.
Relative paths in the file are resolved against the job file's folder.

Example (see ``examples/vertical_lr.py``, which writes one; the defaults and bounds of every field are
the pydantic models below and docs/parameters.md)::

    job:
      id: breast-vlr
      algorithm: vertical_lr
      output_dir: out            # each party writes out/<party id>/
      startup_timeout_s: 7200    # how long a party waits for its partners to start
      max_message_mb: 256        # largest message a party accepts (MiB); raise it for big batches
      psi_security: malicious    # PSI safe against a party that lies: ID alignment by ECDH-PSI
      # psi_protocol: ecdh       # default from psi_security; kkrt (~15x faster) needs psi_security: semi_honest
      psi_max_ids: 10000000      # largest ID set any party may hold or announce in PSI
    security:
      ca: certs/ca.pem           # omit only with insecure: true
    parties:
      - {id: server, role: server, address: "127.0.0.1:50551", cert: certs/server.pem, key: certs/server.key}
      - id: guest
        role: guest
        address: "127.0.0.1:50552"
        cert: certs/guest.pem
        key: certs/guest.key
        data: {path: data/guest.csv, id_column: id, label_column: label}
      - id: host-1
        role: host
        address: "127.0.0.1:50553"
        cert: certs/host-1.pem
        key: certs/host-1.key
        data: {path: data/host-1.csv, id_column: id}
        compute: {engine: ray, address: "10.0.0.5:6379"}  # optional: this party's Ray cluster
    params: {mode: arbiter, epochs: 30, batch_size: 64, learning_rate: 0.15, l2: 0.001}
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ...data.schema import parse_schema
from ...params.factory import FactoryRef


DEFAULT_MAX_MESSAGE_MB = 256.0  # = transport.DEFAULT_MAX_PAYLOAD_BYTES
MAX_MESSAGE_MB = 16384.0  # 16 GiB: far above any message of the shipped algorithms on one machine
DEFAULT_PSI_MAX_IDS = 10_000_000  # = secureflhv.vertical.psi.DEFAULT_MAX_IDS (a test keeps them equal)
MAX_PSI_MAX_IDS = 2 ** 32 - 1     # KKRT bin numbers and every wire count stay far below it


class JobConfigError(ValueError):
    """The job file is missing, unreadable or invalid; the message names the file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSpec(_Strict):
    """One party's data: a CSV/Parquet/NumPy file with an id column (and the label at the guest), or (horizontal
    FL) a torch ``Dataset`` of ``(x, y)`` items built by the consortium's function ``factory`` with ``kwargs``
    (:class:`secureflhv.params.FactoryRef`; the loaders of :mod:`secureflhv.data.torch_datasets` are such
    functions). A relative ``root`` or ``path`` keyword is taken relative to the job file."""

    path: Path | None = None
    factory: str | None = Field(default=None, description="horizontal FL: 'package.module:function' returning a torch "
                                                           "Dataset of (x, y) items (instead of path)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of data.factory")
    code_path: Path | None = Field(default=None, description="folder added to the import path for data.factory "
                                                            "(relative to the job file)")
    id_column: str = "id"
    label_column: str | None = None
    feature_columns: list[str] | None = Field(
        default=None, description="columns used as features; default: all but id and label")
    table_schema: dict[str, Any] | None = Field(
        default=None, alias="schema",
        description="column -> numeric | categorical (with categories, optional 'other') | id | label; "
                    "see secureflhv.data.schema")

    max_memory_mb: float | None = Field(
        default=None, gt=0, description="a CSV/Parquet table larger than this (MiB; Parquet: rows x columns x 8 bytes) "
                                        "is read in row batches and SecureBoost bins it by a bounded-memory sketch")
    batch_rows: int | None = Field(default=None, ge=1, description="rows per batch when streamed "
                                                                   "(default: from max_memory_mb)")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _batch_rows_needs_budget(self) -> "DataSpec":
        if self.batch_rows is not None and self.max_memory_mb is None:
            raise ValueError("batch_rows: only used with max_memory_mb (streamed reading)")
        if (self.path is None) == (self.factory is None):
            raise ValueError("path / factory: give the data file (path) or the function that builds a dataset "
                             "(factory), one of the two")
        if self.factory is not None:
            FactoryRef(factory=self.factory)  # 'package.module:function' (pydantic names the field)
        elif self.kwargs or self.code_path is not None:
            raise ValueError("kwargs, code_path: only with factory")
        return self

    def factory_ref(self, base: Path) -> FactoryRef:
        """:attr:`factory` and :attr:`kwargs` as a FactoryRef, a relative ``root`` / ``path`` keyword resolved
        against the job file's folder ``base``."""
        kwargs = {k: (str((base / v).resolve()) if k in ("root", "path") and isinstance(v, str)
                      and not Path(v).is_absolute() else v) for k, v in self.kwargs.items()}
        code = None if self.code_path is None else (base / self.code_path).resolve()
        return FactoryRef(factory=self.factory, kwargs=kwargs, path=code)

    @field_validator("table_schema")
    @classmethod
    def _schema(cls, v):
        if v is not None:
            parse_schema(v, "schema")  # SchemaError is a ValueError: pydantic names the field
        return v


class ComputeSpec(_Strict):
    """Where this party's batch crypto work runs (:mod:`secureflhv.runtime.process.party_compute`); the party's own business.

    ``local`` (default): this machine's process pool. ``ray``: the organisation's Ray cluster at
    ``address`` (``host:port`` of its head, or ``ray://host:10001``; default ``RAY_ADDRESS``).
    ``auto``: Ray when an address is given (or ``RAY_ADDRESS`` is set) and reachable, else local.
    """

    engine: Literal["local", "ray", "auto"] = "local"
    address: str | None = Field(default=None, description="Ray cluster: host:port or ray://host:port")
    min_batch: int | None = Field(default=None, ge=1, description="batches below this size run in the party "
                                                                  "process (default: the local pool's)")
    # default 1: each further shard per CPU makes the histogram tasks repeat every feature pair's marginals
    # (2 B^2 multiplications per pair and node), CPU a second worker spends and one worker does not
    shards_per_worker: int = Field(default=1, ge=1, le=64, description="object-store shards per cluster CPU")
    task_cpus: float = Field(default=1.0, gt=0, le=64, description="CPUs Ray reserves per task")
    max_retries: int = Field(default=3, ge=0, le=100, description="Ray retries of a task whose worker died")
    task_timeout_s: float = Field(default=3600.0, gt=0, description="a step still running after this fails")
    ship_code: bool = Field(default=True, description="upload this secureflhv package to the Ray workers")
    cluster_lost_s: float = Field(default=10.0, gt=0, le=55, description="a step fails (the whole cluster is gone) "
                                                                      "once the head has not answered this long")

    @field_validator("address")
    @classmethod
    def _ray_address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.removeprefix("ray://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port or ray://host:port with a port in 1..65535, got {v!r}")
        return v

    @model_validator(mode="after")
    def _address_needs_ray(self) -> "ComputeSpec":
        if self.engine == "local" and self.address is not None:
            raise ValueError("address: only used with engine ray or auto (engine is local)")
        return self


class PartySpec(_Strict):
    """One entry of ``parties``: the party's id, role, network addresses, certificate and key, data and
    compute (docs/parameters.md lists every field).
    """
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    role: Literal["guest", "host", "server"]
    address: str = Field(description="host:port where the other parties reach this party")
    listen: str | None = Field(default=None, description="host:port to bind (default: address), "
                                                         "e.g. 0.0.0.0:50051 behind NAT or in a container")
    cert: Path | None = None
    key: Path | None = None
    data: DataSpec | None = None
    compute: ComputeSpec = Field(default_factory=ComputeSpec,
                                 description="where this party's heavy work runs: local pool or its Ray cluster")

    @field_validator("address", "listen")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port with a port in 1..65535, got {v!r}")
        return v


class JobSection(_Strict):
    """The ``job`` section: id, algorithm, output folder, time limits, message size and PSI settings
    (docs/parameters.md lists every field).
    """
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    algorithm: str = Field(description="a name from the job registry (secureflhv.runtime.job.registry)")
    output_dir: Path = Path("out")
    deadline_s: float = Field(default=120.0, gt=0,
                              description="seconds a party waits for a peer during the protocol before failing")
    startup_timeout_s: float = Field(default=7200.0, gt=0,
                                     description="seconds a party waits at start for its partners to come up")
    startup_log_interval_s: float = Field(default=10.0, gt=0,
                                          description="seconds between 'waiting for PARTY' lines at start")
    max_message_mb: float = Field(
        default=DEFAULT_MAX_MESSAGE_MB, gt=0, le=MAX_MESSAGE_MB,
        description="largest message (payload, MiB) a party accepts from a peer; bigger is refused from its header "
                    "before it is read, and each peer may have at most twice this queued. Raise it when a "
                    "legitimate message is refused (e.g. full-batch vertical LR on millions of rows: about "
                    "rows x 512 bytes per encrypted vector with 2048-bit keys)")

    psi_security: Literal["malicious", "semi_honest"] = Field(
        default="malicious",
        description="what vertical jobs' PSI must withstand: malicious (default): a guest or host that lies learns at "
                    "most whether IDs it guesses are in the other's set, so psi_protocol is ecdh; semi_honest: the "
                    "job declares that every party follows the protocol, which allows (and defaults to) kkrt")
    psi_protocol: Literal["ecdh", "kkrt"] | None = Field(
        default=None, description="vertical jobs' ID alignment: ecdh (ECDH-PSI, secureflhv.vertical.psi) or kkrt "
                                  "(OT-extension PSI, secureflhv.vertical.psi_kkrt: same result, ~15x less CPU, "
                                  "but a guest that deviates from it learns every host ID, so only with "
                                  "psi_security: semi_honest). Default: ecdh under malicious, kkrt under "
                                  "semi_honest. KKRT sends ~95 bytes per guest ID to each host, in parts within "
                                  "max_message_mb, so no set size needs a larger limit")
    psi_max_ids: int = Field(
        default=DEFAULT_PSI_MAX_IDS, ge=1, le=MAX_PSI_MAX_IDS,
        description="largest ID set a party may hold or announce in PSI (both protocols): a party refuses a peer's "
                    "larger set, naming it, before any work sized by it; also the most IDs a lying party can "
                    "guess per run")

    @model_validator(mode="after")
    def _psi_protocol_from_security(self) -> "JobSection":
        if self.psi_protocol is None:
            self.psi_protocol = "ecdh" if self.psi_security == "malicious" else "kkrt"
        elif self.psi_protocol == "kkrt" and self.psi_security == "malicious":
            raise ValueError("psi_protocol: kkrt is safe only when every party follows the protocol (a guest that "
                             "crafts its OT-extension matrix learns every host ID); set psi_security: semi_honest "
                             "to declare that, or use psi_protocol: ecdh (the default under psi_security: "
                             "malicious)")
        return self

    @property
    def max_message_bytes(self) -> int:
        """``max_message_mb`` in bytes (the transport's ``max_payload_bytes``)."""
        return int(self.max_message_mb * (1 << 20))


class SecuritySection(_Strict):
    """The ``security`` section: the CA certificate, and the test-only switches (plaintext gRPC, short keys)."""
    ca: Path | None = None
    insecure: bool = Field(default=False, description="plaintext gRPC without TLS: testing only")
    insecure_test_keys: bool = Field(
        default=False, description="allow Paillier keys below 2048 bits (tests only)")


class JobConfig(_Strict):
    """A validated job file. ``base_dir`` is the folder relative paths are resolved against."""

    job: JobSection
    security: SecuritySection = SecuritySection()
    parties: list[PartySpec]
    params: dict = Field(default_factory=dict, description="algorithm hyperparameters")
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> "JobConfig":
        ids = [p.id for p in self.parties]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"parties: duplicate party id(s) {dup}")
        if [p.role for p in self.parties].count("server") > 1:
            raise ValueError("parties: at most one server")
        for i, p in enumerate(self.parties):
            if p.role in ("guest", "host") and p.data is None:
                raise ValueError(f"parties[{i}].data: required for {p.role} {p.id!r}")
            if p.role == "server" and p.data is not None:
                raise ValueError(f"parties[{i}].data: the server holds no data")
            if not self.security.insecure:
                for fld in ("cert", "key"):
                    if getattr(p, fld) is None:
                        raise ValueError(f"parties[{i}].{fld}: required with TLS (or set security.insecure: true)")
        if not self.security.insecure and self.security.ca is None:
            raise ValueError("security.ca: required with TLS (or set security.insecure: true)")
        addresses = [p.address for p in self.parties]
        clash = sorted({a for a in addresses if addresses.count(a) > 1})
        if clash:
            raise ValueError(f"parties: two parties listen on {clash}")
        return self

    # ------------------------------------------------------------------ helpers
    def resolve(self, path: Path | None) -> Path | None:
        """``path`` against the job file's folder (absolute paths unchanged; None stays None)."""
        if path is None:
            return None
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def party(self, party_id: str) -> PartySpec:
        """The party ``party_id``; JobConfigError naming the job's parties when there is none."""
        for p in self.parties:
            if p.id == party_id:
                return p
        raise JobConfigError(f"party {party_id!r} is not in job {self.job.id!r}; parties: {[p.id for p in self.parties]}")

    def by_role(self, role: str) -> list[PartySpec]:
        """The parties of ``role`` (``guest``, ``host`` or ``server``), in file order."""
        return [p for p in self.parties if p.role == role]

    @property
    def guest(self) -> PartySpec:
        """The guest (the job's structure checks make it exist for the families that have one)."""
        return self.by_role("guest")[0]

    @property
    def clients(self) -> list[PartySpec]:
        """Horizontal jobs: every data party (the guest, if any, and the hosts), in file order."""
        return [p for p in self.parties if p.role in ("guest", "host")]

    @property
    def hosts(self) -> list[PartySpec]:
        """The hosts, in file order."""
        return self.by_role("host")

    @property
    def server(self) -> PartySpec | None:
        """The server, or None when the job has none."""
        servers = self.by_role("server")
        return servers[0] if servers else None

    def where(self, party: PartySpec, field: str) -> str:
        """The dotted path of ``field`` of ``party`` in the job file, with its id, for error messages.

        E.g. ``parties[2].data.label_column (party 'host-1')``: every error about a party's settings or
        data is phrased this way, whichever job raises it.
        """
        return f"parties[{self.parties.index(party)}].{field} (party {party.id!r})"

    def output_dir(self, party_id: str) -> Path:
        """The folder party ``party_id`` writes to: ``<job.output_dir>/<party_id>``, resolved."""
        return self.resolve(self.job.output_dir) / party_id


def _loc(loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_validation_error(err: ValidationError, source: str) -> str:
    """A pydantic error as lines a user can act on: the file, then one ``dotted.field: message`` per error."""
    lines = [f"invalid job file {source}:"]
    for e in err.errors():
        where = _loc(e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling)"
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def parse_job_file(data: dict, base_dir: Path | str = ".", source: str = "<job>") -> JobConfig:
    """Validate a job given as a dict. Raises :class:`JobConfigError` naming each bad field."""
    if not isinstance(data, dict):
        raise JobConfigError(f"invalid job file {source}: the top level must be a mapping, got {type(data).__name__}")
    try:
        cfg = JobConfig.model_validate(data)
    except ValidationError as err:
        raise JobConfigError(format_validation_error(err, source)) from None
    cfg.base_dir = Path(base_dir).resolve()
    return cfg


def read_job_file(path: Path | str) -> JobConfig:
    """Read and validate a job file (YAML or JSON).

    Raises:
        JobConfigError: missing/unreadable file, bad YAML, or a bad field (named as a dotted path).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobConfigError(f"cannot read job file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise JobConfigError(f"job file {path} is not valid YAML/JSON: {exc}") from None
    return parse_job_file(data, path.parent, str(path))


def params_error(err: ValidationError) -> JobConfigError:
    """A pydantic error on ``params`` as a JobConfigError naming ``params.<field>`` for each problem."""
    lines = []
    for e in err.errors():
        # a discriminated union's tag (written <like this>) is not a field of the job file
        where = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith("<")))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown parameter (check its spelling)"
        if not where and ":" in msg:  # model-level check: the message starts with the field name
            where, msg = (part.strip() for part in msg.split(":", 1))
        lines.append(f"params.{where}: {msg}" if where else f"params: {msg}")
    return JobConfigError("; ".join(lines))


def validate_params(model: type[BaseModel], cfg: JobConfig, *, paillier: bool = True):
    """Validate ``cfg.params`` with ``model``; ``insecure_test_key`` follows ``security.insecure_test_keys``.

    Raises JobConfigError naming each bad field.
    """
    raw = dict(cfg.params)
    if paillier:
        if "insecure_test_key" in raw:
            raise JobConfigError("params.insecure_test_key: set security.insecure_test_keys instead")
        raw["insecure_test_key"] = cfg.security.insecure_test_keys
    try:
        return model(**raw)
    except ValidationError as err:
        raise params_error(err) from None
