"""What the coverage table of docs/partitions.md claims, cell by cell, and the tests that make each claim true.

One row per algorithm (a horizontal strategy, a tree, a vertical model), one column per partition scheme of
``secureflhv.data`` (horizontal: :func:`secureflhv.data.available_schemes`; vertical: the column splits of
``VERTICAL_SCHEMES`` and the sample overlap that PSI resolves). A cell is one of

* ``equals twin, processes``: at least one test runs the parties as real processes (gRPC + mutual TLS) under
  that partition and compares the result with the twin (the in-process tests of the cell are listed too);
* ``equals twin, in-process``: the comparison runs every party in one process (threads, in-process transport);
* ``n/a: <reason>``.

The twin of a row is stated in its ``twin`` column: for the horizontal strategies it is plaintext aggregation
of the same quantised updates (secure aggregation must change nothing, bit for bit); for the trees and the
vertical models it is a centralised model on the pooled or joined rows, written in the test from numpy /
torch primitives, sharing no code with the federated path.

``tests/test_partition_coverage.py`` checks that every cell of the product is present, that every test
named exists in the suite (node ids as ``pytest --collect-only -q`` prints them), and that the table in
docs/partitions.md is :func:`render`'s output. ``python tests/partition_coverage.py --write`` rewrites it.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from secureflhv.data import available_schemes
from secureflhv.data.partition.features import VERTICAL_SCHEMES

DOC = Path(__file__).resolve().parents[1] / "docs" / "partitions.md"
BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
PROCESSES, IN_PROCESS = "equals twin, processes", "equals twin, in-process"
HORIZONTAL = tuple(available_schemes())
VERTICAL = (*VERTICAL_SCHEMES, "sample_overlap")

# --- node ids of the parametrised grids (built here so that a renamed parameter breaks the check) ----------------
GRID = "tests/horizontal/test_strategy_partition_grid.py"
GRID_IDS = {  # scheme -> the id suffixes of that scheme's parameter sets in the grid (NIID-Bench's settings)
    "iid": ("iid",), "label_quantity": ("label_quantity-k1", "label_quantity-k2", "label_quantity-k3"),
    "label_dirichlet": ("label_dirichlet-beta0.5", "label_dirichlet-beta0.1"),
    "quantity_dirichlet": ("quantity_dirichlet-beta1.0",), "feature_noise": ("feature_noise-sigma0.2",),
    "feature_synthetic": ("feature_synthetic",), "feature_natural": ("feature_natural",),
    "label_noise": ("label_noise-flip0.3",), "temporal": ("temporal",),
    "label_dirichlet+quantity_dirichlet": ("label_dirichlet+quantity_dirichlet-beta0.5-beta_quantity1.0",),
    "label_dirichlet+feature_noise": ("label_dirichlet+feature_noise-beta0.5-sigma0.2",),
}
GRID_TEST = f"{GRID}::test_secagg_equals_plaintext_aggregation_of_the_same_quantised_updates"


@dataclass(frozen=True)
class Cell:
    """One claim: ``status`` (``PROCESSES``, ``IN_PROCESS`` or ``n/a: reason``) and the node ids that test it."""

    status: str
    tests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """An algorithm's claims over the schemes of its family (``"horizontal"`` or ``"vertical"``)."""

    name: str
    family: str
    twin: str
    cells: dict


def _grid_row(name: str, strategy_id: str, processes: dict | None = None) -> Row:
    """A strategy's row from the in-process grid, plus the process tests given per scheme."""
    processes = processes or {}
    cells = {}
    for scheme in HORIZONTAL:
        tests = (*processes.get(scheme, ()), *(f"{GRID_TEST}[{strategy_id}-{i}]" for i in GRID_IDS[scheme]))
        cells[scheme] = Cell(PROCESSES if scheme in processes else IN_PROCESS, tests)
    return Row(name, "horizontal", "plaintext aggregation of the same quantised updates (processes cells: the same job"
               " in one process with plain_quantised)", cells)


