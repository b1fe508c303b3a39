"""Every ``.recv(`` call site in secureflhv/ (file, enclosing function, tag expression), by AST (not a test module)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "secureflhv"


def _tag_arg(call: ast.Call):
    for kw in call.keywords:
        if kw.arg == "tag":
            return kw.value
    return call.args[1] if len(call.args) > 1 else None


def recv_call_sites() -> set[tuple[str, str, str]]:
    """(path relative to secureflhv/, enclosing def name, source of the tag argument) of each ``x.recv(...)``."""
    out = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "proto" in path.relative_to(PACKAGE).parts[:1]:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "recv"
                        and fn.name != "recv"):
                    tag = _tag_arg(node)
                    out.add((str(path.relative_to(PACKAGE)), fn.name, "?" if tag is None else ast.unparse(tag)))
    return out


def tag_constants() -> dict[str, str]:
    """Module-level ``TAG_* = "..."`` constants of secureflhv/ (tuple assignments too): value -> module."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for n, v in zip(names, values):
                    if isinstance(n, ast.Name) and n.id.startswith("TAG_") and isinstance(v, ast.Constant):
                        out[v.value] = str(path.relative_to(PACKAGE))
    return out
