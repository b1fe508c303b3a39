"""An independent centralised twin of the split NN (issue 39): plain torch and numpy, no secureflhv code.

It trains, in one place on the joined table, the network that ``secureflhv/vertical/split_nn.py`` documents,
built here from torch primitives (``nn.Linear``, activations, ``torch.optim``) and autograd:

* bottom model of each party: ``Linear(+activation)`` per width of ``host_bottom`` / ``guest_bottom``
  (``guest_bottom = []``: the guest's raw features);
* interactive layer ``z = a_g W_g + sum_h a_h W_h + c``, then ``interactive_activation``;
* top model: ``Linear(+activation)`` per width of ``top_hidden``, then a ``Linear`` to the outputs (1 for
  two classes or regression, else one per class);
* loss: BCE-with-logits (one output), cross-entropy (several), regression: MSE of ``(y - m) / s`` with m, s the
  training targets' mean and population standard deviation (s = 1 when the targets are constant);
* batches: per epoch ``numpy.random.default_rng([seed, epoch]).permutation(n)`` cut into ``batch_size`` chunks;
* updates: W_g, every W_h and c by plain SGD at ``interactive_lr``; bottoms and top by ``optimizer``
  (torch SGD or Adam) at ``learning_rate``.

Initialisation (the documented seeding rule, reproduced here so that a process test can build the twin
without looking inside the parties; the in-process tests check it against the parties' initial state):
each ``Linear`` in layer order draws weight then bias from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with a
``torch.Generator`` seeded ``1000 * init_seed + 1`` (guest bottom), ``+ 2`` (top), ``+ 10 + i`` (host i, from 0);
``rng = numpy.random.default_rng([init_seed, 7])`` draws W_g (k_g, o), then W_h (k_h, o) per host in order, all
``U(-lim, lim)`` with ``lim = sqrt(6 / (k_g + H k_h + o))``; c = 0.

User modules (issue 37: ``host_bottom_factory`` / ``guest_bottom_factory`` / ``top_factory`` =
``{factory: "module:function", kwargs, path}``): the function is imported here with importlib and called as
``function(**kwargs, in_features=d, out_features=k)`` with torch's global generator seeded by the same rule
(``torch.manual_seed(1000 * init_seed + 1 | + 2 | + 10 + i)``), then cast to float64; k is the declared
``*_bottom_output_width`` (the top: the outputs). Modules predict in inference mode (``train(False)``).
"""
from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import torch

F64 = torch.float64

# Tolerances of the federation against the twin. Q: the quantisation step of the interactive layer's plaintext
# multipliers (V_h, delta: dot_precision_bits = 32, the default; encrypted values carry 40 fraction bits, 256
# times finer). Per batch the host's bottom gradient G = delta' (V_h + E_h)^T is computed with delta rounded to
# Q, times the host's noise share E_h (a few units after some steps of uniform(-1, 1) noise), so each entry of G
# is off by up to o |E_h| Q / 2 ~ 10 Q.
# * Plain SGD adds those errors into the bottom models, scaled by the learning rate, and they mostly cancel over
#   rows and steps: measured over 20 runs of test_split_nn_partitions.py's 5 cases at most 4.4e-9 (19 Q) on any
#   parameter or probability. Two rows swapped in the twin's table move its parameters by 5e-3, another batch
#   order by 4e-2.
# * Adam divides each step by the root of the gradient's running square, so the relative error of a host's
#   gradient (o |E_h| Q / |G|) passes into its step whatever the gradient's size (and a gradient entry near zero
#   can turn a 1e-10 error into a 1e-6 step: long Adam runs are not compared this tightly). Three Adam steps
#   (test_split_nn_e2e.py), 4 runs: at most 9.2e-9 on a parameter, 8.4e-10 on a probability.
Q = 2.0 ** -32
SGD_TOL = 128 * Q  # 3.0e-8
ADAM_TOL = 256 * Q  # 6.0e-8
ACT = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid, "identity": torch.nn.Identity}


