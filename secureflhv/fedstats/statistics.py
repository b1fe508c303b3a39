"""Summable statistics for federated preprocessing of horizontal jobs, as exact integers.

Horizontal clients hold different rows of the same columns. To standardise, impute and one-hot encode
the same way everywhere (and, for trees, to bin on one global grid) they need *global* statistics.
This module computes each client's share as a vector of integers whose sum over clients is the
vector of the pooled rows; :mod:`secureflhv.fedstats.preprocessing` sums them by secure aggregation
(Bonawitz et al. 2017), so the server learns the sums and nothing else. Every entry is an integer of
magnitude below 2^52 and is sent as ``m / 2^40`` under clip 2^12, scale 2^40 and weight 1
(:data:`AGG_CLIP`, :data:`AGG_SCALE_BITS`), which the fixed-point quantisation of secure aggregation
carries *without rounding*: the server's sums are the pooled integers exactly.

Two rounds (a column spec :class:`StatsSpec` fixes the layout at every party):

* **Round A: counts and a range sketch** (:func:`round_a_vector`). The pooled row count; per numeric
  column its non-missing and missing counts and a *log-magnitude histogram*: counts of values per
  bucket ``[2^(e/P), 2^((e+1)/P))`` of |v| (P = :data:`BUCKETS_PER_OCTAVE` = 8, so the bucket ratio
  is gamma = 2^(1/8) ~ 1.0905) for each sign, |v| from 2^-24 (below: one zero bucket) up to 2^40
  (larger magnitudes are refused: declare public ``ranges``); per categorical column its missing count
  and the count of each category of the declared vocabulary. From the pooled histogram the server
  takes a global range ``[lo, hi]``: the outer boundaries of the lowest and highest non-empty buckets.
  It contains every pooled value, and each end is off by at most ``(gamma - 1) * |end|`` (about 9%
  of the extreme value's magnitude) or 2^-24. With public ``ranges`` (e.g. declared bounds) the
  histogram is not sent and ``[lo, hi]`` are those.
* **Round B: moments** (:func:`round_b_vector`, optional). With ``c = (lo + hi) / 2`` and
  ``delta = (hi - lo) / 2^(b+1)``, every present value becomes ``q = round((v - c) / delta)``, an
  integer with |q| <= 2^b; per numeric column a client sends ``sum q`` and ``sum q^2`` (and the count
  of values it had to clip into a public range). ``b`` is public: :func:`moment_bits` of the pooled
  row count N from round A, b = min(24, floor((51 - bit_length(N)) / 2)), so N * 4^b < 2^51 and no
  client's sum of squares can reach the exact-integer limit. The pooled moments are exact sums of the q's.

Numeric error (stated; tests check it): the only rounding is ``v -> c + q delta``, |error| <= delta/2
per value. Hence for each numeric column, with R = hi - lo:

* mean:     |mean_fed - mean_pooled| <= delta / 2 = R / 2^(b+2);
* variance: |var_fed - var_pooled| <= delta * sd_q + delta^2 / 4 <= delta * R / 2 + delta^2 / 4 (sd_q: the
  standard deviation of the quantised values, at most R / 2; from Var(u + e) - Var(u) = 2 Cov(u, e) +
  Var(e) with |e| <= delta / 2), plus float64 rounding of the final division (1e-15 R^2);
* counts, category counts, missing counts, most-frequent categories: exact.

For N = 10^4 rows, b = 18: the mean is within R * 2^-20 ~ 1e-6 R. Values outside public ranges
are clipped to them before quantising (their count is reported): then the bounds hold for the
clipped data only.

Differential privacy (``dp``, :mod:`secureflhv.fedstats.stats_privacy`): each client adds integer Skellam
noise to both rounds' vectors before masking, so the pooled counts and moments are noised (record-level DP).
Every consumer here is then robust to noisy values, by post-processing only (which costs no privacy): counts
are clamped (row count >= 1, other counts >= 0), a mean divides by max(count, 1) and is clamped into [lo, hi],
a variance into [0, ((hi - lo) / 2)^2]; no column is refused as all-missing; a missing indicator needs a noisy
missing count above ``missing_threshold``; clipped counts are not released (sent as 0). The error bounds
above then cover the quantisation only; the noise adds its own (``to_dict`` gives its std).

What the server learns: the column layout (names, declared vocabularies: the schema), the pooled
row count, per column the pooled non-missing/missing counts, category counts and log-magnitude
histogram (hence the global range to within a bucket), the pooled sum q and sum q^2 (hence global
mean and variance), and who took part. Never a client's own counts, sums or rows (secure
aggregation; the plain kinds reveal each client's vector). Clients learn the same pooled values.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..data.tabular import Preprocessor

AGG_SCALE_BITS = 40            # entries are sent as m / 2^40 ...
AGG_CLIP = float(2 ** 12)      # ... with |m| < 2^52, so quantisation is exact
EXACT_LIMIT = 1 << 52
BUCKETS_PER_OCTAVE = 8
EXP_MIN, EXP_MAX = -24, 40     # log-magnitude buckets cover [2^-24, 2^40)
N_MAG = (EXP_MAX - EXP_MIN) * BUCKETS_PER_OCTAVE   # buckets per sign
MAG_WIDTH = 2 * N_MAG + 1      # negative buckets, zero bucket, positive buckets
MAX_COLUMNS = 4096
MAX_CATEGORIES = 4096


class StatsError(ValueError):
    """A column spec, a table or a statistics vector that does not fit (names the column)."""


@dataclass(frozen=True)
class StatsSpec:
    """The columns whose statistics are summed; identical at the server and every client.

    Attributes:
        names: feature columns in table order.
        vocabularies: categorical column -> its declared values in code order (the schema's
            categories, then its "other" bucket); columns not listed are numeric.
        ranges: optional public (lo, hi) per numeric column (in order); then no magnitude histogram is
            sent and values outside are clipped.
        moments: run round B (sums and sums of squares: mean / variance).
    """

    names: tuple[str, ...]
    vocabularies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ranges: tuple[tuple[float, float], ...] | None = None
    moments: bool = True

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        object.__setattr__(self, "vocabularies", {str(k): tuple(str(c) for c in v)
                                                  for k, v in self.vocabularies.items()})
        if not 0 < len(self.names) <= MAX_COLUMNS or len(set(self.names)) != len(self.names):
            raise StatsError(f"columns: need 1..{MAX_COLUMNS} distinct names, got {len(self.names)}")
        for name, vocab in self.vocabularies.items():
            if name not in self.names:
                raise StatsError(f"vocabulary for unknown column {name!r}")
            if not 0 < len(vocab) <= MAX_CATEGORIES:
                raise StatsError(f"column {name!r}: 1..{MAX_CATEGORIES} categories, got {len(vocab)}")
        if self.ranges is not None:
            rng = tuple((float(lo), float(hi)) for lo, hi in self.ranges)
            if len(rng) != len(self.numeric):
                raise StatsError(f"ranges: {len(rng)} (lo, hi) pairs for {len(self.numeric)} numeric columns")
            for n, (lo, hi) in zip(self.numeric, rng):
                if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                    raise StatsError(f"ranges: column {n!r} has range [{lo}, {hi}], not a finite lo < hi")
            object.__setattr__(self, "ranges", rng)

    @property
    def numeric(self) -> list[str]:
        """The names of the numeric columns: every column without a vocabulary, in order."""
        return [n for n in self.names if n not in self.vocabularies]

    @property
    def categories(self) -> dict[str, list[str]]:
        """The vocabularies as lists (the :class:`~secureflhv.data.tabular.Preprocessor`'s form)."""
        return {k: list(v) for k, v in self.vocabularies.items()}

    def columns_json(self) -> str:
        """The layout a client announces (names and vocabularies; compared by the server)."""
        return json.dumps({"names": list(self.names), "vocabularies": {k: list(v) for k, v in self.vocabularies.items()}},
                          sort_keys=True)

    # -------------------------------------------------------------------------------- layouts
    @property
    def dim_a(self) -> int:
        """Length of a round-A vector: row count, then per column its block."""
        mag = 0 if self.ranges is not None else MAG_WIDTH
        return 1 + sum(1 + len(self.vocabularies[n]) if n in self.vocabularies else 2 + mag for n in self.names)

    @property
    def dim_b(self) -> int:
        """Length of a round-B vector: (sum q, sum q^2, clipped count) per numeric column."""
        return 3 * len(self.numeric)


def parse_columns_json(text: str) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(names, vocabularies) of a column layout (:meth:`StatsSpec.columns_json`); StatsError if malformed."""
    try:
        d = json.loads(text)
        names, vocab = d["names"], d["vocabularies"]
        if not isinstance(names, list) or not isinstance(vocab, dict) or \
                not all(isinstance(v, list) for v in vocab.values()):
            raise TypeError("names must be a list, vocabularies a mapping of lists")
        spec = StatsSpec(tuple(names), {k: tuple(v) for k, v in vocab.items()})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise StatsError(f"malformed column layout: {exc}") from None
    return spec.names, spec.vocabularies


def moment_bits(n_rows: int) -> int:
    """b of round B: min(24, floor((51 - bit_length(n_rows)) / 2)), so n_rows * 4^b < 2^51 (sums of q^2
    stay exact integers). Raises StatsError below b = 4 (more than 2^43 rows)."""
    b = (51 - max(int(n_rows), 1).bit_length()) // 2
    if b < 4:
        raise StatsError(f"{n_rows} rows are too many for exact moments (b={b})")
    return min(b, 24)


def _check_table(X: np.ndarray, spec: StatsSpec) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(spec.names):
        raise StatsError(f"table has shape {X.shape}, expected (rows, {len(spec.names)}) for {list(spec.names)[:5]}...")
    if len(X) >= EXACT_LIMIT >> 8:
        raise StatsError(f"{len(X)} rows: too many")
    if np.isinf(X).any():
        j = int(np.argmax(np.isinf(X).any(axis=0)))
        raise StatsError(f"column {spec.names[j]!r} holds an infinite value")
    return X


def magnitude_bucket(v: np.ndarray) -> np.ndarray:
    """Signed bucket index s in [-N_MAG, N_MAG] of each finite value (0: |v| < 2^EXP_MIN).

    s > 0: |v| in [2^(EXP_MIN + (s-1)/P), 2^(EXP_MIN + s/P)); s < 0 the same for -v. Raises StatsError
    for |v| >= 2^EXP_MAX. Bucket boundaries are exactly :func:`bucket_bounds`'s (one correction step
    after the logarithm), so every value lies inside its bucket.
    """
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    if (a >= 2.0 ** EXP_MAX).any():
        raise StatsError(f"|value| {a.max():g} >= 2^{EXP_MAX}: declare public ranges for this column")
    small = a < 2.0 ** EXP_MIN
    with np.errstate(divide="ignore"):
        k = np.floor((np.log2(np.where(small, 1.0, a)) - EXP_MIN) * BUCKETS_PER_OCTAVE).astype(np.int64)
    k = np.clip(k, 0, N_MAG - 1)
    k -= (_edge(k) > a) & ~small
    k += (_edge(k + 1) <= a) & ~small
    k = np.clip(k, 0, N_MAG - 1)
    s = np.where(small, 0, k + 1)
    return np.where(v < 0, -s, s)


def _edge(i) -> np.ndarray:
    """2^(EXP_MIN + i/P): the lower boundary of positive magnitude bucket i (0-based)."""
    return np.exp2(EXP_MIN + np.asarray(i, dtype=np.float64) / BUCKETS_PER_OCTAVE)


def bucket_bounds(s: int) -> tuple[float, float]:
    """[lower, upper] of signed bucket ``s`` (see :func:`magnitude_bucket`)."""
    if s == 0:
        t = float(_edge(0))
        return -t, t
    lo, hi = float(_edge(abs(s) - 1)), float(_edge(abs(s)))
    return (lo, hi) if s > 0 else (-hi, -lo)


def round_a_vector(X: np.ndarray, spec: StatsSpec) -> np.ndarray:
    """A client's round-A integers (int64 (spec.dim_a,)) of ``X`` (rows, columns; NaN = missing;
    categorical cells hold codes into the vocabulary).

    Raises StatsError naming the column for a code outside the vocabulary, an infinite value, or a
    magnitude the sketch cannot hold.
    """
    X = _check_table(X, spec)
    out = [np.array([len(X)], dtype=np.int64)]
    for j, name in enumerate(spec.names):
        col = X[:, j]
        ok = ~np.isnan(col)
        v = col[ok]
        if name in spec.vocabularies:
            k = len(spec.vocabularies[name])
            if ((v < 0) | (v >= k) | (v != np.round(v))).any():
                raise StatsError(f"column {name!r}: category code outside 0..{k - 1}")
            out += [np.array([len(col) - len(v)], dtype=np.int64), np.bincount(v.astype(np.int64), minlength=k)]
        else:
            out.append(np.array([len(v), len(col) - len(v)], dtype=np.int64))
            if spec.ranges is None:
                try:
                    s = magnitude_bucket(v)
                except StatsError as exc:
                    raise StatsError(f"column {name!r}: {exc}") from None
                out.append(np.bincount(s + N_MAG, minlength=MAG_WIDTH).astype(np.int64))
    vec = np.concatenate(out)
    assert vec.shape == (spec.dim_a,)
    return vec


@dataclass
class Counts:
    """Pooled round-A results: row count, per column present/missing counts, category counts, ranges."""

    n_rows: int
    present: dict[str, int]
    missing: dict[str, int]
    category_counts: dict[str, np.ndarray]
    lo: np.ndarray           # per numeric column
    hi: np.ndarray
    magnitude: dict[str, np.ndarray] | None = None   # per numeric column, signed buckets -N_MAG..N_MAG
    noisy: bool = False      # DP: noised sums, clamped (n_rows >= 1, counts >= 0)


def decode_round_a(total: np.ndarray, spec: StatsSpec, *, noisy: bool = False) -> Counts:
    """Split a pooled round-A vector (integers, float64 or int64 (dim_a,)) into :class:`Counts` and
    derive the global ranges (public ``spec.ranges``, else from the magnitude histograms; a numeric
    column with no present value gets [0, 1] and its all-missing state is reported by the caller).
    ``noisy`` (DP): the sums carry noise; negatives are allowed and clamped (row count to >= 1, every
    other count to >= 0), and public ranges are required.

    Raises StatsError when the vector has the wrong shape or holds non-integers / negatives (unless
    ``noisy``), or ``noisy`` without public ranges.
    """
    t = np.asarray(total, dtype=np.float64)
    if t.shape != (spec.dim_a,) or not np.all(np.isfinite(t)):
        raise StatsError(f"round-A statistics have shape {t.shape}, expected ({spec.dim_a},)")
    if (t != np.round(t)).any() or (t < 0).any() and not noisy:
        raise StatsError("round-A statistics must be non-negative integers")
    if noisy and spec.ranges is None:
        raise StatsError("noised statistics need public ranges (no range sketch under differential privacy)")
    t = np.maximum(t, 0).astype(np.int64)
    t[0] = max(t[0], 1)
    n = int(t[0])
    at = 1
    present, missing, cats, mags, lo, hi = {}, {}, {}, {}, [], []
    for name in spec.names:
        if name in spec.vocabularies:
            k = len(spec.vocabularies[name])
            missing[name] = int(t[at])
            cats[name] = t[at + 1:at + 1 + k].copy()
            present[name] = int(cats[name].sum())
            at += 1 + k
            continue
        present[name], missing[name] = int(t[at]), int(t[at + 1])
        at += 2
        if spec.ranges is None:
            m = t[at:at + MAG_WIDTH]
            at += MAG_WIDTH
            mags[name] = m
            nz = np.flatnonzero(m)
            if len(nz):
                lo.append(bucket_bounds(int(nz[0]) - N_MAG)[0])
                hi.append(bucket_bounds(int(nz[-1]) - N_MAG)[1])
            else:
                lo.append(0.0), hi.append(1.0)
    if spec.ranges is not None:
        lo, hi = [r[0] for r in spec.ranges], [r[1] for r in spec.ranges]
    return Counts(n, present, missing, cats, np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64),
                  mags if spec.ranges is None else None, noisy)


def quantise_values(v: np.ndarray, lo: float, hi: float, b: int) -> tuple[np.ndarray, int]:
    """q = round((clip(v) - c) / delta) (int64, |q| <= 2^b) and the number of values clipped to [lo, hi]."""
    c, delta = (lo + hi) / 2, (hi - lo) / 2.0 ** (b + 1)
    clipped = int(np.count_nonzero((v < lo) | (v > hi)))
    q = np.rint((np.clip(v, lo, hi) - c) / delta).astype(np.int64)
    return np.clip(q, -(1 << b), 1 << b), clipped


def round_b_vector(X: np.ndarray, spec: StatsSpec, counts: Counts, bits: int | None = None) -> np.ndarray:
    """A client's round-B integers (int64 (spec.dim_b,)): per numeric column sum q, sum q^2, clipped count.

    ``bits``: b (default :func:`moment_bits` of the pooled row count). Noisy counts (DP): ``bits`` is
    required (it must leave room for the noise: :mod:`~secureflhv.fedstats.stats_privacy`), the pooled row
    count is not compared with this client's (the noise may put it lower) and the clipped counts are 0
    (not released). Raises StatsError for a table that does not fit, or noisy counts without ``bits``.
    """
    X = _check_table(X, spec)
    if counts.noisy and bits is None:
        raise StatsError("noised counts: pass the moment bits the DP plan allows")
    b = moment_bits(counts.n_rows) if bits is None else int(bits)
    if len(X) > counts.n_rows and not counts.noisy:
        raise StatsError(f"this client has {len(X)} rows, more than the pooled {counts.n_rows}")
    out = []
    for i, name in enumerate(spec.numeric):
        col = X[:, spec.names.index(name)]
        q, clipped = quantise_values(col[~np.isnan(col)], counts.lo[i], counts.hi[i], b)
        out += [int(q.sum()), int((q * q).sum()), 0 if counts.noisy else clipped]
    vec = np.array(out, dtype=np.int64)
    assert vec.shape == (spec.dim_b,) and np.all(np.abs(vec) < EXACT_LIMIT)
    return vec


@dataclass
class FederatedStatistics:
    """The pooled statistics of a horizontal job (what :mod:`~secureflhv.fedstats.preprocessing` returns).

    Attributes:
        spec: the columns.
        counts: round A (:class:`Counts`).
        moments: round B, int64 (n_numeric, 3): sum q, sum q^2, clipped count (None without round B).
        bits: b of round B.
        participants: the clients whose rows are in the sums.
        privacy: DP only: the (ε, δ) record (:meth:`secureflhv.dp.integer_sums.SumAccountant.record`) and
            the noise's std per release (``noise_std``, integer units).
        missing_threshold: a column counts as having missing cells when its (noisy) missing count exceeds
            this (0 without DP).
    """

    spec: StatsSpec
    counts: Counts
    moments: np.ndarray | None = None
    bits: int | None = None
    participants: list[str] = field(default_factory=list)
    privacy: dict | None = None
    missing_threshold: float = 0.0

    @property
    def delta(self) -> np.ndarray:
        """Quantisation step per numeric column: (hi - lo) / 2^(b+1)."""
        return (self.counts.hi - self.counts.lo) / 2.0 ** (self.bits + 1)

    def mean_var(self) -> tuple[np.ndarray, np.ndarray]:
        """Global mean and (population) variance per numeric column, float64 (n_numeric,) each.

        Noisy (DP) statistics: post-processed to be valid, the count at least 1, the mean in [lo, hi], the
        variance in [0, ((hi - lo) / 2)^2] (the most a variable in [lo, hi] can have).

        Raises StatsError naming a column that is missing in every row (not under DP), or when round B
        did not run.
        """
        if self.moments is None:
            raise StatsError("no moments: the statistics were computed without round B")
        c = (self.counts.lo + self.counts.hi) / 2
        n = np.array([self.counts.present[nm] for nm in self.spec.numeric], dtype=np.float64)
        self._check_present()
        s1, s2 = self.moments[:, 0].astype(np.float64), self.moments[:, 1].astype(np.float64)
        if self.counts.noisy:   # post-processing of noised sums
            n, half = np.maximum(n, 1.0), 2.0 ** self.bits
            m1 = np.clip(s1 / n, -half, half)
            var = np.clip(s2 / n - m1 * m1, 0.0, half * half) * self.delta ** 2
            return c + self.delta * m1, var
        m1 = s1 / n
        var = np.maximum(s2 / n - m1 * m1, 0.0) * self.delta ** 2
        return c + self.delta * m1, var

    def error_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Stated bounds (mean, variance) per numeric column: delta/2 and delta * (hi - lo)/2 + delta^2/4
        (plus 1e-15 (hi - lo)^2 for float64 rounding)."""
        d, r = self.delta, self.counts.hi - self.counts.lo
        return d / 2, d * r / 2 + d * d / 4 + 1e-15 * r * r

    def _check_present(self) -> None:
        if self.counts.noisy:   # a noised count of 0 proves nothing; the clamps keep every value defined
            return
        for name in self.spec.names:
            if self.counts.present[name] <= 0:
                raise StatsError(f"feature {name!r} is missing in every training row (all clients)")

    def preprocessor(self, *, standardize: bool = True, missing_indicator: bool = False) -> Preprocessor:
        """The global :class:`~secureflhv.data.tabular.Preprocessor`: mean imputation and standardisation
        (federated mean / variance), most-frequent imputation and one-hot over the declared vocabulary,
        missing indicators for columns with a missing cell at any client. Same at every client.

        Raises StatsError for a column missing in every row.
        """
        self._check_present()
        spec, c = self.spec, self.counts
        d = len(spec.names)
        mean, std, mode = np.full(d, np.nan), np.full(d, np.nan), np.full(d, np.nan)
        if self.moments is not None:
            m, v = self.mean_var()
        elif standardize or any(c.missing[n] > self.missing_threshold for n in spec.numeric):
            raise StatsError("standardisation and mean imputation need the moments (round B)")
        else:
            m = v = np.zeros(len(spec.numeric))
        i = 0
        for j, name in enumerate(spec.names):
            if name in spec.vocabularies:
                mode[j] = float(np.argmax(c.category_counts[name]))
            else:
                mean[j], std[j] = m[i], np.sqrt(v[i])
                i += 1
        std[~(std > 0)] = 1.0
        std[np.isnan(mean)] = np.nan
        indicator = np.array([missing_indicator and c.missing[n] > self.missing_threshold for n in spec.names],
                             dtype=bool)
        return Preprocessor(list(spec.names), spec.categories, mean, std, mode, indicator, standardize)

    def to_dict(self) -> dict:
        """JSON-ready summary (the pooled sums and derived values; saved with the model)."""
        c = self.counts
        out = {"n_rows": c.n_rows, "participants": list(self.participants),
               "present": c.present, "missing": c.missing,
               "category_counts": {k: v.tolist() for k, v in c.category_counts.items()},
               "ranges": {n: [float(c.lo[i]), float(c.hi[i])] for i, n in enumerate(self.spec.numeric)},
               "range_source": "public" if self.spec.ranges is not None else "log-magnitude sketch (gamma 2^(1/8))"}
        if self.moments is not None:
            mean, var = self.mean_var()
            em, ev = self.error_bounds()
            out.update({"moment_bits": self.bits, "mean": mean.tolist(), "variance": var.tolist(),
                        "mean_error_bound": em.tolist(), "variance_error_bound": ev.tolist(),
                        "clipped": None if c.noisy else self.moments[:, 2].tolist()})
        if self.privacy is not None:
            out["privacy"] = self.privacy
        return out
