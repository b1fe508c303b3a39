"""Federated WOE binning (:mod:`secureflhv.vertical.woe_binning`) in threads over the in-process
transport: the host's per-bin counts the guest decrypts equal a pandas crosstab of the joined table,
the IV equals a twin written here with pandas, and a lying host is named."""
from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from secureflhv.data.woe import ColumnBins, column_edges, monotonic_groups, woe_iv
from secureflhv.transport import InProcessNetwork
from secureflhv.vertical import woe_binning as wb

MAX_BINS = 8


def _data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    X[rng.random(n) < 0.05, 1] = np.nan  # missing values: their own bin
    X[:, 2] = rng.integers(0, 4, n)       # a categorical code column: one bin per value
    logit = 1.5 * X[:, 0] - 0.5 * np.nan_to_num(X[:, 1]) + 0.3 * X[:, 2]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return X, y


def _bins(X, method="quantile"):
    return [ColumnBins(f"h{j}", column_edges(X[:, j], method, MAX_BINS)) for j in range(X.shape[1])]


def _run(X_hosts, y, n_classes=2, host_cls=wb.BinningHost, decisions=None, deadline=30.0, **guest_kw):
    host_ids = [f"host-{i}" for i in range(1, len(X_hosts) + 1)]
    net = InProcessNetwork("woe-test", ["guest", *host_ids], deadline=deadline)
    guest = wb.BinningGuest(net.transport("guest"), host_ids, y, n_classes, max_features=10, max_bins=MAX_BINS,
                            key_bits=1024, insecure_test_key=True, **guest_kw)
    hosts = [host_cls(net.transport(h), "guest", _bins(X), X, max_bins=MAX_BINS, insecure_test_key=True)
             for h, X in zip(host_ids, X_hosts)]
    out, errors = {}, {}

    def host(role):
        try:
            out[role.party_id] = role.run()
        except Exception as exc:  # noqa: BLE001
            errors[role.party_id] = exc

    threads = [threading.Thread(target=host, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    try:
        out["guest"] = guest.host_counts()
        guest.send_decisions(decisions or {h: wb.HostDecision(
            [np.ones(b.n_bins - 2, bool) for b in role.bins], [True] * len(role.bins), None)
            for h, role in zip(host_ids, hosts)})
    except Exception as exc:  # noqa: BLE001
        errors["guest"] = exc
    for t in threads:
        t.join(60)
    return out, errors, hosts


def _crosstab(x, bins: ColumnBins, y, n_classes):
    """Rows per bin and class, computed here with pandas from the values and the cuts (left-closed)."""
    cut = pd.cut(pd.Series(x), [-np.inf, *bins.edges, np.inf], right=False, labels=False)
    cut = cut.fillna(len(bins.edges) + 1).astype(int)
    tab = pd.crosstab(cut, pd.Series(y)).reindex(index=range(bins.n_bins), columns=range(n_classes), fill_value=0)
    return tab.to_numpy()


def test_host_counts_equal_the_joined_tables_crosstab_for_binary_and_multiclass():
    X, y = _data()
    out, errors, hosts = _run([X[:, :2], X[:, 1:]], y)
    assert not errors, errors
    for h, role in zip(["host-1", "host-2"], hosts):
        got = out["guest"][h]
        assert got.names == [b.name for b in role.bins]
        for j, b in enumerate(role.bins):
            assert np.array_equal(got.counts[j], _crosstab(role.X[:, j], b, y, 2)), (h, j)
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])  # 3 classes: two passes, the second with one empty slot
    out, errors, hosts = _run([X], y3, n_classes=3)
    assert not errors, errors
    for j, b in enumerate(hosts[0].bins):
        assert np.array_equal(out["guest"]["host-1"].counts[j], _crosstab(X[:, j], b, y3, 3))


def test_iv_equals_a_pandas_twin_with_the_same_bins():
    X, y = _data(seed=3)
    out, errors, hosts = _run([X], y)
    assert not errors, errors
    for j, b in enumerate(hosts[0].bins):
        c = out["guest"]["host-1"].counts[j]
        woe, iv = woe_iv(c[:, 1], c[:, 0])
        # twin: pandas groupby on the joined table, 0.5 added to both counts of a bin lacking either class
        df = pd.DataFrame({"bin": b.index(X[:, j]), "y": y})
        g = df.groupby("bin")["y"].agg(["sum", "count"]).reindex(range(b.n_bins), fill_value=0)
        ev, ne = g["sum"].astype(float), (g["count"] - g["sum"]).astype(float)
        adj = ((ev == 0) | (ne == 0)) & (g["count"] > 0)
        pe, pn = (ev + 0.5 * adj) / y.sum(), (ne + 0.5 * adj) / (len(y) - y.sum())
        twin_woe = np.where(g["count"] > 0, np.log(pe / pn), 0.0)
        twin_iv = float(((pe - pn) * twin_woe)[g["count"] > 0].sum())
        assert np.array_equal(woe, twin_woe) and iv == twin_iv, (j, iv, twin_iv)


def test_the_hosts_decision_arrives_and_the_host_sees_only_ciphertexts_and_its_result():
    X, y = _data()
    bins = _bins(X)
    keep = [np.arange(b.n_bins - 2) % 2 == 0 for b in bins]
    woe = [np.linspace(-1, 1, int(k.sum()) + 2) for k in keep]
    decisions = {"host-1": wb.HostDecision(keep, [True, False, True], woe)}
    out, errors, _ = _run([X], y, decisions=decisions)
    assert not errors, errors
    got = out["host-1"]
    assert [k.tolist() for k in got.keep_cuts] == [k.tolist() for k in keep]
    assert got.selected == [True, False, True] and all(np.array_equal(a, b) for a, b in zip(got.woe, woe))


