"""Size and documentation figures of the package, for before/after notes on a restructure.

    python tools/code_metrics.py [--top N]

Prints: modules and lines; the N longest functions (lines from ``def`` to the last line of the body);
the count over 60 lines; the share of public definitions (module-level and class-level functions and
classes whose names do not start with ``_``, and public modules) that have a docstring; file names that
occur more than once under ``secureflhv/``.
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "secureflhv"
LONG = 60


def _public_defs(tree: ast.Module):
    """Public functions and classes at module level and inside public classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                            and not sub.name.startswith("_"):
                        yield sub


def measure(root: Path = PACKAGE) -> dict:
    """Figures of every ``.py`` under ``root`` except generated protobuf modules."""
    files = [p for p in sorted(root.rglob("*.py")) if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]
    lengths, public, documented, lines = [], 0, 0, 0
    for path in files:
        text = path.read_text()
        lines += text.count("\n")
        tree = ast.parse(text)
        rel = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
        defs = list(_public_defs(tree))
        public += len(defs) + (not path.name.startswith("_") or path.name == "__init__.py")
        documented += sum(ast.get_docstring(d) is not None for d in defs)
        documented += (not path.name.startswith("_") or path.name == "__init__.py") and ast.get_docstring(tree) is not None
    names = Counter(p.name for p in files if p.name != "__init__.py")
    return {"files": len(files), "lines": lines, "longest": sorted(lengths, reverse=True),
            "public": public, "documented": documented,
            "same_name": sorted(n for n, c in names.items() if c > 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    m = measure()
    print(f"{m['files']} modules, {m['lines']} lines")
    print(f"functions over {LONG} lines: {sum(n > LONG for n, _ in m['longest'])}")
    for n, where in m["longest"][:args.top]:
        print(f"  {n:4d}  {where}")
    print(f"public definitions with a docstring: {m['documented']} of {m['public']} "
          f"({m['documented'] / m['public']:.1%})")
    print(f"file names used more than once: {', '.join(m['same_name']) or 'none'}")


if __name__ == "__main__":
    main()
