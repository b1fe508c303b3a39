"""Test harness for vertical LR: run the roles in threads over InProcessNetwork, and an independent
centralised plaintext reference of the same Taylor-approximated LR (plain numpy, no library code)."""
from __future__ import annotations

import math
import sys
import threading
from pathlib import Path

import numpy as np

from secureflhv.transport import InProcessNetwork
from secureflhv.vertical.lr import VerticalLRArbiter, VerticalLRConfig, VerticalLRGuest, VerticalLRHost

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: lifecycle_helpers
from lifecycle_helpers import lifecycle_kwargs  # noqa: E402

# Tolerance of the federation against :func:`reference_taylor_lr` for up to ~30 mini-batch steps of learning rate
# <= 0.3 with momentum <= 0.5: the hosts' gradients X^T [[d]] take X on the grid Q = 2**-32 (dot_precision_bits,
# the default) and the residuals d = z/4 - y/2 (|d| < 2 on standardised data) on 2**-40, so a weight's batch
# gradient is off by at most ~|d| Q / 2 < Q, and 27 steps of learning rate 0.3 with momentum 0.5 (a step counts
# at most twice) bound the drift by 16 Q. Measured (test_vertical_lr_partitions.py): at most 1.5e-11 (0.06 Q).
# The rounding is the same in every run (the masks cancel exactly).
TAYLOR_TOL = 16 * 2.0 ** -32  # 3.7e-9


