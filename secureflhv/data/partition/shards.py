"""Write horizontal shards to disk, one file per party, plus a JSON manifest.

Layout of ``out_dir``: ``party_00.npz`` ... (or ``.csv`` / ``.parquet``) and ``partition.json``
(scheme, parameters, seed, sizes, file names, noise levels). A job file can point a party at its
shard; :func:`secureflhv.data.loaders.load_table` reads every format back:

* npz: arrays ``X`` (features, noise applied), ``y`` (labels, noisy under label_noise),
  ``row_index`` (rows in the source data set), ``feature_names``, ``ids`` if the data set has ids;
  load with ``load_table(path, label_column="y")``.
* csv / parquet: columns ``id`` (the data set's id, else the source row index as a string), the
  features, and ``y``; load with ``load_table(path, label_column="y", id_column="id")``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..dataset import Dataset
from .samples import HorizontalPartition

SHARD_FORMATS = ("npz", "csv", "parquet")


def shard_name(party: int, n_parties: int, fmt: str) -> str:
    """The file name of ``party``'s shard: ``party_NN.<fmt>``, zero-padded to at least two digits."""
    return f"party_{party:0{max(2, len(str(n_parties - 1)))}d}.{fmt}"


def write_shards(dataset: Dataset, part: HorizontalPartition, out_dir, fmt: str = "npz") -> list[Path]:
    """Write each party's shard of ``dataset`` (see module docstring) and ``partition.json``.

    Returns the shard paths in party order. Raises ValueError for an unknown ``fmt`` or a column
    name clash with ``id`` / ``y``.
    """
    import pandas as pd

    if fmt not in SHARD_FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(SHARD_FORMATS)}, got {fmt!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(part.n_parties):
        shard = part.party_data(dataset, i)
        path = out_dir / shard_name(i, part.n_parties, fmt)
        rows = part.indices[i]
        if fmt == "npz":
            arrays = {"X": shard.X, "row_index": rows, "feature_names": np.asarray(shard.feature_names)}
            if shard.y is not None:
                arrays["y"] = shard.y
            if shard.ids is not None:
                arrays["ids"] = shard.ids.astype(str)
            np.savez(path, **arrays)
        else:
            clash = {"id", "y"} & set(shard.feature_names)
            if clash:
                raise ValueError(f"feature column(s) {sorted(clash)} clash with reserved shard columns")
            frame = {"id": shard.ids if shard.ids is not None else rows.astype(str)}
            frame.update({n: shard.X[:, j] for j, n in enumerate(shard.feature_names)})
            if shard.y is not None:
                frame["y"] = shard.y
            df = pd.DataFrame(frame)
            if fmt == "csv":
                df.to_csv(path, index=False, float_format="%.9g" if shard.X.dtype == np.float32 else "%.17g")
            else:
                df.to_parquet(path, index=False)
        paths.append(path)
    manifest = {
        "dataset": dataset.name,
        "scheme": part.scheme,
        "params": {k: (v.item() if hasattr(v, "item") else v) for k, v in part.params.items()},
        "seed": part.seed if isinstance(part.seed, int) else None,
        "niid_bench_compat": part.niid_bench_compat,
        "n_parties": part.n_parties,
        "n_rows": len(dataset),
        "n_features": dataset.n_features,
        "format": fmt,
        "sizes": part.sizes.tolist(),
        "files": [p.name for p in paths],
        "noise_levels": None if part.noise_levels is None else part.noise_levels.tolist(),
        "flip_rates": None if part.flip_rates is None else part.flip_rates.tolist(),
    }
    (out_dir / "partition.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return paths
