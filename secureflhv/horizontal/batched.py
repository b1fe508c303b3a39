"""Batched local training: the clients of one process trained together, for simulation speed.

A simulation (``benchmarks/niid_accuracy.py``) runs N client threads in one process; trained one by
one, each client's small model pays the per-step Python and dispatch cost alone. Here the clients'
parameters are stacked along a new leading axis (K clients) and one ``torch.func.vmap`` of
``grad_and_value(functional_call(model, ...))`` computes every client's gradient in one call per step.

Same maths as :func:`secureflhv.horizontal.strategies.local_sgd` (up to float32 rounding; the tests
check 1e-5 after several steps for FedAvg, FedProx and SCAFFOLD):

* each client's batches come from its own ``rng`` exactly as in the loop (one permutation per epoch,
  batches of ``batch_size``, the last one short) — so the same seed gives the same batches;
* a short batch is padded to ``batch_size`` with a zero mask and its loss is the masked mean (= the
  loop's mean over the real rows); a client with fewer steps than the longest stays put (its
  parameters and momentum are kept by ``torch.where``) while the others go on;
* SGD with momentum and weight decay as ``torch.optim.SGD`` (dampening 0, no Nesterov):
  ``d = g + wd·w; b = rho·b + d (b = d at the first step); w ← w − lr·b``;
* FedProx's ``(mu/2)‖w − w_anchor‖²`` is added to each client's loss (its own anchor and mu);
  SCAFFOLD's correction ``w ← w − lr·(c − c_i)`` follows every step.

Float32 rounding differs from the loop's (different reduction order), so a discrete decision taken on
nearly equal numbers — IFCA's choice between two clusters with almost the same loss — can come out the
other way; the FedAvg family's models agree to 1e-5.

Clients are batched together when their models have the same class and parameter shapes and their
:class:`LocalTrainConfig` is equal; other groups are batched separately (a group of one is a batch of
one). :class:`BatchedTrainer` is the rendezvous: each client thread hands in its request for the round
and waits; the last one to arrive (or the first whose wait runs out, when a client never comes) trains
the whole batch. Nothing here touches the wire: the clients then submit their own updates through
(secure) aggregation as before, so the server learns exactly what it learns with the loop.
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from .strategies import LocalTrainConfig


def resolve_device(name: str | None) -> torch.device:
    """``cpu`` (default), ``cuda`` or ``cuda:<i>`` as a torch device.

    Raises ValueError for ``cuda`` when torch sees no CUDA GPU (names what torch reports), or an unknown name.
    """
    name = (name or "cpu").lower()
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but torch {torch.__version__} sees no CUDA GPU "
                             f"(torch.cuda.is_available() is False); use --device cpu")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return dev
    raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {name!r}")


@dataclass
class TrainRequest:
    """One client's local training: ``model`` (trained in place), rows X (n, f) float32 and labels y (n,)
    int, its settings and batch-order generator; ``prox`` = (mu, anchor float (dim,)) for FedProx;
    ``correction`` = c − c_i (float, (dim,)) for SCAFFOLD (subtracted ×lr after every step)."""

    model: nn.Module
    X: np.ndarray
    y: np.ndarray
    cfg: LocalTrainConfig
    rng: np.random.Generator
    prox: tuple[float, np.ndarray] | None = None
    correction: np.ndarray | None = None


def batch_plan(n: int, cfg: LocalTrainConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """The row indices of every step, drawn from ``rng`` in :func:`local_sgd`'s order."""
    if n == 0:
        raise ValueError("local training needs at least one sample")
    plan = []
    for _ in range(cfg.epochs):
        perm = rng.permutation(n)
        plan.extend(perm[start:start + cfg.batch_size] for start in range(0, n, cfg.batch_size))
    return plan


