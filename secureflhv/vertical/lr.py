"""Vertical (hetero) logistic regression with Paillier-protected gradients.

After Hardy et al. 2017, "Private federated learning on vertically partitioned data via entity
resolution and additively homomorphic encryption" (arXiv 1711.10677, sections 3-4) and FATE's hetero
LR, with one change: no party, in particular not the key holder, ever decrypts a plaintext gradient or
loss; every decryption is of a value masked with a uniform element of Z_n (see
:mod:`secureflhv.crypto.homomorphic.backend`).

``he_scheme: ou`` runs the same messages and rounds under Okamoto-Uchiyama (:class:`secureflhv.crypto.homomorphic.backend.OUHE`):
there the masks are statistical (uniform integers 2^40 times wider than any masked value) instead of
uniform in Z_n, because OU's plaintext order p is secret; the guest's setup names the scheme and a
party configured with the other one stops with a ProtocolError.

Parties: one **guest** (labels y and features X_g), one or more **hosts** (features X_h), and in
``mode="arbiter"`` a data-less **arbiter** (the server) holding the Paillier private key. In
``mode="two_party"`` there is no arbiter and the guest holds the key. Rows are already aligned (PSI).

Model and loss (Taylor expansion of the logistic loss at 0, Hardy et al. eq. 3), y in {-1, +1}::

    wx_i   = u_g,i + sum_h u_h,i          u_k = X_k w_k  (the guest's X_g has a trailing 1-column
                                                          for the intercept when fit_intercept)
    loss   = mean_i [ log 2 - 1/2 y_i wx_i + 1/8 wx_i^2 ] + l2/2 * ||w||^2   (intercept not penalised)
    d_i    = 1/4 wx_i - 1/2 y_i
    grad_k = X_k^T d / n_b + l2 * w_k

Tasks (``task``, :mod:`secureflhv.vertical.lr_tasks`): the formulas above are ``binary``. Every task's
loss is a quadratic in the row's K scores, loss_i = c0_i + a_i.z_i + 1/2 z_i^T H z_i with a constant
H = h (I - beta 1 1^T), so the same messages carry it: ``multiclass`` (softmax cross-entropy expanded at 0,
K = classes, weights (d_k, K), u_h / d of shape (n_b, K), gradients [[d]]^T X_k of shape (K, d_k),
and in arbiter mode hosts also send [[sum_i (sum_c u_h,ic)^2]] for the coupling term) and
``regression`` (FATE's hetero linear regression: d = wx - y, loss 1/2 (wx - y)^2, h = 1 so [[d]] needs no
scaling). The guest announces the task and K in its setup; a host or arbiter configured with another
task stops with a ProtocolError, and K is bounded (``lr_tasks.MAX_CLASSES``) before it sizes any work.

Training (identical for every role; the batches come from a seed every party holds)::

    for epoch e in 0..epochs-1:
        lr_e = learning-rate schedule: constant lr | inverse_time lr/(1+decay*e)
               | step lr*decay**(e//lr_step_epochs) | cosine lr*(1+cos(pi*e/epochs))/2
        perm = numpy.random.default_rng([seed, e]).permutation(n)     (full batch: no shuffle)
        batches = consecutive chunks of perm of batch_size rows (the last may be shorter)
        for each batch: loss_b at the current weights; every party updates its own block
            v_k = momentum * v_k - lr_e * grad_k ;  w_k += v_k          (heavy ball; momentum 0 = plain GD)
        epoch loss = mean of loss_b over the epoch's batches (Keras' "loss" of the epoch)
        early stopping (guest decides, tells everyone): an epoch "improves" when its loss is below the
        best loss so far by more than min_delta; stop after `early_stopping_rounds` epochs in a row without
        improvement (None: never).
    model kept (restore_best): every party's weights at the end of the epoch with the lowest epoch
        loss (ties: the earlier epoch), as Keras' EarlyStopping(restore_best_weights=True); the guest
        names that epoch to the hosts (``vlr.best``). Without restore_best: the last epoch's weights.

Momentum and the update are local to each party's block of w, so the federation follows exactly the
same path as centralised mini-batch GD on the joined table. The defaults (:class:`VerticalLRConfig`:
heavy-ball momentum, a cosine-decayed learning rate, small batches, l2 near scikit-learn's C=1) were chosen on
breast cancer: the Taylor loss is a convex quadratic whose optimum is a ridge least-squares
classifier, and plain GD from zero needs hundreds of epochs to get near it (condition number ~1e3).
Weights start at zero.

Arbiter mode, one batch (B = the batch rows, [[.]] = Paillier under the arbiter's key)::

    host h  -> guest : [[u_h]] (n_b,), [[sum_i u_h,i^2]] (1,), [[l2/2 ||w_h||^2]] (1,)
    guest            : [[d]] = 1/4 sum_h [[u_h]] + (1/4 u_g - 1/2 y)
    guest   -> hosts : [[d]]
    guest   -> host j>0 (several hosts): [[S_j]] = sum_{h<j} [[u_h]];  host j -> guest: [[sum_i S_j,i u_j,i]]
    party k -> arbiter: [[X_k^T d + r_k]]  (r_k fresh, uniform in Z_n, per element)
    arbiter -> party k: X_k^T d + r_k mod n     ; party k unmasks, divides by n_b, adds l2 w_k, updates
    guest   -> arbiter: [[n_b * loss_b + r]] assembled from the terms above (cross terms included);
    arbiter -> guest  : n_b * loss_b + r mod n  ; guest unmasks (the arbiter does not learn the loss)

With two or more hosts in arbiter mode the hosts' parts carry zero-sum masks (:mod:`.host_masks`: pairwise,
from an X25519 agreement between the hosts at the start, fresh per batch and row), so the guest holds no
ciphertext of one host's values alone that the arbiter would decrypt to anything but noise::

    host h  -> guest : [[u~_h]] = [[enc(u_h) + m_h]], [[reg~_h]]    (sum_h m_h = 0: sum_h [[u~_h]] = [[U]] exactly)
    guest   -> host j (every host): [[V_j]] = [[2 sum_{h<j} u~_h + u~_j]]
    host j  -> guest : [[u~_j . V_j]] (K > 1: and [[rowsum(u~_j) . rowsum(V_j)]])   sum_j = U.U (resp. the rowsums')
    guest            : [[d]], the gradients as above (bit for bit the unmasked values); the loss's quadratic
                       1/2 U H U from the hosts' products instead of per-host [[|u_h|^2]] and cross terms

Two-party mode, one batch ([[.]] under the guest's key)::

    host h  -> guest : u_h (n_b,) in plaintext, l2/2 ||w_h||^2     <- the known leak of this mode
    guest   -> hosts : [[d]]
    host h  -> guest : [[X_h^T d + r_h]]  (r_h uniform in Z_n) ; guest -> host: X_h^T d + r_h mod n

A stronger two-party variant (Yang et al. 2019, both parties hold keys, u_h never in the clear) is not
implemented.

Prediction (:mod:`secureflhv.vertical.prediction`): two-party mode, each host sends the guest u_h of
the rows asked for in plaintext; arbiter mode, u_h only encrypted under the arbiter's key, and the
arbiter decrypts the guest's masked total (:mod:`secureflhv.vertical.lr_scores`).

Messages are protobuf (``messages.proto`` Bundle/EncryptedTensor/Control/Scalars/MaskedValues/
RowsRequest). Every received payload is checked by the ``parse`` callback of
:meth:`~secureflhv.transport.Transport.recv` (shape, key fingerprint, range), so a wrong-shape,
wrong-key or stale message is rejected and logged while training continues. Round ids:
``epoch * 10_000_000 + batch * 10 + step``. On any failure a role tells its peers
(:meth:`Transport.abort`) and re-raises; a dead peer surfaces as
:class:`~secureflhv.transport.PeerTimeout` / :class:`~secureflhv.transport.TransportError` naming it.

Progress is logged per epoch on logger ``secureflhv.vertical.lr``.

Checkpoints (the constructor's ``callbacks``, :mod:`secureflhv.transport.lifecycle`, run by every role at the end
of each epoch; the guest's first callback is its :class:`~secureflhv.transport.lifecycle.EarlyStopping`)
hold what the next epoch needs: weights, momentum velocity, the end-of-epoch weights kept for
``restore_best``, loss history, epoch times and the early-stopping counters; a role built with
``resume=(arrays, state)`` continues after that epoch. The batch order needs no RNG state (it is drawn
from ``[seed, epoch]``). The Paillier key is not checkpointed: a resumed session runs the usual setup
with a fresh key pair, which changes no trained value (every decryption is exact fixed-point).
"""
from __future__ import annotations


