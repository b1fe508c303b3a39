"""Horizontal FL roles over the transport: :class:`HorizontalServer` and :class:`HorizontalClient`.

One job = one server (no data) and N clients (same features, different rows). Before round 1 each client sends
``fl.layout`` (transport round 0): the names, shapes and dtypes of the tensors it aggregates
(:class:`~.user_model.ParamLayout`, JSON and its digest); the server stops the job (:class:`LayoutMismatch`)
naming a client whose layout differs from its own. Per round ``r``
(1-based), with message tags ``fl.*`` and transport round ``r``:

1. the server samples ``max(1, int(fraction · |alive|))`` of the clients still alive with
   ``np.random.default_rng([seed, r])`` (NIID-Bench: ``int(n_parties · sample)``), and sends every
   alive client ``fl.round`` — a ``Bundle`` with ``text.command`` (``train`` or ``skip``),
   ``text.participants`` (the selected ids, comma-separated) and, for the selected, the global model
   (one float32 ``Tensor`` per parameter, ``model/<name>``) plus the strategy's broadcast arrays
   (SCAFFOLD: ``extra/control``);
2. each selected client trains locally (:mod:`.strategies`) and submits each aggregated part through
   :class:`~secureflhv.secagg.AggregationClient` (aggregation round id
   ``r · 8 + part index``); the server's :class:`~secureflhv.secagg.AggregationServer`
   returns the weighted sum over the survivors — a client that fails or goes silent is dropped from
   the round by the aggregation layer and the round continues while at least ``t`` survive;
   With ``FLConfig.contribution_temperature`` set (client contribution normalisation, Kundalwal et
   al. 2024, :mod:`.contribution`), aggregation slots 0 and 1 of the round first sum the clients'
   unit mean latents and then one exp score each (answers ``fl.latent_sum`` / ``fl.exp_sum``), and
   every client multiplies its sample-weighted parts' weights by its Λ_r; the strategy's parts
   then take slots 2, 3;
3. the server applies the strategy's server half and sends the new global model (``fl.eval``) to
   every alive client, telling each which parts of its update are in the sums it applied
   (``text.applied``, comma-separated; none when the round was refused or the client dropped): the client's
   strategy commits its cross-round state accordingly (SCAFFOLD's c_i,
   :meth:`~.strategies.Strategy.client_round_end`); each evaluates it on its local test split and answers ``fl.metrics``
   (``Scalars``: test correct / n / loss sum; if it trained: train loss, samples, steps; a regression
   head adds Σ|ŷ − y|, Σy and Σy² of its test rows, with loss sum = Σ(ŷ − y)² and correct = 0);
4. the server logs the round (accuracy = Σ correct / Σ n over the reporting clients; each client's
   own accuracy and the worst client's, which personalisation and clustering aim to raise; a
   regression head: pooled RMSE, MAE and R² from the clients' sums, in ``RoundRecord.test_metrics``). A client
   evaluates what its strategy says (:meth:`Strategy.eval_vector`): the global model, its IFCA
   cluster's model, or the global base with its own FedPer head.

After the last round the server sends ``fl.round`` with ``text.command = stop``. A client whose
message cannot be delivered, or that misses ``fl.metrics``, is marked dead and not selected again.
A failing server tells every client (``Transport.abort``); a failing client tells nobody: it is a
dropout, which the aggregation survives while t clients remain.

Wire: every payload is protobuf (``messages_pb2.Bundle`` / ``Scalars``); tensors are dtype + shape +
little-endian bytes (:mod:`secureflhv.transport.codec`) and are checked against the model's parameter
names and shapes (float32, finite) — a bad payload is rejected by the transport and the wait goes on.

Checkpoints (the constructor's ``callbacks`` get ``after_step(rounds_done, state)`` after every round, whose
``state.checkpoint()`` is ``(arrays, state)``; ``resume=(arrays, state)`` continues after one; the job passes a
:class:`~secureflhv.transport.lifecycle.Checkpointer` and the agreed checkpoint, see
:mod:`secureflhv.runtime.store.resume`; the round count is fixed, so a stop request is ignored): the server
stores the global model (float32), the strategy's server state (SCAFFOLD's c, IFCA's cluster models)
and the round records; a client stores its strategy state (SCAFFOLD's c_i, FedPer's head), the last
global model it received and its metrics history. No RNG state: client sampling, batch orders and the
aggregation's stochastic rounding are drawn from (seed, round[, client]), so a resumed job with a fixed
``aggregation.seed`` gives the uninterrupted run's model exactly. A resumed job starts with every client
alive (they all took part in the step agreement).

What each role learns: the server learns each client's model layout (public to the job), the
selected/surviving ids, what the aggregation kind reveals of the updates (secure aggregation: only the weighted sums and total weights), and each
client's local test counts (correct, n, loss; regression: also Σ|ŷ − y|, Σy, Σy² of its test
labels) and training statistics (loss, samples, steps). A client
learns the global models it receives, this round's participant list and which of its own parts the
server applied.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from ..proto import messages_pb2
from ..secagg import AggregateResult, AggregationConfig, AggregationError, OutOfRangeRound, make_client, make_server
from ..transport.base import ProtocolError, TransportError, parse_message
from ..transport.codec import tensor_to_proto, whole_count
from ..transport.lifecycle import Callback, Checkpoint, Lifecycle
from ..transport.collectives import broadcast, gather
from ..transport.round_layout import RoundLayout
from ..transport.role import ProtocolRole
from .contribution import SLOTS, ContributionClient, ContributionServer, latent_dim
from .dp_fedavg import ClientDP
from .dp_sgd import for_config
from .model_wire import float32_tensor, model_bundle, read_model
from .local_data import DatasetRows
from .models import ModelSpec, build_model, check_local_data, get_flat, param_shapes, set_flat
from .user_model import ParamLayout, layout_of
from .strategies import LocalTrainConfig, Strategy, batch_rng


class LayoutMismatch(ValueError):
    """A client's model differs from the server's (names, shapes or dtypes of the aggregated tensors)."""


SUSPECT_SEND_TIMEOUT_S = 2.0  # delivery window for a client the last aggregation lost

log = logging.getLogger("secureflhv.horizontal.fl")

TAG_ROUND = "fl.round"
TAG_EVAL = "fl.eval"
TAG_METRICS = "fl.metrics"
TAG_LAYOUT = "fl.layout"  # client -> server before round 1: the aggregated tensors' layout (user_model.ParamLayout)
PARTS_PER_ROUND = 8  # aggregation round id = fl round * 8 + part index
# the aggregation round id of part ``part`` (contribution's sums first, then the strategy's parts) of a round
AGG_ROUNDS = RoundLayout("horizontal FL aggregation", (("round", None), ("part", PARTS_PER_ROUND)))
DEFAULT_PART_CLIPS = {"control": 10.0, "nova": 1e5}
METRIC_KEYS = ("trained", "test_correct", "test_n", "test_loss_sum")  # fl.metrics of every client
TRAIN_METRIC_KEYS = ("train_loss", "train_n", "steps")                 # ... and of one that trained
REGRESSION_METRIC_KEYS = ("test_abs_sum", "test_y_sum", "test_y2_sum")  # ... and of a regression head's


@dataclass(frozen=True)
class FLConfig:
    """Settings shared by the server and every client.

    Attributes:
        rounds: communication rounds.
        fraction: share of (alive) clients selected per round, in (0, 1].
        seed: seeds client sampling, the initial model and every client's batch order.
        local: local training settings.
        aggregation: the aggregation layer's settings (kind, clip, threshold, timeouts).
        part_clips: clip range per aggregated part other than ``model`` (which uses
            ``aggregation.clip``): SCAFFOLD's ``control`` and FedNova's ``nova`` (= a_i, a step count).
        round_timeout_s: how long a client waits for the server's next message (covers the other
            clients' training and the aggregation), and the server for ``fl.metrics``.
        send_timeout_s: how long the server keeps trying to deliver one message to a client.
        contribution_temperature: T of client contribution normalisation (Kundalwal et al. 2024,
            :mod:`.contribution`), composable with every strategy; None = off.
        dp: client-level differential privacy of FedAvg / FedProx, the noise added by the server (:mod:`.dp_fedavg`)
            or by the clients inside secure aggregation (:mod:`.dp_distributed`); or record-level DP-GD with the
            noise distributed (:mod:`.dp_record_sum`, it replaces local training); None = off.
    """

    rounds: int = 10
    fraction: float = 1.0
    seed: int = 0
    local: LocalTrainConfig = LocalTrainConfig()
    aggregation: AggregationConfig = AggregationConfig()
    part_clips: dict = field(default_factory=lambda: dict(DEFAULT_PART_CLIPS))
    round_timeout_s: float = 600.0
    send_timeout_s: float = 30.0
    contribution_temperature: float | None = None
    dp: ClientDP | None = None

    def __post_init__(self):
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        t = self.contribution_temperature
        if t is not None and not (t > 0 and math.isfinite(t)):
            raise ValueError(f"contribution_temperature must be positive and finite (or None), got {t}")

    @property
    def part_offset(self) -> int:
        """Aggregation slot of the strategy's first part in a round (after contribution's two sums)."""
        return SLOTS if self.contribution_temperature is not None else 0

    def for_model(self, dim: int) -> "FLConfig":
        """These settings for a model of ``dim`` parameters (client-level DP planned for it; ValueError when it
        cannot be)."""
        return self if self.dp is None else replace(self, dp=self.dp.bound(dim))

    def agg_dim(self, part: str, dim: int) -> int:
        """The length of the vector ``part`` aggregates for an update of ``dim`` values (distributed DP sends the
        rotated, padded model)."""
        return self.dp.agg_dim(dim) if part == "model" and self.dp is not None else dim

    def part_config(self, part: str) -> AggregationConfig:
        """The aggregation settings of ``part`` (``model``, or a strategy's extra part such as SCAFFOLD's control
        variates): the job's, with the part's own clip range where one is set.
        """
        if part == "model":
            return self.aggregation if self.dp is None else self.dp.aggregation_for(self.aggregation)
        clip = self.part_clips.get(part, DEFAULT_PART_CLIPS.get(part, self.aggregation.clip))
        return self.aggregation.replace(clip=float(clip))


@dataclass
class RoundRecord:
    """What the server logs for one round."""

    round: int
    selected: list[str]
    survivors: list[str]
    dropped: list[str]
    test_accuracy: float
    test_loss: float
    test_n: int
    train_loss: float
    seconds: float
    aggregation: dict = field(default_factory=dict)  # part -> {clip, scale, k_bits, n_clipped, weight}
    dead: list[str] = field(default_factory=list)
    contribution: dict = field(default_factory=dict)  # status, n, latent_sum_norm, exp_sum (when on)
    client_accuracy: dict = field(default_factory=dict)  # client -> its local test accuracy (clients with rows)
    worst_client_accuracy: float = float("nan")          # min of client_accuracy (personalisation's measure)
    test_metrics: dict = field(default_factory=dict)     # regression: pooled rmse, mae, r2 over the test rows
    refused: str = ""   # why the round's sum was refused as out of range (the global model stayed as it was)
    privacy: dict = field(default_factory=dict)  # with params.dp: the (ε, δ) spent after this round and its mechanism


def pooled_regression(metrics: Sequence[dict]) -> dict:
    """RMSE, MAE and R² over every client's test rows from their sums (``fl.metrics`` of a regression
    head): R² = 1 − Σ(ŷ − y)² / (Σy² − (Σy)²/n), the pooled rows' own total sum of squares."""
    n = sum(m["test_n"] for m in metrics)
    if not n:
        return {}
    sse = sum(m["test_loss_sum"] for m in metrics)
    sst = sum(m["test_y2_sum"] for m in metrics) - sum(m["test_y_sum"] for m in metrics) ** 2 / n
    return {"rmse": math.sqrt(sse / n), "mae": sum(m["test_abs_sum"] for m in metrics) / n,
            "r2": 1.0 - sse / sst if sst > 0 else float("nan"), "n": int(n)}


