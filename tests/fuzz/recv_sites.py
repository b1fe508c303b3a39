"""Every ``.recv(`` (and ``.recv_while_reachable(``) and ``gather(`` call site in secureflhv/ (file, enclosing function, tag expression), by AST
(not a test module)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "secureflhv"
RECEIVERS = ("recv", "recv_while_reachable")  # Transport's receiving methods


def _tag_arg(call: ast.Call, position: int):
    for kw in call.keywords:
        if kw.arg == "tag":
            return kw.value
    return call.args[position] if len(call.args) > position else None


def _receiving(call: ast.Call) -> int | None:
    """The tag's position in a receiving call: ``x.recv(sender, tag, ...)`` (or ``x.recv_while_reachable``) or
    the collective ``gather(transport, peers, tag, ...)`` (transport/collectives.py); None for any other call."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if name in RECEIVERS and isinstance(call.func, ast.Attribute):
        return 1
    return 2 if name == "gather" else None


def recv_call_sites() -> set[tuple[str, str, str]]:
    """(path relative to secureflhv/, enclosing def name, source of the tag argument) of each ``x.recv(...)``
    and each ``gather(...)`` (the generic receivers themselves, :data:`RECEIVERS` and ``gather``, excluded)."""
    out = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "proto" in path.relative_to(PACKAGE).parts[:1]:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name in (*RECEIVERS, "gather"):
                continue
            for node in ast.walk(fn):
                position = _receiving(node) if isinstance(node, ast.Call) else None
                if position is not None:
                    tag = _tag_arg(node, position)
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
