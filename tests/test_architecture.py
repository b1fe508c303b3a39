"""Architecture rules of ``secureflhv``, checked on the source with ``ast`` (nothing is imported).

1. The import graph of ``secureflhv`` modules has no cycle. Every ``import`` / ``from ... import``
   counts, absolute or relative, at module level or inside functions, classes and ``if`` blocks.
2. Layers, bottom to top (docs/architecture.md): compute -> crypto -> transport (with ``secureflhv.proto``,
   the generated wire schema) -> data -> algorithms (vertical, horizontal, tree, secagg, fedstats) ->
   runtime -> cli / ``__main__``. No module imports a module of a higher layer; ``secureflhv.proto`` is not
   imported by compute/, crypto/ or data/ (they know no wire schema).
3. grpc is imported only in ``secureflhv/transport`` (and by the generated ``proto/*_pb2_grpc.py``
   stubs, which are transport-level by rule 2).

``python tests/test_architecture.py`` prints the layer violations, the cycles, and which algorithm
packages import each other sideways.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = "secureflhv"
SRC = Path(__file__).resolve().parents[1] / PACKAGE

# first component below secureflhv -> layer (the package root ``secureflhv`` itself is below everything);
# ``params`` (the shared pydantic parameter models) sits with data: it imports only pydantic and crypto
# constants, and every algorithm family and the runtime embed it
LAYERS = {"_version": -1, "compute": 0, "crypto": 1, "transport": 2, "proto": 2, "data": 3, "params": 3, "dp": 3,
          "vertical": 4, "horizontal": 4, "tree": 4, "secagg": 4, "fedstats": 4,
          "runtime": 5, "cli": 6, "__main__": 6}
LAYER_NAMES = {-1: "package root", 0: "compute", 1: "crypto", 2: "transport", 3: "data", 4: "algorithms",
               5: "runtime", 6: "cli"}
NO_WIRE_SCHEMA = ("compute", "crypto", "data")  # must not import secureflhv.proto
GRPC_ALLOWED = ("transport", "proto")
# the package root's lazy exports (PEP 562 ``__getattr__``): imported on first use of the name, never when
# ``secureflhv`` is imported, so they neither layer the root above runtime nor close an import cycle
LAZY_EXPORTS = {("secureflhv", "secureflhv.runtime.store.model_api"), ("secureflhv", "secureflhv.runtime.api")}


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file for every ``.py`` file of the package (``pkg/__init__.py`` -> ``pkg``)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names (relative levels resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules) -> list[tuple[str, int]]:
    """(imported name, line) for every import in ``path``; ``from X import y`` gives ``X.y`` when that
    is a module of ours, else ``X``. Names outside ``secureflhv`` are kept as written (e.g. ``grpc``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in modules else target, node.lineno))
    return found


def import_graph(src: Path = SRC) -> tuple[dict[str, dict[str, int]], dict[str, list[tuple[str, int]]]]:
    """(edges: module -> {secureflhv module it imports: line}, external: module -> [(name, line)])."""
    modules = module_files(src)
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    external: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for module, path in modules.items():
        for name, line in imports_of(module, path, modules):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                while name not in modules and "." in name:  # ``import secureflhv.x.y`` of a non-module name
                    name = name.rsplit(".", 1)[0]
                if (module, name) in LAZY_EXPORTS:
                    continue
                if name != module:
                    edges[module].setdefault(name, line)
            else:
                external[module].append((name, line))
    return edges, external


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per strongly connected component with more than one module (Tarjan)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(set(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_cycle_in(scc, edges) for scc in sccs]


def _cycle_in(scc: set[str], edges) -> list[str]:
    """A shortest cycle through the smallest module name of ``scc`` (breadth-first inside ``scc``)."""
    start = min(scc)
    parent = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if w in scc and w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"no cycle found in strongly connected component {sorted(scc)}")


def layer_of(module: str) -> int:
    parts = module.split(".")
    return -1 if len(parts) == 1 else LAYERS[parts[1]]


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _describe(cycle, edges) -> str:
    return " -> ".join(cycle) + "  (" + ", ".join(
        f"{a} line {edges[a][b]}" for a, b in zip(cycle, cycle[1:])) + ")"