# ------------------------------------------------------------------------------------ wire helpers
def applied_parts(bundle: messages_pb2.Bundle) -> set[str]:
    """The parts named in an ``fl.eval`` bundle's ``text.applied`` (comma-separated; absent: none)."""
    return {p for p in bundle.text.get("applied", "").split(",") if p}


def check_slots(strategy: Strategy, config: FLConfig) -> None:
    """ValueError when the strategy's parts (after contribution's two sums) exceed a round's aggregation slots,
    or when the strategy is decentralised (MultiConfederated: no server, see :mod:`.mc_peer`)."""
    if getattr(strategy, "decentralised", False):
        raise ValueError(f"{strategy.name} is decentralised: it has no server or clients; run its peers "
                         f"(job.algorithm: {strategy.name})")
    if config.part_offset + len(strategy.parts) > PARTS_PER_ROUND:
        raise ValueError(f"{strategy.name}: {len(strategy.parts)} aggregated parts"
                         f"{' + 2 contribution sums' if config.part_offset else ''} exceed the {PARTS_PER_ROUND} "
                         f"aggregation slots of a round (fewer IFCA clusters?)")


def _check_target_scale(party_id: str, y: np.ndarray, spec: ModelSpec) -> None:
    """Warn (locally: nothing is sent) when this client's targets sit far from the head's
    ``target_mean`` / ``target_std``: the network would then have to learn a large offset or scale, and its
    updates may be clipped by the aggregation or diverge."""
    if len(y) < 2:
        return
    mean, std = float(y.mean()), float(y.std())
    if abs(mean - spec.target_mean) > 3 * spec.target_std or not 0.1 <= std / spec.target_std <= 10:
        log.warning("%s: the local regression targets have mean %.4g and std %.4g, far from model.target_mean "
                    "%.4g / model.target_std %.4g: set them near the target's location and scale (e.g. from the "
                    "data dictionary) so training stays inside the aggregation clip", party_id, mean, std,
                    spec.target_mean, spec.target_std)


