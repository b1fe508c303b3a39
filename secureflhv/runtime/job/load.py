"""Load a job file and validate all of it: its structure, its algorithm, its roles and its params.

This is what every entry point calls (``secureflhv validate / party / run``, the examples): a job that
loads here fails later only for reasons outside the file (data contents, peers, network).
The schema itself is :mod:`secureflhv.runtime.job.job_file`; the algorithms are
:mod:`secureflhv.runtime.job.registry`'s.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from .job_file import JobConfig, JobConfigError, PartySpec, parse_job_file, read_job_file
from .registry import job_params

__all__ = ["JobConfig", "JobConfigError", "PartySpec", "load_job", "load_job_params", "parse_job"]


def _checked(cfg: JobConfig, source: str) -> tuple[JobConfig, BaseModel]:
    try:
        return cfg, job_params(cfg)
    except JobConfigError as exc:
        raise JobConfigError(f"invalid job file {source}:\n  {exc}") from None


def parse_job(data: dict, base_dir: Path | str = ".", source: str = "<job>") -> JobConfig:
    """Validate a job given as a dict. Raises :class:`JobConfigError` naming the file and each bad field."""
    return _checked(parse_job_file(data, base_dir, source), source)[0]


def load_job(path: Path | str) -> JobConfig:
    """Read and validate a job file (YAML or JSON).

    Raises:
        JobConfigError: missing/unreadable file, bad YAML, a bad field (named as a dotted path), an
            unknown algorithm, roles that do not fit its family, or bad ``params``.
    """
    return load_job_params(path)[0]


def load_job_params(path: Path | str) -> tuple[JobConfig, BaseModel]:
    """:func:`load_job`, also returning the validated ``params`` (the algorithm's params model)."""
    return _checked(read_job_file(path), str(path))
