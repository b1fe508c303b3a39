"""Cross-party Pearson correlation of a vertical job, under additively homomorphic encryption, and each
party's own column statistics.

The statistic (Pearson 1896): for columns x, y over the same n rows,
``r = cov(x, y) / (sd(x) sd(y)) = (1/n) sum_i z_x,i z_y,i`` with population z-scores
``z = (x - mean) / sd`` (``sd`` with ddof 0; the same r as :func:`numpy.corrcoef`). So with each party
standardising its own columns locally, the cross-party matrix between the guest's p_g columns and a host's
p_h columns is ``R = (1/n) Z_g^T Z_h`` (p_g, p_h): one encrypted matrix product. FATE's ``hetero_pearson``
and SecretFlow's ``ss_pearsonr`` compute the same quantity (HE + masking, resp. secret sharing); this module
follows the codebase's HE layer (:mod:`secureflhv.crypto.homomorphic.backend`) and is not derived from their
code. Secret sharing is not implemented here.

Protocol (one guest G with the key pair, hosts h = 1..H; rows already aligned by PSI; [[.]] = encryption
under G's key, Paillier or OU; round ids in brackets)::

    G -> h : corr.setup  [0]  Bundle: scalars n_rows, p_g, chunk_rows; text reveal_to, he_scheme, missing,
                              precision, ratio; (reveal_to host) text names and tensor undefined (p_g,)
    G -> h : corr.pubkey [0]  PaillierPublicKey
    h -> G : corr.hello  [0]  Bundle: scalars p_h; (reveal_to guest) text names and tensor undefined (p_h,)
    G -> h : corr.zg     [k+1] EncryptedTensor [[Z_g[rows of chunk k]]] (rows_k, p_g), fresh encryptions
    h -> G : corr.ack    [k+1] Scalars {part: k}   (G keeps at most WINDOW chunks unacknowledged per host)
    host h             : [[S_h]] = sum_k [[Z_g,k]]^T Z_h,k   (p_g, p_h)   (``t_matmul``; exponent
                         -(precision_bits + dot_precision_bits))
    reveal_to guest:
      h -> G : corr.result [1] EncryptedTensor [[S_h]] re-randomised with a fresh Enc(0) (so G cannot trace
                               its own encryption randomness to Z_h); G decrypts, R_h = S_h / n
    reveal_to host:
      h -> G : corr.masked [1] EncryptedTensor [[S_h + M]] (M uniform in Z_n per entry, ``he.mask``)
      G -> h : corr.unmask [2] MaskedValues S_h + M mod n (``decrypt_masked``); h removes M, R_h = S_h / n

``chunk_rows`` (the guest's choice, bounded by the host to [1, n]) keeps each ``corr.zg`` within a quarter
of the job's message limit; with at most :data:`WINDOW` chunks in flight per host a host's mailbox never
holds more than the limit.

Precision: Z_g is encrypted at ``precision_bits`` fraction bits (error <= 2^-(p+1) per value), Z_h enters
the product at ``dot_precision_bits``; since (1/n) sum_i |z_i| <= 1, each r is within
2^-(precision_bits+1) + 2^-(dot_precision_bits+1) of the float64 value (defaults 40 / 40: < 2e-12), and the
decryption is exact fixed-point. By Cauchy-Schwarz |S| <= n, so a plaintext mantissa stays below
n 2^(p + dot) (2^80 n at the defaults), far inside the key's range (Paillier: n_key / 3, ~2^509 for a
512-bit test key; OU: plain_bits less the statistical mask's 40 bits, ~2^300 at OU's minimum of 1024 bits).
A plaintext multiplier must stay below 2^(62 - dot) in size; |z| <= sqrt(n - 1), so n - 1 < 2^(2 (62 - dot))
is checked (ValueError).

Columns: each party standardises its own columns over the rows it is given (:func:`standardise_columns`).
``missing: mean`` replaces a party's missing cells by its column mean first (so R equals
:func:`numpy.corrcoef` of the joined table with every missing cell mean-imputed); ``missing: nan`` gives NaN
for every pair involving a column with a missing cell (numpy's result on the raw joined table). A constant
column (population sd <= 1e-12 x max |x|) or a column with no value has no correlation: NaN, as numpy's
0/0. Such "undefined" columns enter the product as zeros and the learner is told which they are.

Validation (every peer message, in the ``parse`` callback of :meth:`Transport.recv`; anything wrong is a
:class:`~secureflhv.transport.ProtocolError`: rejected, logged, and the receiver waits on until its deadline,
whose :class:`~secureflhv.transport.PeerTimeout` names the peer): the host takes the setup only with the
guest's n_rows equal to its own aligned row count, 1 <= p_g <= ``max_features``, 1 <= chunk_rows <= n, and
reveal_to / he_scheme / missing / precisions / ratio equal to its own config; the key of at least the job's
key size; each chunk at exactly (rows_k, p_g), the fresh-encryption exponent, under the guest's key with
every ciphertext in range. The guest takes a hello only with 1 <= p_h <= ``max_features``, a result or
masked matrix only at (p_g, p_h), exponent -(precision_bits + dot_precision_bits) and under its key; a host
takes the unmasked values only at (p_g, p_h), its mask's exponent and the guest's key fingerprint. Names
are a JSON list of exactly p strings of at most :data:`MAX_NAME` characters; undefined flags exactly (p,)
values in {0, 1}.

What each role learns (semi-honest parties; guest and hosts do not collude):
    the party named by ``reveal_to`` (guest: every host's matrix; host: its own matrix with the guest):
        R (p_g, p_h), which columns of the peer are undefined, the peer's column names (or anonymous names
        without ``share_feature_names``) and count. R is linear in the peer's data: the learner learns
        p_learner linear functionals of every standardised peer column (Z_peer^T Z_own / n). With
        p_learner >= n - 1 and Z_own of full rank that is the peer's standardised columns themselves, so
        the party that does not learn refuses unless ``n_rows - 1 > min_rows_per_feature * p_learner``
        (:class:`CorrelationRefused`; default factor 2). This bound is a guard against the exact
        reconstruction only, not a privacy guarantee: a learner with many columns, or several jobs over the
        same rows, learns correspondingly more.
    the other party: nothing about the learner's values. The guest (reveal_to host) decrypts only values
        masked uniformly in Z_n (OU: statistically hiding) and sees R_h of no host; a host (reveal_to guest)
        sees only ciphertexts under the guest's key. Both learn n (already known from PSI), p_g and p_h,
        and the host learns the guest's chunk size.
    hosts learn nothing about each other.

Column statistics (:func:`column_statistics`): local only, no messages.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
from pydantic import ConfigDict, Field

from ..crypto.homomorphic.backend import make_backend
from ..crypto.homomorphic.key_prefetch import resolve_keypair
from ..params import HEParams, with_defaults
from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto, whole_count
from ..transport.row_parts import ROW_PART_WINDOW
from .common import VerticalRole

log = logging.getLogger("secureflhv.vertical.correlation")

TAG_SETUP = "corr.setup"
TAG_PUBKEY = "corr.pubkey"
TAG_HELLO = "corr.hello"
TAG_ZG = "corr.zg"
TAG_ACK = "corr.ack"
TAG_RESULT = "corr.result"
TAG_MASKED = "corr.masked"
TAG_UNMASK = "corr.unmask"

WINDOW = ROW_PART_WINDOW   # encrypted chunks in flight per host (each <= a quarter of the message limit)
CHUNK_BYTES = 8 * 2 ** 20  # target payload of one chunk (pipelines the guest's encryption with the host's work)
MAX_NAME = 256             # characters of one column name on the wire
CONSTANT_RTOL = 1e-12      # a column whose population sd <= this x max |x| is constant
DEFAULT_DOT_PRECISION_BITS = 40


class CorrelationRefused(ValueError):
    """The party that does not learn the matrix refuses to run: the learner has too many columns for the
    rows (see the module docstring, "What each role learns")."""


class CorrelationConfig(with_defaults(HEParams, dot_precision_bits=DEFAULT_DOT_PRECISION_BITS)):
    """Settings of the cross-party correlation; guest and hosts must use the same values (the guest's setup
    carries them and a host with other values rejects it).

    The homomorphic scheme, key and fixed-point precision are :class:`~secureflhv.params.HEParams`
    (``dot_precision_bits`` defaults to 40 here: each r within ~1e-12 of float64, see the module docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reveal_to: Literal["guest", "host"] = Field(
        default="guest", description="who learns the guest x host correlation matrix: guest (every host's) "
                                     "or host (each host its own); the other party learns nothing of it")
    missing: Literal["mean", "nan"] = Field(
        default="mean", description="missing cells in the correlation: mean (each party imputes its column "
                                    "mean first) or nan (a column with a missing cell has NaN correlations)")
    max_features: int = Field(default=1000, ge=1, description="most columns a peer may announce (bounds the "
                                                               "work a peer's setup can ask for)")
    min_rows_per_feature: float = Field(
        default=2.0, ge=1.0, description="the party that does not learn the matrix refuses unless rows - 1 > "
                                         "this x the learner's columns (guards against reconstructing its "
                                         "standardised columns from the matrix)")
    share_feature_names: bool = Field(default=True, description="send this party's column names to the party "
                                                                "that learns the matrix (else: party:index)")


# --------------------------------------------------------------------------------------- local parts
def standardise_columns(X, missing: str = "mean", dot_precision_bits: int = DEFAULT_DOT_PRECISION_BITS
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Population z-scores of each column of ``X`` and which columns have no defined correlation.

    Args:
        X: float (n, p), NaN for a missing cell.
        missing: ``"mean"`` (a missing cell takes its column's mean of the present cells before the z-score)
            or ``"nan"`` (a column with any missing cell is undefined).
        dot_precision_bits: the product's plaintext precision (bounds n, see below).
    Returns:
        ``(Z, undefined)``: Z float64 (n, p) with ``(x - mean) / sd`` (sd with ddof 0, over the n rows) and
        0 in undefined columns; undefined bool (p,): constant (sd <= 1e-12 x max |x|), entirely missing, or
        (``missing="nan"``) with a missing cell.
    Raises:
        ValueError: X not 2-D, an infinite cell, fewer than 2 rows, or n - 1 >= 2^(2 (62 - dot_precision_bits))
            (a z-score could exceed the plaintext multiplier range).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D (rows, columns) array, got shape {X.shape}")
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"X: a correlation needs at least 2 rows, got {n}")
    if np.isinf(X).any():
        raise ValueError("X: infinite cells have no correlation; replace them first")
    if n - 1 >= 2 ** (2 * (62 - dot_precision_bits)):
        raise ValueError(f"X: {n} rows give z-scores up to sqrt({n - 1}), beyond the 2^{62 - dot_precision_bits} "
                         f"the dot_precision_bits={dot_precision_bits} encoding holds; lower dot_precision_bits")
    miss = np.isnan(X)
    empty = miss.all(axis=0)
    undefined = empty.copy()
    if missing == "nan":
        undefined |= miss.any(axis=0)
    elif missing != "mean":
        raise ValueError(f"missing: 'mean' or 'nan', got {missing!r}")
    if miss.any():
        means = np.zeros(X.shape[1])
        present = ~empty
        means[present] = np.nanmean(X[:, present], axis=0)
        X = np.where(miss, means, X)
    mu = X.mean(axis=0)
    sd = X.std(axis=0)
    undefined |= sd <= CONSTANT_RTOL * np.abs(X).max(axis=0)
    Z = np.zeros_like(X)
    ok = ~undefined
    Z[:, ok] = (X[:, ok] - mu[ok]) / sd[ok]
    return Z, undefined


def column_statistics(X, names: Sequence[str], quantiles: Sequence[float] = (0.01, 0.25, 0.5, 0.75, 0.99),
                      categorical: Sequence[str] = ()):
    """One party's report of its own columns (local; nothing is sent): a pandas DataFrame, one row per column.

    Args:
        X: float (n, p), NaN for a missing cell (categorical columns: category codes).
        names: p column names (the index of the result).
        quantiles: levels in [0, 1]; each gives a column ``q<level>`` (pandas' ``quantile``, linear
            interpolation, of the present cells).
        categorical: names of categorical columns: counts only, their numeric statistics are NaN.
    Returns:
        DataFrame indexed by name (``column``), p rows, with columns ``rows`` (n), ``missing`` (NaN cells),
        ``unique`` (distinct present values) as ints, and float64 ``mean``, ``std`` (sample, ddof 1, as
        pandas' ``describe``), ``min``, the quantiles, ``max``, in the units of X; statistics of a column
        without present cells are NaN.
    Raises:
        ValueError: X not 2-D, a name count that does not match X's columns, or a level outside [0, 1].
    """
    import pandas as pd

    X = np.asarray(X, dtype=np.float64)
    names = [str(c) for c in names]
    if X.ndim != 2:
        raise ValueError(f"X: expected a 2-D (rows, columns) array, got shape {X.shape}")
    if X.shape[1] != len(names):
        raise ValueError(f"names: {len(names)} names for the {X.shape[1]} columns of X; give one name per column")
    qs = [float(q) for q in quantiles]
    if any(not 0.0 <= q <= 1.0 for q in qs):
        raise ValueError(f"quantiles: levels must lie in [0, 1], got {qs}")
    frame = pd.DataFrame(X, columns=names)
    cat = set(categorical)
    stats = ["mean", "std", "min", *(quantile_name(q) for q in qs), "max"]
    rows = []
    for name in names:
        col = frame[name]
        row = {"rows": int(len(col)), "missing": int(col.isna().sum()), "unique": int(col.nunique(dropna=True))}
        if name in cat:  # counts only
            row.update(dict.fromkeys(stats, math.nan))
        else:
            row.update(mean=float(col.mean()), std=float(col.std()), min=float(col.min()),
                       **{quantile_name(q): float(col.quantile(q)) for q in qs}, max=float(col.max()))
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(names, name="column"))


def quantile_name(q: float) -> str:
    """The report's column name of quantile level ``q``: ``q0.25``, ``q0.5``, ``q0.01``."""
    return f"q{float(q):g}"


@dataclass(frozen=True)
class CrossCorrelation:
    """The Pearson matrix between the guest's and one host's columns.

    Attributes:
        host: the host's party id.
        guest_names, host_names: column names (p_g and p_h; the peer's as it announced them).
        r: float64 (p_g, p_h); NaN where a column is undefined (constant, empty, or missing under ``nan``).
    """

    host: str
    guest_names: list[str]
    host_names: list[str]
    r: np.ndarray


@dataclass
class CorrelationResult:
    """What one role ends with.

    Attributes:
        n_rows: rows the statistic used.
        reveal_to: the config's ``reveal_to``.
        matrices: the learner: host id -> :class:`CrossCorrelation` (the guest: one per host; a host: its
            own); the other party: empty.
    """

    n_rows: int
    reveal_to: str
    matrices: dict[str, CrossCorrelation] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- the roles
class _Role(VerticalRole):
    protocol = "vertical correlation"

    def __init__(self, transport: Transport, X, config, backend, feature_names):
        self.config = config if isinstance(config, CorrelationConfig) else CorrelationConfig(**config)
        cfg = self.config
        backend = cfg.he_scheme if backend is None else backend
        super().__init__(transport, backend, cfg.precision_bits, cfg.dot_precision_bits)
        self.Z, self.undefined = standardise_columns(X, cfg.missing, self.he.dot_precision_bits)
        self.n, self.p = self.Z.shape
        if self.p < 1:
            raise ValueError("X: no columns to correlate; give this party at least one numeric column")
        if self.p > cfg.max_features:
            raise ValueError(f"X: {self.p} columns exceed max_features={cfg.max_features}; drop columns or raise "
                             f"max_features (the same value at every party)")
        self.names = self._anonymous_names() if feature_names is None else [str(c) for c in feature_names]
        if len(self.names) != self.p:
            raise ValueError(f"feature_names: {len(self.names)} names for {self.p} columns of X; give one name "
                             f"per column")

    def _anonymous_names(self) -> list[str]:
        """``<party id>:<column index>`` for each of this party's columns."""
        return [f"{self.party_id}:{j}" for j in range(self.p)]

    def _shared_names(self) -> list[str]:
        """This party's column names as the learner sees them."""
        if self.config.share_feature_names:
            return [c[:MAX_NAME] for c in self.names]
        return self._anonymous_names()

    def _check_learner_columns(self, p_learner: int, who: str) -> None:
        """Refuse (:class:`CorrelationRefused`) unless n - 1 > min_rows_per_feature x the learner's columns."""
        ratio = self.config.min_rows_per_feature
        if not self.n - 1 > ratio * p_learner:
            raise CorrelationRefused(
                f"{self.party_id}: {who} would learn the correlation of its {p_learner} columns with ours over "
                f"{self.n} rows; that needs rows - 1 > min_rows_per_feature ({ratio:g}) x {p_learner} (the matrix "
                f"would reveal too much of our standardised columns); use fewer columns or reveal_to "
                f"{'host' if self.config.reveal_to == 'guest' else 'guest'}")

    def _finish(self, S: np.ndarray, undefined_g: np.ndarray, undefined_h: np.ndarray) -> np.ndarray:
        """R = S / n (p_g, p_h) float64, NaN in the rows / columns of undefined columns."""
        r = np.asarray(S, dtype=np.float64) / self.n
        r[undefined_g, :] = np.nan
        r[:, undefined_h] = np.nan
        return r


def _names_from(msg: messages_pb2.Bundle, p: int, what: str) -> list[str]:
    try:
        names = json.loads(msg.text.get("names", ""))
    except ValueError:
        raise ProtocolError(f"{what}: names are not JSON") from None
    if not isinstance(names, list) or len(names) != p or \
            not all(isinstance(c, str) and len(c) <= MAX_NAME for c in names):
        raise ProtocolError(f"{what}: names must be a list of {p} strings of at most {MAX_NAME} characters")
    return names


def _undefined_from(msg: messages_pb2.Bundle, p: int, what: str) -> np.ndarray:
    if "undefined" not in msg.tensors:
        raise ProtocolError(f"{what}: no 'undefined' flags")
    flags = tensor_from_proto(msg.tensors["undefined"], what=f"{what} undefined", dtype="<f8", shape=(p,))
    if not np.all((flags == 0) | (flags == 1)):
        raise ProtocolError(f"{what}: undefined flags must be 0 or 1")
    return flags.astype(bool)


def _chunks(n: int, rows: int) -> list[tuple[int, int]]:
    """``[a, b)`` row bounds of the ``corr.zg`` chunks: ``rows`` rows each, the last one shorter."""
    return [(a, min(n, a + rows)) for a in range(0, n, rows)]


def _put_columns(msg: messages_pb2.Bundle, names: list[str], undefined: np.ndarray) -> None:
    msg.text["names"] = json.dumps(names)
    msg.tensors["undefined"].CopyFrom(tensor_to_proto(undefined.astype(np.float64), "<f8"))


class CorrelationGuest(_Role):
    """The guest's side: holds the key pair, encrypts its z-scores once for every host.

    Args:
        transport: this party's transport.
        host_ids: the hosts, in the same order at every party.
        X: float (n, p_g) the guest's columns over the aligned rows (NaN: missing), 1 <= p_g <= max_features.
        config: :class:`CorrelationConfig` (or a dict of its fields).
        feature_names: p_g names (default ``guest:0`` ...).
        keypair: (public, private) of ``config.he_scheme``, or a Future of one
            (:func:`~secureflhv.crypto.homomorphic.key_prefetch.prefetch_keypair`); default: generated.
        backend: "paillier" / "ou" (default: ``config.he_scheme``), "identity" (NO encryption: benchmarks)
            or an :class:`~secureflhv.crypto.homomorphic.backend.HEBackend`.

    Raises (constructor): ValueError for X (see :func:`standardise_columns`), no hosts, or names that do not fit.

    What the guest learns: with ``reveal_to: guest`` every host's matrix R_h (p_g, p_h), its column names
    and undefined columns, i.e. p_g linear functionals of each standardised host column (module docstring);
    with ``reveal_to: host`` nothing but p_h (it decrypts uniformly masked values only).
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], X, config, *, feature_names=None,
                 keypair=None, backend=None):
        super().__init__(transport, X, config, backend, feature_names)
        self.host_ids = list(host_ids)
        if not self.host_ids:
            raise ValueError("host_ids: a cross-party correlation needs at least one host")
        self._keypair = keypair

    def _peers(self) -> list[str]:
        return list(self.host_ids)

    def run(self) -> CorrelationResult:
        """Run the protocol with every host.

        Returns: :class:`CorrelationResult` (matrices for every host with ``reveal_to: guest``, else empty).
        Raises: CorrelationRefused (a host has too many columns for the rows, ``reveal_to: host``);
            PeerTimeout naming a host that sent nothing valid in time; JobAborted when a host failed.
        """
        return self._guarded(self._run)

    def chunk_rows(self, pub) -> int:
        """Rows per ``corr.zg`` message (int in [1, n]): p_g ciphertexts of ``pub.byte_width`` bytes (8 when
        the key has none, e.g. the identity backend) per row, at most ``CHUNK_BYTES`` and a quarter of the
        transport's message limit less 4 KiB of framing per message; at least 1 row however small the limit."""
        width = int(getattr(pub, "byte_width", 8) or 8) * self.p
        limit = self.t.max_payload_bytes
        budget = CHUNK_BYTES if limit is None else min(CHUNK_BYTES, int(limit) // 4 - 4096)
        return max(1, min(self.n, budget // width))

    def _run(self) -> CorrelationResult:
        cfg, t = self.config, self.t
        pub, priv = resolve_keypair(self._keypair) or self.he.generate_keypair(cfg.key_bits, cfg.insecure_test_key)
        rows = self.chunk_rows(pub)
        setup = messages_pb2.Bundle(
            scalars={"n_rows": float(self.n), "p_g": float(self.p), "chunk_rows": float(rows)},
            text=_setup_text(cfg))
        if cfg.reveal_to == "host":
            _put_columns(setup, self._shared_names(), self.undefined)
        key = self.wire.public_key_to_proto(pub)
        for h in self.host_ids:
            t.send(h, TAG_SETUP, setup, round=0)
            t.send(h, TAG_PUBKEY, key, round=0)
        hello = {h: t.recv(h, TAG_HELLO, round=0, parse=self._hello_parser(h)) for h in self.host_ids}
        if cfg.reveal_to == "host":
            for h, (p_h, _, _) in hello.items():
                self._check_learner_columns(p_h, f"host {h!r}")
        log.info("%s: correlating %d columns with %s over %d rows (reveal_to %s)", self.party_id, self.p,
                 {h: v[0] for h, v in hello.items()}, self.n, cfg.reveal_to)
        self._stream(priv, rows)
        out = CorrelationResult(self.n, cfg.reveal_to)
        tag = TAG_RESULT if cfg.reveal_to == "guest" else TAG_MASKED
        product = self._exponent(dots=1)  # every honest [[S]]: a fresh encryption times one plaintext product
        for h in self.host_ids:
            p_h, names_h, undefined_h = hello[h]
            enc = t.recv(h, tag, round=1, parse=self._enc_parser(pub, (self.p, p_h), f"{tag} from {h}", product))
            if cfg.reveal_to == "guest":
                r = self._finish(self.he.decrypt(priv, enc), self.undefined, undefined_h)
                out.matrices[h] = CrossCorrelation(h, list(self.names), names_h, r)
            else:
                self._send_decrypted(priv, enc, h, TAG_UNMASK, 2)
        return out

    def _stream(self, priv, rows: int) -> None:
        """Encrypt Z_g chunk by chunk (once) and send each chunk to every host, WINDOW in flight per host."""
        bounds = _chunks(self.n, rows)
        for k, (a, b) in enumerate(bounds):
            proto = self.wire.to_proto(self.he.encrypt(priv, self.Z[a:b]))
            for h in self.host_ids:
                if k >= WINDOW:
                    self._ack(h, k - WINDOW)
                self.t.send(h, TAG_ZG, proto, round=k + 1)
        for h in self.host_ids:
            for k in range(max(0, len(bounds) - WINDOW), len(bounds)):
                self._ack(h, k)

    def _ack(self, host: str, part: int) -> None:
        def check(m: messages_pb2.Scalars):
            if m.values.get("part") != float(part):
                raise ProtocolError(f"{TAG_ACK} from {host}: acknowledges part {m.values.get('part')!r}, "
                                    f"expected {part}")
        self.t.recv(host, TAG_ACK, round=part + 1, parse=parse_message(messages_pb2.Scalars, check))

    def _hello_parser(self, host: str):
        cfg, what = self.config, f"{TAG_HELLO} from {host}"

        def validate(m: messages_pb2.Bundle):
            p_h = whole_count(m.scalars.get("p_h", -1.0), f"{what}: p_h", lo=1, hi=cfg.max_features + 1)
            if cfg.reveal_to == "guest":
                return p_h, _names_from(m, p_h, what), _undefined_from(m, p_h, what)
            return p_h, None, None

        return parse_message(messages_pb2.Bundle, validate)


def _setup_text(cfg: CorrelationConfig) -> dict:
    """The settings guest and hosts must share, as the setup's text fields (a host compares them to its own)."""
    return {"reveal_to": cfg.reveal_to, "he_scheme": cfg.he_scheme, "missing": cfg.missing,
            "precision": f"{cfg.precision_bits}/{cfg.dot_precision_bits}",
            "min_rows_per_feature": repr(float(cfg.min_rows_per_feature))}


class CorrelationHost(_Role):
    """A host's side: multiplies the guest's encrypted z-scores with its own.

    Args:
        transport: this party's transport.
        guest_id: the guest's party id.
        X: float (n, p_h) the host's columns over the aligned rows (same n and order as the guest's),
            1 <= p_h <= max_features.
        config, feature_names, backend: as :class:`CorrelationGuest`.

    Raises (constructor): ValueError for X (see :func:`standardise_columns`) or names that do not fit.

    What the host learns: with ``reveal_to: host`` its own matrix R_h (p_g, p_h), the guest's column names
    and undefined columns, i.e. p_h linear functionals of each standardised guest column; with
    ``reveal_to: guest`` nothing but n, p_g and the chunk size (it sees only ciphertexts under the guest's
    key). Never anything about other hosts.
    """

    def __init__(self, transport: Transport, guest_id: str, X, config, *, feature_names=None, backend=None):
        super().__init__(transport, X, config, backend, feature_names)
        self.guest_id = guest_id

    def _peers(self) -> list[str]:
        return [self.guest_id]

    def run(self) -> CorrelationResult:
        """Run the protocol with the guest.

        Returns: :class:`CorrelationResult` (its own matrix with ``reveal_to: host``, else empty).
        Raises: CorrelationRefused (the guest has too many columns for the rows, ``reveal_to: guest``);
            PeerTimeout naming the guest when nothing valid arrives in time; JobAborted when it failed.
        """
        return self._guarded(self._run)

    def _run(self) -> CorrelationResult:
        cfg, t, g = self.config, self.t, self.guest_id
        p_g, rows, names_g, undefined_g = t.recv(g, TAG_SETUP, round=0, parse=self._setup_parser())
        pub = t.recv(g, TAG_PUBKEY, round=0,
                     parse=self.wire.public_key_parser(cfg.insecure_test_key, f"{TAG_PUBKEY} from {g}"))
        if cfg.reveal_to == "guest":
            self._check_learner_columns(p_g, f"the guest {g!r}")
        hello = messages_pb2.Bundle(scalars={"p_h": float(self.p)})
        if cfg.reveal_to == "guest":
            _put_columns(hello, self._shared_names(), self.undefined)
        t.send(g, TAG_HELLO, hello, round=0)
        fresh = self._exponent()
        S = None
        for k, (a, b) in enumerate(_chunks(self.n, rows)):
            enc = t.recv(g, TAG_ZG, round=k + 1,
                         parse=self._enc_parser(pub, (b - a, p_g), f"{TAG_ZG} part {k} from {g}", fresh))
            t.send(g, TAG_ACK, messages_pb2.Scalars(values={"part": float(k)}), round=k + 1)
            part = self.he.t_matmul(enc, self.Z[a:b])
            S = part if S is None else S + part
        out = CorrelationResult(self.n, cfg.reveal_to)
        if cfg.reveal_to == "guest":
            self._send_enc(g, TAG_RESULT, self._rerandomised(pub, S), 1)
            return out
        mask = self._ask_decrypt(pub, S, g, TAG_MASKED, 1)
        plain = self._take_decrypted(pub, mask, g, TAG_UNMASK, 2, (p_g, self.p))
        r = self._finish(plain, undefined_g, self.undefined)
        out.matrices[self.party_id] = CrossCorrelation(self.party_id, names_g, list(self.names), r)
        return out

    def _rerandomised(self, pub, enc):
        """``enc`` times a fresh encryption of 0 at its own exponent: the guest cannot relate the result's
        randomness to the randomness of its own encryptions (hence to Z_h). Identity backend: unchanged."""
        if self.he.name == "identity":
            return enc
        zero = make_backend(self.he.name, -enc.exponent, self.he.dot_precision_bits).encrypt(pub, np.zeros(enc.shape))
        if zero.exponent != enc.exponent:
            raise AssertionError(f"re-randomisation at exponent {zero.exponent}, result at {enc.exponent}")
        return enc + zero

    def _setup_parser(self):
        cfg, what = self.config, f"{TAG_SETUP} from {self.guest_id}"
        ours = _setup_text(cfg)

        def validate(m: messages_pb2.Bundle):
            for k, v in ours.items():
                theirs = m.text.get(k)
                if theirs != v:
                    field = "precision_bits/dot_precision_bits" if k == "precision" else k
                    raise ProtocolError(f"{what}: {k} is {theirs!r} at the guest but {v!r} here; set {field} "
                                        f"the same at the guest and every host")
            n = whole_count(m.scalars.get("n_rows", -1.0), f"{what}: n_rows")
            if n != self.n:
                raise ProtocolError(f"{what}: {n} aligned rows at the guest but {self.n} here (align the rows by "
                                    f"PSI first, with the same row selection at every party)")
            p_g = whole_count(m.scalars.get("p_g", -1.0), f"{what}: p_g", lo=1, hi=cfg.max_features + 1)
            rows = whole_count(m.scalars.get("chunk_rows", -1.0), f"{what}: chunk_rows", lo=1, hi=self.n + 1)
            if cfg.reveal_to == "host":
                return p_g, rows, _names_from(m, p_g, what), _undefined_from(m, p_g, what)
            return p_g, rows, None, None

        return parse_message(messages_pb2.Bundle, validate)