# ------------------------------------------------------------------------------------ server
class _Resumable(Lifecycle):
    """Checkpoint state of server and client (see the module docstring)."""

    @property
    def family(self) -> str:
        return f"{self.strategy.name} horizontal FL"

    def _restored_rounds(self, history_type) -> tuple[int, dict, list]:
        """(rounds done, arrays, history) of ``resume`` ((0, {}, []) without one); the strategy's state
        is loaded. ValueError when it is not a horizontal FL checkpoint of this configuration."""
        self._restored_state: dict = {}
        done, arrays, state = self._restored(self.config.rounds, check=lambda done, arrays, state: isinstance(
            state.get("history"), list) and len(state["history"]) == done and all(
            isinstance(h, dict) for h in state["history"]) and state.get("strategy") == self.strategy.name)
        if not done:
            return 0, {}, []
        try:
            history = [history_type(**h) for h in state["history"]]
        except TypeError as exc:
            raise ValueError(f"checkpoint: malformed round history ({exc})") from None
        self.strategy.load_state({k[len("strategy."):]: v for k, v in arrays.items() if k.startswith("strategy.")},
                                 self.dim)
        self._restored_state = state
        return done, arrays, history

    def _round_done(self, done: int, arrays: dict, history: list) -> None:
        def snapshot(_step):
            state = {"strategy": self.strategy.name, "history": history}
            if getattr(self.strategy, "record_dp", None) is not None:  # a client's DP-SGD accountant (JSON)
                state["record_dp"] = self.strategy.record_dp.state_dict()
            return ({**arrays, **{f"strategy.{k}": v for k, v in self.strategy.state_arrays().items()}}, state)

        self._after_step(done, snapshot)

    def _restored_model(self, arrays: dict, name: str) -> np.ndarray:
        vec = arrays.get(name)
        if vec is None or vec.dtype != np.float32 or vec.shape != (self.dim,):
            raise ValueError(f"checkpoint: {name!r} is not a float32 ({self.dim},) model")
        return np.array(vec)