import logging
import math
import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, ClassVar, Literal, Sequence

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from ..crypto.homomorphic.backend import constant_shift_bits as _shift_bits
from ..crypto.homomorphic.key_prefetch import resolve_keypair
from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto, whole_count
from ..transport.lifecycle import Callback, Checkpoint, EarlyStopping, Lifecycle
from ..data.dataset import check_matrix
from ..params import EarlyStopping as EarlyStoppingParams, HEParams, with_defaults
from ..params.aliases import rename, warn_renamed
from .common import MAX_BATCHES, VerticalRole, control_parser, round_id
from .host_masks import HostMasks, check_scores, cross_terms, encrypt_masked, masked_mantissas
from .lr_tasks import MAX_CLASSES, TaylorLoss
from .lr_scores import ScoreArbiter, ScoreGuest, ScoreHost
from .prediction import PredictionGuest, PredictionHost

log = logging.getLogger("secureflhv.vertical.lr")

LOG2 = math.log(2.0)

TAG_SETUP = "vlr.setup"
TAG_PUBKEY = "vlr.pubkey"
TAG_HELLO = "vlr.hello"
TAG_FWD = "vlr.fwd"
TAG_D = "vlr.d"
TAG_CROSS_IN = "vlr.cross_in"
TAG_CROSS = "vlr.cross"
TAG_GRAD = "vlr.grad"
TAG_GRAD_DEC = "vlr.grad_dec"
TAG_LOSS = "vlr.loss"
TAG_LOSS_DEC = "vlr.loss_dec"
TAG_CTL = "vlr.ctl"
TAG_BEST = "vlr.best"
TAG_PRED_REQ = "vlr.pred_req"
TAG_PRED = "vlr.pred"

# steps inside one batch (round = base + step)
S_FWD, S_D, S_CROSS, S_GRAD, S_DEC = 1, 2, 3, 4, 5


# --------------------------------------------------------------------------- configuration
class _EpochEarlyStopping(with_defaults(EarlyStoppingParams, early_stopping_rounds=10, min_delta=1e-4)):
    """Early stopping on by default: 10 epochs in a row whose training loss is not 1e-4 below the best."""

    early_stopping_metric: ClassVar[str] = "training loss (mean of the epoch's mini-batch Taylor losses)"


def _old_early_stopping(data: Any) -> Any:
    """The names before :class:`~secureflhv.params.EarlyStopping` (deprecated): ``early_stopping: false`` is
    ``early_stopping_rounds: null``; ``patience`` is ``early_stopping_rounds``, ``tol`` is ``min_delta``."""
    if isinstance(data, dict) and "early_stopping" in data:
        data = dict(data)
        on = data.pop("early_stopping")
        if not isinstance(on, bool):
            raise ValueError(f"early_stopping: must be true or false, got {on!r} (deprecated: use "
                             f"early_stopping_rounds)")
        if "early_stopping_rounds" in data:
            raise ValueError("early_stopping: replaced by early_stopping_rounds; give early_stopping_rounds only")
        warn_renamed("early_stopping", "early_stopping_rounds", " (null: off)")
        if not on:
            data.pop("patience", None)
            data["early_stopping_rounds"] = None
    return rename(data, {"patience": "early_stopping_rounds", "tol": "min_delta"})


class VerticalLRConfig(HEParams, _EpochEarlyStopping):
    """Hyperparameters of vertical LR; every party of a job must use the same values.

    Field names match the job file's ``params`` section; the homomorphic key and precision are
    :class:`~secureflhv.params.HEParams`, early stopping :class:`~secureflhv.params.EarlyStopping` (the
    monitored loss is the epoch's training loss). The guest sends mode, epochs, batch_size, seed and the
    host list at the start and every party checks them against its own (ValueError on a mismatch).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _old_names = model_validator(mode="before")(_old_early_stopping)

    task: Literal["binary", "multiclass", "regression"] = Field(
        default="binary", description="binary: Taylor logistic regression (labels 0/1 or -1/+1); multiclass: "
                                      "Taylor softmax regression (labels 0..K-1); regression: linear regression "
                                      "(squared loss); see secureflhv.vertical.lr_tasks")
    mode: Literal["arbiter", "two_party"] = Field(
        default="arbiter", description="arbiter: a data-less server holds the Paillier key; two_party: the guest holds "
                                       "it and sees the hosts' partial scores (see the module docstring)")
    epochs: int = Field(default=20, ge=1, description="maximum number of passes over the training rows")
    batch_size: int | None = Field(default=32, ge=1, description="rows per mini-batch; None = full batch")
    learning_rate: float = Field(default=0.4, gt=0, description="step size of epoch 0 (the schedule scales it)")
    lr_schedule: Literal["constant", "inverse_time", "step", "cosine"] = Field(
        default="cosine", description="constant: lr; inverse_time: lr/(1+lr_decay*epoch); "
                                      "step: lr*lr_decay**(epoch//lr_step_epochs); cosine: lr*(1+cos(pi*epoch/epochs))/2")
    lr_decay: float = Field(default=0.0, ge=0, description="decay factor of the inverse_time and step schedules")
    lr_step_epochs: int = Field(default=10, ge=1, description="epochs per step of the step schedule")
    momentum: float = Field(default=0.8, ge=0, lt=1,
                            description="heavy-ball momentum of each party's own weights (0: plain gradient descent)")
    l2: float = Field(default=0.0025, ge=0,
                      description="L2 penalty alpha on the mean loss: loss += alpha/2 ||w||^2 (intercept not "
                                  "penalised); scikit-learn's C corresponds to alpha = 1/(C * training rows)")
    fit_intercept: bool = Field(default=True, description="learn an intercept (a column of ones at the guest)")
    restore_best: bool = Field(default=True, description="keep the weights of the epoch with the lowest training "
                                                         "loss (else those of the last epoch)")
    seed: int = Field(default=0, ge=0, description="seed of the mini-batch shuffle")

    @model_validator(mode="after")
    def _check(self):
        if self.lr_schedule == "step" and not 0 < self.lr_decay <= 1:
            raise ValueError("lr_decay: the step schedule needs a factor in (0, 1]")
        return self

    def learning_rate_at(self, epoch: int) -> float:
        """Learning rate of ``epoch`` (0-based)."""
        if self.lr_schedule == "inverse_time":
            return self.learning_rate / (1.0 + self.lr_decay * epoch)
        if self.lr_schedule == "step":
            return self.learning_rate * self.lr_decay ** (epoch // self.lr_step_epochs)
        if self.lr_schedule == "cosine":
            return self.learning_rate * 0.5 * (1.0 + math.cos(math.pi * epoch / self.epochs))
        return self.learning_rate

    def step(self, w: np.ndarray, velocity: np.ndarray, grad: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """One heavy-ball update of a party's own block: returns (new weights, new velocity), float64 like ``w``."""
        velocity = self.momentum * velocity - lr * grad
        return w + velocity, velocity


def batch_plan(n_rows: int, batch_size: int | None, seed: int, epoch: int) -> list[np.ndarray]:
    """Row indices of each mini-batch of ``epoch``, identical at every party (see module docstring)."""
    if batch_size is None or batch_size >= n_rows:
        return [np.arange(n_rows)]
    perm = np.random.default_rng([seed, epoch]).permutation(n_rows)
    return [perm[i:i + batch_size] for i in range(0, n_rows, batch_size)]


@dataclass
class FitResult:
    """What ``fit`` returns.

    Attributes:
        weights: this party's feature weights, float64 (d_k,) (empty for the arbiter).
        intercept: the intercept (guest with fit_intercept) or None.
        losses: decrypted Taylor loss per epoch (guest only; empty elsewhere).
        epoch_seconds: wall time of each epoch.
        stopped_early: True when early stopping ended training before ``epochs``.
        best_epoch: 0-based epoch whose end-of-epoch weights are kept (see ``restore_best``).
    """

    weights: np.ndarray
    intercept: float | None
    losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    stopped_early: bool = False
    best_epoch: int = -1

    @property
    def epochs(self) -> int:
        """Epochs trained (this session and any resumed from)."""
        return len(self.epoch_seconds)