VERTICAL_IDS = {"even": "even", "random": "random-2hosts", "explicit": "explicit", "overlap": "overlap",
                "sample_overlap": "sample-overlap-psi"}  # the vertical grids' parameter ids
E2E_LR = tuple(f"tests/runtime/test_e2e_vertical_lr.py::test_trained_model_and_psi_match_centralised[{i}]"
               for i in ("1-arbiter-None", "2-two_party-kkrt"))
LR_OVERLAP_JOB = ("tests/vertical/test_vertical_lr_overlap_job.py::"
                  "test_same_named_columns_at_both_parties_job_and_prediction_equal_the_twin")
SNN_E2E = "tests/vertical/test_split_nn_e2e.py::test_guest_and_host_processes_over_grpc_tls"
SNN_REGRESSION = ("tests/vertical/test_split_nn_regression.py::"
                  "test_regression_job_processes_with_overlapping_columns_equals_the_twin")


def _vertical_row(name: str, twin: str, grid_test: str, processes: dict) -> Row:
    """A vertical model's row from its in-process grid over every split, plus the process tests per split."""
    cells = {s: Cell(PROCESSES if s in processes else IN_PROCESS, (*processes.get(s, ()), f"{grid_test}[{VERTICAL_IDS[s]}]"))
             for s in VERTICAL}
    return Row(name, "vertical", twin, cells)


PROC = "tests/horizontal/test_strategies_processes.py"
TREE_TWIN = "histogram GBDT on the pooled / joined rows, numpy, with its own cuts and base margin (tests/tree/numpy_gbdt.py)"
SB_H, SB_V = "tests/tree/test_secureboost_horizontal.py", "tests/tree/test_secureboost_vertical.py"
SB_GRPC = "tests/tree/test_secureboost_grpc.py"
SB_PROCESSES = {  # horizontal SecureBoost over gRPC processes, compared with the numpy twin
    "label_dirichlet+feature_noise": (f"{SB_GRPC}::test_horizontal_server_and_three_clients_over_grpc_tls",),
    "quantity_dirichlet": (f"{SB_GRPC}::test_horizontal_client_killed_mid_training_the_others_finish_over_grpc_tls",),
}
PROC_TEST = f"{PROC}::test_secagg_over_processes_equals_plain_quantised_in_process"
FL_JOB = "tests/horizontal/test_fl_job.py::test_multiprocess_grpc_tls_run"
ROWS: list[Row] = [
    _grid_row("FedAvg", "fedavg", {"label_quantity": (f"{PROC_TEST}[fedavg-label_quantity]",)}),
    _grid_row("FedProx", "fedprox", {"label_dirichlet": (FL_JOB,)}),
    _grid_row("SCAFFOLD", "scaffold", {"quantity_dirichlet": (f"{PROC_TEST}[scaffold-quantity_dirichlet]",)}),
    _grid_row("FedNova", "fednova"),
    _grid_row("FedAvg + CCN", "fedavg+contribution"),
    _grid_row("FedProx + CCN", "fedprox+contribution"),
    _grid_row("SCAFFOLD + CCN", "scaffold+contribution", {"label_dirichlet": (
        "tests/horizontal/test_contribution.py::test_multiprocess_grpc_tls_job_with_contribution_normalisation",)}),
    _grid_row("FedNova + CCN", "fednova+contribution",
              {"feature_noise": (f"{PROC_TEST}[fednova+contribution-feature_noise]",)}),
    _grid_row("IFCA", "ifca", {"label_dirichlet": (f"{PROC_TEST}[ifca-label_dirichlet]",)}),
    _grid_row("FedPer", "fedper",
              {"label_dirichlet+feature_noise": (f"{PROC_TEST}[fedper-label_dirichlet+feature_noise]",)}),
    Row("MultiConfederated learning", "horizontal",
        "each peer's filtered, sample-weighted mean of the models on the wire, computed in the test",
        {s: Cell(IN_PROCESS, tuple(f"{GRID}::test_multiconfederated_aggregates_the_filtered_weighted_mean[{i}]"
                                   for i in GRID_IDS[s])) for s in HORIZONTAL}),
    Row("SecureBoost (horizontal)", "horizontal", TREE_TWIN, {
        s: Cell(PROCESSES if s in SB_PROCESSES else IN_PROCESS,
                (*SB_PROCESSES.get(s, ()), f"{SB_H}::test_secure_aggregation_equals_numpy_twin_for_every_partition[{s}]"))
        for s in HORIZONTAL}),
    Row("SecureBoost (vertical)", "vertical", TREE_TWIN, {
        **{s: Cell(IN_PROCESS, (f"{SB_V}::test_vertical_equals_numpy_twin_for_every_feature_split[{s}]",))
           for s in VERTICAL_SCHEMES},
        "overlap": Cell(PROCESSES, (f"{SB_GRPC}::test_vertical_guest_and_two_hosts_over_grpc_tls",
                                    f"{SB_V}::test_vertical_equals_numpy_twin_for_every_feature_split[overlap]")),
        "sample_overlap": Cell(PROCESSES, ("tests/runtime/test_secureboost_vertical_psi.py::"
                                           "test_model_after_psi_equals_the_twin_on_the_joined_intersection",)),
    }),
    _vertical_row("Vertical LR", "centralised Taylor-approximated LR on the joined table, numpy (tests/vertical/vlr_harness.py)",
                  "tests/vertical/test_vertical_lr_partitions.py::"
                  "test_every_vertical_partition_equals_the_centralised_taylor_lr", {
                      "random": (*E2E_LR,),
                      "overlap": (LR_OVERLAP_JOB,),
                      "sample_overlap": (LR_OVERLAP_JOB, *E2E_LR)}),
    _vertical_row("Split NN", "the same network in torch on the joined table (tests/vertical/snn_twin.py)",
                  "tests/vertical/test_split_nn_partitions.py::test_every_vertical_partition_equals_the_torch_twin", {
                      "random": (SNN_E2E,),
                      "overlap": (SNN_REGRESSION,),
                      "sample_overlap": (SNN_E2E, SNN_REGRESSION)}),
]