class HorizontalServer(_Resumable, ProtocolRole):
    """The aggregator: samples clients, broadcasts the global model, aggregates, applies the strategy.

    Args:
        transport: the server's transport.
        clients: client party ids (in the job's order).
        spec: model architecture.
        strategy: the server's strategy instance.
        config: shared settings.
        on_round: optional callback ``(record, global_vector float32)`` after each round.
        callbacks, resume: the role lifecycle (:mod:`secureflhv.transport.lifecycle`; Checkpoints above).

    Raises (from :meth:`run`, after telling every client): AggregationError when a round keeps fewer
    than t clients; TransportError when no client is left.
    """

    protocol = "horizontal FL"

    def __init__(self, transport, clients: Sequence[str], spec: ModelSpec, strategy: Strategy, config: FLConfig,
                 on_round: Callable[[RoundRecord, np.ndarray], None] | None = None, *,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None):
        super().__init__(transport)
        self._init_lifecycle(callbacks, resume)
        self.clients = list(clients)
        if len(set(self.clients)) != len(self.clients) or len(self.clients) < 1:
            raise ValueError(f"clients must be distinct and non-empty, got {self.clients}")
        self.spec = spec
        self.strategy = strategy
        self.config = config
        self.on_round = on_round
        model = build_model(spec, seed=config.seed)
        self.layout = layout_of(model)
        self.shapes = param_shapes(model)
        self.global_vec = get_flat(model)
        self.dim = self.global_vec.size
        self.config = config = config.for_model(self.dim)
        # IFCA's k cluster models: the global model, then one fresh initialisation per extra seed
        self.initial = [self.global_vec] + [get_flat(build_model(spec, seed=config.seed + 7919 * j))
                                            for j in range(1, strategy.n_models)]
        self.part_dims = strategy.part_dims(self.dim)
        check_slots(strategy, config)
        self.agg_servers = {p: make_server(
            transport, config.part_config(p).replace(zero_weight_ok=strategy.zero_weight_parts)) for p in strategy.parts}
        self.contrib = None
        if config.contribution_temperature is not None:
            self.contrib = ContributionServer(transport, latent_dim(model), config.aggregation, self._send_all)
        self.dead: set[str] = set()
        self.suspect: set[str] = set()  # lost by the last aggregation; maybe dead
        self.history: list[RoundRecord] = []

    def _peers(self) -> list[str]:
        return self.clients

    def run(self) -> list[RoundRecord]:
        """Run every round; return the per-round records (also in :attr:`history`)."""
        return self._guarded(self._trained, self._run)

    def _run(self) -> list[RoundRecord]:
        self.strategy.server_init(self.dim, self.initial)
        cfg = self.config
        log.info("server: %s, %d clients, %d rounds, fraction %g, %d parameters, aggregation %s",
                 self.strategy.name, len(self.clients), cfg.rounds, cfg.fraction, self.dim, cfg.aggregation.kind)
        self._agree_layout()
        done, arrays, self.history = self._restored_rounds(lambda **d: RoundRecord(**d))
        if done:
            self.global_vec = self._restored_model(arrays, "global")
        if cfg.dp is not None:  # the rounds released so far (a refused round releases nothing)
            self.privacy = cfg.dp.accountant_for()
            for h in self.history:
                if not h.refused:
                    cfg.dp.replay(self.privacy, h.privacy)
        for r in range(done + 1, cfg.rounds + 1):
            if self._over_budget(r):
                break
            record = self.run_round(r)
            self._round_done(r, {"global": self.global_vec}, [dict(vars(h)) for h in self.history])
            tm = record.test_metrics
            quality = (f"test RMSE {tm.get('rmse', float('nan')):.4f}, R² {tm.get('r2', float('nan')):.4f} "
                       f"(n={record.test_n})" if self.spec.task == "regression" else
                       f"test accuracy {record.test_accuracy:.4f} (n={record.test_n}, worst client "
                       f"{record.worst_client_accuracy:.4f})")
            log.info("round %d/%d: %d selected, %d survived%s; %s, train loss %.4f, %.1fs", r, cfg.rounds,
                     len(record.selected), len(record.survivors),
                     f" (dropped {', '.join(record.dropped)})" if record.dropped else "", quality, record.train_loss,
                     record.seconds)
            if self.on_round is not None:
                self.on_round(record, self.global_vec)
        # the round the clients wait for: after the last one, or the one the privacy budget stopped
        self._send_all(self._alive(), TAG_ROUND, len(self.history) + 1,
                       lambda c: messages_pb2.Bundle(text={"command": "stop"}))
        return self.history

    def _over_budget(self, r: int) -> bool:
        """Whether round ``r`` would take the privacy spent past ``dp.epsilon_budget`` (then the job stops here,
        before any of its noise is drawn)."""
        dp = self.config.dp
        if dp is None or dp.epsilon_budget is None:
            return False
        if not self.privacy.would_exceed(dp.epsilon_budget, dp.delta, self.privacy.rounds + 1):
            return False
        log.error("server: stopping before round %d of %d: it would spend ε = %.4g > the budget %.4g (δ = %g; %d "
                  "rounds released, ε = %.4g)", r, self.config.rounds,
                  self.privacy.epsilon(dp.delta, self.privacy.rounds + 1), dp.epsilon_budget, dp.delta,
                  self.privacy.rounds, self.privacy.epsilon(dp.delta))
        return True

    def _agree_layout(self) -> None:
        """Before round 1: every client's ``fl.layout`` (its aggregated tensors' names, shapes and dtypes) must
        equal the server's. LayoutMismatch naming the first client that differs and how (the job stops: a
        silent average of different models would be wrong); a client that sends nothing is marked dead."""
        def validate(msg):
            try:
                layout = ParamLayout.from_json(msg.text.get("layout", ""))
            except ValueError as exc:  # json's errors are ValueErrors too
                raise ProtocolError(f"layout: {exc}") from None
            if msg.text.get("digest") != layout.digest():
                raise ProtocolError("layout: digest does not match the layout sent")
            return layout

        got = gather(self.t, self.clients, TAG_LAYOUT, 0, self.config.round_timeout_s, "drop",
                     parse_message(messages_pb2.Bundle, validate))
        for c, drop in got.dropped.items():
            log.warning("server: no model layout from %s (%s); marking it dead", c, drop.error)
            self.dead.add(c)
        for c, layout in got.values.items():
            diff = self.layout.difference(layout, "the server", c)
            if diff:
                raise LayoutMismatch(f"{c}: params.model: its model's layout ({layout.digest()}) differs from the "
                                     f"server's ({self.layout.digest()}): {diff}")
        log.info("server: %d clients agree on the model layout %s (%d tensors, %d values)", len(got.values),
                 self.layout.digest(), len(self.layout.entries), self.layout.size)

    def run_round(self, r: int) -> RoundRecord:
        """Round ``r``: select and broadcast, aggregate every part, update, evaluate; returns its record."""
        t0 = time.monotonic()
        selected = self._sample(r)
        self._send_all(self._alive(), TAG_ROUND, r, self._round_message(selected))
        contribution = {}
        if self.contrib is not None:
            try:
                contribution = vars(self.contrib.run(r, selected, AGG_ROUNDS.pack(round=r, part=0)))
            except AggregationError as exc:
                raise AggregationError(f"round {r}, contribution normalisation: {exc}") from None
        results, refused = self._aggregate(r, selected)
        survivors = sorted(set.intersection(*(set(res.survivors) for res in results.values()))) if results else []
        if results:
            self.suspect.update(set(selected) - set(survivors))
        released = {}
        if not refused and self.config.dp is not None:  # DP-FedAvg: (Σ clipped + noise) / n, or refused
            new_vec, refused = self.config.dp.release(self.global_vec, results["model"], r, len(selected))
            if not refused:
                self.global_vec = new_vec
                released = self.config.dp.account(self.privacy, results["model"], len(selected))
        if refused:  # never used: the model (and the strategy's state) stay as they were
            log.error("round %d refused, the global model is unchanged: %s", r, refused)
        elif self.config.dp is None:
            self.global_vec = self.strategy.server_update(self.global_vec, results)
        if not np.all(np.isfinite(self.global_vec)):
            raise FloatingPointError(f"round {r}: the global model became non-finite (lower lr?)")
        self._send_all(self._alive(), TAG_EVAL, r, self._eval_message(results))
        metrics = self._collect_metrics(r, self._alive())
        record = self._record(r, selected, survivors, results, metrics, time.monotonic() - t0)
        record.contribution = contribution
        record.refused = refused
        if self.config.dp is not None:
            record.privacy = {**self.privacy.record(self.config.dp.delta), **self.config.dp.describe(), **released}
        self.history.append(record)
        return record

    def _alive(self) -> list[str]:
        return [c for c in self.clients if c not in self.dead]

    def _sample(self, round_id: int) -> list[str]:
        alive = self._alive()
        if not alive:
            raise TransportError("no client is left alive")
        m = max(1, int(len(alive) * self.config.fraction))
        rng = np.random.default_rng([self.config.seed, round_id])
        pick = set(rng.choice(len(alive), size=m, replace=False).tolist())
        return [c for i, c in enumerate(alive) if i in pick]

    def _round_message(self, selected: list[str]) -> Callable[[str], messages_pb2.Bundle]:
        """``fl.round`` per client: ``train`` with the global model and the strategy's extras, or ``skip``."""
        extras = self.strategy.broadcast()
        participants = ",".join(selected)

        def round_msg(c):
            if c not in selected:
                return messages_pb2.Bundle(text={"command": "skip", "participants": participants})
            b = model_bundle(self.shapes, self.global_vec, command="train", participants=participants)
            for k, v in extras.items():
                b.tensors[f"extra/{k}"].CopyFrom(tensor_to_proto(v, "<f4"))
            return b
        return round_msg

    def _eval_message(self, results: dict[str, AggregateResult]) -> Callable[[str], messages_pb2.Bundle]:
        """``fl.eval``: the new global model, the strategy's evaluation extras (IFCA: every cluster) and, per
        client, ``text.applied``: its parts whose sums the server applied (``results``; empty when refused)."""
        b = model_bundle(self.shapes, self.global_vec, command="eval")
        for k, v in self.strategy.eval_extras().items():
            b.tensors[f"extra/{k}"].CopyFrom(tensor_to_proto(v, "<f4"))

        def eval_msg(c):
            applied = [p for p, res in results.items() if c in res.survivors]
            if not applied:
                return b
            own = messages_pb2.Bundle()
            own.CopyFrom(b)
            own.text["applied"] = ",".join(applied)
            return own
        return eval_msg

    def _aggregate(self, r: int, selected: list[str]) -> tuple[dict[str, AggregateResult], str]:
        """Every part's sum, and why the round is refused ("" when it is not): a part whose unmasked sum is
        out of range (:class:`OutOfRangeRound`) refuses the whole round, after the other parts ran (their
        clients are waiting); so do parts with different survivors when the strategy combines them
        (:attr:`Strategy.joint_parts`). Raises AggregationError for any other failure."""
        results: dict[str, AggregateResult] = {}
        refused = []
        for i, part in enumerate(self.strategy.parts):
            try:
                results[part] = self.agg_servers[part].aggregate(
                    AGG_ROUNDS.pack(round=r, part=self.config.part_offset + i), selected,
                    self.config.agg_dim(part, self.part_dims[part]))
            except OutOfRangeRound as exc:
                refused.append(f"part {part!r}: {exc}")
            except AggregationError as exc:
                raise AggregationError(f"round {r}, part {part!r}: {exc}") from None
        if not refused and self.strategy.joint_parts:
            sets = {p: sorted(res.survivors) for p, res in results.items()}
            if len({tuple(s) for s in sets.values()}) > 1:
                refused.append(f"{self.strategy.name} combines its parts into one step, but they were summed over "
                               f"different clients {sets}")
        return ({}, "; ".join(refused)) if refused else (results, "")

    def _send_all(self, receivers: Sequence[str], tag: str, round_id: int, payload_of) -> None:
        """Send ``payload_of(c)`` to every receiver concurrently. Dropout policy "drop": a client that cannot be
        reached is marked dead and the round goes on without it (it is no longer selected)."""
        def window(c):
            # A client the aggregation just lost gets a short delivery window: waiting the full window for
            # a dead client would hold back the next round past the live clients' own deadline.
            return min(SUSPECT_SEND_TIMEOUT_S, self.config.send_timeout_s) if c in self.suspect \
                else self.config.send_timeout_s
        sent = broadcast(self.t, receivers, tag, payload_of, round_id, window, "drop", concurrent=True)
        self.suspect.difference_update(sent.ok)
        for c, drop in sent.dropped.items():
            log.warning("server: cannot reach client %s (%s, round %d): %s; marking it dead", c, tag,
                        round_id, drop.error)
            self.dead.add(c)

    def _collect_metrics(self, round_id: int, clients: Sequence[str]) -> dict[str, dict]:
        def validate(msg):
            vals = dict(msg.values)
            # exactly the keys a client sends (a renamed key would silently drop a statistic)
            trained = vals.get("trained")
            if trained not in (0.0, 1.0):
                raise ProtocolError(f"metrics: 'trained' is {trained!r}, expected 0 or 1")
            expected = set(METRIC_KEYS) | (set(TRAIN_METRIC_KEYS) if trained else set()) | regression_keys
            unknown, missing = set(vals) - expected, expected - set(vals)
            if unknown or missing:
                raise ProtocolError(f"metrics: unexpected keys {sorted(unknown)}, missing {sorted(missing)}")
            if trained:
                whole_count(vals["train_n"], "metrics: 'train_n'", lo=1, hi=1 << 53)
                whole_count(vals["steps"], "metrics: 'steps'", lo=1, hi=1 << 53)
                if math.isinf(vals["train_loss"]):  # NaN: withheld (DP-SGD does not release it)
                    raise ProtocolError(f"metrics: train_loss {vals['train_loss']!r} is not finite")
            for k in ("test_correct", "test_n"):
                whole_count(vals.get(k, -1.0), f"metrics: {k!r}", hi=1 << 53)
            if vals["test_correct"] > vals["test_n"]:
                raise ProtocolError(f"metrics: test_correct {vals['test_correct']} > test_n {vals['test_n']}")
            loss = vals.get("test_loss_sum", 0.0)
            if not math.isfinite(loss) or loss < 0:
                raise ProtocolError(f"metrics: test_loss_sum {loss!r} is not a finite non-negative sum")
            for k in regression_keys:
                if not math.isfinite(vals[k]) or (k != "test_y_sum" and vals[k] < 0):
                    raise ProtocolError(f"metrics: {k} {vals[k]!r} is not a finite{'' if k == 'test_y_sum' else ' non-negative'} sum")
            if regression_keys and vals["test_correct"] != 0:
                raise ProtocolError(f"metrics: test_correct {vals['test_correct']!r} from a regression head (expected 0)")
            return vals

        regression_keys = set(REGRESSION_METRIC_KEYS) if self.spec.task == "regression" else set()

        # dropout policy "drop": a client without valid metrics by the shared deadline is marked dead
        got = gather(self.t, clients, TAG_METRICS, round_id, self.config.round_timeout_s, "drop",
                     parse_message(messages_pb2.Scalars, validate))
        for c, drop in got.dropped.items():
            log.warning("server: no metrics from %s in round %d (%s); marking it dead", c, round_id, drop.error)
            self.dead.add(c)
        return got.values

    def _record(self, r, selected, survivors, results, metrics, seconds) -> RoundRecord:
        """The round's record; ``survivors``: the clients that survived every part's aggregation (sorted)."""
        dropped = sorted(set(selected) - set(survivors))
        correct = sum(m["test_correct"] for m in metrics.values())
        n_test = sum(m["test_n"] for m in metrics.values())
        loss_sum = sum(m.get("test_loss_sum", 0.0) for m in metrics.values())
        trained = [m for m in metrics.values() if m.get("trained", 0) > 0 and math.isfinite(m["train_loss"])]
        n_train = sum(m["train_n"] for m in trained)
        train_loss = sum(m["train_loss"] * m["train_n"] for m in trained) / n_train if n_train else float("nan")
        agg = {p: {"clip": res.clip, "scale": res.scale, "k_bits": res.k_bits, "n_clipped": res.n_clipped,
                   "weight": res.weight, "survivors": len(res.survivors)} for p, res in results.items()}
        per_client = {c: m["test_correct"] / m["test_n"] for c, m in sorted(metrics.items()) if m["test_n"] > 0}
        if self.spec.task == "regression":  # no accuracy: the pooled regression metrics instead
            return RoundRecord(r, list(selected), survivors, dropped, float("nan"),
                               loss_sum / n_test if n_test else float("nan"), int(n_test), train_loss, seconds, agg,
                               sorted(self.dead), test_metrics=pooled_regression(list(metrics.values())))
        return RoundRecord(r, list(selected), survivors, dropped,
                           correct / n_test if n_test else float("nan"),
                           loss_sum / n_test if n_test else float("nan"), int(n_test), train_loss, seconds, agg,
                           sorted(self.dead), client_accuracy=per_client,
                           worst_client_accuracy=min(per_client.values()) if per_client else float("nan"))