def reference_taylor_lr(X, y01, **cfg):
    """Centralised mini-batch GD on mean(log2 - y wx/2 + (wx)^2/8) + l2/2 |w|^2, y in {-1,+1}.

    ``cfg``: VerticalLRConfig fields (others ignored; missing ones take the config's defaults, only the
    values are read from it). Batches: per epoch, numpy.random.default_rng([seed, epoch]).permutation(n)
    cut into chunks of batch_size (full batch: rows in order). Heavy-ball momentum on every weight;
    with restore_best the weights after the epoch of lowest epoch loss are returned.
    Returns (w, b, losses)."""
    c = VerticalLRConfig(**{k: v for k, v in cfg.items() if k in VerticalLRConfig.model_fields and "key" not in k})
    X = np.asarray(X, float)
    y = np.where(np.asarray(y01) == 1, 1.0, -1.0)
    n, d = X.shape
    w, b = np.zeros(d), 0.0
    vw, vb = np.zeros(d), 0.0
    losses, kept = [], []
    best, bad = math.inf, 0
    for epoch in range(c.epochs):
        if c.lr_schedule == "constant":
            lr = c.learning_rate
        elif c.lr_schedule == "inverse_time":
            lr = c.learning_rate / (1.0 + c.lr_decay * epoch)
        elif c.lr_schedule == "cosine":
            lr = c.learning_rate * (1.0 + math.cos(math.pi * epoch / c.epochs)) / 2.0
        else:
            lr = c.learning_rate * c.lr_decay ** (epoch // c.lr_step_epochs)
        if c.batch_size is None or c.batch_size >= n:
            batches = [np.arange(n)]
        else:
            order = np.random.default_rng([c.seed, epoch]).permutation(n)
            batches = [order[s:s + c.batch_size] for s in range(0, n, c.batch_size)]
        epoch_losses = []
        for rows in batches:
            z = X[rows] @ w + (b if c.fit_intercept else 0.0)
            yy = y[rows]
            epoch_losses.append(np.mean(math.log(2) - 0.5 * yy * z + 0.125 * z ** 2) + 0.5 * c.l2 * (w @ w))
            resid = 0.25 * z - 0.5 * yy
            vw = c.momentum * vw - lr * (X[rows].T @ resid / len(rows) + c.l2 * w)
            w = w + vw
            if c.fit_intercept:
                vb = c.momentum * vb - lr * resid.mean()
                b = b + vb
        kept.append((w.copy(), b))
        loss = float(np.mean(epoch_losses))
        losses.append(loss)
        if loss < best - c.min_delta:
            best, bad = loss, 0
        else:
            bad += 1
        if c.early_stopping_rounds is not None and bad >= c.early_stopping_rounds:
            break
    w, b = kept[int(np.argmin(losses)) if c.restore_best else -1]
    return w, b, losses


def _reference_gd(X, targets, loss_and_resid, cfg):
    """The mini-batch heavy-ball GD loop of :func:`reference_taylor_lr` for K outputs: W (d, K), b (K,).

    ``loss_and_resid(z, targets_rows) -> (mean loss without penalty, dloss/dz (n_b, K))``."""
    c = VerticalLRConfig(**{k: v for k, v in cfg.items() if k in VerticalLRConfig.model_fields and "key" not in k})
    X = np.asarray(X, float)
    n, d = X.shape
    k = targets.shape[1]
    W, b, vW, vb = np.zeros((d, k)), np.zeros(k), np.zeros((d, k)), np.zeros(k)
    losses, kept, best, bad = [], [], math.inf, 0
    for epoch in range(c.epochs):
        lr = {"constant": c.learning_rate, "inverse_time": c.learning_rate / (1.0 + c.lr_decay * epoch),
              "cosine": c.learning_rate * (1.0 + math.cos(math.pi * epoch / c.epochs)) / 2.0,
              "step": c.learning_rate * c.lr_decay ** (epoch // c.lr_step_epochs)}[c.lr_schedule]
        if c.batch_size is None or c.batch_size >= n:
            batches = [np.arange(n)]
        else:
            order = np.random.default_rng([c.seed, epoch]).permutation(n)
            batches = [order[s:s + c.batch_size] for s in range(0, n, c.batch_size)]
        epoch_losses = []
        for rows in batches:
            z = X[rows] @ W + (b if c.fit_intercept else 0.0)
            loss, resid = loss_and_resid(z, targets[rows])
            epoch_losses.append(loss + 0.5 * c.l2 * np.sum(W * W))
            vW = c.momentum * vW - lr * (X[rows].T @ resid / len(rows) + c.l2 * W)
            W = W + vW
            if c.fit_intercept:
                vb = c.momentum * vb - lr * resid.mean(axis=0)
                b = b + vb
        kept.append((W.copy(), b.copy()))
        losses.append(float(np.mean(epoch_losses)))
        if losses[-1] < best - c.min_delta:
            best, bad = losses[-1], 0
        else:
            bad += 1
        if c.early_stopping_rounds is not None and bad >= c.early_stopping_rounds:
            break
    W, b = kept[int(np.argmin(losses)) if c.restore_best else -1]
    return W, b, losses


def reference_taylor_softmax(X, y, n_classes, **cfg):
    """Centralised multinomial LR on the second-order Taylor expansion at z = 0 of the softmax
    cross-entropy -z_y + log sum_c exp(z_c):  log K + (1/K - Y).z + 1/2 (|z|^2/K - (sum_c z_c)^2/K^2),
    residual (1/K - Y) + z/K - sum_c z_c / K^2. Batches and schedule as :func:`reference_taylor_lr`.
    Returns (W (d, K), b (K,), losses)."""
    K = n_classes
    Y = np.eye(K)[np.asarray(y, dtype=int)]

    def loss_and_resid(z, Yb):
        s = z.sum(axis=1, keepdims=True)
        loss = np.mean(math.log(K) + np.sum((1.0 / K - Yb) * z, axis=1)
                       + 0.5 * (np.sum(z * z, axis=1) / K - s[:, 0] ** 2 / K ** 2))
        return loss, (1.0 / K - Yb) + z / K - s / K ** 2

    return _reference_gd(X, Y, loss_and_resid, cfg)


def reference_linear_regression(X, y, **cfg):
    """Centralised linear regression by the same mini-batch GD: loss mean((z - y)^2)/2, residual z - y
    (FATE's hetero linear regression). Returns (w (d,), b, losses)."""
    def loss_and_resid(z, yb):
        r = z - yb
        return 0.5 * np.mean(r ** 2), r

    W, b, losses = _reference_gd(X, np.asarray(y, float).reshape(-1, 1), loss_and_resid, cfg)
    return W[:, 0], float(b[0]), losses


def run_vertical_lr(X_guest, y, X_hosts, cfg: dict | VerticalLRConfig, *, deadline=60.0, transports=None,
                    predict_sets=None, job_id="vlr-test", n_classes=None, arbiter_rows=None, callbacks=None,
                    resume=None):
    """Train guest + hosts (+ arbiter) in threads. ``transports``: optional {party: factory(net, pid)}.

    Returns (results, errors, net, roles) where results/errors map party id -> FitResult/exception.
    With ``predict_sets`` = (X_guest_pred, [X_host_pred...]) also returns guest probabilities in
    results['proba']; the arbiter then accepts score requests of up to ``arbiter_rows`` rows (default: the
    prediction set's; ``"job"``: as in a job, ``batch_size``, else the training rows).
    ``callbacks`` / ``resume``: {party id: callbacks list / (arrays, state)}, each role's
    lifecycle arguments at construction (:mod:`secureflhv.transport.lifecycle`; absent: none)."""
    config = cfg if isinstance(cfg, VerticalLRConfig) else VerticalLRConfig(**cfg)
    hosts = [f"host-{i + 1}" for i in range(len(X_hosts))]
    arbiter = "server" if config.mode == "arbiter" else None
    parties = ["guest"] + hosts + ([arbiter] if arbiter else [])
    net = InProcessNetwork(job_id, parties, deadline=deadline)
    transports = transports or {}

    def tr(pid):
        return transports[pid](net, pid) if pid in transports else net.transport(pid)

    life = lifecycle_kwargs(callbacks, resume)
    roles = {"guest": VerticalLRGuest(tr("guest"), hosts, X_guest, y, config, arbiter, n_classes=n_classes,
                                      **life("guest"))}
    for h, Xh in zip(hosts, X_hosts):
        roles[h] = VerticalLRHost(tr(h), "guest", hosts, Xh, config, arbiter, **life(h))
    if arbiter:
        roles[arbiter] = VerticalLRArbiter(tr(arbiter), "guest", hosts, config, **life(arbiter))
    results, errors = {}, {}

    def work(pid):
        try:
            results[pid] = roles[pid].fit()
            if predict_sets is not None:
                if pid == arbiter:  # arbiter mode: decrypts the guest's masked total scores
                    if arbiter_rows == "job":
                        roles[pid].serve_predictions()
                    else:
                        roles[pid].serve_predictions(max_rows=arbiter_rows or len(predict_sets[0]))
                elif pid == "guest":
                    results["proba"] = roles[pid].predict_proba(predict_sets[0])
                    roles[pid].end_prediction()
                else:
                    roles[pid].serve_predictions(predict_sets[1][hosts.index(pid)])
        except BaseException as exc:  # noqa: BLE001 - collected for the test's assertions
            errors[pid] = exc

    threads = [threading.Thread(target=work, args=(p,), daemon=True) for p in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline * 4)
    assert not any(t.is_alive() for t in threads), "a party hung"
    return results, errors, net, roles
