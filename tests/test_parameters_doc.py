"""``docs/parameters.md`` lists every job-file setting with the code's default, and nothing else.

The code side is walked from the pydantic models: :class:`~secureflhv.runtime.job.job_file.JobConfig` (the
``job``, ``security`` and ``parties[i]`` sections, nested models such as ``parties[i].data`` by dotted
path) and, for every algorithm of :data:`secureflhv.runtime.job.registry.JOBS`, its ``params`` model (nested
models such as ``params.aggregation`` by dotted path). The doc side is every table of the page whose header
is ``| name | type | default | meaning |``. Its scope is read from the code spans of the nearest heading
above it:

* ``algorithm: a, b``: the rows are ``params`` fields of those algorithms;
* a dotted path (``job``, ``parties[i].data``, ``params.aggregation``): the prefix of every row's name
  (default ``params`` when an algorithm is named); a path without an algorithm is a job-file section,
  and ``job file`` is the job file's top level (rows without a prefix).

A row's default is ``required``, ``{}`` (a nested model with all its defaults, as ``aggregation: {}`` in
YAML) or a Python / YAML literal (``0.3``, ``True``, ``None``, ``[16, 8]``, ``secagg``). The tests fail
naming each documented field that the code lacks, each default that differs, and each code field without a
row (with a row to paste). ``python tests/test_parameters_doc.py`` prints the same report.
"""
from __future__ import annotations

import ast
import enum
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from secureflhv.runtime.job.job_file import JobConfig
from secureflhv.runtime.job.registry import JOBS

DOC = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"
HEADER = ("name", "type", "default", "meaning")
JOB_FILE = "job file"  # the scope of the job-file sections (as opposed to an algorithm's params)
SCOPES = (JOB_FILE, *JOBS)


class _Required:
    """The default of a field that has none (written ``required`` in the doc)."""

    def __repr__(self) -> str:
        return "required"


REQUIRED = _Required()
_PATH = re.compile(r"^[a-z_][a-z0-9_]*(\[i\])?(\.[a-z_][a-z0-9_]*(\[i\])?)*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


# ----------------------------------------------------------------------------------------- the code side
@dataclass(frozen=True)
class CodeField:
    path: str          # dotted, list items as [i]: parties[i].data.path, params.aggregation.kind
    default: object    # normalised (see _normalise), or REQUIRED
    annotation: str
    description: str


def _nested_models(annotation) -> list[tuple[type[BaseModel], str]]:
    """The pydantic models inside a field's type, each with the path suffix of its items ('' or '[i]')."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a tagged member of a discriminated union (params.model)
        return _nested_models(args[0])
    if origin in (list, tuple, set, frozenset):
        return [(m, "[i]" + suffix) for a in args for m, suffix in _nested_models(a)]
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _nested_models(a)]
    return []  # dicts of scalars (part_clips), Literals, scalars


def _normalise(value):
    """A default as the doc can write it: tuples as lists, paths and enums as text, a nested model left at
    all its defaults as {} (else its fields)."""
    if isinstance(value, BaseModel):
        try:
            if value == type(value)():
                return {}
        except ValidationError:  # a model with required fields has no all-defaults form
            pass
        return _normalise(value.model_dump(by_alias=True))
    if isinstance(value, enum.Enum):
        return _normalise(value.value)
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def code_fields(model: type[BaseModel], prefix: str = "") -> list[CodeField]:
    """Every field of ``model`` and of the models nested in it, depth first, by dotted path."""
    out = []
    for name, info in model.model_fields.items():
        if info.exclude:  # not a job-file field (JobConfig.base_dir)
            continue
        path = f"{prefix}{info.alias or name}"
        if info.is_required():
            default = REQUIRED
        else:
            default = _normalise(info.get_default(call_default_factory=True, validated_data={}))
        annotation = info.annotation.__name__ if isinstance(info.annotation, type) else \
            str(info.annotation).replace("typing.", "")
        out.append(CodeField(path, default, annotation, info.description or ""))
        for sub, suffix in _nested_models(info.annotation):
            out.extend(code_fields(sub, f"{path}{suffix}."))
    return out


def code_scope(scope: str) -> dict[str, CodeField]:
    """The fields the doc must list for ``scope``: the job file's sections, or one algorithm's params.

    The job file's top-level sections (``job``, ``security``, ``parties``: a table each; ``params``: the
    algorithms' tables) are not rows; a top-level setting that is not a section would go in a table
    whose heading names `job file`.
    """
    if scope == JOB_FILE:
        sections = {name for name, info in JobConfig.model_fields.items()
                    if _nested_models(info.annotation) or name == "params"}
        return {f.path: f for f in code_fields(JobConfig)
                if f.path not in sections and f.path.split(".")[0].removesuffix("[i]") != "params"}
    return {f.path: f for f in code_fields(JOBS[scope].params, "params.")}


# ------------------------------------------------------------------------------------------ the doc side
@dataclass
class DocRow:
    path: str
    default: str
    line: int


@dataclass
class DocTable:
    heading: str
    line: int
    scopes: tuple[str, ...]
    prefix: str
    rows: list[DocRow] = field(default_factory=list)


class DocFormatError(AssertionError):
    """The page breaks the table conventions of this module's docstring."""


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT.split(line.strip().strip("|"))]