def test_a_host_whose_sums_do_not_match_its_counts_is_named():
    X, y = _data()
    # the host reports counts of its true bins but sums rows of shifted bins: sizes and sums disagree
    class Liar(wb.BinningHost):
        def _run(self):
            shifted = self.index.copy()
            shifted[:50, 0] = (shifted[:50, 0] + 1) % (self.n_bins[0] - 1)
            real = self.index
            orig = self.t.send

            def send(to, tag, msg, round=0, **kw):
                if tag == wb.TAG_COUNTS:
                    self.index = shifted  # the histograms use the shifted bins from now on
                return orig(to, tag, msg, round=round, **kw)
            self.t.send = send
            try:
                return super()._run()
            finally:
                self.index = real

    _, errors, _ = _run([X], y, host_cls=Liar, deadline=5.0)
    assert isinstance(errors.get("guest"), wb.BinningError) and "host-1" in str(errors["guest"]), errors


def test_monotonic_groups_give_monotone_rates_and_minimum_sizes():
    rng = np.random.default_rng(1)
    counts = rng.integers(20, 80, 12)
    rate = np.clip(np.linspace(0.1, 0.6, 12) + rng.normal(0, 0.08, 12), 0, 1)
    events = np.round(counts * rate).astype(int)
    keep = monotonic_groups(events, counts, min_rows=100)
    groups = np.split(np.arange(12), np.flatnonzero(keep) + 1)
    merged_rate = [events[g].sum() / counts[g].sum() for g in groups]
    assert np.all(np.diff(merged_rate) >= 0), merged_rate
    assert all(counts[g].sum() >= 100 for g in groups)
    assert 1 < len(groups) < 12
    # decreasing rates are detected as such
    keep = monotonic_groups(events[::-1], counts[::-1])
    groups = np.split(np.arange(12), np.flatnonzero(keep) + 1)
    assert np.all(np.diff([events[::-1][g].sum() / counts[::-1][g].sum() for g in groups]) <= 0)


def test_woe_needs_both_classes():
    with pytest.raises(ValueError, match="both events and non-events"):
        woe_iv(np.array([0, 0]), np.array([3, 4]))


def test_the_hosts_transcript_holds_the_key_the_layout_ciphertexts_and_its_result_only():
    """Everything the host receives, as it parsed it: no label in the clear, rows only as ciphertexts
    spread over Z_{n^2}, no WOE unless the guest sends it."""
    X, y = _data()
    seen: list = []

    class Recording(wb.BinningHost):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            recv = self.t.recv

            def recording(sender, tag, round=0, parse=None, **k):
                got = recv(sender, tag, round=round, parse=parse, **k)
                seen.append((tag, got))
                return got
            self.t.recv = recording

    out, errors, _ = _run([X], y, host_cls=Recording)
    assert not errors, errors
    tags = [t for t, _ in seen]
    assert tags[0] == wb.TAG_SETUP and tags[1] == wb.TAG_START and tags[-1] == wb.TAG_RESULT
    assert set(tags[2:-1]) == {wb.TAG_ROWS}
    setup = seen[0][1]
    assert setup.n_rows == len(y) and setup.n_classes == 2  # the guest's row count and K: nothing per row
    rows = [c for t, part in seen if t == wb.TAG_ROWS for c in part]
    assert len(rows) == len(y) and len(set(int(c) for c in rows)) == len(y)  # fresh randomness per row
    assert min(int(c) for c in rows).bit_length() > 1500  # 1024-bit key: ciphertexts mod n^2, no 0/1 labels
    assert out["host-1"].woe is None  # no send_woe: the host learns no label statistic


@pytest.mark.parametrize("lie", ["too_many_bins", "counts_not_summing_to_n"])
def test_a_host_announcing_counts_outside_the_jobs_bounds_is_refused_and_named(lie):
    X, y = _data()

    class Liar(wb.BinningHost):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if lie == "too_many_bins":  # 20 value bins where the job allows MAX_BINS
                self.bins[0] = ColumnBins("h0", np.linspace(-2, 2, 19))
                self.index[:, 0] = self.bins[0].index(self.X[:, 0])
                self.n_bins[0] = self.bins[0].n_bins
            else:  # one row counted twice
                self.index = np.vstack([self.index, self.index[:1]])

    _, errors, _ = _run([X], y, host_cls=Liar, deadline=3.0)
    assert isinstance(errors.get("guest"), wb.BinningError) and "host-1" in str(errors["guest"]), errors


def test_okamoto_uchiyama_gives_the_same_counts():
    X, y = _data(n=300)
    host_ids = ["host-1"]
    net = InProcessNetwork("woe-ou", ["guest", *host_ids], deadline=30.0)
    guest = wb.BinningGuest(net.transport("guest"), host_ids, y, 2, max_features=10, max_bins=MAX_BINS,
                            key_bits=1024, insecure_test_key=True, backend="ou")
    host = wb.BinningHost(net.transport("host-1"), "guest", _bins(X), X, max_bins=MAX_BINS, insecure_test_key=True,
                          backend="ou")
    t = threading.Thread(target=host.run, daemon=True)
    t.start()
    got = guest.host_counts()["host-1"]
    guest.send_decisions({"host-1": wb.HostDecision([np.ones(b.n_bins - 2, bool) for b in host.bins],
                                                    [True] * 3, None)})
    t.join(30)
    for j, b in enumerate(host.bins):
        assert np.array_equal(got.counts[j], _crosstab(X[:, j], b, y, 2))