def _mlp(d_in: int, widths, act: str, out: int | None = None) -> torch.nn.Sequential:
    layers, d = [], d_in
    for w in widths:
        layers += [torch.nn.Linear(d, w, dtype=F64), ACT[act]()]
        d = w
    if out is not None:
        layers.append(torch.nn.Linear(d, out, dtype=F64))
    return torch.nn.Sequential(*layers)


def _seed_mlp(module: torch.nn.Sequential, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module:
            if isinstance(m, torch.nn.Linear):
                bound = 1.0 / math.sqrt(m.in_features)
                m.weight.uniform_(-bound, bound, generator=g)
                m.bias.uniform_(-bound, bound, generator=g)


def _user_module(ref: dict, seed: int, d_in: int, d_out: int) -> torch.nn.Module:
    """The module of a job-file factory reference, seeded and float64 (the module docstring's rule)."""
    if ref.get("path") is not None and str(ref["path"]) not in sys.path:
        sys.path.insert(0, str(ref["path"]))
    module_name, attr = ref["factory"].split(":")
    fn = importlib.import_module(module_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = fn(**(ref.get("kwargs") or {}), in_features=d_in, out_features=d_out)
    return module.to(F64)


def _bottom(c: dict, side: str, d_in: int, seed: int):
    """(module or None, output width) of a party's bottom: the factory's module, else the seeded MLP."""
    ref = c.get(f"{side}_bottom_factory")
    if ref is not None:
        k = c[f"{side}_bottom_output_width"]
        return _user_module(ref, seed, d_in, k), k
    widths = c[f"{side}_bottom"]
    if not widths:
        return None, d_in
    m = _mlp(d_in, widths, c["activation"])
    _seed_mlp(m, seed)
    return m, widths[-1]


class SplitNNTwin:
    """The split network trained centrally. ``cfg``: the job's hyperparameters (a mapping, or a pydantic model
    whose values are read); ``d_guest`` / ``d_hosts``: input widths; ``y_train`` fixes the outputs (class count,
    or the regression target's scale)."""

    def __init__(self, cfg, d_guest: int, d_hosts, y_train, n_classes: int | None = None):
        c = dict(cfg if isinstance(cfg, dict) else cfg.model_dump())
        self.c = c
        self.regression = c.get("task", "classification") == "regression"
        y = np.asarray(y_train)
        if self.regression:
            s = float(np.std(y.astype(np.float64)))
            self.target = (float(np.mean(y.astype(np.float64))), s if s > 0 else 1.0)
            self.out = 1
        else:
            k = n_classes or c.get("n_classes") or max(2, int(y.max()) + 1)
            self.target, self.out = None, 1 if k == 2 else k
        o, act, s = c["interactive_units"], c["activation"], c["init_seed"]
        self.gb, k_g = _bottom(c, "guest", d_guest, 1000 * s + 1)
        hosts = [_bottom(c, "host", d, 1000 * s + 10 + i) for i, d in enumerate(d_hosts)]
        self.hbs = [m for m, _ in hosts]
        k_h = hosts[0][1] if hosts else 0
        if c.get("top_factory") is not None:
            self.top = _user_module(c["top_factory"], 1000 * s + 2, o, self.out)
        else:
            self.top = _mlp(o, c["top_hidden"], act, out=self.out)
            _seed_mlp(self.top, 1000 * s + 2)
        lim = math.sqrt(6.0 / (k_g + k_h * len(d_hosts) + o))
        rng = np.random.default_rng([s, 7])
        self.W_g = torch.tensor(rng.uniform(-lim, lim, size=(k_g, o)), dtype=F64, requires_grad=True)
        self.W_h = [torch.tensor(rng.uniform(-lim, lim, size=(k_h, o)), dtype=F64, requires_grad=True)
                    for _ in d_hosts]
        self.bias = torch.zeros(o, dtype=F64, requires_grad=True)
        params = [p for m in [self.gb, *self.hbs, self.top] if m is not None for p in m.parameters()]
        opt = torch.optim.Adam if c["optimizer"] == "adam" else torch.optim.SGD
        self.opt = opt(params, lr=c["learning_rate"])

    def _logits(self, Xg, Xhs) -> torch.Tensor:
        xg = torch.as_tensor(np.asarray(Xg, dtype=np.float64))
        z = (self.gb(xg) if self.gb is not None else xg) @ self.W_g + self.bias
        for hb, W, Xh in zip(self.hbs, self.W_h, Xhs):
            z = z + hb(torch.as_tensor(np.asarray(Xh, dtype=np.float64))) @ W
        return self.top(ACT[self.c["interactive_activation"]]()(z))

    def _loss(self, logits, yb) -> torch.Tensor:
        F = torch.nn.functional
        if self.regression:
            t = (torch.as_tensor(np.asarray(yb, dtype=np.float64)) - self.target[0]) / self.target[1]
            return F.mse_loss(logits[:, 0], t)
        t = torch.as_tensor(np.asarray(yb).astype(np.int64))
        if self.out == 1:
            return F.binary_cross_entropy_with_logits(logits[:, 0], t.to(F64))
        return F.cross_entropy(logits, t)

    def fit(self, Xg, Xhs, y) -> list[float]:
        """Train for ``epochs``; returns every batch's loss."""
        c, y, losses = self.c, np.asarray(y), []
        interactive = [self.W_g, self.bias, *self.W_h]
        for epoch in range(c["epochs"]):
            order = np.random.default_rng([c["seed"], epoch]).permutation(len(y))
            for i in range(0, len(y), c["batch_size"]):
                rows = order[i:i + c["batch_size"]]
                self.opt.zero_grad()
                for p in interactive:
                    p.grad = None
                loss = self._loss(self._logits(Xg[rows], [X[rows] for X in Xhs]), y[rows])
                loss.backward()
                with torch.no_grad():
                    for p in interactive:
                        p -= c["interactive_lr"] * p.grad
                self.opt.step()
                losses.append(float(loss.detach()))
        return losses

    def predict(self, Xg, Xhs) -> np.ndarray:
        """P(y=1) (n,), class probabilities (n, C), or regression values in the target's units (n,)."""
        mods = [m for m in [self.gb, *self.hbs, self.top] if m is not None]
        for m in mods:
            m.train(False)
        with torch.no_grad():
            logits = self._logits(Xg, Xhs)
        for m in mods:
            m.train(True)
        if self.regression:
            return (self.target[0] + self.target[1] * logits[:, 0]).numpy()
        return torch.sigmoid(logits[:, 0]).numpy() if self.out == 1 else torch.softmax(logits, 1).numpy()

    def state(self) -> dict[str, np.ndarray]:
        """Every parameter by name: ``W_g``, ``bias``, ``W_h.<i>``, ``top.*``, ``guest_bottom.*``,
        ``host_bottom.<i>.*`` (the names :func:`federated_state` gives the parties' arrays)."""
        out = {"W_g": self.W_g.detach().numpy().copy(), "bias": self.bias.detach().numpy().copy()}
        for i, W in enumerate(self.W_h):
            out[f"W_h.{i}"] = W.detach().numpy().copy()
        mods = [("top", self.top), ("guest_bottom", self.gb),
                *[(f"host_bottom.{i}", m) for i, m in enumerate(self.hbs)]]
        for name, m in mods:
            if m is not None:
                out.update({f"{name}.{k}": v.detach().numpy().copy() for k, v in m.state_dict().items()})
        return out


def federated_state(guest: dict, hosts: list[dict], host_ids: list[str]) -> dict[str, np.ndarray]:
    """The parties' saved arrays (guest, then each host's, as their model bundles and ``state_arrays`` hold them)
    under :meth:`SplitNNTwin.state`'s names; a host's interactive weights are the guest's share plus the host's
    noise share, ``V_h + E_h``."""
    out = {"W_g": guest["interactive.W_g"], "bias": guest["interactive.bias"]}
    for k, v in guest.items():
        if k.startswith("top."):
            out[k] = v
        elif k.startswith("bottom."):
            out["guest_bottom." + k[len("bottom."):]] = v
    for i, (h, arrays) in enumerate(zip(host_ids, hosts)):
        out[f"W_h.{i}"] = np.asarray(guest[f"interactive.V.{h}"]) + np.asarray(arrays["interactive.E"])
        out.update({f"host_bottom.{i}.{k[len('bottom.'):]}": v for k, v in arrays.items() if k.startswith("bottom.")})
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


def roles_state(guest, hosts) -> dict[str, np.ndarray]:
    """:func:`federated_state` of in-process roles (their ``state_arrays()``; hosts in the guest's order)."""
    return federated_state(guest.state_arrays(), [h.state_arrays() for h in hosts], [h.party_id for h in hosts])


def seeded_twin(cfg, guest, hosts, Xg, Xhs, y, n_classes: int | None = None) -> SplitNNTwin:
    """The twin of these untrained roles (on their features Xg, Xhs and labels y); asserts that its seeded
    initial weights are theirs, bit for bit."""
    twin = SplitNNTwin(cfg, Xg.shape[1], [X.shape[1] for X in Xhs], y, n_classes)
    init, start = roles_state(guest, hosts), twin.state()
    assert init.keys() == start.keys(), (sorted(init), sorted(start))
    for k in start:
        np.testing.assert_array_equal(init[k], start[k], err_msg=k)
    return twin


def job_twin(job, params: dict, config_cls):
    """The twin of a finished ``vertical_nn`` job, trained on the joined table: the parties' CSVs named in the job
    file joined on their ids; the rows every party holds (PSI's output, checked: exactly the common ids, in
    code-point order); the held-out ids of the guest's ``split.json``; each party's columns standardised with
    the training rows' mean and population standard deviation (1 for a constant column), as every party does
    to its own.

    ``config_cls`` (the job's config model) only fills in the defaults of ``params``. Returns
    (twin after training, {"ids", "Xg", "Xhs", "y"} of the held-out rows, host ids).
    """
    import json

    import pandas as pd
    import yaml

    doc = yaml.safe_load(open(job).read())
    parties = [p for p in doc["parties"] if p.get("data")]
    tables = {p["id"]: pd.read_csv(p["data"]["path"], dtype={p["data"].get("id_column", "id"): str})
              .set_index(p["data"].get("id_column", "id")) for p in parties}
    guest = next(p for p in parties if p["role"] == "guest")
    label = guest["data"].get("label_column", "label")
    host_ids = [p["id"] for p in parties if p["role"] == "host"]
    split = json.loads((job.parent / "out" / guest["id"] / "split.json").read_text())
    common = sorted(set.intersection(*(set(t.index) for t in tables.values())))
    train, test = split["train"], split["test"]
    assert sorted(train + test) == common and train == sorted(train)  # PSI's rows, in code-point order
    y = tables[guest["id"]][label]
    blocks = []
    for pid in [guest["id"], *host_ids]:
        X = tables[pid].drop(columns=[label] if pid == guest["id"] else [])
        Xtr, Xte = X.loc[train].to_numpy(np.float64), X.loc[test].to_numpy(np.float64)
        mu, sd = Xtr.mean(0), Xtr.std(0)
        sd[sd == 0] = 1.0
        blocks.append(((Xtr - mu) / sd, (Xte - mu) / sd))
    cfg = config_cls(**{k: v for k, v in params.items() if k in config_cls.model_fields}, insecure_test_key=True)
    twin = SplitNNTwin(cfg, blocks[0][0].shape[1], [b[0].shape[1] for b in blocks[1:]], y.loc[train].to_numpy())
    twin.fit(blocks[0][0], [b[0] for b in blocks[1:]], y.loc[train].to_numpy())
    held_out = {"ids": test, "Xg": blocks[0][1], "Xhs": [b[1] for b in blocks[1:]], "y": y.loc[test].to_numpy()}
    return twin, held_out, host_ids
