"""A job built in Python: the same document and pydantic models as a job file, validated as it is built.

::

    import secureflhv
    job = secureflhv.Job.horizontal(
        clients={"hospital-a": "a.npz", "hospital-b": "b.npz", "hospital-c": "c.npz"},
        params={"model": {"name": "mlp", "n_features": 6, "n_classes": 4}, "rounds": 5,
                "aggregation": {"kind": "secagg", "seed": 1}},
        job_id="hospitals", output_dir="out")
    job.params                       # the validated params model (HorizontalJobParams)
    job.config                       # the JobConfig, exactly what `secureflhv run` parses from job.yaml
    secureflhv.simulate(job)         # every party in this process (secureflhv.runtime.api.simulation)
    job.write("deploy")              # deploy/job.yaml + deploy/certs/: `secureflhv run deploy/job.yaml`

A :class:`Job` holds the job document (the dict a job file holds) and the folder its relative paths are
taken against (``base_dir``, default the working directory). Building validates it as ``secureflhv
validate`` does, in three steps: the job-file schema (:class:`~secureflhv.runtime.job.job_file.JobConfig`),
the algorithm's ``params`` model from the job registry (:mod:`secureflhv.runtime.job.registry`), then the
family's role rules and the algorithm's own check of the whole job. The first two raise pydantic's
``ValidationError``, whose lines name each bad field (``params.learning_rate``, ``parties.1.data.path``);
the third raises :class:`~secureflhv.runtime.job.job_file.JobConfigError` naming the field.

A party's data is a file path (as in a job file) or a mapping passed into ``parties[i].data`` unchanged:
a full ``data`` section (``{"path": ..., "label_column": ...}``) or user code that makes the data
(``{"factory": "pkg.mod:fn", "kwargs": {...}}``, :class:`secureflhv.params.FactoryRef`).
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, create_model

from ..job.demo import free_ports
from ..job.job_file import JobConfig, JobConfigError
from ..job.registry import job_spec
from ..job.spec import JobSpec

__all__ = ["Job"]

CERT_DIR = "certs"  # where write() puts the CA and the parties' certificates, under the job's folder
JOB_FILE = "job.yaml"


@functools.lru_cache(maxsize=64)
def _params_wrapper(spec_name: str, model: type[BaseModel]) -> type[BaseModel]:
    """A pydantic model ``{params: <model>}``: its ValidationError locates each error as ``params.<field>``."""
    return create_model(f"{spec_name} job", params=(model, ...))


def _data_section(entry, label_column: str | None) -> dict:
    """``parties[i].data`` of a data entry: a path becomes ``{path[, label_column]}``; a mapping is copied as is."""
    if isinstance(entry, Mapping):
        return copy.deepcopy(dict(entry))
    if not isinstance(entry, (str, os.PathLike)):
        raise TypeError(f"a party's data is a path or a mapping, got {type(entry).__name__}")
    data = {"path": os.fspath(entry)}
    if label_column is not None:
        data["label_column"] = label_column
    return data


def _params_doc(params) -> dict:
    """The ``params`` section of ``params``: a mapping (copied), or a params model (its set fields)."""
    if isinstance(params, BaseModel):
        return params.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"insecure_test_key"})
    if not isinstance(params, Mapping):
        raise TypeError(f"params is a mapping or the algorithm's params model, got {type(params).__name__}")
    return copy.deepcopy(dict(params))


def _security(certs, parties: list[dict]) -> dict:
    """``security`` of a built job: TLS with the certificates in folder ``certs`` (as ``secureflhv certs``
    writes them), else ``insecure`` (a simulation then makes throw-away ones; :meth:`Job.write` real ones)."""
    if certs is None:
        return {"insecure": True}
    for party in parties:
        party.update(cert=os.path.join(os.fspath(certs), f"{party['id']}.pem"),
                     key=os.path.join(os.fspath(certs), f"{party['id']}.key"))
    return {"ca": os.path.join(os.fspath(certs), "ca.pem")}


class Job:
    """A validated job: the document a job file holds, and what ``secureflhv run`` would parse from it.

    Attributes:
        config: the :class:`~secureflhv.runtime.job.job_file.JobConfig` (``base_dir``: the folder its
            relative paths are taken against).
        params: the validated ``params`` (the algorithm's pydantic model from the job registry, e.g.
            ``HorizontalJobParams``), the same object a party gets.
        spec: the algorithm's registry entry (:class:`~secureflhv.runtime.job.spec.JobSpec`).

    Raises (at construction): pydantic ``ValidationError`` naming each bad field of the document or its
    ``params``; JobConfigError for an unknown algorithm, roles that do not fit its family, or a job the
    algorithm's check refuses (e.g. too few clients for the aggregation's threshold).
    """

    def __init__(self, doc: Mapping[str, Any], base_dir: str | os.PathLike = ".", *, source: str = "<job>"):
        if not isinstance(doc, Mapping):
            raise JobConfigError(f"invalid job {source}: the top level must be a mapping, got {type(doc).__name__}")
        self._doc = copy.deepcopy(dict(doc))
        self.source = source
        config = JobConfig.model_validate(self._doc)  # ValidationError naming the field
        config.base_dir = Path(base_dir).resolve()
        self.spec: JobSpec = job_spec(config.job.algorithm)
        raw = dict(config.params)
        if "insecure_test_key" in self.spec.params.model_fields and "insecure_test_key" not in raw:
            raw["insecure_test_key"] = config.security.insecure_test_keys  # as validate_params sets it
        _params_wrapper(self.spec.name, self.spec.params).model_validate({"params": raw})  # ValidationError
        self.params: BaseModel = self.spec.validate(config)  # roles and the job's check: JobConfigError
        self.config = config

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], base_dir: str | os.PathLike = ".") -> "Job":
        """The job in ``doc`` (a job file's content); relative paths are taken against ``base_dir``."""
        return cls(doc, base_dir)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "Job":
        """The job in the YAML (or JSON) file ``path``; relative paths are taken against its folder.
        JobConfigError when the file cannot be read or parsed."""
        path = Path(path)
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise JobConfigError(f"cannot read job file {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise JobConfigError(f"job file {path} is not valid YAML/JSON: {exc}") from None
        return cls(doc, path.parent, source=str(path))

    @classmethod
    def horizontal(cls, clients: Mapping[str, Any], params, *, job_id: str = "horizontal-job",
                   algorithm: str = "horizontal", server: str | None = "server", output_dir: str = "out",
                   deadline_s: float | None = None, label_column: str | None = None, certs=None,
                   addresses: Mapping[str, str] | None = None, job: Mapping[str, Any] | None = None,
                   base_dir: str | os.PathLike = ".") -> "Job":
        """A horizontal job (``algorithm``: ``horizontal``, ``secureboost_horizontal``, ``multiconfederated``
        with ``server=None``): one client per entry of ``clients`` ({party id: data}, the first the guest,
        the others hosts) and the aggregation server ``server``.

        Args:
            clients: party id -> its data: a table path (``.npz`` shard, CSV, Parquet) or a ``data`` mapping
                (``{"path": ..., ...}``, or ``{"factory": "pkg.mod:fn", "kwargs": {...}}``, copied unchanged).
            params: the algorithm's ``params`` (a mapping, or its params model).
            label_column: set as ``data.label_column`` of each client given by path (default: none, so
                ``params.label_column`` applies).
            certs: a folder of ``ca.pem`` and ``<party>.pem`` / ``<party>.key`` (``secureflhv certs``); None: the
                job is ``insecure`` until :meth:`write` makes certificates.
            addresses: party id -> ``host:port`` (default: free loopback ports, for ``secureflhv run``).
            job: further ``job`` section fields (``startup_timeout_s``, ``max_message_mb``, ...).
        """
        ids = ([server] if server is not None else []) + list(clients)
        parties = [{"id": server, "role": "server"}] if server is not None else []
        parties += [{"id": cid, "role": "guest" if i == 0 else "host", "data": _data_section(entry, label_column)}
                    for i, (cid, entry) in enumerate(clients.items())]
        return cls._built(parties, ids, algorithm, params, job_id=job_id, output_dir=output_dir, deadline_s=deadline_s,
                          certs=certs, addresses=addresses, job=job, base_dir=base_dir)

    @classmethod
    def vertical(cls, guest: tuple[str, Any], hosts: Mapping[str, Any], params, *, algorithm: str = "vertical_lr",
                 server: str | None = None, job_id: str = "vertical-job", output_dir: str = "out",
                 deadline_s: float | None = None, insecure_test_keys: bool = False, certs=None,
                 addresses: Mapping[str, str] | None = None, job: Mapping[str, Any] | None = None,
                 base_dir: str | os.PathLike = ".") -> "Job":
        """A vertical job: ``guest`` = (id, data mapping with ``label_column``), ``hosts`` = {id: data}, and
        an optional ``server`` (e.g. vertical LR's arbiter mode). Data as in :meth:`horizontal` (a path
        gets the default ``id`` column); ``insecure_test_keys``: allow short Paillier keys (tests only).
        Other arguments: :meth:`horizontal`."""
        gid, gdata = guest
        ids = ([server] if server is not None else []) + [gid, *hosts]
        parties = [{"id": server, "role": "server"}] if server is not None else []
        parties.append({"id": gid, "role": "guest", "data": _data_section(gdata, None)})
        parties += [{"id": hid, "role": "host", "data": _data_section(d, None)} for hid, d in hosts.items()]
        return cls._built(parties, ids, algorithm, params, job_id=job_id, output_dir=output_dir, deadline_s=deadline_s,
                          certs=certs, addresses=addresses, job=job, base_dir=base_dir,
                          test_keys=insecure_test_keys)

    @classmethod
    def _built(cls, parties: list[dict], ids: list[str], algorithm: str, params, *, job_id, output_dir, deadline_s,
               certs, addresses, job, base_dir, test_keys: bool = False) -> "Job":
        """The document of a built job: addresses (given, else free loopback ports), security, job section."""
        addresses = dict(addresses or {})
        ports = iter(free_ports(len(ids)))
        for party in parties:
            party["address"] = addresses.pop(party["id"], None) or f"127.0.0.1:{next(ports)}"
        if addresses:
            raise JobConfigError(f"addresses: {sorted(addresses)} are not parties of the job ({ids})")
        section = {"id": job_id, "algorithm": algorithm, "output_dir": os.fspath(output_dir), **dict(job or {})}
        if deadline_s is not None:
            section["deadline_s"] = deadline_s
        security = _security(certs, parties)
        if test_keys:
            security["insecure_test_keys"] = True
        return cls({"job": section, "security": security, "parties": parties, "params": _params_doc(params)},
                   base_dir)

    # ------------------------------------------------------------------ views
    @property
    def id(self) -> str:
        """``job.id``."""
        return self.config.job.id

    @property
    def base_dir(self) -> Path:
        """The folder relative paths of the document are taken against (absolute)."""
        return self.config.base_dir

    @property
    def output_dir(self) -> Path:
        """``job.output_dir``, resolved: each party writes ``<output_dir>/<party id>/``."""
        return self.config.resolve(self.config.job.output_dir)

    def to_dict(self) -> dict:
        """A copy of the job document (paths as given, relative to :attr:`base_dir`)."""
        return copy.deepcopy(self._doc)

    def replace(self, **job_fields) -> "Job":
        """The same job with ``job`` section fields changed (e.g. ``output_dir="out2"``), validated again."""
        doc = self.to_dict()
        doc["job"].update({k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in job_fields.items()})
        return Job(doc, self.base_dir, source=self.source)

    def __repr__(self) -> str:
        roles = ", ".join(f"{p.id} ({p.role})" for p in self.config.parties)
        return (f"Job({self.id!r}, {self.spec.name}, {len(self.config.parties)} parties: {roles}; "
                f"{'insecure' if self.config.security.insecure else 'mutual TLS'}; output {self.output_dir})")

    # ------------------------------------------------------------------ deployment
    def write(self, directory: str | os.PathLike, *, certificates: bool = True, overwrite: bool = False) -> Path:
        """Write this job as ``<directory>/job.yaml`` for ``secureflhv run`` / ``secureflhv party``.

        Every input path of the document (data files, a dataset factory's ``root`` / ``path`` keywords, a
        factory's import folder ``path`` and initial ``weights``, certificates) is rewritten relative to
        ``directory``, so the file loads from there; a relative ``job.output_dir`` stays
        relative, so the parties write under ``directory``. With ``certificates``, a new CA and one
        certificate + key per party (CN = party id; names localhost, 127.0.0.1 and the host of its
        address, as ``secureflhv certs --job`` gives) go to ``<directory>/certs/`` and the job's
        ``security.ca`` and each party's ``cert`` / ``key`` point at them (TLS on); without, the
        security section is kept (its paths rewritten).

        Returns the path of ``job.yaml``. Raises FileExistsError when ``job.yaml`` or a certificate file
        exists and not ``overwrite``.
        """
        from ...transport.certs import generate_certificates

        out = Path(directory).resolve()
        target = out / JOB_FILE
        if target.exists() and not overwrite:
            raise FileExistsError(f"{target} already exists (pass overwrite=True to replace it)")
        doc = _rebased(self.to_dict(), self.base_dir, out)
        if certificates:
            ids = [p["id"] for p in doc["parties"]]
            names = {p["id"]: _cert_names(p["address"]) for p in doc["parties"]}
            generate_certificates(out / CERT_DIR, ids, hostnames=names, overwrite=overwrite)
            for party in doc["parties"]:
                party.update(cert=f"{CERT_DIR}/{party['id']}.pem", key=f"{CERT_DIR}/{party['id']}.key")
            security = {k: v for k, v in doc.get("security", {}).items() if k != "insecure"}
            doc["security"] = {**security, "ca": f"{CERT_DIR}/ca.pem"}
        Job(doc, out, source=str(target))  # what secureflhv run will load must be valid
        out.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return target


def _cert_names(address: str) -> list[str]:
    """A party certificate's extra names: loopback, and the host of its address (unless a wildcard)."""
    names = ["localhost", "127.0.0.1"]
    host = address.rpartition(":")[0].strip("[]")
    if host and host not in ("0.0.0.0", "::") and host not in names:
        names.append(host)
    return names


def _relative(value: str, base: Path, out: Path) -> str:
    """Path ``value``, relative to ``base``, as relative to ``out`` (POSIX separators); an absolute one stays."""
    path = Path(value)
    if path.is_absolute():
        return value
    absolute = (base / path).resolve()
    try:
        return Path(os.path.relpath(absolute, out)).as_posix()
    except ValueError:  # another drive (Windows): no relative path exists
        return absolute.as_posix()


# the fields of a factory reference that are paths relative to the job file: its import folder ``path`` (a data
# factory's: ``code_path``) and a user model's agreed initial ``weights`` (params.model); a data factory's
# ``root`` / ``path`` keywords
_FACTORY_PATHS = ("path", "weights", "code_path")
_DATA_FACTORY_KWARGS = ("root", "path")


def _rebase_factories(obj, base: Path, out: Path):
    """``obj`` with the relative paths of every factory reference (``{factory, kwargs, path, ...}``) rebased."""
    if isinstance(obj, dict):
        obj = {k: _rebase_factories(v, base, out) for k, v in obj.items()}
        if "factory" in obj:
            for field in _FACTORY_PATHS:
                if isinstance(obj.get(field), str):
                    obj[field] = _relative(obj[field], base, out)
        return obj
    if isinstance(obj, list):
        return [_rebase_factories(v, base, out) for v in obj]
    return obj


def _rebased(doc: dict, base: Path, out: Path) -> dict:
    """The job document with its input paths relative to ``out`` instead of ``base``."""
    doc = _rebase_factories(doc, base, out)
    security = doc.get("security") or {}
    if isinstance(security.get("ca"), str):
        security["ca"] = _relative(security["ca"], base, out)
    for party in doc.get("parties", []):
        for field in ("cert", "key"):
            if isinstance(party.get(field), str):
                party[field] = _relative(party[field], base, out)
        data = party.get("data")
        if isinstance(data, dict) and "factory" not in data and isinstance(data.get("path"), str):
            data["path"] = _relative(data["path"], base, out)
        elif isinstance(data, dict) and isinstance(data.get("kwargs"), dict):  # a dataset factory (DataSpec)
            kwargs = data["kwargs"]
            for field in _DATA_FACTORY_KWARGS:
                if isinstance(kwargs.get(field), str):
                    kwargs[field] = _relative(kwargs[field], base, out)
    return doc