# ------------------------------------------------------------------------------------ client
def _rows(X):
    """A numpy matrix as float32; a user dataset's rows as they are."""
    return X if isinstance(X, DatasetRows) else np.asarray(X, np.float32)


class HorizontalClient(_Resumable, ProtocolRole):
    """A data holder: trains the global model on its rows and submits its update through aggregation.

    A failing client tells nobody (:meth:`_peers` is empty): it is a dropout of the round, which the
    aggregation survives while t clients remain; the server marks it dead.

    Args:
        transport: this client's transport.
        server_id: the server's party id.
        X_train, y_train: local training rows (n, n_features) float32 and int labels in [0, n_classes)
            (a regression head: finite float targets).
        X_test, y_test: local test rows for the per-round metrics (may be empty).
        spec, strategy, config: as at the server (the client owns its strategy instance; its ``loop``, when
            set, is the user's training / evaluation code).
        callbacks, resume: the role lifecycle, as at the server.
        device: where the model trains (``cpu``, ``cuda``).
        on_round: optional callback with each round's history entry (after it is recorded).

    Raises ValueError for data that does not fit ``spec`` (names the mismatch).
    """

    protocol = "horizontal FL"

    def __init__(self, transport, server_id: str, X_train: np.ndarray, y_train: np.ndarray, X_test: np.ndarray,
                 y_test: np.ndarray, spec: ModelSpec, strategy: Strategy, config: FLConfig, *,
                 callbacks: Sequence[Callback] = (), resume: Checkpoint | None = None, device: str = "cpu",
                 on_round: Callable[[dict], None] | None = None):
        super().__init__(transport)
        self._init_lifecycle(callbacks, resume)
        self.server_id = server_id
        self.on_round = on_round
        check_local_data(self.party_id, spec, X_train, y_train, X_test, y_test)
        if spec.task == "regression":
            _check_target_scale(self.party_id, np.asarray(y_train, np.float64), spec)
        ydt = np.float64 if spec.task == "regression" else np.int64
        self.X_train, self.y_train = _rows(X_train), np.asarray(y_train, ydt)
        self.X_test, self.y_test = _rows(X_test), np.asarray(y_test, ydt)
        self.spec = spec
        self.strategy = strategy
        self.config = config
        self.model = build_model(spec, seed=config.seed).to(device)
        self.layout = layout_of(self.model)
        self.shapes = param_shapes(self.model)
        self.dim = sum(int(np.prod(s)) for s in self.shapes.values())
        self.config = config = config.for_model(self.dim)
        self.part_dims = strategy.part_dims(self.dim)
        check_slots(strategy, config)
        self.agg_clients = {p: make_client(transport, server_id, config.part_config(p)) for p in strategy.parts}
        self.contrib = None
        if config.contribution_temperature is not None:
            self.contrib = ContributionClient(transport, server_id, latent_dim(self.model), config.aggregation,
                                              config.contribution_temperature, config.round_timeout_s)
        self.history: list[dict] = []
        self.global_vec: np.ndarray | None = None

    def _peers(self) -> list[str]:
        return []  # a failing client is a dropout: it tells nobody

    def _parse_round(self, payload: bytes) -> messages_pb2.Bundle:
        b = messages_pb2.Bundle.FromString(payload)
        cmd = b.text.get("command")
        if cmd not in ("train", "skip", "stop", "eval"):
            raise ProtocolError(f"unknown command {cmd!r}")
        if cmd in ("train", "eval"):
            read_model(b, self.shapes)  # validate now, so a bad model is rejected and we keep waiting
        if cmd in ("train", "eval"):
            for k in b.tensors:
                if k.startswith("extra/"):
                    float32_tensor(b.tensors[k], (self.dim,), k)
        unknown = applied_parts(b) - set(self.strategy.parts)
        if unknown:
            raise ProtocolError(f"applied parts {sorted(unknown)} are not {self.strategy.name}'s "
                                f"{list(self.strategy.parts)}")
        return b

    def train_round(self, round_id: int, bundle: messages_pb2.Bundle) -> dict:
        """Local training and aggregation of one round (called for ``command == train``)."""
        participants = [p for p in bundle.text["participants"].split(",") if p]
        global_vec = read_model(bundle, self.shapes)
        extras = {k[len("extra/"):]: float32_tensor(t, (self.dim,), k) for k, t in bundle.tensors.items()
                  if k.startswith("extra/")}
        gradient_sum = None if self.config.dp is None else self.config.dp.local_update
        if gradient_sum is not None:  # distributed record-level DP-GD: the clipped gradient sum, no local steps
            upd = gradient_sum(self.model, global_vec, self.X_train, self.y_train)
        else:
            upd = self._local_update(round_id, len(participants), global_vec, extras)
        for part in self.strategy.parts:
            vec, _ = upd.parts[part]
            if vec.shape != (self.part_dims[part],):
                raise ValueError(f"{self.party_id}: part {part!r} has shape {vec.shape}, "
                                 f"expected ({self.part_dims[part]},)")
            if not np.all(np.isfinite(vec)):
                # nothing sensible to aggregate: this client drops out of the round (lower lr?)
                raise FloatingPointError(f"{self.party_id}: local training diverged in round {round_id} (non-finite "
                                         f"{part!r} update); lower the learning rate")
        factor = None
        if self.contrib is not None:  # Λ_r from the locally trained model (Kundalwal et al., Alg. 1)
            self.contrib.factor = None
            factor = self.contrib.factor_for(round_id, participants, self.model, self.X_train,
                                             AGG_ROUNDS.pack(round=round_id, part=0))
        for i, part in enumerate(self.strategy.parts):
            vec, weight = upd.parts[part]
            if self.config.dp is not None and part == "model":  # DP-FedAvg: clipped (and encoded), weight 1
                vec, weight = self.config.dp.client_input(vec, round_id, len(participants), self.party_id, weight)
            if factor is not None and part in self.strategy.sample_weighted_parts:
                weight = weight * factor  # Λ_r ∈ [0, 1]; Σ_r Λ_r = 1 keeps the total weight away from 0
            self.agg_clients[part].submit(AGG_ROUNDS.pack(round=round_id, part=self.config.part_offset + i),
                                          participants, vec, weight)
        # DP-GD's record count travels only inside the noised sum: 1 here (train_n only weighs the withheld loss)
        n_told = 1.0 if gradient_sum is not None else float(upd.n_samples)
        return {"trained": 1.0, "train_loss": upd.loss, "train_n": n_told, "steps": float(upd.steps)}

    def _local_update(self, round_id: int, n_participants: int, global_vec: np.ndarray, extras: dict):
        """The strategy's local training from the global model (the user's loop or the batched trainer told first)."""
        rng = batch_rng(self.config.seed, round_id, self.party_id)
        if self.strategy.loop is not None:
            self.strategy.loop.begin(round_id)
        if self.strategy.trainer is not None:  # batched simulation: this round's batch has every participant
            self.strategy.trainer.begin(round_id, n_participants)
        return self.strategy.client_update(self.model, global_vec, self.X_train, self.y_train,
                                           self.config.local.for_round(round_id), rng, extras)

    def run(self) -> list[dict]:
        """Serve rounds until the server says stop; return this client's per-round metrics."""
        return self._trained(self._serve_rounds)  # a failing client tells nobody: it is a dropout

    def _serve_rounds(self) -> list[dict]:
        timeout = self.config.round_timeout_s
        self.t.send(self.server_id, TAG_LAYOUT, messages_pb2.Bundle(
            text={"layout": self.layout.to_json(), "digest": self.layout.digest()}), round=0, timeout=timeout)
        done, arrays, self.history = self._restored_rounds(dict)
        if done:
            self.global_vec = self._restored_model(arrays, "global")
            self._restore_record_dp(self._restored_state.get("record_dp"))
        r = done + 1
        while True:
            bundle = self.t.recv(self.server_id, TAG_ROUND, r, timeout=timeout, parse=self._parse_round)
            cmd = bundle.text["command"]
            if cmd == "stop":
                log.info("%s: server finished after %d rounds", self.party_id, r - 1)
                return self.history
            stats = {"trained": 0.0}
            if cmd == "train":
                stats = self.train_round(r, bundle)
            ev = self.t.recv(self.server_id, TAG_EVAL, r, timeout=timeout, parse=self._parse_round)
            self.global_vec = read_model(ev, self.shapes)
            self.strategy.client_round_end(applied_parts(ev) if cmd == "train" else set())
            extras = {k[len("extra/"):]: float32_tensor(t, (self.dim,), k) for k, t in ev.tensors.items()
                      if k.startswith("extra/")}
            metrics = self.evaluate(self.strategy.eval_vector(self.model, self.global_vec, extras, self.X_train,
                                                              self.y_train))
            stats.update(test_correct=metrics["correct"], test_n=metrics["n"],
                         test_loss_sum=metrics["loss"] * metrics["n"] if metrics["n"] else 0.0)
            if self.spec.task == "regression":
                stats.update(test_loss_sum=metrics.get("sse", 0.0), test_abs_sum=metrics.get("sae", 0.0),
                             test_y_sum=metrics.get("y_sum", 0.0), test_y2_sum=metrics.get("y2_sum", 0.0))
            self.t.send(self.server_id, TAG_METRICS, messages_pb2.Scalars(values=stats), round=r,
                                timeout=timeout)
            local = {}  # kept here, never sent: the server must not learn a client's Λ_r
            if cmd == "train" and self.contrib is not None and self.contrib.factor is not None:
                local["contribution_factor"] = self.contrib.factor
            if self.record_privacy is not None:  # DP-SGD: this client's ε over every step so far
                local["record_epsilon"] = self.record_privacy["epsilon"]
            quality = {"test_accuracy": metrics["accuracy"]}
            if self.spec.task == "regression":
                quality = {"test_mse": metrics["loss"]}
            self.history.append({"round": r, **stats, **quality, **local})
            self._round_done(r, {"global": self.global_vec}, self.history)
            if self.on_round is not None:
                self.on_round(self.history[-1])
            log.info("%s: round %d %s; local %s (n=%d)", self.party_id, r,
                     f"trained {int(stats['steps'])} steps, loss {stats['train_loss']:.4f}" if cmd == "train"
                     else "not selected", ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in quality.items()),
                     metrics["n"])
            r += 1

    def _restore_record_dp(self, state) -> None:
        """After a resume: the DP-SGD accountant of the rounds already trained (ε continues, never restarts)."""
        if self.config.local.dp_sgd is None:
            return
        if not isinstance(state, dict):
            raise ValueError("checkpoint: params.record_dp is on but the checkpoint holds no DP-SGD accountant")
        self.strategy.record_dp = for_config(None, self.config.local, len(self.y_train))
        self.strategy.record_dp.load_state_dict(state)

    @property
    def record_privacy(self) -> dict | None:
        """This client's record-level DP-SGD guarantee so far (:meth:`~.dp_sgd.RecordDP.record`), or None."""
        rec = getattr(self.strategy, "record_dp", None)
        return None if rec is None else rec.record()

    def evaluate(self, vector: np.ndarray) -> dict[str, float]:
        """Metrics of the flat parameter vector ``vector`` (float32, (d,)) on this client's test rows: accuracy and
        loss, plus the sums the server pools (correct, n, sse, sae, y_sum, y2_sum); NaN metrics without test rows.
        """
        set_flat(self.model, vector)
        if len(self.y_test) == 0:
            return {"accuracy": float("nan"), "loss": float("nan"), "correct": 0.0, "n": 0.0, "sse": 0.0, "sae": 0.0,
                    "y_sum": 0.0, "y2_sum": 0.0}
        return self.strategy.evaluate_rows(self.model, self.X_test, self.y_test)
