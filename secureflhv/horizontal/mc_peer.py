"""MultiConfederated learning over the transport: :class:`MultiConfederatedPeer`, one per party, no server
(Duchesne, Zhang, Talhi 2024, arXiv:2404.13421, Alg. 1–2; the rules are :mod:`.mc_rules`).

Per round ``r`` (1-based; tag ``mc.update``, transport round ``r``), every peer:

1. selects the ⌈√|pool|⌉ best models of its pool by local accuracy and last round's popularity
   (a fork it made last round is always among them);
2. trains each of them locally (SGD from its copy; batches from ``batch_rng(seed, r, "<peer>/<model>")``);
3. sends every other peer ``mc.update`` — a ``Bundle`` with ``text.sender``, ``text.models`` (the
   trained ids, comma-separated), one float32 tensor ``model/<id>`` (dim,) per trained model (the
   trained weights) and ``scalars.n`` (training rows) and ``scalars.loss`` (mean training loss);
4. receives every other peer's ``mc.update`` of round ``r`` (in id order). Each is validated before it
   is used: protobuf, exactly these keys, sender field = the authenticated sender, 1..⌈√max_models⌉
   distinct model ids each known in the network or the sender's own fork of last round (id
   ``<sender>@<r−1>``, only while forks are allowed), float32 tensors of the model's shape with finite
   values, n a whole number in [1, 2^40), loss finite and >= 0, at most ⌈√max_models⌉·(4·dim + 256) + 4096
   bytes (checked before decoding). A message that fails is rejected and
   logged by the transport (with its size and digest) and the peer keeps waiting for a valid one;
   the payload size is bounded by the transport (``job.max_message_mb``);
5. for every model someone trained: aggregates its own trained copy (if it trained it) with the peers'
   copies that pass the divergence filter (median + tolerance · std of ‖W_j − W_local‖/‖W_local‖),
   weighted by n; adopts a new fork as sent; then forks (its own trained model, when the aggregate is
   worse on its rows by more than ``fork_margin``) and merges models that became alike;
6. evaluates its *personal* model — the best of its pool on its training rows — on its local test split.

Dropouts are **not** tolerated: every round needs every peer's update. A peer that sends nothing valid
within ``round_timeout_s`` makes the waiting peer fail with a PeerTimeout naming it, tag and round; a
failing peer tells every other peer (:meth:`Transport.abort`), so all stop at once naming the first
failure. Rationale: the pool and the popularity counts stay the same at every honest peer only when
every peer sees the same messages.

Checkpoints (Issue 12): after each round ``r`` the peer runs its ``callbacks``
(:mod:`secureflhv.transport.lifecycle`; the job passes a Checkpointer) with its whole state as
``(arrays, state)`` — ``arrays["pool"]`` float32 (|pool|, dim), the pool's models in pool order, and in
``state`` the pool
ids, the announced ids, last round's popularity, its pending fork and its round records (plain JSON, no
pickle). Nothing else carries over between rounds: batches come from ``batch_rng(seed, round, ...)`` and
the torch module is reloaded from the pool before every use, so a peer built with ``resume=`` the
states of round k (every peer the same k, agreed by :func:`secureflhv.runtime.store.resume.agree_step`) runs
rounds k+1.. exactly as the uninterrupted run does.

What each peer learns: see :mod:`.mc_rules` — every other peer's trained weights of the
models it trains, its sample count and training loss: **peers see each other's updates**, as in the paper.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..proto import messages_pb2
from ..transport.base import ProtocolError
from ..transport.collectives import broadcast, gather
from ..transport.codec import whole_count
from ..transport.lifecycle import Callback, Checkpoint, Lifecycle
from ..transport.role import ProtocolRole
from .model_wire import model_bundle, model_tensors
from .models import ModelSpec, build_model, check_local_data, evaluate, get_flat, set_flat
from .mc_rules import (MODEL_ID, MCConfig, divergence, divergence_filter, initial_ids, max_selected, may_fork,
                       merge_pool, select, weighted_mean)
from .strategies import FedAvg, batch_rng

log = logging.getLogger("secureflhv.horizontal.mc")

TAG_UPDATE = "mc.update"
MAX_ROWS = 1 << 40


@dataclass
class PeerUpdate:
    """A validated ``mc.update``: the sender's trained models (id -> float32 (dim,)), rows and loss."""

    sender: str
    models: dict[str, np.ndarray]
    n: int
    loss: float