def render() -> str:
    """The markdown of the coverage section: per family a table (partition × algorithm), then each cell's tests."""
    out = []
    for family, schemes in (("horizontal", HORIZONTAL), ("vertical", VERTICAL)):
        rows = [r for r in ROWS if r.family == family]
        if not rows:
            continue
        out.append(f"| {family} partition | " + " | ".join(r.name for r in rows) + " |")
        out.append("|---|" + "---|" * len(rows))
        for s in schemes:
            out.append(f"| `{s}` | " + " | ".join(r.cells[s].status for r in rows) + " |")
        out.append("")
    twins: dict[str, list[str]] = {}
    for r in ROWS:
        twins.setdefault(r.twin, []).append(r.name)
    out.append("The twins:\n")
    out.extend(f"- {', '.join(names)}: {twin}." for twin, names in twins.items())
    out.append("")
    out.append("<details><summary>The tests of every cell</summary>\n")
    for r in ROWS:
        out.append(f"**{r.name}**\n")
        for scheme, cell in r.cells.items():
            out.append(f"- `{scheme}`: " + (", ".join(f"`{t}`" for t in cell.tests) or cell.status))
        out.append("")
    out.append("</details>")
    return "\n".join(out)


def documented() -> str:
    """The text between the coverage markers of docs/partitions.md (ValueError when they are missing)."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), DOC.read_text(), re.S)
    if not m:
        raise ValueError(f"{DOC}: no {BEGIN} ... {END} block")
    return m.group(1)


def write() -> None:
    """Rewrite the coverage block of docs/partitions.md with :func:`render`."""
    text = DOC.read_text()
    new = re.sub(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END), lambda _: f"{BEGIN}\n{render()}\n{END}", text,
                 flags=re.S)
    DOC.write_text(new)


if __name__ == "__main__":
    if "--write" in sys.argv:
        write()
    else:
        print(render())