def _split(vec: np.ndarray, shapes: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
    t = torch.from_numpy(np.asarray(vec, dtype=np.float32).copy())
    out, offset = {}, 0
    for name, shape in shapes:
        k = int(np.prod(shape)) if len(shape) else 1
        out[name] = t[offset:offset + k].reshape(shape)
        offset += k
    return out


def _group_key(r: TrainRequest):
    return (type(r.model), tuple((n, tuple(p.shape)) for n, p in r.model.named_parameters()), r.cfg,
            r.prox is not None, r.correction is not None)


def batched_local_sgd(requests: list[TrainRequest], device: str | torch.device | None = None
                      ) -> list[tuple[int, float]]:
    """Train every request's model in place; return (steps, mean batch loss) per request, in order.

    Requests whose models/settings match are trained as one vmapped batch (see the module docstring).
    Raises ValueError for a client without rows.
    """
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    groups: dict = {}
    for i, r in enumerate(requests):
        groups.setdefault(_group_key(r), []).append(i)
    out: list = [None] * len(requests)
    for idx in groups.values():
        for i, res in zip(idx, _train_group([requests[i] for i in idx], dev)):
            out[i] = res
    return out


def _step_plan(reqs: list[TrainRequest], cfg: LocalTrainConfig, dev: torch.device):
    """Every client's batch plan, and per step s and client k: the row indices (int64 (S, K, B)) into
    the clients' concatenated rows, the row mask (float32 (S, K, B)) and whether k steps (bool (S, K))."""
    plans = [batch_plan(len(r.y), cfg, r.rng) for r in reqs]
    S, K, B = max(len(p) for p in plans), len(reqs), cfg.batch_size
    offsets = np.concatenate([[0], np.cumsum([len(r.y) for r in reqs])[:-1]])
    idx = np.zeros((S, K, B), np.int64)
    mask = np.zeros((S, K, B), np.float32)
    for k, plan in enumerate(plans):
        idx[:, k, :] = offsets[k]  # padding points at a real row of the same client (finite logits)
        for s, b in enumerate(plan):
            idx[s, k, :len(b)] = b + offsets[k]
            mask[s, k, :len(b)] = 1.0
    active = torch.from_numpy(mask.max(axis=2) > 0).to(dev)                 # (S, K)
    return plans, torch.from_numpy(idx).to(dev), torch.from_numpy(mask).to(dev), active


def _stacked(reqs: list[TrainRequest], shapes, dev: torch.device):
    """FedProx's mu (float32 (K,)) and anchors, and SCAFFOLD's corrections, stacked per parameter name
    along a leading client axis (None where the group has none)."""
    names = [n for n, _ in shapes]
    has_prox = reqs[0].prox is not None
    mu = torch.tensor([r.prox[0] if has_prox else 0.0 for r in reqs], dtype=torch.float32, device=dev)
    anchors = ({n: torch.stack([_split(r.prox[1], shapes)[n] for r in reqs]).to(dev) for n in names}
               if has_prox else None)
    corr = None
    if reqs[0].correction is not None:
        parts = [_split(r.correction, shapes) for r in reqs]
        corr = {n: torch.stack([p[n] for p in parts]).to(dev) for n in names}
    return mu, anchors, corr


def _sgd_update(params: dict, bufs: dict, grads: dict, act: torch.Tensor, cfg: LocalTrainConfig, corr) -> None:
    """One SGD step (``torch.optim.SGD``'s momentum and weight decay, SCAFFOLD's correction) applied in
    place to the clients where ``act`` (bool (K,)) is set; the others keep parameters and momentum."""
    lr, rho, wd = cfg.lr, cfg.momentum, cfg.weight_decay
    for n in params:
        a = act.view(len(act), *([1] * (params[n].dim() - 1)))
        d = grads[n] + wd * params[n] if wd else grads[n]
        b = rho * bufs[n] + d if rho else d
        w = params[n] - lr * b
        if corr is not None:
            w = w - lr * corr[n]
        params[n] = torch.where(a, w, params[n])
        bufs[n] = torch.where(a, b, bufs[n])


def _train_group(reqs: list[TrainRequest], dev: torch.device) -> list[tuple[int, float]]:
    """Train one group of alike requests as a vmapped batch; (steps, mean batch loss) per request."""
    K, cfg = len(reqs), reqs[0].cfg
    template = copy.deepcopy(reqs[0].model).to(dev)
    shapes = [(n, p.shape) for n, p in template.named_parameters()]
    names = [n for n, _ in shapes]
    with torch.no_grad():
        params = {n: torch.stack([dict(r.model.named_parameters())[n].detach().float() for r in reqs]).to(dev)
                  for n in names}
    plans, idx_t, mask_t, active = _step_plan(reqs, cfg, dev)
    X_all = torch.from_numpy(np.ascontiguousarray(np.concatenate([r.X for r in reqs]), dtype=np.float32)).to(dev)
    y_all = torch.from_numpy(np.concatenate([np.asarray(r.y, np.int64) for r in reqs])).to(dev)
    mu, anchors, corr = _stacked(reqs, shapes, dev)

    def loss_fn(p, x, y, m, mu_k, anchor):
        ce = nn.functional.cross_entropy(functional_call(template, p, (x,)), y, reduction="none")
        loss = (ce * m).sum() / m.sum().clamp(min=1.0)
        if anchor is not None:
            loss = loss + (mu_k / 2) * sum(torch.sum((p[n] - anchor[n]) ** 2) for n in names)
        return loss

    step_fn = vmap(grad_and_value(loss_fn), in_dims=(0, 0, 0, 0, 0, 0 if anchors is not None else None))
    bufs = {n: torch.zeros_like(params[n]) for n in names}
    loss_sum = torch.zeros(K, dtype=torch.float64, device=dev)
    template.train()
    for s in range(len(idx_t)):
        rows = idx_t[s]
        grads, loss = step_fn(params, X_all[rows], y_all[rows], mask_t[s], mu, anchors)
        with torch.no_grad():
            _sgd_update(params, bufs, grads, active[s], cfg, corr)
            loss_sum += torch.where(active[s], loss.detach().double(), torch.zeros_like(loss_sum))
    losses = loss_sum.cpu().numpy()
    with torch.no_grad():
        for k, r in enumerate(reqs):
            for n, p in r.model.named_parameters():
                p.copy_(params[n][k].to(p.device, p.dtype))
    return [(len(plans[k]), float(losses[k] / len(plans[k]))) for k in range(K)]


@dataclass
class _Job:
    request: TrainRequest
    result: tuple[int, float] | None = None
    error: BaseException | None = None
    taken: bool = False
    done: bool = False


@dataclass
class BatchedTrainer:
    """Rendezvous of the client threads of one simulated FL run (see the module docstring).

    Args:
        device: where the batch trains (``cpu``, ``cuda``; :func:`resolve_device`).
        wait_s: how long a client waits for the rest of its round before training whoever came
            (a client that died never arrives; the batch is then smaller, the maths unchanged).

    Attributes: ``samples`` and ``seconds`` (client-samples trained and the time spent, for throughput).
    """

    device: str | None = None
    wait_s: float = 30.0
    samples: int = 0
    seconds: float = 0.0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: dict = field(default_factory=dict)

    def __post_init__(self):
        self._device = resolve_device(self.device)

    def handle(self) -> "TrainerHandle":
        """A client's handle (set as ``Strategy.trainer``)."""
        return TrainerHandle(self)

    def train(self, key, expected: int, request: TrainRequest) -> tuple[int, float]:
        """Join round ``key``'s batch of ``expected`` clients; return this client's (steps, mean loss)."""
        job = _Job(request)
        batch = None
        with self._cond:
            self._pending.setdefault(key, []).append(job)
            if len(self._pending[key]) >= expected:
                batch = self._take(key)
            else:
                deadline = time.monotonic() + self.wait_s
                while not job.taken:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        batch = self._take(key)
                        break
                    self._cond.wait(left)
        if batch is not None:
            self._run(batch)
        with self._cond:
            self._cond.wait_for(lambda: job.done)
        if job.error is not None:
            raise job.error
        return job.result

    def _take(self, key) -> list[_Job]:
        batch = self._pending.pop(key)
        for j in batch:
            j.taken = True
        self._cond.notify_all()
        return batch

    def _run(self, batch: list[_Job]) -> None:
        t0 = time.perf_counter()
        try:
            results = batched_local_sgd([j.request for j in batch], self._device)
        except BaseException as exc:  # noqa: BLE001 - every client of the batch sees the failure
            results, error = [None] * len(batch), exc
        else:
            error = None
        with self._cond:
            for j, res in zip(batch, results):
                j.result, j.error, j.done = res, error, True
            self.seconds += time.perf_counter() - t0
            self.samples += sum(len(j.request.y) * j.request.cfg.epochs for j in batch)
            self._cond.notify_all()


class TrainerHandle:
    """One client's view of a :class:`BatchedTrainer`: :meth:`begin` names the round and its size."""

    def __init__(self, trainer: BatchedTrainer):
        self.trainer = trainer
        self.key, self.expected = None, 1

    def begin(self, round_id, n_participants: int) -> None:
        """Name the coming round (``round_id``) and how many clients train in it, so the batch waits for that many."""
        self.key, self.expected = round_id, max(1, int(n_participants))

    def train(self, model: nn.Module, X: np.ndarray, y: np.ndarray, cfg: LocalTrainConfig, rng: np.random.Generator,
              *, prox=None, correction=None) -> tuple[int, float]:
        """:func:`local_sgd` of ``model`` in place, batched with the round's other clients: (steps, mean loss)."""
        return self.trainer.train(self.key, self.expected, TrainRequest(model, X, y, cfg, rng, prox, correction))
