"""Preflight: everything local to one party, checked before it sends a single protocol message.

``secureflhv validate JOB --party ID`` prints these checks; ``secureflhv party`` and ``secureflhv run``
run them first and stop (exit code 2) on any finding, so a wrong path, a bad certificate or a bad data
cell is found in seconds, on the machine that has it, instead of after every partner has started (and,
for data, after PSI has already revealed the id overlap).

Checks, each reported as a :class:`Finding` naming the party, the job-file field and, where it applies,
the file, the column and the first bad row:

* TLS (unless insecure): ``security.ca``, ``parties[i].cert`` and ``.key`` exist and are readable; the
  certificate chains to the CA, is in date, names this party (CN) and matches the key
  (:func:`secureflhv.transport.certs.load_party_credentials`).
* Data (data parties): the file exists and parses; the id, label and feature columns exist; every
  column has its declared type (:func:`column_problems`: no empty cell, numeric features, unique ids).
  A table above ``data.max_memory_mb`` is checked one row batch at a time, as the job reads it
  (:func:`check_columns_batched`: the same findings; memory: one batch plus the ids).
* User code (horizontal FL, ``params.party_checks``): the model factory builds, its layout is the declared
  ``params.model.layout_hash``, the loops import, the client's dataset factory builds and one batch goes through
  the model (:mod:`secureflhv.runtime.algorithms.user_code`).
* Network: the listen address can be bound now (not in use, an address of this machine).
* Output: ``job.output_dir`` can be created and written.

What it reveals: nothing leaves the party; findings are printed locally only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from .job_file import JobConfig, JobConfigError, PartySpec
from ..process.os_errors import plain_error, port_problem, port_sentence

__all__ = ["ColumnType", "Finding", "PreflightFailed", "check_columns", "check_columns_batched", "column_problems",
           "preflight", "require_preflight", "ID", "LABEL", "NUMERIC"]


@dataclass(frozen=True)
class Finding:
    """One problem found by preflight.

    Attributes:
        party: the party id.
        where: the job-file field with the party, e.g. ``parties[2].data.label_column (party 'host-1')``.
        message: what is wrong, in one sentence (names the file, column and row when known).
        file: the file concerned, if any.
        column: the data column concerned, if any.
        row: the first bad data row, 1-based (the CSV line is ``row + 1`` after the header), if any.
    """

    party: str
    where: str
    message: str
    file: Path | None = None
    column: str | None = None
    row: int | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class PreflightFailed(JobConfigError):
    """Preflight found problems; ``findings`` lists them (the message has one line each)."""

    def __init__(self, party_id: str, findings: list[Finding]):
        self.findings = findings
        lines = "\n".join(f"  - {f}" for f in findings)
        super().__init__(f"preflight of party {party_id!r} found {len(findings)} problem(s); nothing was sent "
                         f"to any other party:\n{lines}")


# ------------------------------------------------------------------------------------ column types
@dataclass(frozen=True)
class ColumnType:
    """What a column must hold. A data schema (a later job-file section) extends checks by making new
    instances, e.g. ``replace(NUMERIC, allow_missing=True)`` for a feature that may have gaps.

    Attributes:
        name: for messages ("numeric feature", "id", "label").
        numeric: every non-empty cell parses as a finite number.
        allow_missing: empty cells are allowed.
        unique: no value repeats (ids).
    """

    name: str
    numeric: bool = False
    allow_missing: bool = False
    unique: bool = False


ID = ColumnType("id", unique=True)
LABEL = ColumnType("label")
NUMERIC = ColumnType("numeric feature", numeric=True)
CATEGORICAL = ColumnType("categorical feature", allow_missing=True)


def _problem_masks(values, kind: ColumnType):
    """``(problem, mask of the cells that have it)`` for one column, in the order they are reported."""
    import pandas as pd

    missing = values.isna().to_numpy()
    yield "missing", missing if not kind.allow_missing else np.zeros_like(missing)
    if kind.numeric:
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
        yield "text", np.isnan(numbers) & ~missing
        yield "infinite", np.isinf(numbers)
    if kind.unique:
        yield "duplicate", values.duplicated().to_numpy() & ~missing


def _problem_sentence(problem: str, kind: ColumnType, count: int, value) -> str:
    if problem == "missing":
        return f"empty cell (missing value) in {kind.name} column; {count} such cell(s)"
    if problem == "text":
        return (f"non-numeric value {str(value)[:40]!r} in a {kind.name} column; {count} such cell(s) (encode it "
                f"as numbers, or name it as the id or label column)")
    if problem == "infinite":
        return f"infinite value in a {kind.name} column"
    return f"duplicate {kind.name} {str(value)[:40]!r}"


def column_problems(values, kind: ColumnType) -> list[tuple[int, str]]:
    """The problems of one column for its declared ``kind``: ``(first bad row, 0-based; what)`` each.

    Args:
        values: a pandas Series (CSV cells read as text, or typed Parquet values).
        kind: the declared :class:`ColumnType`.
    """
    out: list[tuple[int, str]] = []
    for problem, mask in _problem_masks(values, kind):
        if mask.any():
            row = int(np.argmax(mask))
            out.append((row, _problem_sentence(problem, kind, int(mask.sum()), values.iloc[row])))
    return out


def check_columns(frame, declared: Mapping[str, ColumnType]) -> list[tuple[str, int, str]]:
    """``(column, first bad row 0-based, what)`` for every column of ``frame`` named in ``declared``."""
    return [(col, row, what) for col, kind in declared.items() for row, what in column_problems(frame[col], kind)]


def check_columns_batched(frames, declared: Mapping[str, ColumnType]) -> list[tuple[str, int, str]]:
    """:func:`check_columns` of the table whose row batches (pandas frames, in file order) ``frames``
    yields: the same findings (first bad row of the table, counts over the table), one batch at a time.

    Memory: one batch plus the values of the ``unique`` columns (ids), checked for repeats at the end.
    """
    import pandas as pd

    first: dict[tuple[str, str], list] = {}  # (column, problem) -> [row, count, value]
    kept = {col: [] for col, kind in declared.items() if kind.unique}
    at = 0
    for frame in frames:
        for col, kind in declared.items():
            for problem, mask in _problem_masks(frame[col], replace(kind, unique=False)):
                if mask.any():
                    row = int(np.argmax(mask))
                    seen = first.setdefault((col, problem), [at + row, 0, frame[col].iloc[row]])
                    seen[1] += int(mask.sum())
            if col in kept:
                kept[col].append(frame[col].to_numpy(dtype=object))
        at += len(frame)
    for col, parts in kept.items():
        values = pd.Series(np.concatenate(parts) if parts else np.empty(0, dtype=object))
        mask = values.duplicated().to_numpy() & ~values.isna().to_numpy()
        if mask.any():
            row = int(np.argmax(mask))
            first[col, "duplicate"] = [row, int(mask.sum()), values.iloc[row]]
    order = ("missing", "text", "infinite", "duplicate")
    return [(col, first[col, p][0], _problem_sentence(p, kind, first[col, p][1], first[col, p][2]))
            for col, kind in declared.items() for p in order if (col, p) in first]


# ------------------------------------------------------------------------------------ the checks
class _Report:
    """Collects findings of one party, phrasing ``where`` as :meth:`JobConfig.where` does."""

    def __init__(self, cfg: JobConfig, party: PartySpec):
        self.cfg, self.party, self.findings = cfg, party, []

    def add(self, fld: str, message: str, **extra) -> None:
        where = (self.cfg.where(self.party, fld) if not fld.startswith(("security.", "job.", "params."))
                 else f"{fld} (party {self.party.id!r})")
        self.findings.append(Finding(self.party.id, where, message, **extra))


def preflight(cfg: JobConfig, party_id: str, params=None, *, insecure: bool = False,
              check_port: bool = True) -> list[Finding]:
    """Run every local check of party ``party_id``; return the findings (empty: ready to start).

    Args:
        cfg: the validated job.
        params: the job's validated params (for a job-level default label column); optional.
        insecure: the party runs without TLS (no certificate checks).
        check_port: also check that the listen address is free now.
    Raises:
        JobConfigError: ``party_id`` is not in the job.
    """
    party = cfg.party(party_id)
    report = _Report(cfg, party)
    if not insecure:
        _check_tls(report)
    if party.data is not None and party.data.factory is None:
        _check_data(report, params)
    hook = getattr(params, "party_checks", None)  # the algorithm's own (horizontal FL: the user's code)
    if hook is not None:
        for fld, message in hook(cfg, party):
            report.add(fld, message)
    if check_port:
        listen = party.listen or party.address
        exc = port_problem(listen)
        if exc is not None:
            report.add("listen" if party.listen else "address", port_sentence(listen, exc))
    _check_output(report)
    return report.findings


def require_preflight(cfg: JobConfig, party_id: str, params=None, *, insecure: bool = False,
                      check_port: bool = True) -> None:
    """:func:`preflight`, raising :class:`PreflightFailed` (a JobConfigError: exit code 2) on any finding."""
    findings = preflight(cfg, party_id, params, insecure=insecure, check_port=check_port)
    if findings:
        raise PreflightFailed(party_id, findings)


def _check_tls(report: _Report) -> None:
    from ...transport.certs import CertificateError, load_party_credentials

    cfg, party = report.cfg, report.party
    files = {"security.ca": cfg.resolve(cfg.security.ca), "cert": cfg.resolve(party.cert),
             "key": cfg.resolve(party.key)}
    readable = True
    for fld, path in files.items():
        if path is None:
            report.add(fld, "required with TLS (or set security.insecure: true and pass --insecure)")
        elif not path.is_file():
            report.add(fld, f"file not found: {path}", file=path)
        elif not os.access(path, os.R_OK):
            report.add(fld, f"permission denied on {path}: check the file's owner and mode (ls -l)", file=path)
        else:
            continue
        readable = False
    if not readable:
        return
    try:
        load_party_credentials(ca_cert=files["security.ca"], cert=files["cert"], key=files["key"],
                               party_id=party.id)
    except (CertificateError, OSError) as exc:
        text = plain_error(exc)
        fld = ("key" if text.startswith("private key") else
               "security.ca" if text.startswith("CA certificate") else "cert")
        report.add(fld, text, file=files[fld])


def _data_columns(report: _Report, params, columns: list[str]) -> dict[str, tuple[str, ColumnType]]:
    """Declared column -> (job-file field, type), after checking each named column exists."""
    from .registry import job_spec

    cfg, spec = report.cfg, report.party.data
    vertical = job_spec(cfg.job.algorithm).family == "vertical"
    label, label_field = spec.label_column, "data.label_column"
    if label is None and not vertical:
        label, label_field = getattr(params, "label_column", None), "params.label_column"
    named = {}
    if vertical or spec.id_column in columns:
        named[spec.id_column] = ("data.id_column", ID)
    if label is not None:
        named[label] = (label_field, LABEL)
    features = spec.feature_columns
    if features is None:
        features = [c for c in columns if c not in named]
    # jobs that preprocess (vertical LR, split NN, scoring with their bundles) impute missing cells, trees
    # learn default directions for them: their params say so (``accepts_missing_values``)
    numeric = replace(NUMERIC, allow_missing=True) if _accepts_missing(params) else NUMERIC
    declared = (spec.table_schema or {})
    for col in features:
        kind = declared.get(col, {})
        categorical = kind == "categorical" or isinstance(kind, dict) and kind.get("kind") == "categorical"
        named.setdefault(col, ("data.schema" if categorical else "data.feature_columns",
                               CATEGORICAL if categorical else numeric))
    out = {}
    for col, (fld, kind) in named.items():
        if col in columns:
            out[col] = (fld, kind)
        else:
            shown = ", ".join(columns[:20]) + (" ..." if len(columns) > 20 else "")
            report.add(fld, f"no column {col!r} in {cfg.resolve(spec.path)}; its columns are: {shown}",
                       file=cfg.resolve(spec.path), column=col)
    return out


def _accepts_missing(params) -> bool:
    """Whether the job takes empty numeric cells (NaN): its params say so (a class constant, or a property
    where it depends on the params, e.g. horizontal FL with federated preprocessing)."""
    return bool(getattr(params, "accepts_missing_values", False))


def _read_frame(path: Path):
    import pandas as pd

    if path.suffix.lower() in (".parquet", ".pq"):
        return pd.read_parquet(path)
    return pd.read_csv(path, dtype=str, keep_default_na=True)


def _check_data(report: _Report, params) -> None:
    cfg, spec = report.cfg, report.party.data
    path = cfg.resolve(spec.path)
    if not path.is_file():
        report.add("data.path", f"data file not found: {path}", file=path)
        return
    if not os.access(path, os.R_OK):
        report.add("data.path", f"permission denied on {path}: check the file's owner and mode (ls -l)", file=path)
        return
    if path.suffix.lower() not in (".csv", ".parquet", ".pq"):
        _check_array_file(report, params, path)
        return
    from .data_prep import _columns, streamed_batch_rows

    try:
        batch_rows = streamed_batch_rows(cfg, report.party)
        if batch_rows:  # bigger than data.max_memory_mb: one row batch at a time, as the job reads it
            from ...data.stream import iter_text_batches

            columns = [str(c) for c in _columns(path)]
            declared = _data_columns(report, params, columns)
            problems = check_columns_batched(iter_text_batches(path, batch_rows),
                                             {c: kind for c, (_, kind) in declared.items()})
        else:
            frame = _read_frame(path)
            frame.columns = [str(c) for c in frame.columns]
            declared = _data_columns(report, params, list(frame.columns))
            problems = check_columns(frame, {c: kind for c, (_, kind) in declared.items()})
    except JobConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - pandas / pyarrow raise many types for a malformed file
        report.add("data.path", f"cannot read {path}: {plain_error(exc)}", file=path)
        return
    line = 1 if path.suffix.lower() == ".csv" else 0  # header line before the first data row
    for col, row, what in problems:
        at = f"row {row + 1}" + (f" (line {row + 1 + line})" if line else "")
        report.add(declared[col][0] if declared[col][0] != "data.feature_columns" else "data",
                   f"{path}, column {col!r}, {at}: {what}", file=path, column=col, row=row + 1)
    if spec.table_schema is not None:
        _check_schema(report, path, batch_rows)


def _check_schema(report: _Report, path: Path, batch_rows: int | None = None) -> None:
    """Load the table as the job will, through ``data.schema``; report where it breaks the schema.
    With ``batch_rows`` (a streamed table) in row batches, keeping no feature row."""
    from ...data import SchemaError, load_table
    from ...data.stream import load_table_batched

    spec = report.party.data
    kw = dict(id_column=spec.id_column, label_column=spec.label_column, feature_columns=spec.feature_columns,
              schema=spec.table_schema)
    try:
        if batch_rows:
            load_table_batched(path, batch_rows, rows=np.empty(0, dtype=np.int64), **kw)
        else:
            load_table(path, **kw)
    except SchemaError as exc:
        report.add("data.schema", plain_error(exc), file=path)
    except (OSError, ValueError):
        pass  # other problems are reported by the column checks above


def _check_array_file(report: _Report, params, path: Path) -> None:
    """NumPy / IDX files: load as the job will, then look for non-finite features."""
    from ...data import load_table

    spec = report.party.data
    label = spec.label_column or getattr(params, "label_column", None)
    try:
        table = load_table(path, label_column=label, feature_columns=spec.feature_columns)
    except (OSError, ValueError) as exc:
        report.add("data", plain_error(exc), file=path)
        return
    X = np.asarray(table.X, dtype=np.float64)
    bad = np.isinf(X) if _accepts_missing(params) else ~np.isfinite(X)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        name = table.feature_names[col]
        report.add("data", f"{path}, column {name!r}, row {row + 1}: missing or infinite value; "
                           f"{int(bad.sum())} such cell(s)", file=path, column=name, row=row + 1)


def _check_output(report: _Report) -> None:
    out = report.cfg.output_dir(report.party.id)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        report.add("job.output_dir", f"permission denied: cannot create {out} ({existing} is not a writable "
                                     f"folder)", file=out)