# --------------------------------------------------------------------------- wire helpers
class _Role(Lifecycle, VerticalRole):
    """Shared plumbing of the three roles."""

    protocol = "vertical LR"
    pred_request_tag = TAG_PRED_REQ
    step_key, family, list_arrays = "epochs_done", "vertical LR", True

    def __init__(self, transport: Transport, config: VerticalLRConfig | dict, backend,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        self.config = config if isinstance(config, VerticalLRConfig) else VerticalLRConfig(**config)
        backend = self.config.he_scheme if backend is None else backend  # an explicit backend wins (benchmarks)
        super().__init__(transport, backend, self.config.precision_bits, self.config.dot_precision_bits)
        self._init_lifecycle(callbacks, resume)

    def _pubkey_parser(self):
        return self.wire.public_key_parser(self.config.insecure_test_key)

    def _masked(self) -> bool:
        """Arbiter mode with two or more hosts: the hosts' scores carry zero-sum masks (:mod:`.host_masks`)."""
        return self.config.mode == "arbiter" and len(getattr(self, "host_ids", ())) >= 2

    def _restored_epochs(self, names: Sequence[str], width: int | None) -> tuple[int, dict, dict]:
        """(epochs done, arrays, state) of ``resume`` (0, {}, {} without one); ValueError if it does not fit."""
        done, arrays, state = self._restored(self.config.epochs, names)
        for name in names if done else ():
            rows = arrays[name].shape[0] if arrays[name].ndim else -1
            if (name in ("seconds", "losses", "kept") and rows != done) or \
                    (width is not None and name in ("w", "v", "kept")
                     and arrays[name].shape[1 if name == "kept" else 0] != width):
                raise ValueError(f"checkpoint: {name} has shape {arrays[name].shape}, which does not fit")
        return done, arrays, state

    def _end_epoch(self, epoch: int, t0: float, seconds: list[float], done: str) -> bool:
        """Host / arbiter: wait for the guest's end-of-epoch Control; log and time the epoch; True to stop."""
        ctl = self.t.recv(self.guest_id, TAG_CTL, round=epoch + 1, parse=control_parser(epoch))
        seconds.append(time.perf_counter() - t0)
        log.info("%s: epoch %d/%d %s in %.2fs", self.party_id, epoch + 1, self.config.epochs, done, seconds[-1])
        return ctl.command == "stop"

    def _serve_decrypt(self, priv, pub, sender: str, tag_in: str, tag_out: str, rnd: int, shape) -> None:
        """Key holder: decrypt one masked vector for ``sender`` and send back the masked plaintexts."""
        enc = self.t.recv(sender, tag_in, round=rnd, parse=self._enc_parser(pub, shape, f"{tag_in} from {sender}",
                                                                            self._wire_exponent(tag_in)))
        self._send_decrypted(priv, enc, sender, tag_out, rnd + 1)

    def _wire_exponent(self, tag: str) -> int:
        """The fixed-point exponent of every honest [[tag]] (the batch diagrams in the module docstring):
        fresh encryptions [[u]], sums of them; [[d]] = 1/4 sum [[u_h]] + plain (arbiter mode; the key holder
        encrypts d fresh in two-party mode); cross terms and gradients one plaintext product further; the
        loss the finest of its terms. A received tensor at any other exponent is rejected."""
        fresh, dot = -self.he.precision_bits, self.he.dot_precision_bits
        L, arbiter = self.loss, self.config.mode == "arbiter"
        d_shift = max(_shift_bits(L.h), _shift_bits(L.h * L.beta)) if arbiter else 0  # [[U H]] (_h_times)
        if self._masked():  # the quadratic from the hosts' masked products at 2 * fresh (_batch_arbiter)
            quad = [2 * fresh - _shift_bits(0.5 * L.h)]
            if L.k > 1:
                quad.append(2 * fresh - _shift_bits(0.5 * L.h * L.beta))
            if tag == TAG_LOSS:  # dot(coef, U), [[reg]] * n_b, the quadratic
                return min([fresh - dot, fresh] + quad)
            if tag == TAG_CROSS:
                return 2 * fresh
        if tag == TAG_LOSS:  # dot(coef, U), [[u2]] * h/2, [[u1]] * -h beta/2, [[reg]] * n_b, [[cross]] * h
            terms = [fresh - dot, fresh - _shift_bits(0.5 * L.h), fresh]
            if L.k > 1:
                terms.append(fresh - _shift_bits(0.5 * L.h * L.beta))
            if len(self.host_ids) > 1:
                terms.append(fresh - dot - _shift_bits(L.h))
            return min(terms)
        return {TAG_FWD: fresh, TAG_CROSS_IN: fresh, TAG_CROSS: fresh - dot, TAG_D: fresh - d_shift,
                TAG_GRAD: fresh - dot - d_shift}[tag]

    # K-output helpers (K = self.loss.k; K = 1 keeps the binary protocol's shapes)
    loss: TaylorLoss | None = None  # the task's loss, known after setup (hosts, arbiter) or at init (guest)

    def _grad_shape(self, d: int) -> tuple:
        """Shape of an encrypted gradient of a d-feature block on the wire: (d,) or (K, d)."""
        return (d,) if self.loss.k == 1 else (self.loss.k, d)

    def _xt_enc(self, X: np.ndarray, d_enc):
        """[[X^T d]] in the wire shape of :meth:`_grad_shape` (one multi-exponentiation per column of d)."""
        return self.he.dot(X, d_enc) if self.loss.k == 1 else self.he.t_matmul(d_enc, X)

    def _h_times(self, U):
        """[[U H]] for encrypted scores U (n,) or (n, K): h U - h beta rowsum(U) 1^T, on ciphertexts."""
        L = self.loss
        out = self.he.mul_const(U, L.h)
        if L.beta:
            out = out + self.he.mul_const(U.sum(axis=1).reshape(U.shape[0], 1), -L.h * L.beta)
        return out


def _setup_message(cfg: VerticalLRConfig, n_rows: int, host_ids: Sequence[str], k: int = 1) -> messages_pb2.Bundle:
    return messages_pb2.Bundle(
        scalars={"n_rows": n_rows, "batch_size": float(cfg.batch_size or 0), "seed": float(cfg.seed),
                 "epochs": float(cfg.epochs), "n_outputs": float(k)},
        text={"mode": cfg.mode, "hosts": ",".join(host_ids), "he_scheme": cfg.he_scheme, "task": cfg.task})


def _check_setup(msg: messages_pb2.Bundle, cfg: VerticalLRConfig, host_ids: Sequence[str] | None,
                 n_rows: int | None, who: str) -> tuple[int, TaylorLoss]:
    """Compare the guest's plan with ours; return (number of rows, the task's loss with the guest's
    output count K, bounded by MAX_CLASSES). ProtocolError names the field."""
    theirs = {"batch_size": msg.scalars.get("batch_size"), "seed": msg.scalars.get("seed"),
              "epochs": msg.scalars.get("epochs"), "mode": msg.text.get("mode"),
              "he_scheme": msg.text.get("he_scheme", "paillier"), "task": msg.text.get("task", "binary")}
    ours = {"batch_size": float(cfg.batch_size or 0), "seed": float(cfg.seed), "epochs": float(cfg.epochs),
            "mode": cfg.mode, "he_scheme": cfg.he_scheme, "task": cfg.task}
    for k in ours:
        if theirs[k] != ours[k]:
            raise ProtocolError(f"{who}: config field {k!r} is {ours[k]!r} here but {theirs[k]!r} at the guest")
    if host_ids is not None and msg.text.get("hosts") != ",".join(host_ids):
        raise ProtocolError(f"{who}: host list {list(host_ids)} differs from the guest's {msg.text.get('hosts')!r}")
    rows = whole_count(msg.scalars.get("n_rows", -1.0), f"{who}: the guest's n_rows")
    if n_rows is not None and rows != n_rows:
        raise ProtocolError(f"{who}: {n_rows} aligned rows here but {rows} at the guest (run PSI first)")
    k = whole_count(msg.scalars.get("n_outputs", 1.0), f"{who}: the guest's n_outputs", lo=1, hi=MAX_CLASSES + 1)
    try:
        loss = TaylorLoss(cfg.task, k)
    except ValueError as exc:
        raise ProtocolError(f"{who}: the guest's n_outputs: {exc}") from None
    return rows, loss


def _scalars_parser(keys: Sequence[str]):
    """``parse`` callback for Scalars carrying ``keys``, each a whole count in [1, 2^31)."""
    def validate(m: messages_pb2.Scalars):
        missing = [k for k in keys if k not in m.values]
        if missing:
            raise ProtocolError(f"missing scalar(s) {missing}")
        for k in keys:
            whole_count(m.values[k], k, lo=1)
        return m
    return parse_message(messages_pb2.Scalars, validate)


def _best_epoch_parser(epochs_run: int):
    """``parse`` callback for the guest's ``vlr.best``: an integer epoch in [0, epochs_run)."""
    def validate(m: messages_pb2.Scalars):
        best = m.values.get("epoch", -1.0)
        if best != int(best) or not 0 <= best < epochs_run:
            raise ProtocolError(f"{TAG_BEST}: epoch {best!r} is not one of the {epochs_run} epochs trained")
        return int(best)
    return parse_message(messages_pb2.Scalars, validate)


class _BestWeights:
    """End-of-epoch weights of one party, and the rule that picks the one every party keeps."""

    def __init__(self):
        self.history: list[np.ndarray] = []

    def record(self, w: np.ndarray) -> None:
        self.history.append(w.copy())

    def pick(self, best_epoch: int) -> np.ndarray:
        return self.history[best_epoch].copy()


# --------------------------------------------------------------------------- guest
class VerticalLRGuest(PredictionGuest, ScoreGuest, _Role):
    """The label holder (active party); drives training, decides early stopping, predicts.

    Args:
        transport: this party's transport.
        host_ids: the hosts, in the same order at every party.
        X: float64 (n, d_g) features, rows aligned by PSI with every host.
        y: (n,) labels: ``task`` binary: {0, 1} or {-1, +1}; multiclass: class ids 0..K-1; regression:
            float targets.
        config: :class:`VerticalLRConfig` (or a dict of its fields).
        arbiter_id: the arbiter's party id (``mode="arbiter"``), else None.
        keypair: (public, private) key of ``config.he_scheme`` to use in two-party mode, or a Future of one
            (:func:`~secureflhv.crypto.homomorphic.key_prefetch.prefetch_keypair`; default: generated).
        backend: "paillier" (default), "identity" (NO encryption, benchmarks only) or an
            :class:`~secureflhv.crypto.homomorphic.backend.HEBackend`.
        on_epoch: optional ``callback(epoch, loss)`` called after each epoch (progress reporting).
        callbacks, resume: the role lifecycle (Checkpoints in the module docstring); they run after the
            guest's own EarlyStopping, and a stop request from any of them ends the training for every party.
        n_classes: K for ``task: multiclass`` (default: largest label + 1); sent to every party in the setup.

    Weights: binary / regression (d_g,) float64 and a float intercept; multiclass (d_g, K) and (K,).

    What the guest learns:
        arbiter mode: its own gradient and weights; the per-batch and per-epoch Taylor loss (sum over
        all parties, the one value it decrypts, through the arbiter, under its own mask); nothing about
        host data or weights beyond what the loss implies (host values reach it only encrypted). A guest
        that deviates can have the arbiter decrypt any ciphertext it holds: with one host that gives u_h;
        with two or more only sums over all hosts (per row: sum_h u_h), each host's part being masked
        (:mod:`.host_masks`).
        two-party mode: additionally each host's partial score u_h = X_h w_h for every row of every
        batch and each host's ||w_h||^2 (through the loss); it decrypts the hosts' masked gradients but
        the masks are uniform in Z_n, so it learns nothing about them.
        prediction, two-party mode: each host's partial score u_h of every row it asks about; arbiter
        mode: only each row's total score (:mod:`secureflhv.vertical.lr_scores`), also when it deviates
        (two or more hosts).
    """

    def __init__(self, transport: Transport, host_ids: Sequence[str], X, y, config, arbiter_id: str | None = None,
                 *, keypair=None, backend=None, on_epoch=None, n_classes: int | None = None,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        cfg = config if isinstance(config, VerticalLRConfig) else VerticalLRConfig(**config)
        # early stopping is the first callback (the job file's early_stopping / patience / tol); it tracks the
        # best loss even when off, for the checkpoints
        self._stopping = EarlyStopping(cfg.early_stopping_rounds, cfg.min_delta, "loss", cfg.epochs)
        super().__init__(transport, cfg, backend, [self._stopping, *callbacks], resume)
        self.on_epoch = on_epoch  # optional callback(epoch index, epoch loss), e.g. for a progress bar
        self.host_ids = list(host_ids)
        if not self.host_ids:
            raise ValueError("host_ids: vertical LR needs at least one host")
        self.arbiter_id = arbiter_id
        if self.config.mode == "arbiter" and arbiter_id is None:
            raise ValueError("arbiter_id: mode 'arbiter' needs the arbiter's party id")
        if self.config.mode == "two_party" and arbiter_id is not None:
            raise ValueError("arbiter_id: mode 'two_party' has no arbiter")
        self.X = check_matrix(X, "X")
        y = np.asarray(y).ravel()
        if y.shape[0] != self.X.shape[0]:
            raise ValueError(f"y: {y.shape[0]} labels for {self.X.shape[0]} rows")
        k = 1
        if self.config.task == "multiclass":
            if n_classes is None and not (y.size and np.all(np.isfinite(y)) and np.all(y == np.round(y))):
                raise ValueError("y: multiclass labels must be class ids 0..K-1")
            k = int(n_classes if n_classes is not None else np.max(y) + 1)
        self.loss = TaylorLoss(self.config.task, k)
        self.T = self.loss.targets(y)  # (n, K) targets: +-1, one-hot or the value
        self.y = self.loss.wire(self.T)
        self._keypair = keypair
        self.weights = np.zeros((self.X.shape[1],) + self.loss.cols)
        self.intercept = (0.0 if k == 1 else np.zeros(k)) if self.config.fit_intercept else None
        self.result: FitResult | None = None
        self.public_key = None  # the key holder's public key, once training has started

    @classmethod
    def from_model(cls, transport: Transport, host_ids: Sequence[str], weights, intercept: float | None,
                   config, arbiter_id: str | None = None) -> "VerticalLRGuest":
        """A guest that only predicts (:meth:`predict_proba`), with saved ``weights`` (d_g,) float64
        (multiclass: (d_g, K)) and ``intercept`` (a float, multiclass (K,); None without one). With
        ``arbiter_id`` the hosts' scores arrive encrypted and the arbiter (in
        :meth:`VerticalLRArbiter.serve_predictions`) decrypts the masked totals; without one they arrive
        in plaintext and no key is needed."""
        cfg = config if isinstance(config, VerticalLRConfig) else VerticalLRConfig(**config)
        w = np.asarray(weights, dtype=np.float64)
        w = w.reshape(w.shape[0], -1) if cfg.task == "multiclass" else w.ravel()
        guest = cls(transport, host_ids, np.zeros((1, w.shape[0])), np.zeros(1),
                    cfg.model_copy(update={"mode": "two_party" if arbiter_id is None else "arbiter",
                                           "fit_intercept": intercept is not None}),
                    arbiter_id, n_classes=w.shape[1] if w.ndim == 2 else None)
        guest.weights = w.copy()
        if intercept is not None:
            b = np.asarray(intercept, dtype=np.float64)
            guest.intercept = float(b) if w.ndim == 1 else b.reshape(w.shape[1]).copy()
        else:
            guest.intercept = None
        return guest

    def _peers(self):
        return self.host_ids + ([self.arbiter_id] if self.arbiter_id else [])

    def _design(self, X: np.ndarray) -> np.ndarray:
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.config.fit_intercept else X

    def fit(self) -> FitResult:
        """Train; returns the guest's :class:`FitResult` (weights, intercept, loss per epoch)."""
        self.result = self._guarded(self._trained, self._fit)
        return self.result

    def _fit(self) -> FitResult:
        cfg = self.config
        n = self.X.shape[0]
        if -(-n // (cfg.batch_size or n)) >= MAX_BATCHES:
            raise ValueError(f"batch_size: {cfg.batch_size} gives too many batches for {n} rows")
        Xd = self._design(self.X)
        self.max_score_rows = n  # the arbiter bounds score requests by the training rows of the setup
        keys = self._key_exchange(n, Xd.shape[1])
        self.public_key = keys[0]
        w = np.zeros((Xd.shape[1],) + self.loss.cols)
        v = np.zeros_like(w)
        losses, seconds, kept, stopped = [], [], _BestWeights(), False
        first, arr, st = self._restored_epochs(("w", "v", "kept", "losses", "seconds"), Xd.shape[1])
        if first:
            w, v, kept.history = arr["w"].copy(), arr["v"].copy(), [r.copy() for r in arr["kept"]]
            losses, seconds = arr["losses"].tolist(), arr["seconds"].tolist()
            self._stopping.replay(losses)  # the same best and count as the checkpoint's "best" / "bad"
            stopped = bool(st.get("stopped", False))
        for epoch in range(first, first if stopped else cfg.epochs):
            t0 = time.perf_counter()
            w, v, loss = self._train_epoch(epoch, Xd, w, v, *keys)
            kept.record(w)
            losses.append(loss)
            seconds.append(time.perf_counter() - t0)
            stop = self._after_step(epoch + 1, lambda step, w=w, v=v: self._snapshot(step, w, v, kept, losses, seconds),
                                    {"loss": loss})
            ctl = messages_pb2.Control(command="stop" if stop else "continue", epoch=epoch)
            for p in self._peers():
                self.t.send(p, TAG_CTL, ctl, round=epoch + 1)
            log.info("%s: epoch %d/%d loss %.6f lr %.4g %.2fs", self.party_id, epoch + 1, cfg.epochs, loss,
                     cfg.learning_rate_at(epoch), seconds[-1])
            if self.on_epoch is not None:
                self.on_epoch(epoch, loss)
            if stop:
                stopped = True
                log.info("%s: early stopping after epoch %d (no improvement > %g for %d epochs)",
                         self.party_id, epoch + 1, cfg.min_delta, cfg.early_stopping_rounds)
                break
        best_epoch = self._keep(kept, losses)
        return FitResult(self.weights, self.intercept, losses, seconds, stopped, best_epoch)

    def _snapshot(self, step, w, v, kept: _BestWeights, losses: list, seconds: list) -> tuple[dict, dict]:
        """The guest's checkpoint after an epoch: weights, velocity, kept weights, history, early-stopping state."""
        stopping = self._stopping
        return ({"w": w, "v": v, "kept": np.array(kept.history), "losses": np.array(losses),
                 "seconds": np.array(seconds)},
                {"best": None if math.isinf(stopping.best) else stopping.best, "bad": stopping.bad,
                 "stopped": step.stop})

    def _keep(self, kept: _BestWeights, losses: list) -> int:
        """Name the kept epoch to the hosts (``vlr.best``) and set :attr:`weights` / :attr:`intercept`; returns it."""
        cfg = self.config
        best_epoch = int(np.argmin(losses)) if cfg.restore_best else len(losses) - 1
        for h in self.host_ids:
            self.t.send(h, TAG_BEST, messages_pb2.Scalars(values={"epoch": best_epoch}), round=0)
        log.info("%s: keeping the weights after epoch %d (loss %.6f)", self.party_id, best_epoch + 1,
                 losses[best_epoch])
        w = kept.pick(best_epoch)
        self.weights = w[:-1].copy() if cfg.fit_intercept else w.copy()
        self.intercept = (float(w[-1]) if w.ndim == 1 else w[-1].copy()) if cfg.fit_intercept else None
        return best_epoch

    def _key_exchange(self, n: int, d_g: int):
        """Setup to every peer; the key pair (arbiter mode: the arbiter's public key); each host's width.

        Returns (pub, priv or None, {host: n_features})."""
        cfg, t = self.config, self.t
        setup = _setup_message(cfg, n, self.host_ids, self.loss.k)
        for p in self._peers():
            t.send(p, TAG_SETUP, setup, round=0)
        if cfg.mode == "arbiter":
            pub, priv = t.recv(self.arbiter_id, TAG_PUBKEY, parse=self._pubkey_parser()), None
            t.send(self.arbiter_id, TAG_HELLO, messages_pb2.Scalars(values={"n_features": d_g}), round=0)
        else:
            pub, priv = resolve_keypair(self._keypair) or self.he.generate_keypair(cfg.key_bits, cfg.insecure_test_key)
            for h in self.host_ids:
                t.send(h, TAG_PUBKEY, self.wire.public_key_to_proto(pub), round=0)
        host_dims = {h: int(t.recv(h, TAG_HELLO, parse=_scalars_parser(["n_features"])).values["n_features"])
                     for h in self.host_ids}
        return pub, priv, host_dims

    def _train_epoch(self, epoch: int, Xd: np.ndarray, w: np.ndarray, v: np.ndarray, pub, priv,
                     host_dims) -> tuple[np.ndarray, np.ndarray, float]:
        """One epoch of mini-batch gradient descent with the hosts; returns (weights, velocity, mean batch loss)."""
        cfg = self.config
        penal = np.ones((Xd.shape[1],) + (1,) * (w.ndim - 1))
        if cfg.fit_intercept:
            penal[-1] = 0.0  # the intercept is not regularised
        lr = cfg.learning_rate_at(epoch)
        batch_losses = []
        for b, idx in enumerate(batch_plan(Xd.shape[0], cfg.batch_size, cfg.seed, epoch)):
            rnd = round_id(epoch, b, 0)
            Xb, yb = Xd[idx], self.T[idx]
            u_g = Xb @ w
            reg_g = 0.5 * cfg.l2 * float(np.sum(penal * w * w))
            if cfg.mode == "arbiter":
                g_sum, loss_b = self._batch_arbiter(pub, Xb, yb, u_g, reg_g, rnd)
            else:
                g_sum, loss_b = self._batch_two_party(pub, priv, Xb, yb, u_g, reg_g, rnd, host_dims)
            w, v = cfg.step(w, v, g_sum / len(idx) + cfg.l2 * penal * w, lr)
            batch_losses.append(loss_b)
        return w, v, float(np.mean(batch_losses))

    def _batch_arbiter(self, pub, Xb, Tb, u_g, reg_g, rnd):
        he, t, L = self.he, self.t, self.loss
        nb = Xb.shape[0]
        masked = self._masked()
        quad = ("reg",) if masked else ("u2", "reg") + (("u1",) if L.k > 1 else ())

        def fwd_parser(h):
            def validate(m: messages_pb2.Bundle):
                missing = [k for k in ("u",) + quad if k not in m.encrypted]
                if missing:
                    raise ProtocolError(f"{TAG_FWD} from {h}: missing {missing}")
                e = self._wire_exponent(TAG_FWD)
                return (self.wire.from_proto(m.encrypted["u"], pub, (nb,) + L.cols, f"{TAG_FWD}.u from {h}",
                                             exponent=e),) + \
                    tuple(self.wire.from_proto(m.encrypted[k], pub, (1,), f"{TAG_FWD}.{k} from {h}", exponent=e)
                          for k in quad)
            return parse_message(messages_pb2.Bundle, validate)

        fwds = [t.recv(h, TAG_FWD, round=rnd + S_FWD, parse=fwd_parser(h)) for h in self.host_ids]
        U = reduce(lambda a, b: a + b, [f[0] for f in fwds])
        coef = L.wire(L.residual(Tb, L.rows(u_g)))  # a + u_g H: the guest's plaintext part of d
        d_enc = self._h_times(U) + coef
        d_msg = self.wire.to_proto(d_enc)
        for h in self.host_ids:
            t.send(h, TAG_D, d_msg, round=rnd + S_D)
        # our gradient first, so the arbiter can start decrypting while we assemble the loss
        g_mask = self._ask_decrypt(pub, self._xt_enc(Xb, d_enc), self.arbiter_id, TAG_GRAD, rnd + S_GRAD)
        # n_b * loss = sum_i[c0 + a.u_g + u_g H u_g/2] + coef . U + 1/2 U H U + n_b * reg
        # (binary: coef = -y/2 + u_g/4, U H U / 2 = |U|^2 / 8; lr_tasks.TaylorLoss)
        plain = float(np.sum(L.row_losses(Tb, L.rows(u_g)))) + nb * reg_g
        loss_enc = he.dot(coef.reshape(-1, 1), U.reshape(-1)) + np.array([plain])
        if masked:
            loss_enc = loss_enc + self._masked_quadratic(pub, fwds, rnd) + reduce(lambda a, b: a + b,
                                                                                   [f[1] for f in fwds]) * nb
        else:
            # cross terms u_h H u_h' (h < h'), computed by host j on the encrypted sum of the earlier hosts' u
            S = fwds[0][0]
            for j, h in enumerate(self.host_ids[1:], start=1):
                t.send(h, TAG_CROSS_IN, self.wire.to_proto(S), round=rnd + S_D)
                S = S + fwds[j][0]
            cross = [t.recv(h, TAG_CROSS, round=rnd + S_CROSS, parse=self._enc_parser(
                         pub, (1,), f"{TAG_CROSS} from {h}", self._wire_exponent(TAG_CROSS)))
                     for h in self.host_ids[1:]]
            for f in fwds:
                loss_enc = loss_enc + he.mul_const(f[1], 0.5 * L.h) + f[2] * nb
                if L.k > 1:  # - h beta / 2 * sum_i (sum_c u_ic)^2
                    loss_enc = loss_enc + he.mul_const(f[3], -0.5 * L.h * L.beta)
            for c in cross:
                loss_enc = loss_enc + he.mul_const(c, L.h)
        l_mask = self._ask_decrypt(pub, loss_enc, self.arbiter_id, TAG_LOSS, rnd + S_GRAD)
        g_sum = self._take_decrypted(pub, g_mask, self.arbiter_id, TAG_GRAD_DEC, rnd + S_DEC,
                                     self._grad_shape(Xb.shape[1]))
        loss_b = float(self._take_decrypted(pub, l_mask, self.arbiter_id, TAG_LOSS_DEC, rnd + S_DEC, (1,))[0]) / nb
        return g_sum.T, loss_b

    def _masked_quadratic(self, pub, fwds, rnd):
        """[[1/2 U H U]] from masked parts (arbiter mode, >= 2 hosts): host j gets [[V_j]] =
        [[2 sum_{h<j} u~_h + u~_j]] and returns [[u~_j . V_j]] (K > 1: also the rowsums' product); since
        sum_j u~_j . V_j = (sum_j u~_j)^2 = U.U exactly, no host's own |u_h|^2 (nor anything else of a
        single host) is ever a ciphertext the guest holds."""
        he, t, L = self.he, self.t, self.loss
        S = None
        for j, h in enumerate(self.host_ids):
            V = fwds[j][0] if S is None else S + S + fwds[j][0]
            t.send(h, TAG_CROSS_IN, self.wire.to_proto(V), round=rnd + S_D)
            S = fwds[j][0] if S is None else S + fwds[j][0]
        shape, e = (2 if L.k > 1 else 1,), self._wire_exponent(TAG_CROSS)
        cross = reduce(lambda a, b: a + b, [t.recv(h, TAG_CROSS, round=rnd + S_CROSS, parse=self._enc_parser(
            pub, shape, f"{TAG_CROSS} from {h}", e)) for h in self.host_ids])
        out = he.mul_const(cross[0:1], 0.5 * L.h)
        if L.k > 1:  # - h beta / 2 * sum_i (sum_c U_ic)^2
            out = out + he.mul_const(cross[1:2], -0.5 * L.h * L.beta)
        return out

    def _batch_two_party(self, pub, priv, Xb, Tb, u_g, reg_g, rnd, host_dims):
        he, t, L = self.he, self.t, self.loss
        nb = Xb.shape[0]

        def fwd_parser(h):
            def validate(m: messages_pb2.Bundle):
                if "u" not in m.tensors or "reg" not in m.scalars:
                    raise ProtocolError(f"{TAG_FWD} from {h}: needs tensor 'u' and scalar 'reg'")
                return (tensor_from_proto(m.tensors["u"], shape=(nb,) + L.cols, what=f"{TAG_FWD}.u from {h}"),
                        float(m.scalars["reg"]))
            return parse_message(messages_pb2.Bundle, validate)

        fwds = [t.recv(h, TAG_FWD, round=rnd + S_FWD, parse=fwd_parser(h)) for h in self.host_ids]
        z = L.rows(u_g + sum(f[0] for f in fwds))
        d = L.wire(L.residual(Tb, z))
        d_msg = self.wire.to_proto(he.encrypt(priv, d))  # the key holder encrypts with CRT (faster, same distribution)
        for h in self.host_ids:
            t.send(h, TAG_D, d_msg, round=rnd + S_D)
        loss_b = float(np.mean(L.row_losses(Tb, z))) + reg_g + sum(f[1] for f in fwds)
        for h in self.host_ids:
            self._serve_decrypt(priv, pub, h, TAG_GRAD, TAG_GRAD_DEC, rnd + S_GRAD, self._grad_shape(host_dims[h]))
        return Xb.T @ d, loss_b

    # prediction ------------------------------------------------------------
    def predict_proba(self, X, rows: Sequence[int] | None = None) -> np.ndarray:
        """Predictions for the given rows, from the guest's X and the hosts' partial scores: binary P(y=1),
        multiclass the softmax class probabilities (m, K), regression the predicted value.

        Args:
            X: guest features (m, d_g) of the prediction set, rows aligned with every host's set.
            rows: optional row indices into that set (default: all m rows).
        Returns: float64 (len(rows),) (multiclass (len(rows), K)). The hosts must be in
            :meth:`VerticalLRHost.serve_predictions` (arbiter mode: the arbiter too, and the scores are
            exact to the fixed-point encoding, :mod:`~secureflhv.vertical.lr_scores`). Raises PeerTimeout
            if a peer does not answer.
        """
        return self._guarded(self._predict, X, rows)

    def end_prediction(self) -> None:
        """Tell the hosts (and in arbiter mode the arbiter) that prediction is over."""
        super().end_prediction()
        if self.arbiter_id is not None:
            self.end_score_service(self._pred_round)

    def _predict(self, X, rows):
        X, sel = self._prediction_rows(X, self.weights.shape[0], rows)
        if self.arbiter_id is not None:  # hosts' parts only encrypted, the total decrypted under our mask
            return self.loss.link(self._encrypted_scores(X, sel))
        rnd = self._request_rows(X.shape[0], [] if rows is None else sel.tolist())
        score = X[sel] @ self.weights + (0.0 if self.intercept is None else self.intercept)
        shape = (len(sel),) + self.loss.cols
        for h in self.host_ids:
            score = score + self.t.recv(h, TAG_PRED, round=rnd, parse=parse_message(
                messages_pb2.Tensor, lambda msg, h=h: tensor_from_proto(msg, shape=shape, what=f"{TAG_PRED} from {h}")))
        return self.loss.link(score)


    max_score_rows: int | None = None  # full batch: the arbiter's bound per score request (training rows, after fit)

    def _encrypted_scores(self, X: np.ndarray, sel: np.ndarray) -> np.ndarray:
        """Arbiter mode: total scores of rows ``sel``, one request per ``batch_size`` rows (each party's
        work per step as in a training batch, so the job's deadline fits). Full batch: per training row
        count after :meth:`fit` (the arbiter's bound), else one request (a prediction job bounds ``rows``)."""
        # multiclass: K scores per row travel as one flat vector, so a request holds step // K rows
        step = max((self.config.batch_size or self.max_score_rows or max(len(sel), 1)) // self.loss.k, 1)
        b = 0.0 if self.intercept is None else self.intercept
        parts = [np.zeros((0,) + self.loss.cols)]
        for i in range(0, len(sel), step):
            chunk = sel[i:i + step]
            rnd = self._request_rows(X.shape[0], chunk.tolist())
            own = X[chunk] @ self.weights + b
            parts.append(self._encrypted_total(own.ravel(), rnd).reshape(own.shape))
        return np.concatenate(parts)


# --------------------------------------------------------------------------- host
class VerticalLRHost(PredictionHost, ScoreHost, _Role):
    """A feature holder without labels (passive party).

    Args:
        transport, config, backend: as for :class:`VerticalLRGuest`.
        guest_id: the guest's party id.
        host_ids: every host in the guest's order (this party included).
        X: float64 (n, d_h) features aligned with the guest's rows.
        arbiter_id: the arbiter (arbiter mode) or None (two-party mode).

    What the host learns: its own weights and gradients (decrypted under its own uniform mask), the
    batch plan and the epoch at which the guest stops. Everything else it receives is a ciphertext
    under a key it does not hold ([[d]], and with several hosts the encrypted sum of earlier hosts'
    scores), so it learns nothing about labels, the guest's features or other hosts.
    In two-party mode it reveals to the guest its partial scores u_h per batch row and ||w_h||^2, and
    per prediction row; in arbiter mode prediction sends u_h encrypted (:mod:`~secureflhv.vertical.lr_scores`).
    In arbiter mode with two or more hosts it masks every value it sends the guest (zero-sum over the
    hosts, :mod:`~secureflhv.vertical.host_masks`), after a key agreement with the other hosts of
    ``host_ids`` over their direct channels; ValueError if a partial score reaches 2^SCORE_BITS.
    """

    def __init__(self, transport: Transport, guest_id: str, host_ids: Sequence[str], X, config,
                 arbiter_id: str | None = None, *, backend=None, callbacks: Sequence[Callback] = (),
                 resume: Checkpoint | None = None):
        super().__init__(transport, config, backend, callbacks, resume)
        self.guest_id = guest_id
        self.host_ids = list(host_ids)
        if self.party_id not in self.host_ids:
            raise ValueError(f"host_ids: {self.party_id!r} is not listed in {self.host_ids}")
        self.index = self.host_ids.index(self.party_id)
        self.arbiter_id = arbiter_id
        if (self.config.mode == "arbiter") != (arbiter_id is not None):
            raise ValueError(f"arbiter_id: mode {self.config.mode!r} and arbiter_id={arbiter_id!r} disagree")
        self.X = check_matrix(X, "X")
        self.weights = np.zeros(self.X.shape[1])
        self.result: FitResult | None = None
        self.public_key = None  # the key holder's public key, once training has started

    @classmethod
    def from_model(cls, transport: Transport, guest_id: str, host_ids: Sequence[str], weights,
                   config, arbiter_id: str | None = None) -> "VerticalLRHost":
        """A host that only answers prediction requests (:meth:`serve_predictions`) with saved ``weights``
        (d_h,) float64 (multiclass: (d_h, K)); encrypted under the key of ``arbiter_id`` when given, else in plaintext."""
        cfg = config if isinstance(config, VerticalLRConfig) else VerticalLRConfig(**config)
        w = np.asarray(weights, dtype=np.float64)
        w = w.reshape(w.shape[0], -1) if cfg.task == "multiclass" else w.ravel()
        mode = "two_party" if arbiter_id is None else "arbiter"
        host = cls(transport, guest_id, host_ids, np.zeros((1, w.shape[0])), cfg.model_copy(update={"mode": mode}),
                   arbiter_id)
        host.weights = w.copy()
        return host

    def _peers(self):
        return [self.guest_id] + ([self.arbiter_id] if self.arbiter_id else [])

    def fit(self) -> FitResult:
        """Train with the guest (and arbiter); returns this host's weights."""
        self.result = self._guarded(self._trained, self._fit)
        return self.result

    def _fit(self) -> FitResult:
        cfg, t = self.config, self.t
        n, d_h = self.X.shape
        _, L = _check_setup(t.recv(self.guest_id, TAG_SETUP, parse=parse_message(messages_pb2.Bundle)), cfg,
                            self.host_ids, n, self.party_id)
        self.loss = L
        arbiter = cfg.mode == "arbiter"
        key_holder = self.arbiter_id if arbiter else self.guest_id
        pub = self.public_key = t.recv(key_holder, TAG_PUBKEY, parse=self._pubkey_parser())
        hello = messages_pb2.Scalars(values={"n_features": d_h})
        t.send(self.guest_id, TAG_HELLO, hello, round=0)
        if arbiter:
            t.send(self.arbiter_id, TAG_HELLO, hello, round=0)
        masked = self._masked()
        if masked:
            self._agree_masks()
        w = np.zeros((d_h,) + L.cols)
        v = np.zeros_like(w)
        seconds, stopped, kept = [], False, _BestWeights()
        first, arr, st = self._restored_epochs(("w", "v", "kept", "seconds"), d_h)
        if first:
            w, v, kept.history = arr["w"].copy(), arr["v"].copy(), [r.copy() for r in arr["kept"]]
            seconds, stopped = arr["seconds"].tolist(), bool(st.get("stopped", False))
        for epoch in range(first, first if stopped else cfg.epochs):
            t0 = time.perf_counter()
            lr = cfg.learning_rate_at(epoch)
            for b, idx in enumerate(batch_plan(n, cfg.batch_size, cfg.seed, epoch)):
                w, v = self._host_batch(pub, key_holder, masked, L, round_id(epoch, b, 0), idx, w, v, lr)
            kept.record(w)
            stopped = self._end_epoch(epoch, t0, seconds, "done")
            self._after_step(epoch + 1, lambda _step, w=w, v=v, stopped=stopped: (  # the guest decides the stop
                {"w": w, "v": v, "kept": np.array(kept.history), "seconds": np.array(seconds)}, {"stopped": stopped}),
                stopping=stopped)
            if stopped:
                break
        best_epoch = t.recv(self.guest_id, TAG_BEST, parse=_best_epoch_parser(len(seconds)))
        self.weights = kept.pick(best_epoch)
        return FitResult(self.weights.copy(), None, [], seconds, stopped, best_epoch)

    def _forward(self, pub, u, reg: float, rnd: int, idx, masked: bool, L):
        """This host's forward message of one batch ((Bundle, masked scores or None)): zero-sum masked
        ciphertexts (arbiter mode, >= 2 hosts), ciphertexts under the arbiter's key, or plaintext (two-party)."""
        he = self.he
        if masked:  # zero-sum masks; no per-host quadratic: the cross step carries it
            return self._masked_forward(pub, u, reg, rnd, idx)
        if self.config.mode == "arbiter":
            fwd = messages_pb2.Bundle()
            fwd.encrypted["u"].CopyFrom(self.wire.to_proto(he.encrypt(pub, u)))
            fwd.encrypted["u2"].CopyFrom(self.wire.to_proto(he.encrypt(pub, np.array([np.sum(u * u)]))))
            fwd.encrypted["reg"].CopyFrom(self.wire.to_proto(he.encrypt(pub, np.array([reg]))))
            if L.k > 1:  # for the coupling term of the multinomial Hessian
                fwd.encrypted["u1"].CopyFrom(self.wire.to_proto(
                    he.encrypt(pub, np.array([np.sum(u.sum(axis=1) ** 2)]))))
            return fwd, None
        fwd = messages_pb2.Bundle(scalars={"reg": reg})
        fwd.tensors["u"].CopyFrom(tensor_to_proto(u))
        return fwd, None

    def _host_batch(self, pub, key_holder: str, masked: bool, L, rnd: int, idx, w, v, lr: float):
        """One mini-batch at this host (rows ``idx``, round ids from ``rnd``): forward scores, [[d]] from the
        guest, the masked gradient decrypted by ``key_holder``, the cross term (arbiter mode); returns the
        updated (weights, velocity)."""
        cfg, he, t = self.config, self.he, self.t
        Xb, nb = self.X[idx], len(idx)
        u = Xb @ w
        fwd, u_masked = self._forward(pub, u, 0.5 * cfg.l2 * float(np.sum(w * w)), rnd, idx, masked, L)
        t.send(self.guest_id, TAG_FWD, fwd, round=rnd + S_FWD)
        d_enc = t.recv(self.guest_id, TAG_D, round=rnd + S_D,
                       parse=self._enc_parser(pub, (nb,) + L.cols, f"{TAG_D} from {self.guest_id}",
                                              self._wire_exponent(TAG_D)))
        g_mask = self._ask_decrypt(pub, self._xt_enc(Xb, d_enc), key_holder, TAG_GRAD, rnd + S_GRAD)
        if cfg.mode == "arbiter" and (masked or self.index > 0):
            S = t.recv(self.guest_id, TAG_CROSS_IN, round=rnd + S_D,
                       parse=self._enc_parser(pub, (nb,) + L.cols, f"{TAG_CROSS_IN} from {self.guest_id}",
                                              self._wire_exponent(TAG_CROSS_IN)))
            if masked:  # u~_j . V_j (and rowsums), V_j = 2 sum_{h<j} u~_h + u~_j: the sum over j is U.U
                cross = cross_terms(he, S, u_masked, L.k, self._wire_exponent(TAG_CROSS))
            else:  # sum_i u_i (I - beta 1 1^T) S_i; the guest multiplies by h
                uP = u - L.beta * u.sum(axis=1, keepdims=True) if L.k > 1 else u
                cross = he.dot(uP.reshape(-1, 1), S.reshape(-1))
            t.send(self.guest_id, TAG_CROSS, self.wire.to_proto(cross), round=rnd + S_CROSS)
        g_sum = self._take_decrypted(pub, g_mask, key_holder, TAG_GRAD_DEC, rnd + S_DEC,
                                     self._grad_shape(self.X.shape[1]))
        return cfg.step(w, v, g_sum.T / nb + cfg.l2 * w, lr)

    # prediction (the loop is :meth:`PredictionHost.serve_predictions`): u_h = X[rows] @ w_h per request
    def _prediction_matrix(self, X) -> np.ndarray:
        return self._prediction_features(X, self.weights.shape[0])

    _host_masks: HostMasks | None = None  # this session's pair seeds (arbiter mode, >= 2 hosts)

    def _agree_masks(self) -> None:
        """Key agreement with the other hosts of the job (once per session: training and the in-job
        prediction share it; a prediction job starts its own)."""
        if self._host_masks is None:
            self._host_masks = HostMasks(self.t, self.host_ids, self.he.precision_bits).agree()

    def _masked_forward(self, pub, u, reg, rnd, idx):
        """Arbiter mode, >= 2 hosts: the batch's [[u~]] and [[reg~]] (zero-sum masks over the hosts,
        fresh per batch and row) and u~ as ints (this host's cross-term multiplier)."""
        check_scores(u, self.party_id)
        width = self.loss.k
        m_u = self._host_masks.masks(("train-u", rnd), idx, width)
        m_reg = self._host_masks.masks(("train-reg", rnd), [0], 1)
        fwd = messages_pb2.Bundle()
        fwd.encrypted["u"].CopyFrom(self.wire.to_proto(encrypt_masked(self.he, pub, u, m_u)))
        fwd.encrypted["reg"].CopyFrom(self.wire.to_proto(encrypt_masked(self.he, pub, np.array([reg]), m_reg)))
        return fwd, masked_mantissas(self.he, u, m_u)

    def _serve(self, X, max_requests):
        if self._masked():
            self._agree_masks()
        return super()._serve(X, max_requests)

    def _answer(self, X, rows, rnd):
        if self.arbiter_id is not None:
            u = X[rows] @ self.weights
            masks = None
            if self._masked():  # keyed by the row index: asking hosts for different rows gives noise too
                check_scores(u, self.party_id)
                masks = self._host_masks.masks(("pred", rnd, X.shape[0]), rows, 1 if u.ndim == 1 else u.shape[1])
            self._send_encrypted_scores(u.ravel(), rnd, masks)
        else:
            self.t.send(self.guest_id, TAG_PRED, tensor_to_proto(X[rows] @ self.weights), round=rnd)


# --------------------------------------------------------------------------- arbiter
class VerticalLRArbiter(ScoreArbiter, _Role):
    """The data-less key holder of arbiter mode (the job's server).

    Args:
        transport, config, backend: as for :class:`VerticalLRGuest`.
        guest_id, host_ids: the data parties (hosts in the guest's order).
        keypair: (public, private) key of ``config.he_scheme``, or a Future of one
            (:func:`~secureflhv.crypto.homomorphic.key_prefetch.prefetch_keypair`; default: generated with ``config.key_bits``).

    What the arbiter learns: the number of rows, batches and epochs, each party's feature count and
    the epoch at which training stops. Every value it decrypts (gradients, loss) is masked with a
    fresh uniform element of Z_n by the party that asked, so it learns nothing about gradients, loss,
    weights or data. Assumes it does not collude with the guest or a host (docs/security.md, "Who can attack, and how").
    Prediction (:meth:`serve_predictions`): the number of requests and rows per request only.
    """

    def __init__(self, transport: Transport, guest_id: str, host_ids: Sequence[str], config, *, keypair=None,
                 backend=None, callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport, config, backend, callbacks, resume)
        if self.config.mode != "arbiter":
            raise ValueError("mode: the arbiter only takes part in mode 'arbiter'")
        self.guest_id = guest_id
        self.host_ids = list(host_ids)
        self._keypair = keypair
        self.result: FitResult | None = None

    def _peers(self):
        return [self.guest_id] + self.host_ids

    def fit(self) -> FitResult:
        """Serve key generation and masked decryptions until the guest stops training."""
        self.result = self._guarded(self._trained, self._fit)
        return self.result

    def _fit(self) -> FitResult:
        cfg, he, t = self.config, self.he, self.t
        n, self.loss = _check_setup(t.recv(self.guest_id, TAG_SETUP, parse=parse_message(messages_pb2.Bundle)), cfg,
                                    self.host_ids, None, self.party_id)
        self.n_rows = n  # the training rows: the bound of an in-job prediction request
        pub, priv = self._keypair = (resolve_keypair(self._keypair)
                                     or he.generate_keypair(cfg.key_bits, cfg.insecure_test_key))
        for p in self._peers():
            t.send(p, TAG_PUBKEY, self.wire.public_key_to_proto(pub), round=0)
        dims = {p: int(t.recv(p, TAG_HELLO, parse=_scalars_parser(["n_features"])).values["n_features"])
                for p in self._peers()}
        seconds, stopped = [], False
        first, arr, st = self._restored_epochs(("seconds",), None)
        if first:
            seconds, stopped = arr["seconds"].tolist(), bool(st.get("stopped", False))
        for epoch in range(first, first if stopped else cfg.epochs):
            t0 = time.perf_counter()
            for b, _ in enumerate(batch_plan(n, cfg.batch_size, cfg.seed, epoch)):
                rnd = round_id(epoch, b, S_GRAD)
                # hosts first: if a host dies, the arbiter's own timeout names it
                for p in self.host_ids + [self.guest_id]:
                    self._serve_decrypt(priv, pub, p, TAG_GRAD, TAG_GRAD_DEC, rnd, self._grad_shape(dims[p]))
                self._serve_decrypt(priv, pub, self.guest_id, TAG_LOSS, TAG_LOSS_DEC, rnd, (1,))
            stopped = self._end_epoch(epoch, t0, seconds, "served")
            self._after_step(epoch + 1, lambda _step, stopped=stopped: ({"seconds": np.array(seconds)},
                                                                        {"stopped": stopped}), stopping=stopped)
            if stopped:
                break
        return FitResult(np.zeros(0), None, [], seconds, stopped)

    n_rows: int | None = None  # training rows, known after fit()

    def serve_predictions(self, max_rows: int | None = None, idle_s: float | None = None) -> int:
        """Serve the guest's prediction requests (:meth:`ScoreArbiter.serve_scores`) until it ends
        prediction, with the training key pair after :meth:`fit`, else a fresh one. Rows per request: at
        most ``config.batch_size`` (the guest's request size), full batch: ``max_rows`` (default: the
        training rows, after :meth:`fit`); ``idle_s``: as in serve_scores (online serving). Returns the number
        of requests served."""
        bound = self.config.batch_size or max_rows or self.n_rows
        if bound is None:
            raise ValueError("max_rows: needed with a full-batch config when the arbiter has not trained")
        return self.serve_scores(bound, resolve_keypair(self._keypair), idle_s)