def layer_violations(edges) -> list[str]:
    out = []
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if layer_of(target) > layer_of(module):
                out.append(f"{module} (line {line}) imports {target}: {LAYER_NAMES[layer_of(module)]} layer "
                           f"importing the higher {LAYER_NAMES[layer_of(target)]} layer")
            elif _area(module) in NO_WIRE_SCHEMA and _area(target) == "proto":
                out.append(f"{module} (line {line}) imports {target}: {_area(module)}/ must not know the wire "
                           f"schema (wire encoding belongs in secureflhv/transport)")
    return out


def grpc_imports(external) -> list[str]:
    return [f"{module} (line {line}) imports {name}"
            for module, names in sorted(external.items()) for name, line in names
            if (name == "grpc" or name.startswith("grpc.")) and _area(module) not in GRPC_ALLOWED]


def sideways_imports(edges) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> ['module line N -> module'] within the algorithms layer."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            a, b = _area(module), _area(target)
            if a != b and layer_of(module) == layer_of(target) == LAYERS["vertical"]:
                out[(a, b)].append(f"{module} line {line} -> {target}")
    return dict(out)


# ------------------------------------------------------------------------------------------ tests
def test_every_package_has_a_layer():
    unknown = sorted({_area(m) for m in module_files() if _area(m) and _area(m) not in LAYERS})
    assert not unknown, f"secureflhv packages/modules with no layer in LAYERS: {unknown}"


def test_no_import_cycles():
    edges, _ = import_graph()
    cycles = find_cycles(edges)
    assert not cycles, "import cycles among secureflhv modules:\n" + "\n".join(_describe(c, edges) for c in cycles)


def test_layers_import_only_downward():
    edges, _ = import_graph()
    bad = layer_violations(edges)
    assert not bad, "imports that break the layer rule (docs/architecture.md):\n" + "\n".join(bad)


def test_grpc_only_in_transport():
    _, external = import_graph()
    bad = grpc_imports(external)
    assert not bad, "grpc imported outside secureflhv/transport:\n" + "\n".join(bad)


def test_algorithm_packages_share_only_secure_aggregation():
    """Within the algorithms layer, vertical/, horizontal/ and tree/ are independent; what two of them
    need in common is a shared service (secagg/) or belongs to a lower layer."""
    edges, _ = import_graph()
    bad = {pair: where for pair, where in sideways_imports(edges).items() if pair[1] != "secagg"}
    assert not bad, "sideways imports between algorithm packages:\n" + "\n".join(
        line for where in bad.values() for line in where)


def test_checker_sees_relative_nested_and_cyclic_imports(tmp_path):
    """The checker itself: relative and in-function imports are edges, and a cycle is reported."""
    pkg = tmp_path / PACKAGE
    (pkg / "crypto").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "crypto" / "__init__.py").write_text("from . import a\n")
    (pkg / "crypto" / "a.py").write_text("def f():\n    from ..runtime.job import run\n")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "runtime" / "job.py").write_text("import grpc\nfrom secureflhv.crypto import a\n")
    edges, external = import_graph(pkg)
    assert edges["secureflhv.crypto.a"] == {"secureflhv.runtime.job": 2}
    assert edges["secureflhv.crypto"] == {"secureflhv.crypto.a": 1}
    assert find_cycles(edges) == [["secureflhv.crypto.a", "secureflhv.runtime.job", "secureflhv.crypto.a"]]
    assert layer_violations(edges) == [
        "secureflhv.crypto.a (line 2) imports secureflhv.runtime.job: crypto layer importing the higher "
        "runtime layer"]
    assert grpc_imports(external) == ["secureflhv.runtime.job (line 1) imports grpc"]


if __name__ == "__main__":
    graph, ext = import_graph()
    print("layer violations:", *layer_violations(graph) or ["none"], sep="\n  ")
    print("cycles:", *[_describe(c, graph) for c in find_cycles(graph)] or ["none"], sep="\n  ")
    print("grpc outside transport:", *grpc_imports(ext) or ["none"], sep="\n  ")
    print("sideways imports between algorithm packages:")
    for (a, b), where in sorted(sideways_imports(graph).items()):
        print(f"  {a} -> {b}:", *where, sep="\n    ")