@dataclass
class MCRound:
    """What a peer records for one round."""

    round: int
    trained: list[str]
    accepted: dict = field(default_factory=dict)   # model -> peers whose copy was aggregated
    rejected: dict = field(default_factory=dict)   # model -> peers the divergence filter excluded
    divergences: dict = field(default_factory=dict)  # model -> {peer: δ}
    forked: str | None = None
    merged: list = field(default_factory=list)     # [(kept, retired)]
    pool: list[str] = field(default_factory=list)
    personal: str = ""
    train_loss: float = float("nan")
    test_accuracy: float = float("nan")
    test_n: int = 0
    seconds: float = 0.0


def fork_id(peer: str, round_id: int) -> str:
    """The id of the model ``peer`` forks in round ``round_id`` (``peer@round``; unique in every pool)."""
    return f"{peer}@{round_id}"


class MultiConfederatedPeer(Lifecycle, ProtocolRole):
    """One MultiConfederated peer (see the module docstring).

    Args:
        transport: this peer's transport.
        peers: every peer's party id, this one included (the job's clients, in job order).
        X_train, y_train: local training rows (n, n_features) float32 and int labels in [0, n_classes).
        X_test, y_test: local test rows (may be empty).
        spec: model architecture; config: shared settings (:class:`MCConfig`).
        callbacks, resume: the role lifecycle (Checkpoints in the module docstring); the rounds are fixed.

    Raises (constructor) ValueError for fewer than 2 peers, this party missing from ``peers`` or data
    that does not fit ``spec``; (:meth:`run`) PeerTimeout naming a silent peer, JobAborted when another
    peer failed, TransportError when a peer cannot be reached.
    """

    protocol = "MultiConfederated learning"

    def __init__(self, transport, peers, X_train, y_train, X_test, y_test, spec: ModelSpec, config: MCConfig, *,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport)
        self.all_peers = list(peers)
        if len(set(self.all_peers)) != len(self.all_peers) or len(self.all_peers) < 2:
            raise ValueError(f"MultiConfederated learning needs at least 2 distinct peers, got {self.all_peers}")
        if self.party_id not in self.all_peers:
            raise ValueError(f"{self.party_id} is not among the peers {self.all_peers}")
        self._init_lifecycle(callbacks, resume)
        self.others = [p for p in self.all_peers if p != self.party_id]
        if spec.task != "classification":  # its divergence filter and evaluation compare class predictions
            raise ValueError(f"{self.party_id}: MultiConfederated learning supports classification models only "
                             f"(model.task is {spec.task!r})")
        check_local_data(self.party_id, spec, X_train, y_train, X_test, y_test)
        self.X_train, self.y_train = np.asarray(X_train, np.float32), np.asarray(y_train, np.int64)
        self.X_test, self.y_test = np.asarray(X_test, np.float32), np.asarray(y_test, np.int64)
        self.spec, self.config = spec, config
        self.model = build_model(spec)
        self.dim = get_flat(self.model).size
        k = config.n_initial(len(self.all_peers))
        self.pool: dict[str, np.ndarray] = {
            m: get_flat(build_model(spec, seed=config.seed + 7919 * j)) for j, m in enumerate(initial_ids(k))}
        self.announced: set[str] = set(self.pool)   # every id seen in a round's messages (same at every peer)
        self.popularity: dict[str, int] = {}        # model -> peers that trained it last round
        self.pending_fork: str | None = None        # this peer's fork, to train and announce next round
        # an honest update: ≤ ⌈√max_models⌉ tensors of dim float32, ids and a few fields
        self.max_update_bytes = max_selected(config.max_models) * (4 * self.dim + 256) + 4096
        self.trainer = FedAvg()                      # plain local SGD (Strategy.client_update)
        self.history: list[MCRound] = []

    def _peers(self) -> list[str]:
        return self.others  # not dropout-tolerant: a failing peer tells everyone

    # ---------------------------------------------------------------- wire
    def update_message(self, trained: dict[str, np.ndarray], loss: float) -> messages_pb2.Bundle:
        """This round's update to every other peer: the trained models' flat vectors (one (d,) float32 each, named
        by model id), this peer's training-row count ``n`` (the merge weight) and its mean training loss.
        """
        b = model_bundle({m: (self.dim,) for m in trained}, np.concatenate([np.ravel(w) for w in trained.values()]),
                         sender=self.party_id, models=",".join(trained))
        b.scalars.update({"n": float(len(self.y_train)), "loss": float(loss)})
        return b

    def parser(self, sender: str, round_id: int):
        """The ``parse`` callback of ``mc.update`` from ``sender`` in ``round_id`` (see the module docstring)."""
        known = frozenset(self.announced)
        forks_ok = may_fork(len(known), len(self.all_peers), self.config.max_models)
        new_ok = fork_id(sender, round_id - 1)
        limit = max_selected(self.config.max_models)

        def parse(payload: bytes) -> PeerUpdate:
            if len(payload) > self.max_update_bytes:  # before decoding: the most an honest update can weigh
                raise ProtocolError(f"mc.update of {len(payload)} bytes, at most {self.max_update_bytes} "
                                    f"({limit} models of {self.dim} float32)")
            b = messages_pb2.Bundle.FromString(payload)
            if set(b.text) != {"sender", "models"} or set(b.scalars) != {"n", "loss"} or b.encrypted:
                raise ProtocolError(f"mc.update: fields text {sorted(b.text)}, scalars {sorted(b.scalars)}, "
                                    f"encrypted {len(b.encrypted)}; expected text sender/models, scalars n/loss")
            if b.text["sender"] != sender:
                raise ProtocolError(f"mc.update: claims sender {b.text['sender']!r}, authenticated as {sender!r}")
            ids = b.text["models"].split(",")
            if not 1 <= len(ids) <= limit or len(set(ids)) != len(ids):
                raise ProtocolError(f"mc.update: {len(ids)} model ids (distinct: {len(set(ids))}); expected 1..{limit}")
            for m in ids:
                if not MODEL_ID.match(m) or (m not in known and not (m == new_ok and forks_ok)):
                    raise ProtocolError(f"mc.update: unknown model id {m[:80]!r} (not in the pool, nor {sender}'s "
                                        f"fork of round {round_id - 1} while forks are allowed)")
            models = model_tensors(b, {m: (self.dim,) for m in ids}, f"mc.update from {sender}", only=True)
            n = whole_count(b.scalars["n"], "mc.update n", lo=1, hi=MAX_ROWS)
            loss = b.scalars["loss"]
            if not (math.isfinite(loss) and loss >= 0):
                raise ProtocolError(f"mc.update: loss {loss!r} is not finite and >= 0")
            return PeerUpdate(sender, models, n, float(loss))

        return parse

    def _send_all(self, round_id: int, msg: messages_pb2.Bundle) -> None:
        """``mc.update`` to every other peer concurrently. Dropout policy "raise": dropouts are not tolerated,
        the first unreachable peer (in id order) ends the job; the error names it, the tag and the round."""
        broadcast(self.t, self.others, TAG_UPDATE, msg, round_id, self.config.send_timeout_s, "raise",
                  concurrent=True)

    # ---------------------------------------------------------------- rules
    def score(self, w: np.ndarray) -> float:
        """Accuracy in [0, 1] of flat parameters ``w`` on this peer's own training rows (the ranking of Alg. 1)."""
        set_flat(self.model, w)
        return evaluate(self.model, self.X_train, self.y_train)["accuracy"]

    def train(self, m: str, round_id: int) -> tuple[np.ndarray, float]:
        """Train pool model ``m`` locally for round ``round_id``; returns (its new flat vector, the mean training
        loss). FloatingPointError when training diverges (non-finite weights).
        """
        rng = batch_rng(self.config.seed, round_id, f"{self.party_id}/{m}")
        upd = self.trainer.client_update(self.model, self.pool[m], self.X_train, self.y_train, self.config.local, rng)
        w = get_flat(self.model)
        if not np.all(np.isfinite(w)):
            raise FloatingPointError(f"{self.party_id}: local training of {m} diverged in round {round_id} "
                                     f"(non-finite weights); lower the learning rate")
        return w, upd.loss

    def aggregate(self, rec: MCRound, trained: dict[str, np.ndarray], updates: list[PeerUpdate]) -> None:
        """Step 5's aggregation for every model someone trained this round (in id order)."""
        n_own = len(self.y_train)
        touched = sorted(set(trained) | {m for u in updates for m in u.models})
        for m in touched:
            cands = [u for u in updates if m in u.models]
            if m not in self.pool:
                if m in self.announced:  # merged away here: this peer no longer follows it
                    continue
                self.pool[m] = cands[0].models[m].copy()  # a new fork, adopted as its owner trained it
                continue
            ref = trained.get(m, self.pool[m])
            divs = [divergence(u.models[m], ref) for u in cands]
            keep = divergence_filter(divs, self.config.tolerance)
            rec.divergences[m] = {u.sender: d for u, d in zip(cands, divs)}
            rec.accepted[m] = [u.sender for u, k in zip(cands, keep) if k]
            rec.rejected[m] = [u.sender for u, k in zip(cands, keep) if not k]
            if rec.rejected[m]:
                log.info("%s: round %d, model %s: divergence filter excluded %s (δ %s, threshold median + %g·std)",
                         self.party_id, rec.round, m, ", ".join(rec.rejected[m]),
                         ", ".join(f"{d:.3g}" for d in divs), self.config.tolerance)
            vecs = ([trained[m]] if m in trained else []) + [u.models[m] for u, k in zip(cands, keep) if k]
            ws = ([n_own] if m in trained else []) + [u.n for u, k in zip(cands, keep) if k]
            self.pool[m] = weighted_mean(vecs, ws)

    def fork_and_merge(self, rec: MCRound, trained: dict[str, np.ndarray]) -> None:
        """After aggregation: fork the trained model that beats its aggregate most on local rows (by more than
        ``fork_margin``, when the pool may grow), then merge models closer than ``merge_tolerance``
        (Duchesne et al. 2024, Alg. 2); records both on ``rec``.
        """
        cfg = self.config
        self.pending_fork = None
        if may_fork(len(self.announced), len(self.all_peers), cfg.max_models):
            gaps = {m: self.score(trained[m]) - self.score(self.pool[m]) for m in sorted(trained) if m in self.pool}
            worst = max(gaps, key=lambda m: (gaps[m], m), default=None)  # deterministic
            if worst is not None and gaps[worst] > cfg.fork_margin:
                fid = fork_id(self.party_id, rec.round)
                self.pool[fid] = trained[worst].copy()
                self.pending_fork = rec.forked = fid
                log.info("%s: round %d: forked %s from %s (own model %.3f better on local rows than the aggregate)",
                         self.party_id, rec.round, fid, worst, gaps[worst])
        mergeable = {m: w for m, w in self.pool.items() if m != self.pending_fork}
        rec.merged = merge_pool(mergeable, self.popularity, cfg.merge_tolerance)
        self.pool = {**mergeable, **({self.pending_fork: self.pool[self.pending_fork]} if self.pending_fork else {})}

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, state) of this peer after its last round: everything the next round reads."""
        ids = list(self.pool)  # pool order, not sorted: the continuation iterates it the same way
        arrays = {"pool": np.stack([self.pool[m] for m in ids]).astype(np.float32, copy=False)}
        state = {"rounds_done": len(self.history), "party_id": self.party_id, "peers": self.all_peers,
                 "dim": self.dim, "pool_ids": ids, "announced": sorted(self.announced),
                 "popularity": dict(self.popularity), "pending_fork": self.pending_fork,
                 "history": [dataclasses.asdict(r) for r in self.history]}
        return arrays, state

    def _restore(self) -> int:
        """Load the ``resume`` checkpoint (if any); return the rounds it completed (0 without one).

        Raises ValueError("checkpoint: ...") when it is not a checkpoint of this peer and configuration."""
        if self._resume is None:
            return 0
        arrays, state = self._resume
        done, ids, pool = state.get("rounds_done"), state.get("pool_ids"), arrays.get("pool")
        fork, announced, pop = state.get("pending_fork"), state.get("announced"), state.get("popularity")
        history = state.get("history")
        problems = [what for what, bad in (
            ("rounds_done", not (type(done) is int and 1 <= done <= self.config.rounds)),
            ("party/peers/dim", (state.get("party_id"), state.get("peers"), state.get("dim"))
             != (self.party_id, self.all_peers, self.dim)),
            ("pool_ids", not (isinstance(ids, list) and 1 <= len(ids) <= self.config.max_models
                              and len(set(ids)) == len(ids)
                              and all(isinstance(m, str) and MODEL_ID.match(m) for m in ids))),
            ("pool", not (isinstance(pool, np.ndarray) and pool.dtype == np.float32 and isinstance(ids, list)
                          and pool.shape == (len(ids), self.dim) and np.all(np.isfinite(pool)))),
            ("pending_fork", not (fork is None or (isinstance(ids, list) and fork in ids))),
            ("announced", not (isinstance(announced, list) and all(isinstance(m, str) for m in announced)
                               and isinstance(ids, list) and set(ids) - {fork} <= set(announced))),
            ("popularity", not (isinstance(pop, dict) and all(type(v) is int and v >= 0 for v in pop.values()))),
            ("history", not (isinstance(history, list) and len(history) == done
                             and all(isinstance(h, dict) for h in history))),
        ) if bad]
        if problems:
            raise ValueError(f"checkpoint: not a MultiConfederated checkpoint of {self.party_id} in this "
                             f"configuration ({', '.join(problems)} do not fit)")
        try:
            records = [MCRound(**{**h, "merged": [tuple(x) for x in h.get("merged", [])]}) for h in history]
        except TypeError as exc:
            raise ValueError(f"checkpoint: round records do not fit ({exc})") from None
        self.pool = {m: pool[i].copy() for i, m in enumerate(ids)}
        self.announced, self.popularity, self.pending_fork = set(announced), dict(pop), fork
        self.history = records
        log.info("%s: resuming after round %d (pool %s)", self.party_id, done, ",".join(ids))
        return done

    # ---------------------------------------------------------------- rounds
    def run(self) -> list[MCRound]:
        """Run every round; return this peer's records (also in :attr:`history`)."""
        return self._guarded(self._trained, self._run)

    def _run(self) -> list[MCRound]:
        cfg = self.config
        log.info("%s: MultiConfederated learning with %s, %d rounds, %d initial models, %d parameters",
                 self.party_id, ", ".join(self.others), cfg.rounds, len(self.pool), self.dim)
        done = self._restore()
        self._steps_begin(done, cfg.rounds)
        for r in range(done + 1, cfg.rounds + 1):
            rec = self.run_round(r)
            # the rounds are fixed: a stop request is not taken
            self._after_step(r, lambda _step: self.checkpoint_state())
            log.info("%s: round %d/%d: trained %s; pool %s; personal model %s, local test accuracy %.4f (n=%d)%s%s",
                     self.party_id, r, cfg.rounds, ",".join(rec.trained), ",".join(rec.pool), rec.personal,
                     rec.test_accuracy, rec.test_n, f"; forked {rec.forked}" if rec.forked else "",
                     f"; merged {rec.merged}" if rec.merged else "")
        return self.history

    def run_round(self, r: int) -> MCRound:
        """One MultiConfederated round: rank the pool, train the chosen models, send them to every other peer,
        gather theirs (every one needed: PeerTimeout names a silent peer), aggregate, fork and merge; returns
        the round's record.
        """
        t0 = time.monotonic()
        scores = {m: self.score(w) for m, w in sorted(self.pool.items())}
        chosen = select(sorted(self.pool), scores, self.popularity, len(self.all_peers), self.config.popularity_weight,
                        must=self.pending_fork)
        trained, losses = {}, []
        for m in chosen:
            trained[m], loss = self.train(m, r)
            losses.append(loss)
        rec = MCRound(r, list(chosen), train_loss=float(np.mean(losses)))
        parsers = {p: self.parser(p, r) for p in self.others}  # before anything changes the shared state
        self._send_all(r, self.update_message(trained, rec.train_loss))
        # dropout policy "raise": every peer's update is needed (each within round_timeout_s); the first
        # silent one ends the job with a PeerTimeout naming it
        updates = list(gather(self.t, self.others, TAG_UPDATE, r, self.config.round_timeout_s, "raise", parsers,
                              shared=False).values.values())
        self.aggregate(rec, trained, updates)
        self.popularity = {}
        for ids in [list(trained)] + [list(u.models) for u in updates]:
            for m in ids:
                self.popularity[m] = self.popularity.get(m, 0) + 1
        self.announced |= set(self.popularity)
        self.fork_and_merge(rec, trained)
        rec.pool = sorted(self.pool)
        scores = {m: self.score(w) for m, w in sorted(self.pool.items())}
        rec.personal = max(sorted(scores), key=lambda m: scores[m])
        ev = self.evaluate(self.pool[rec.personal])
        rec.test_accuracy, rec.test_n = ev["accuracy"], int(ev["n"])
        rec.seconds = time.monotonic() - t0
        self.history.append(rec)
        return rec

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        """Metrics of flat parameters ``w`` on this peer's test rows (accuracy, loss, correct, n); NaN without
        test rows."""
        set_flat(self.model, w)
        if len(self.y_test) == 0:
            return {"accuracy": float("nan"), "loss": float("nan"), "correct": 0.0, "n": 0.0}
        return evaluate(self.model, self.X_test, self.y_test)

    @property
    def personal_model(self) -> np.ndarray:
        """This peer's personal model (float32 (dim,)): the best of its pool on its rows after the last round."""
        return self.pool[self.history[-1].personal] if self.history else self.pool[sorted(self.pool)[0]]