def _scope_of(heading: str, line: int) -> tuple[tuple[str, ...], str]:
    algorithms, paths = [], []
    for span in re.findall(r"`([^`]+)`", heading):
        if span == JOB_FILE:  # the job file's top level (rows without a prefix)
            paths.append("")
        elif span.startswith("algorithm:"):
            algorithms += [a.strip() for a in span.removeprefix("algorithm:").split(",") if a.strip()]
        elif _PATH.match(span):
            paths.append(span)
    if len(paths) > 1:
        raise DocFormatError(f"line {line}: heading {heading!r} names several paths {paths}; name one")
    unknown = [a for a in algorithms if a not in JOBS]
    if unknown:
        raise DocFormatError(f"line {line}: heading {heading!r} names unknown algorithm(s) {unknown}; "
                             f"the registry has {sorted(JOBS)}")
    if algorithms:
        prefix = paths[0] if paths else "params"
        if prefix != "params" and not prefix.startswith("params."):
            raise DocFormatError(f"line {line}: heading {heading!r}: an algorithm's table lists params.* fields, "
                                 f"not {prefix!r}")
        return tuple(algorithms), prefix
    if paths == [""]:
        return (JOB_FILE,), ""
    if not paths:
        raise DocFormatError(f"line {line}: the table under heading {heading!r} has no scope: put "
                             f"`algorithm: NAME` or a dotted path such as `parties[i].data` in the heading")
    if paths[0].split(".")[0].removesuffix("[i]") == "params":
        raise DocFormatError(f"line {line}: heading {heading!r}: params.* tables must name their algorithm(s)")
    return (JOB_FILE,), paths[0]


def parse_doc(text: str) -> list[DocTable]:
    """Every parameter table of the page, with its scope and rows (DocFormatError on a malformed one)."""
    lines = text.splitlines()
    tables, heading, heading_line, i = [], None, 0, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading, heading_line = line.lstrip("#").strip(), i + 1
        elif line.lstrip().startswith("|") and tuple(c.lower() for c in _cells(line)) == HEADER:
            if heading is None:
                raise DocFormatError(f"line {i + 1}: a parameter table before any heading")
            scopes, prefix = _scope_of(heading, heading_line)
            table = DocTable(heading, i + 1, scopes, prefix)
            if i + 1 >= len(lines) or not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*", lines[i + 1].strip()):
                raise DocFormatError(f"line {i + 2}: the table's second line must be |---|---|---|---|")
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = _cells(lines[i])
                if len(cells) != 4:
                    raise DocFormatError(f"line {i + 1}: {len(cells)} cells, expected 4 (name | type | default | "
                                         f"meaning; escape a | inside a cell as \\|)")
                name, typ, default, meaning = cells
                name = name.strip("`")
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise DocFormatError(f"line {i + 1}: name {cells[0]!r} is not one field name in backticks "
                                         f"(nested fields go in their own table)")
                if not (typ and default and meaning):
                    raise DocFormatError(f"line {i + 1}: {prefix}.{name}: type, default and meaning must all be "
                                         f"filled in")
                table.rows.append(DocRow(f"{prefix}.{name}" if prefix else name, default, i + 1))
                i += 1
            tables.append(table)
            continue
        i += 1
    return tables


