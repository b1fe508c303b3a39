"""Party data: loaders, non-IID partitioners (horizontal and vertical), statistics and plots.

Layer 3 of secureflhv (docs/architecture.md): imports nothing from the algorithm, runtime or CLI layers.

Quick tour::

    from secureflhv.data import load_dataset, partition, partition_stats, plot_label_distribution
    ds = load_dataset("fmnist")                          # 60000 x 784 float32, labels 0..9
    part = partition("label_dirichlet", ds, 10, seed=0, beta=0.1)
    st = partition_stats(ds.y, part.indices)             # sizes, label histograms, EMD/JS/Hellinger
    plot_label_distribution(st, "fmnist_dir01.png")
    shard = part.party_data(ds, 3)                       # Dataset of party 3

    bc = load_dataset("breast_cancer")
    vp = vertical_split(bc, n_hosts=2, scheme="random", sample_overlap=0.8)
    write_vertical_csvs(bc, vp, "vfl/")                  # guest.csv (id, features, y), host_1.csv, ...
    guest = load_party_csv("vfl/guest.csv", id_column="id", label_column="y")
"""
from .dataset import DataError, Dataset
from .partition.fcube import make_fcube, octant_pair
from .partition.samples import (ALIASES, SCHEMES, HorizontalPartition, SchemeSpec, apply_feature_noise,
                                available_schemes, feature_natural, feature_noise, feature_synthetic, iid,
                                label_dirichlet, label_dirichlet_feature_noise, label_noise, label_quantity,
                                label_quantity_dirichlet, noise_levels, partition, quantity_dirichlet,
                                resolve_scheme, temporal)
from .loaders import (BUILTIN_DATASETS, PENGUIN_SCHEMA, load_dataset, load_diabetes, load_fashion_mnist,
                      load_idx, load_mnist_5k, load_party_csv, load_penguins, load_shuttle, load_sklearn,
                      load_table, read_idx, with_missing_cells)
from .partition.plots import plot_label_distribution
from .schema import ColumnSchema, SchemaError, TableSchema, parse_schema
from .partition.shards import write_shards
from .partition.stats import PartitionStats, divergences, partition_stats, print_stats, stats_markdown, stats_table
from .partition.features import VerticalPartition, default_ids, vertical_split, write_vertical_csvs

__all__ = [
    "ALIASES", "BUILTIN_DATASETS", "PENGUIN_SCHEMA", "SCHEMES", "ColumnSchema", "DataError", "Dataset", "HorizontalPartition", "PartitionStats",
    "SchemaError", "SchemeSpec", "TableSchema", "VerticalPartition", "apply_feature_noise", "available_schemes", "default_ids", "divergences",
    "feature_natural", "feature_noise", "feature_synthetic", "iid", "label_dirichlet",
    "label_dirichlet_feature_noise", "label_noise", "label_quantity", "label_quantity_dirichlet", "load_dataset",
    "load_diabetes", "load_fashion_mnist", "load_idx", "load_mnist_5k", "load_party_csv", "load_penguins", "load_shuttle", "load_sklearn",
    "load_table", "make_fcube", "noise_levels", "octant_pair", "parse_schema", "partition", "partition_stats",
    "plot_label_distribution", "print_stats", "quantity_dirichlet", "read_idx", "resolve_scheme", "stats_markdown",
    "stats_table", "temporal", "vertical_split", "with_missing_cells", "write_shards", "write_vertical_csvs",
]
