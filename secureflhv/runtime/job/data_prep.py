"""One data-preparation path for every job: load a party's table, align ids by PSI, split, standardise.

Every job calls these in the same order at every data party, so each PSI message has its partner and
every party holds the same train/validation/test rows. Errors about a party's data are JobConfigErrors
phrased one way, ``parties[i].data... (party 'ID'): what is wrong``, whichever job raises them.

What each role learns: PSI (:mod:`secureflhv.vertical.psi`) tells guest and hosts the ids common to all
of them and the set sizes (guest: every host's; host: the guest's); nothing else leaves a party here.
Preprocessing (impute missing cells, one-hot categorical columns, standardise; :mod:`secureflhv.data.tabular`)
is fitted on the party's own training rows (vertical: its own columns; nothing is sent) and saved with
the model (``meta["preprocessor"]``).
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from ...data import Dataset, load_table
from ...data.stream import load_ids_batched, load_table_batched, table_bytes
from ...data.tabular import Preprocessor
from ...data.woe import WOEEncoder
from ...transport import Transport
from ...vertical import psi as psi_ecdh, psi_kkrt
from .job_file import JobConfig, JobConfigError, PartySpec

log = logging.getLogger("secureflhv.job")
PSI_PROTOCOLS = {"ecdh": psi_ecdh, "kkrt": psi_kkrt}  # job.psi_protocol -> module with align_ids_guest/host


class SplitParams(BaseModel):
    """Job-level parameters of the held-out split (mixed into a job's params model)."""

    test_fraction: float = Field(default=0.3, ge=0, lt=1, description="share of aligned rows held out")
    split_seed: int = Field(default=0, ge=0, description="seed of the train/test split of aligned rows")


class ChainedInputParams(BaseModel):
    """Chaining after a ``feature_selection`` and / or ``feature_binning`` job (mixed into the vertical jobs'
    params): the selection first, then the WOE encoding."""

    select_from: str | None = Field(default=None, description="output_dir of a feature_selection job: each party "
                                                              "reads only the columns it kept, in training and "
                                                              "prediction")
    woe_from: str | None = Field(default=None, description="output_dir of a feature_binning job: each party keeps "
                                                           "the columns it selected and encodes them (WOE, or a host "
                                                           "sent none: bin index) before preprocessing")


class StandardisedSplitParams(SplitParams):
    """The split plus per-party preprocessing (vertical LR and split NN)."""

    accepts_missing_values: ClassVar[bool] = True  # imputed by the preprocessing (preflight allows gaps)

    standardize: bool = Field(default=True, description="each party standardises its own columns")
    missing_indicator: bool = Field(default=False, description="add a 0/1 '<column>=missing' feature for "
                                                               "each column with missing training cells")


class ValidationSplitParams(SplitParams):
    """The split plus a validation part for early stopping (SecureBoost)."""

    validation_fraction: float = Field(default=0.0, ge=0, lt=1,
                                       description="share of training rows held out for early stopping")


@dataclass(frozen=True)
class RowSplit:
    """Row indices (sorted int64 arrays) of the training, validation and test parts."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def validation(self, a: np.ndarray | None) -> np.ndarray | None:
        """``a[val]``, or None when there are no validation rows (or no ``a``): early stopping is off."""
        return a[self.val] if a is not None and len(self.val) else None


@dataclass
class PartyData:
    """One data party's rows after preparation: ``X[k]`` (and ``y[k]``) belong to id ``ids[k]``.

    ``split`` indexes the rows; ``meta`` holds params, feature names, PSI sizes and the preprocessing
    state (the bundle's ``preprocessing``: :func:`preprocessing_state`).
    """

    X: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray
    split: RowSplit
    feature_names: list[str]
    meta: dict = field(default_factory=dict)
    batch_rows: int | None = None  # the table exceeded data.max_memory_mb: work on it in batches of this many rows

    @property
    def train(self) -> np.ndarray:
        """The training rows' indices into ``X`` (sorted int64)."""
        return self.split.train

    @property
    def test(self) -> np.ndarray:
        """The test rows' indices into ``X`` (sorted int64)."""
        return self.split.test


def _columns(path: Path) -> list[str]:
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return list(z.files)
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    import pandas as pd

    return list(pd.read_csv(path, nrows=0).columns)


def load_party_table(cfg: JobConfig, party: PartySpec, *, label_column: str | None = None,
                     require_label: bool = False, id_required: bool = True, ids_only: bool = False,
                     rows: np.ndarray | None = None) -> Dataset:
    """Read ``parties[i].data`` of ``party`` (CSV / Parquet / NumPy / IDX, see :func:`secureflhv.data.load_table`).

    Args:
        label_column: overrides ``data.label_column`` (a job-level default, e.g. horizontal ``y``).
        require_label: the table must have its label column.
        id_required: the id column must exist (vertical jobs align on it); otherwise it is used only
            when present (never as a feature).
        ids_only: only for a streamed table (:func:`streamed_batch_rows` not None): read only the id and
            label columns (:func:`secureflhv.data.stream.load_ids_batched`; ``X`` has no columns).
        rows: only for a streamed table: read only these rows, in this order
            (``load_table_batched(rows=...)``: the whole feature matrix never exists).
    Raises:
        JobConfigError: unreadable file, missing or non-numeric column, missing label — naming the party.
    """
    spec = party.data
    path = cfg.resolve(spec.path)
    label = label_column or spec.label_column
    batch_rows = streamed_batch_rows(cfg, party)
    if (ids_only or rows is not None) and not batch_rows:
        raise ValueError("ids_only / rows apply to a streamed table only")
    if batch_rows and rows is None:
        log.info("%s: %s exceeds data.max_memory_mb=%g: reading it in batches of %d rows",
                 party.id, path.name, spec.max_memory_mb, batch_rows)
    try:
        id_column = spec.id_column if id_required or spec.id_column in _columns(path) else None
        kw = dict(id_column=id_column, label_column=label, feature_columns=spec.feature_columns,
                  schema=spec.table_schema)
        if ids_only:
            table = load_ids_batched(path, batch_rows, **kw)
        elif batch_rows:
            table = load_table_batched(path, batch_rows, rows=rows, **kw)
        else:
            table = load_table(path, **kw)
    except (OSError, ValueError) as exc:
        raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None
    if require_label and table.y is None:
        raise JobConfigError(f"{cfg.where(party, 'data.label_column')}: no label column {label!r} in {path}")
    if ids_only:
        log.info("%s: read %d ids from %s", party.id, table.n_rows, path)
    else:
        log.info("%s: loaded %d rows x %d features from %s", party.id, table.n_rows, table.n_features, path)
    return table


def streamed_batch_rows(cfg: JobConfig, party: PartySpec) -> int | None:
    """Rows per batch when ``party``'s table is read in row batches, else None (read whole).

    Streamed when ``data.max_memory_mb`` is set and the table's size (:func:`secureflhv.data.stream.table_bytes`)
    exceeds it; ``data.batch_rows`` or, by default, as many rows as fill an eighth of the budget.
    Raises JobConfigError (naming ``data.max_memory_mb``) for a format that cannot be streamed.
    """
    spec = party.data
    if spec is None or spec.max_memory_mb is None:
        return None
    path = cfg.resolve(spec.path)
    if not path.is_file():
        return None  # the loader reports it
    if path.suffix.lower() not in (".csv", ".txt", ".parquet", ".pq"):
        raise JobConfigError(f"{cfg.where(party, 'data.max_memory_mb')}: streamed reading applies to CSV and "
                             f"Parquet files, not {path.name}")
    budget = spec.max_memory_mb * 2 ** 20
    if table_bytes(path) <= budget:
        return None
    return spec.batch_rows or max(1, int(budget / 8 / (8 * max(1, len(_columns(path))))))


def align_by_psi(cfg: JobConfig, party: PartySpec, transport: Transport, table: Dataset):
    """Run PSI (``job.psi_protocol``, sets bounded by ``job.psi_max_ids``) with the other data parties; returns the
    :class:`~secureflhv.vertical.psi.PsiResult`.

    Raises ValueError when fewer than two ids are common (training on them would be meaningless).
    """
    t0 = time.monotonic()
    protocol = PSI_PROTOCOLS[cfg.job.psi_protocol]
    if party.role == "guest":
        psi = protocol.align_ids_guest(transport, list(table.ids), [h.id for h in cfg.hosts],
                                       max_ids=cfg.job.psi_max_ids)
    else:
        psi = protocol.align_ids_host(transport, list(table.ids), cfg.guest.id, max_ids=cfg.job.psi_max_ids)
    log.info("%s: PSI found %d common ids (own %d) in %.2fs", party.id, len(psi), table.n_rows,
             time.monotonic() - t0)
    if len(psi) < 2:
        raise ValueError(f"PSI left {len(psi)} common ids (this party has {table.n_rows}, peers "
                         f"{psi.peer_sizes}): check that every party's data.id_column names the same ids, "
                         f"written the same way (e.g. no leading zeros lost, same prefix)")
    return psi


def split_rows(n: int, test_fraction: float, seed: int, validation_fraction: float = 0.0) -> RowSplit:
    """Seeded split of ``n`` rows: the same (n, fractions, seed) gives the same rows at every party.

    ``test_fraction`` of the rows are held out; ``validation_fraction`` of the rest is kept for early
    stopping.
    """
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    test, rest = np.sort(perm[:n_test]), perm[n_test:]
    n_val = int(round(validation_fraction * len(rest)))
    return RowSplit(train=np.sort(rest[n_val:]), val=np.sort(rest[:n_val]), test=test)


def local_split(n: int, fraction: float, seed: int, party_id: str) -> RowSplit:
    """A horizontal client's own train/test split; depends only on (n, fraction, seed, party id).

    At least one training row is kept. ``val`` is empty.
    """
    cid = int.from_bytes(hashlib.sha256(party_id.encode()).digest()[:8], "little")
    perm = np.random.default_rng([seed, cid, 7]).permutation(n)
    n_test = min(int(round(fraction * n)), n - 1)
    return RowSplit(train=np.sort(perm[n_test:]), val=np.sort(perm[:0]), test=np.sort(perm[:n_test]))


def standardise(X: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, dict]:
    """``(X - mean) / std`` with the statistics of ``rows`` (constant columns keep std 1); returns the state."""
    mean, std = X[rows].mean(axis=0), X[rows].std(axis=0)
    std[std == 0] = 1.0
    return (X - mean) / std, {"mean": mean, "std": std}


def read_party_bundle(cfg: JobConfig, party: PartySpec, field: str, folder, **expect):
    """``party``'s bundle in ``<folder>/<party id>/model/``, verified under the job's CA and signed by this
    party (``expect``: ``expect_job`` / ``expect_role`` as :func:`~secureflhv.runtime.store.model_bundle.read_bundle`
    takes them). The one way a job reads a bundle an earlier job left (``params.model_dir``, ``woe_from``,
    ``select_from``).

    Raises JobConfigError naming ``security.ca`` when the job file names no CA, else ``params.<field>``
    with the party and the failed check.
    """
    from ..store.model_bundle import ModelBundleError, read_bundle

    if cfg.security.ca is None:  # bundles are signed: only the job CA can say by whom
        raise JobConfigError(f"security.ca: required to verify party {party.id!r}'s model bundle, which its "
                             f"certificate signed (the training job's CA)")
    try:
        return read_bundle(cfg.resolve(Path(folder)) / party.id, ca=cfg.resolve(cfg.security.ca),
                           expect_party=party.id, **expect)
    except ModelBundleError as exc:
        raise JobConfigError(f"params.{field} (party {party.id!r}): {exc}") from None


def _chained_bundle(cfg: JobConfig, party: PartySpec, field: str, folder: str, algorithm: str):
    """:func:`read_party_bundle` of an ``algorithm`` job; JobConfigError naming ``params.<field>`` for a bundle
    of another algorithm."""
    bundle = read_party_bundle(cfg, party, field, folder)
    if bundle.algorithm != algorithm:
        raise JobConfigError(f"params.{field} (party {party.id!r}): {bundle.path} is a {bundle.algorithm} bundle; "
                             f"point it at the output_dir of a {algorithm} job")
    return bundle


def woe_encoder(cfg: JobConfig, party: PartySpec, woe_from: str, columns: list[str]) -> WOEEncoder:
    """The :class:`~secureflhv.data.woe.WOEEncoder` of ``party``'s ``feature_binning`` bundle under
    ``woe_from``; JobConfigError naming ``params.woe_from`` when it cannot be read or bins columns this
    table lacks."""
    bundle = _chained_bundle(cfg, party, "woe_from", woe_from, "feature_binning")
    try:
        return WOEEncoder.from_dict({**bundle.extra["woe_encoder"], "columns": columns})
    except (ValueError, KeyError) as exc:
        raise JobConfigError(f"params.woe_from (party {party.id!r}): {exc}") from None


def selected_columns(cfg: JobConfig, party: PartySpec, select_from: str, columns: list[str]) -> list[str]:
    """The columns ``party``'s ``feature_selection`` bundle under ``select_from`` kept, in table order;
    JobConfigError naming ``params.select_from`` when it cannot be read or names a column this table lacks."""
    kept = list(_chained_bundle(cfg, party, "select_from", select_from, "feature_selection").extra["selected"])
    missing = [c for c in kept if c not in columns]
    if missing:
        raise JobConfigError(f"params.select_from (party {party.id!r}): kept columns {missing} are not in the table")
    return [c for c in columns if c in kept]


def _preprocess(names: list[str], categories: dict, X: np.ndarray, rows: np.ndarray, *, standardize: bool,
                missing_indicator: bool = False) -> tuple[np.ndarray, list[str], Preprocessor | None]:
    """Fit a :class:`~secureflhv.data.tabular.Preprocessor` on ``X[rows]`` and apply it to ``X``.

    Returns ``(X', output feature names, preprocessor)``; ``X`` unchanged and no preprocessor when there
    is nothing to do (no missing cells, no categorical columns, no standardisation).
    Raises ValueError naming a column that is missing in every training row.
    """
    if not standardize and not categories and not np.isnan(X).any():
        return X, list(names), None
    pre = Preprocessor.fit(X[rows], names, categories, standardize=standardize, missing_indicator=missing_indicator)
    return pre.transform(X), pre.output_names, pre


def prepare_vertical(cfg: JobConfig, party: PartySpec, transport: Transport, params: BaseModel, *,
                     validation_fraction: float = 0.0, standardize: bool = False,
                     preprocess: bool = False) -> PartyData:
    """Load, align by PSI, split (``params.test_fraction``, ``params.split_seed``) and optionally preprocess.

    For a vertical guest or host; ``y`` is set at the guest only. With ``preprocess`` (linear and neural
    families) missing cells are imputed, categorical columns one-hot encoded and, with ``standardize``,
    numeric columns standardised — all fitted on this party's training rows; trees take the raw codes
    and NaN (``preprocess=False``).

    A streamed table (:func:`streamed_batch_rows` not None: ``data.max_memory_mb`` exceeded) is read in
    two passes of row batches: the id (and label) columns for PSI, then the feature columns, each batch's
    common rows copied to their aligned places. The result is bit-identical to reading the table whole,
    and the peak is the aligned matrix (common ids x features x 8 bytes) plus the ids and labels of the
    whole table plus one batch, not the whole table. With ``preprocess`` the preprocessor still makes its
    own copy of the aligned matrix (fit on the training rows, transform). Raises JobConfigError when the
    file changes between the two passes (its ids no longer match PSI's).
    """
    if streamed_batch_rows(cfg, party):
        # two passes over the file: ids (and labels) for PSI, then only the common rows' features,
        # each batch's rows copied to their aligned places: the whole table is never in memory
        keys = load_party_table(cfg, party, ids_only=True)
        psi = align_by_psi(cfg, party, transport, keys)
        table = load_party_table(cfg, party, rows=psi.rows)
        if not np.array_equal(table.ids, np.asarray(psi.ids)):
            raise JobConfigError(f"{cfg.where(party, 'data')}: {cfg.resolve(party.data.path)} changed while it "
                                 f"was read (the ids of its second pass differ from those of the first)")
        X, y, own = table.X, table.y, keys.n_rows
    else:
        table = load_party_table(cfg, party)
        psi = align_by_psi(cfg, party, transport, table)
        X, y, own = table.X[psi.rows], table.y[psi.rows] if table.y is not None else None, table.n_rows
    split = split_rows(len(psi), params.test_fraction, params.split_seed, validation_fraction)
    names, categories, pre, woe = list(table.feature_names), table.categories, None, None
    if getattr(params, "select_from", None):
        names = selected_columns(cfg, party, params.select_from, names)
        X = X[:, [list(table.feature_names).index(c) for c in names]]
        categories = {c: v for c, v in categories.items() if c in names}
    inputs = list(names)
    if getattr(params, "woe_from", None):
        woe = woe_encoder(cfg, party, params.woe_from, names)
        X, names, categories = woe.transform(X), woe.output_names, {}
    if preprocess:
        try:
            X, names, pre = _preprocess(names, categories, X, split.train, standardize=standardize,
                                        missing_indicator=getattr(params, "missing_indicator", False))
        except ValueError as exc:
            raise JobConfigError(f"{cfg.where(party, 'data')}: {exc}") from None
    meta = {"params": params.model_dump(mode="json"), "feature_names": names,
            "input_features": inputs, "schema": party.data.table_schema,
            "psi": {"common_ids": len(psi), "own_ids": own, "peer_sizes": psi.peer_sizes},
            "standardisation": ({"mean": pre.mean, "std": pre.std}
                                if pre is not None and pre.standardize and pre.identity_on_complete_numeric else None),
            "preprocessor": pre.to_dict() if pre is not None else None,
            "woe": woe.to_dict() if woe is not None else None}
    y = y if party.role == "guest" else None
    return PartyData(X, y, np.asarray(psi.ids), split, names, meta, streamed_batch_rows(cfg, party))


def preprocessing_state(data: PartyData) -> dict:
    """What a prediction job needs to prepare new rows as training did (saved in the model bundle):
    the input columns, the schema they were read with, and the fitted preprocessor (or None)."""
    return {key: data.meta.get(key) for key in ("input_features", "schema", "woe", "preprocessor", "standardisation")}


def bundle_fields(data: PartyData, config) -> dict:
    """The model-bundle fields of a vertical party (``save_job_bundle(**...)``): its feature names, the
    protocol's ``config`` (a pydantic model, dumped as JSON) and :func:`preprocessing_state`."""
    return {"feature_names": data.feature_names, "config": config.model_dump(mode="json"),
            "preprocessing": preprocessing_state(data)}