def doc_value(text: str):
    """A documented default as a value: ``required``, else a Python literal, else YAML, else the text."""
    text = text.strip()
    if text.startswith("`") and text.endswith("`"):
        text = text[1:-1].strip()
    if text == "required":
        return REQUIRED
    try:
        return _normalise(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return _normalise(yaml.safe_load(text))
    except yaml.YAMLError:
        return text


def same(a, b) -> bool:
    """Equal as defaults: bools only equal bools (True is not 1), 1 equals 1.0, lists and dicts item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def doc_scope(tables: list[DocTable], scope: str) -> tuple[dict[str, DocRow], list[str]]:
    """The documented rows of ``scope`` by path, and the paths documented twice."""
    rows, twice = {}, []
    for table in tables:
        if scope in table.scopes:
            for row in table.rows:
                if row.path in rows:
                    twice.append(f"{row.path} (lines {rows[row.path].line} and {row.line})")
                rows[row.path] = row
    return rows, twice


# --------------------------------------------------------------------------------------------- the checks
def wrong_rows(code: dict[str, CodeField], doc: dict[str, DocRow]) -> list[str]:
    """Each documented field that the code lacks, or whose default differs from the code's."""
    problems = []
    for path, row in doc.items():
        if path not in code:
            problems.append(f"line {row.line}: {path} is documented but the code has no such field")
        elif not same(doc_value(row.default), code[path].default):
            problems.append(f"line {row.line}: {path}: the doc's default is {row.default}, the code's is "
                            f"{code[path].default!r}")
    return problems


def _paste_row(f: CodeField) -> str:
    default = "required" if f.default is REQUIRED else f"`{f.default}`" if isinstance(f.default, str) \
        else f"`{f.default!r}`"
    return (f"| `{f.path.rsplit('.', 1)[-1]}` | `{f.annotation}` | {default} | "
            f"{f.description or 'MEANING'} |").replace("||", "\\|\\|")


def missing_rows(code: dict[str, CodeField], doc: dict[str, DocRow]) -> list[str]:
    """Each code field without a row, with a row to paste into the table of its prefix."""
    return [f"{f.path} (table `{f.path.rsplit('.', 1)[0] if '.' in f.path else JOB_FILE}`): {_paste_row(f)}"
            for p, f in code.items() if p not in doc]


@pytest.fixture(scope="module")
def tables() -> list[DocTable]:
    return parse_doc(DOC.read_text(encoding="utf-8"))


def test_every_parameter_table_has_a_scope(tables):
    """The page parses (parse_doc raises on a table without a scope or a malformed row), every algorithm and
    every job-file section has a table, and no field is listed twice for the same algorithm."""
    covered = {s for t in tables for s in t.scopes}
    assert covered >= set(SCOPES), f"no parameter table for {sorted(set(SCOPES) - covered)}"
    twice = {scope: doc_scope(tables, scope)[1] for scope in SCOPES}
    assert not any(twice.values()), f"documented twice: { {s: d for s, d in twice.items() if d} }"


@pytest.mark.parametrize("scope", SCOPES)
def test_documented_fields_exist_with_the_code_default(tables, scope):
    problems = wrong_rows(code_scope(scope), doc_scope(tables, scope)[0])
    assert not problems, f"docs/parameters.md, {scope}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("scope", SCOPES)
def test_every_code_field_is_documented(tables, scope):
    missing = missing_rows(code_scope(scope), doc_scope(tables, scope)[0])
    assert not missing, (f"docs/parameters.md lacks a row for these fields of {scope} (add each to the table "
                         f"whose heading names its prefix):\n  " + "\n  ".join(missing))


# ------------------------------------------------------------------------- the checker catches each drift
class _Inner(BaseModel):
    clip: float = 1.0


class _Params(BaseModel):
    flag: bool = True
    count: int = 1
    ratio: float = 1e-5
    widths: tuple[int, ...] = (32, 16)
    kind: typing.Literal["a", "b"] = "a"
    out: Path = Path("out")
    maybe: int | None = None
    model: int
    inner: _Inner = _Inner()


_GOOD = """\
## Example (`algorithm: horizontal`)

| name | type | default | meaning |
|---|---|---|---|
| `flag` | `bool` | `True` | a flag |
| `count` | `int` | `1` | a count |
| `ratio` | `float` | `1e-05` | a ratio |
| `widths` | `tuple[int, ...]` | `[32, 16]` | widths |
| `kind` | `Literal['a', 'b']` | `a` | a or b \\| nothing else |
| `out` | `Path` | `out` | a folder |
| `maybe` | `int \\| None` | `null` | optional |
| `model` | `int` | required | required |
| `inner` | `_Inner` | `{}` | nested |

### Example inner (`algorithm: horizontal`, `params.inner`)

| name | type | default | meaning |
|---|---|---|---|
| `clip` | `float` | `1.0` | clip |
"""


def _check(doc_text: str) -> tuple[list[str], list[str]]:
    code = {f.path: f for f in code_fields(_Params, "params.")}
    doc = doc_scope(parse_doc(doc_text), "horizontal")[0]
    return wrong_rows(code, doc), missing_rows(code, doc)


def test_checker_accepts_a_matching_doc():
    assert _check(_GOOD) == ([], [])


@pytest.mark.parametrize("old, new, expect", [
    ("| `True` | a flag", "| `False` | a flag", "params.flag: the doc's default is `False`, the code's is True"),
    ("| `1` | a count", "| `True` | a count", "params.count: the doc's default is `True`, the code's is 1"),
    ("| `1e-05` |", "| `1e-04` |", "params.ratio: the doc's default is `1e-04`"),
    ("| `[32, 16]` |", "| `[32, 8]` |", "params.widths"),
    ("| `a` | a or b", "| `b` | a or b", "params.kind"),
    ("| `null` |", "| `0` |", "params.maybe"),
    ("| required |", "| `0` |", "params.model: the doc's default is `0`, the code's is required"),
    ("| `1.0` | clip", "| `2.0` | clip", "params.inner.clip"),
    ("| `count` |", "| `counts` |", "params.counts is documented but the code has no such field"),
])
def test_checker_names_a_wrong_row(old, new, expect):
    assert old in _GOOD
    wrong, _ = _check(_GOOD.replace(old, new))
    assert len(wrong) == 1 and expect in wrong[0], wrong


def test_checker_names_a_missing_row():
    doc = "\n".join(line for line in _GOOD.splitlines() if "| `clip` |" not in line)
    wrong, missing = _check(doc)
    assert wrong == [] and len(missing) == 1 and missing[0].startswith("params.inner.clip (table `params.inner`)")


def test_job_file_scopes():
    doc = "## Top (`job file`)\n\n| name | type | default | meaning |\n|---|---|---|---|\n| `version` | `int` | `1` | v |\n" \
          "## Data (`parties[i].data`)\n\n| name | type | default | meaning |\n|---|---|---|---|\n| `path` | `Path` | required | p |\n"
    rows = doc_scope(parse_doc(doc), JOB_FILE)[0]
    assert sorted(rows) == ["parties[i].data.path", "version"]
    assert "parties[i].data.path" in code_scope(JOB_FILE) and "job" not in code_scope(JOB_FILE)


def test_checker_refuses_a_table_without_scope():
    with pytest.raises(DocFormatError, match="has no scope"):
        parse_doc(_GOOD.replace(" (`algorithm: horizontal`)\n", "\n", 1))


if __name__ == "__main__":  # a report of every difference, for whoever updates the page
    parsed = parse_doc(DOC.read_text(encoding="utf-8"))
    for s in SCOPES:
        for problem in wrong_rows(code_scope(s), doc_scope(parsed, s)[0]) + \
                missing_rows(code_scope(s), doc_scope(parsed, s)[0]):
            print(f"[{s}] {problem}")
