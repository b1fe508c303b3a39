"""Helpers of the SecureBoost tests: run the roles as threads over the in-process transport."""
from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from secureflhv.transport import InProcessNetwork
from secureflhv.tree.horizontal import HorizontalSecureBoostClient, HorizontalSecureBoostServer, tree_aggregation_config
from secureflhv.tree.vertical import SecureBoostGuest, SecureBoostHost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: lifecycle_helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))      # tests/tree/: the numpy twin
import numpy_gbdt as twin  # noqa: E402
from lifecycle_helpers import lifecycle_kwargs  # noqa: E402

LEAF_TOL = 1e-6   # federated leaves use g, h on a 2^-p grid (p <= 24); the twin float64: ~1e-8 apart here


def run_threads(targets: dict, timeout: float = 120.0) -> tuple[dict, dict]:
    """Run name -> callable in threads; return (results, exceptions)."""
    results, errors = {}, {}

    def wrap(name, fn):
        try:
            results[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - collected for the test to assert on
            errors[name] = exc

    threads = [threading.Thread(target=wrap, args=(k, v), daemon=True) for k, v in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a party thread hung"
    return results, errors


def vertical_run(X, y, col_groups, params, *, X_val=None, y_val=None, X_pred=None, deadline=60.0, backend="paillier",
                 host_wrappers=None, keypair=None, max_payload_bytes=None, callbacks=None, resume=None):
    """Train vertical SecureBoost with guest = col_groups[0], hosts = the rest (``max_payload_bytes``:
    every party's message limit, default the transport's). ``callbacks`` / ``resume``: {party id: callbacks
    list / (arrays, state)}, each role's lifecycle arguments at construction
    (:mod:`secureflhv.transport.lifecycle`; absent: none).

    Returns dict(guest, hosts, result, pred (margins of X_pred or None), net, errors).
    """
    host_ids = [f"host-{i}" for i in range(1, len(col_groups))]
    net = InProcessNetwork("sb-test", ["guest", *host_ids], deadline=deadline,
                           **({} if max_payload_bytes is None else {"max_payload_bytes": max_payload_bytes}))
    sel = lambda A, c: None if A is None else A[:, c]  # noqa: E731
    life = lifecycle_kwargs(callbacks, resume)
    guest = SecureBoostGuest(net.transport("guest"), host_ids, X[:, col_groups[0]], y, params,
                             X_val=sel(X_val, col_groups[0]), y_val=y_val, backend=backend, keypair=keypair,
                             **life("guest"))
    hosts = []
    for hid, cols in zip(host_ids, col_groups[1:]):
        tr = net.transport(hid)
        if host_wrappers and hid in host_wrappers:
            tr = host_wrappers[hid](tr, net)
        hosts.append(SecureBoostHost(tr, "guest", X[:, cols], params, X_val=sel(X_val, cols), backend=backend,
                                     **life(hid)))

    def host_job(h, cols):
        h.fit()
        if X_pred is not None:
            h.serve_predictions(X_pred[:, cols])
        return h

    def guest_job():
        res = guest.fit()
        pred = None
        if X_pred is not None:
            pred = guest.predict_margin(X_pred[:, col_groups[0]])
            guest.end_prediction()
        return res, pred

    targets = {"guest": guest_job}
    for h, cols in zip(hosts, col_groups[1:]):
        targets[h.party_id] = (lambda h=h, cols=cols: host_job(h, cols))
    results, errors = run_threads(targets, timeout=deadline * 4)
    out = dict(guest=guest, hosts=hosts, net=net, errors=errors)
    if "guest" in results:
        out["result"], out["pred"] = results["guest"]
    return out


def vertical_structure(guest, hosts, tree, col_groups) -> list[tuple]:
    """The federated tree in the reference's terms: (id, leaf, global feature, bin, default_left) per node."""
    offsets = np.cumsum([0] + [len(c) for c in col_groups])
    ids = [h.party_id for h in hosts]
    out = []
    for nid, n in sorted(tree.nodes.items()):
        if n.leaf:
            out.append((nid, True, -1, -1, False))
        elif n.owner == "guest":
            out.append((nid, False, n.feature, n.bin, n.default_left))
        else:
            i = ids.index(n.owner)
            j, b, _, dl = hosts[i].records[n.record]
            out.append((nid, False, int(offsets[i + 1] + j), b, dl))
    return out


def horizontal_run(parts, params, *, kind="plain_quantised", deadline=60.0, val_parts=None, feature_ranges=None,
                   stage_timeout=None, threshold=None, vanish=None, agg_kw=None, callbacks=None, resume=None):
    """parts: list of (X_i, y_i). Returns dict(server_model, client_models, errors, net, server, clients).

    ``stage_timeout``: the aggregation's stage and input timeouts (default ``deadline``);
    ``threshold``: the aggregation threshold (default: from max_colluders); ``vanish``: client index ->
    (tree, stage) at which that client dies (:func:`vanish_at`); ``agg_kw``: more aggregation settings
    (e.g. the two-client opt-in ``min_clients=2, max_colluders=0``); ``callbacks`` / ``resume``: {party id:
    callbacks list / (arrays, state)}, each role's lifecycle arguments at construction
    (:mod:`secureflhv.transport.lifecycle`; absent: none).
    """
    ids = [f"client-{i}" for i in range(len(parts))]
    net = InProcessNetwork("hsb-test", ["server", *ids], deadline=deadline)
    extra = {**({} if threshold is None else {"threshold": threshold}), **(agg_kw or {})}
    st = deadline if stage_timeout is None else stage_timeout
    cfg = tree_aggregation_config(kind, seed=7, stage_timeout_s=st, input_timeout_s=st, **extra)
    life = lifecycle_kwargs(callbacks, resume)
    server = HorizontalSecureBoostServer(net.transport("server"), ids, params, aggregation=cfg,
                                         feature_ranges=feature_ranges, **life("server"))
    clients = []
    for i, (cid, (Xi, yi)) in enumerate(zip(ids, parts)):
        vx, vy = (None, None) if val_parts is None else val_parts[i]
        clients.append(HorizontalSecureBoostClient(net.transport(cid), "server", ids, Xi, yi, params, X_val=vx,
                                                   y_val=vy, aggregation=cfg, send_ranges=feature_ranges is None,
                                                   **life(cid)))
    for i, (tree, stage) in (vanish or {}).items():
        vanish_at(clients[i], net, tree, stage)
    targets = {"server": server.fit, **{c.party_id: c.fit for c in clients}}
    results, errors = run_threads(targets, timeout=deadline * 4)
    return dict(server_model=results.get("server"), client_models=[results.get(c) for c in ids], errors=errors,
                net=net, server=server, clients=clients)


def vanish_at(client, net, tree: int, stage: str = "histograms") -> None:
    """Make ``client`` die like a killed process (its mailbox closes, it tells nobody) when it is about
    to submit its first histograms of tree ``tree`` (stage "histograms") or the validation loss of the
    round that ends with tree ``tree`` (stage "validation")."""
    grow, real_submit, validation = client.grow_tree, client._submit, client.validation
    at = {"tree": None}

    def die():
        net.take_down(client.party_id)
        raise SystemExit(f"{client.party_id} killed")

    def grow_tree(seq, *args):
        at["tree"] = seq
        return grow(seq, *args)

    def submit(vector):
        if stage == "histograms" and at["tree"] == tree:
            die()
        return real_submit(vector)

    def validate(*args):
        if stage == "validation" and at["tree"] == tree:
            die()
        return validation(*args)

    client.grow_tree, client._submit, client.validation = grow_tree, submit, validate


def horizontal_nodes(tree) -> dict:
    """A federated tree (server/client model or :class:`~secureflhv.tree.model.Tree`) in the twin's terms:
    id -> ("leaf", value) or ("split", feature, bin, threshold, default_left)."""
    return {nid: ("leaf", n.value) if n.leaf else ("split", n.feature, n.bin, n.threshold, bool(n.default_left))
            for nid, n in tree.nodes.items()}


def vertical_nodes(tree, guest_cols: int, hosts: list[tuple[str, int, list]]) -> dict:
    """A vertical guest's tree in the twin's terms with global feature indices (guest columns first, then
    each host's); ``hosts``: (party id, its number of columns, its split table [(j, bin, threshold,
    default_left)] by record id), in host order."""
    offset, table = guest_cols, {}
    for hid, ncols, records in hosts:
        table[hid] = (offset, records)
        offset += ncols
    out = {}
    for nid, n in tree.nodes.items():
        if n.leaf:
            out[nid] = ("leaf", n.value)
        elif n.owner in ("guest", ""):
            out[nid] = ("split", n.feature, n.bin, n.threshold, bool(n.default_left))
        else:
            off, records = table[n.owner]
            j, b, thr, dl = records[n.record]
            out[nid] = ("split", off + int(j), int(b), float(thr), bool(dl))
    return out


def assert_trees_equal_twin(fed: list[tuple[int, dict]], model: "twin.TwinModel") -> None:
    """Federated trees [(output, nodes)] equal the twin's: the same nodes, the same split (feature, bin,
    threshold, default direction) at each, leaf values within :data:`LEAF_TOL`."""
    assert len(fed) == len(model.trees) > 0, (len(fed), len(model.trees))
    for t, ((output, nodes), tt) in enumerate(zip(fed, model.trees)):
        assert output == tt.output, f"tree {t}: output {output} != {tt.output}"
        assert sorted(nodes) == sorted(tt.nodes), f"tree {t}: nodes {sorted(nodes)} != twin {sorted(tt.nodes)}"
        for nid, want in tt.nodes.items():
            got = nodes[nid]
            if want[0] == "leaf":
                assert got[0] == "leaf", f"tree {t} node {nid}: {got} where the twin has a leaf"
                assert abs(got[1] - want[1]) <= LEAF_TOL * max(1.0, abs(want[1])), \
                    f"tree {t} node {nid}: {got} != {want}"
            else:
                assert got == want, f"tree {t} node {nid}: federated {got} != twin {want}"


def pooled_grid_cuts(X, params) -> list[np.ndarray]:
    """The twin's horizontal cuts of the pooled rows X: the range of every feature over X (as the clients'
    min/max give it), ``params.sketch_bins`` cells, ``params.max_bin``."""
    with np.errstate(all="ignore"):
        lo, hi = np.nanmin(X, axis=0), np.nanmax(X, axis=0)
    return [twin.grid_cuts(X[:, j], lo[j], hi[j], params.sketch_bins, params.max_bin) for j in range(X.shape[1])]


def two_phase_twin(shards, survivors: list[int], first_round: int, params) -> "twin.TwinModel":
    """The model a horizontal run that lost clients in round ``first_round`` must equal: the numpy twin on
    every shard's rows (its own cuts and base margin) for the rounds before, then boosting continued on the
    ``survivors``' rows from their margins after those rounds (cuts and base margin unchanged)."""
    X = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    cuts, cfg = pooled_grid_cuts(X, params), twin.Config.of(params)
    before = twin.fit(X, y, cuts, replace(cfg, n_trees=first_round))
    Xs = np.concatenate([shards[i][0] for i in survivors])
    ys = np.concatenate([shards[i][1] for i in survivors])
    after = twin.fit(Xs, ys, cuts, replace(cfg, n_trees=params.n_trees - first_round),
                     init_margin=before.predict_margin(Xs), base=before.base)
    before.trees += after.trees
    return before
