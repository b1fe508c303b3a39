"""The serving exchange: the guest's service drives its hosts step by step over the job's mTLS transport.

Each step is one control message (``serve.ctl``, round = step number, a Bundle whose ``text["op"]`` says
what to do) from the guest to every host, and the hosts' reply (``serve.reply``, same round)::

    score    ids (JSON list)        host: looks the ids up in its feature store, replies the positions of
                                    the ids it does not know (their rows are all-missing: the model's
                                    missing-value path), then answers the family's prediction requests for
                                    those rows (:mod:`.scoring`: exactly the batch job's exchange)
    prepare  model_dir, fingerprint host: loads and checks its bundle in model_dir (signed by itself under the
                                    job CA, the same fingerprint, its store has the columns); replies ok/error
    commit / abort                  host: switches to the prepared model (session keys and counters carried
                                    over: no new handshake) or drops it; replies ok
    stop                            host: leaves the loop

Steps are taken one at a time by the guest's single worker, so a swap falls between two requests and no
request is dropped. What a host learns: the ids asked about and when (as in the batch job's PSI, it learns
which of its rows are scored), and the fingerprint of the model in use; nothing about the guest's features
or the scores. A host checks every control message (op, id count and length, JSON types) and rejects a bad
one (logged; it keeps waiting); it never trusts the guest's id count beyond :data:`MAX_IDS`.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Callable, Sequence

import numpy as np

from ...proto import messages_pb2
from ...transport import ProtocolError, Transport, TransportError, parse_message
from ..job.job_file import JobConfig, JobConfigError, PartySpec
from ..store.model_bundle import ModelBundle
from .scoring import GuestScoring, HostScoring, Precomputer, build_scoring, fingerprint, input_columns

log = logging.getLogger("secureflhv.serve")

TAG_CTL, TAG_REPLY = "serve.ctl", "serve.reply"
OPS = ("score", "prepare", "commit", "abort", "stop")
MAX_IDS = 4096          # ids in one step, whatever the guest says (its max_batch is below this)
MAX_ID_CHARS = 256      # one id's length
IDLE_S = 10 * 365 * 24 * 3600.0   # a host waits for the next step while the guest is reachable


class FederationDown(RuntimeError):
    """The federation cannot score any more (a host failed or went away); the message names the party."""


class StepRefused(RuntimeError):
    """A host could not answer this step (e.g. its feature store failed) but the exchange stayed in step: this
    request fails, naming the host, and the next one is served."""


def _ctl(op: str, **text: str) -> messages_pb2.Bundle:
    return messages_pb2.Bundle(text={"op": op, **text})


def _ids_of(msg: messages_pb2.Bundle) -> list[str]:
    ids = json.loads(msg.text.get("ids", "null"))
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_IDS:
        raise ProtocolError(f"serve.ctl score: ids must be a list of 1..{MAX_IDS} strings")
    if not all(isinstance(i, str) and 0 < len(i) <= MAX_ID_CHARS for i in ids):
        raise ProtocolError(f"serve.ctl score: every id must be a string of 1..{MAX_ID_CHARS} characters")
    return ids


def _check_ctl(msg: messages_pb2.Bundle) -> messages_pb2.Bundle:
    op = msg.text.get("op")
    if op not in OPS:
        raise ProtocolError(f"serve.ctl: unknown op {op!r}")
    if op == "score":
        _ids_of(msg)
    if op == "prepare" and not (msg.text.get("model_dir") and msg.text.get("fingerprint")):
        raise ProtocolError("serve.ctl prepare: needs model_dir and fingerprint")
    return msg


def _reply_parser(host: str, m: int):
    """A host's reply to a score step: the sorted positions (< m) of the ids it does not know."""
    def validate(msg: messages_pb2.Bundle):
        if "error" in msg.text:
            return msg.text["error"]
        pos = json.loads(msg.text.get("missing", "null"))
        if not isinstance(pos, list) or not all(isinstance(p, int) and 0 <= p < m for p in pos) \
                or pos != sorted(set(pos)):
            raise ProtocolError(f"serve.reply from {host}: missing must be sorted distinct positions below {m}")
        return pos
    return parse_message(messages_pb2.Bundle, validate)


class GuestFederation:
    """The guest's side of the exchange, used by one worker thread at a time (the service's).

    Args:
        t: the guest's transport (partners met).
        cfg, party: the serve job and the guest's entry.
        load: model_dir -> this party's verified bundle (JobConfigError when it is not one).
        model_dir: the first model; max_rows: the most rows of one step.
    """

    def __init__(self, t: Transport, cfg: JobConfig, party: PartySpec, load: Callable[[str], ModelBundle],
                 model_dir: str, max_rows: int):
        self.t, self.cfg, self.party, self.load, self.max_rows = t, cfg, party, load, max_rows
        self.step, self.down = 0, None
        bundle = load(model_dir)
        self.hosts = [h.id for h in cfg.hosts]
        self.scoring: GuestScoring = build_scoring(cfg, party, t, bundle, max_rows=max_rows)
        self.model = fingerprint(bundle)
        self.columns = input_columns(bundle)
        self.lock = threading.Lock()
        self.precompute = Precomputer(2 * max_rows)

    def _send_all(self, msg) -> None:
        for h in self.hosts:
            self.t.send(h, TAG_CTL, msg, round=self.step)

    def _fail(self, exc: BaseException) -> FederationDown:
        who = getattr(exc, "sender", None) or next((h for h in self.hosts if h in str(exc)), "a host")
        self.down = f"{who}: {type(exc).__name__}: {exc}"
        log.error("%s: serving stopped: %s", self.party.id, self.down)
        return FederationDown(self.down)

    def score(self, ids: Sequence[str], X_raw: np.ndarray) -> tuple[np.ndarray, dict[str, list[str]]]:
        """Scores of the rows (ids, the guest's raw features X_raw (m, d_g)) and id -> hosts that lacked it.
        FederationDown once a host failed (this step and every later one)."""
        if self.down:
            raise FederationDown(self.down)
        with self.lock:
            self.step += 1
            try:
                self._send_all(_ctl("score", ids=json.dumps(list(ids))))
                scores = self.scoring.score(X_raw)
                missing: dict[str, list[str]] = {}
                refused = []
                for h in self.hosts:
                    pos = self.t.recv(h, TAG_REPLY, round=self.step, parse=_reply_parser(h, len(ids)))
                    if isinstance(pos, str):
                        refused.append(f"{h}: {pos}")
                        continue
                    for p in pos:
                        missing.setdefault(ids[p], []).append(h)
            except (TransportError, ProtocolError, RuntimeError) as exc:
                raise self._fail(exc) from exc
        if refused:
            raise StepRefused("; ".join(refused))
        self.precompute.top_up(self.scoring.role)
        return scores, missing

    def swap(self, model_dir: str) -> str:
        """Every party switches to its bundle in ``model_dir`` (the same fingerprint everywhere), between two
        requests; returns the new fingerprint. JobConfigError (nothing changed) when this party's bundle or a
        host's refusal says no; FederationDown when a host fails."""
        bundle = self.load(model_dir)
        if bundle.algorithm != self.scoring.bundle.algorithm:
            raise JobConfigError(f"swap: a {bundle.algorithm} model cannot replace a {self.scoring.bundle.algorithm}")
        new = fingerprint(bundle)
        with self.lock:
            try:
                self.step += 1
                self._send_all(_ctl("prepare", model_dir=str(model_dir), fingerprint=new))
                answers = {h: self.t.recv(h, TAG_REPLY, round=self.step, parse=parse_message(messages_pb2.Bundle))
                           for h in self.hosts}
                refused = {h: a.text.get("error", "no answer") for h, a in answers.items() if a.text.get("ok") != new}
                self.step += 1
                self._send_all(_ctl("abort" if refused else "commit"))
                for h in self.hosts:
                    self.t.recv(h, TAG_REPLY, round=self.step, parse=parse_message(messages_pb2.Bundle))
            except (TransportError, ProtocolError) as exc:
                raise self._fail(exc) from exc
            if refused:
                raise JobConfigError("swap refused: " + "; ".join(f"{h}: {why}" for h, why in refused.items()))
            self.scoring = build_scoring(self.cfg, self.party, self.t, bundle, max_rows=self.max_rows,
                                         session_from=self.scoring.role)
            self.model, self.columns = new, input_columns(bundle)
        log.info("%s: now serving model %s (%s)", self.party.id, new, model_dir)
        return new

    def close(self) -> None:
        """Release an LR arbiter and the hosts; best effort. The role's own end of prediction goes first: it
        messages the hosts too (split NN, LR), and a host that has had its "stop" leaves and closes its
        transport, so a message to it after that would be retried until the deadline (the guest's SIGTERM
        then took ``--deadline`` seconds, and a supervisor's kill left the arbiter without its end)."""
        with self.lock:
            try:
                self.scoring.close()
            except TransportError as exc:
                log.info("%s: could not end prediction at every party: %s", self.party.id, exc)
            self.step += 1
            try:
                self._send_all(_ctl("stop"))
            except TransportError as exc:
                log.info("%s: could not tell every party that serving stopped: %s", self.party.id, exc)


class HostLoop:
    """A host's side: answer the guest's steps until it stops or goes away.

    Args:
        t, cfg, party: the host's transport (partners met), the serve job, its entry.
        load: model_dir -> verified bundle; open_store: columns -> the feature store holding them.
    """

    def __init__(self, t: Transport, cfg: JobConfig, party: PartySpec, load: Callable[[str], ModelBundle],
                 open_store, model_dir: str, max_rows: int):
        self.t, self.cfg, self.party, self.load, self.open_store = t, cfg, party, load, open_store
        self.guest, self.max_rows, self.step = cfg.guest.id, max_rows, 0
        bundle = load(model_dir)
        self.store = open_store(input_columns(bundle))
        self.scoring: HostScoring = build_scoring(cfg, party, t, bundle, max_rows=max_rows)
        self.prepared = None
        self.served = 0
        self.precompute = Precomputer(2 * max_rows)

    def run(self) -> int:
        """Serve until the guest's stop; returns the number of score steps. PeerTimeout when the guest is gone."""
        parse = parse_message(messages_pb2.Bundle, _check_ctl)
        while True:
            self.step += 1
            msg = self.t.recv_while_reachable(self.guest, TAG_CTL, round=self.step, timeout=IDLE_S, parse=parse)
            op = msg.text["op"]
            if op == "stop":
                log.info("%s: the guest stopped serving after %d requests", self.party.id, self.served)
                return self.served
            getattr(self, f"_{op}")(msg)

    def _reply(self, **text: str) -> None:
        self.t.send(self.guest, TAG_REPLY, messages_pb2.Bundle(text=text), round=self.step)

    def _score(self, msg) -> None:
        ids = _ids_of(msg)
        try:
            X, found = self.store.lookup(ids)
            self._reply(missing=json.dumps(np.flatnonzero(~found).tolist()))
        except Exception as exc:  # noqa: BLE001 - a store failure fails this request, not the session
            log.error("%s: feature store failed on a request of %d ids: %s", self.party.id, len(ids), exc)
            self._reply(error=f"feature store: {type(exc).__name__}: {exc}"[:500])
            X = np.full((len(ids), len(self.store.columns)), np.nan)  # the exchange still runs: rounds stay in step
        self.scoring.answer(X)
        self.served += 1
        self.precompute.top_up(self.scoring.role)

    def _prepare(self, msg) -> None:
        self.prepared = None
        try:
            bundle = self.load(msg.text["model_dir"])
            if fingerprint(bundle) != msg.text["fingerprint"]:
                raise JobConfigError(f"the bundle in {msg.text['model_dir']} is model {fingerprint(bundle)}, "
                                     f"the guest's is {msg.text['fingerprint']}")
            self.prepared = (bundle, self.open_store(input_columns(bundle)))
        except (JobConfigError, ValueError, OSError) as exc:
            log.warning("%s: swap to %s refused: %s", self.party.id, msg.text["model_dir"], exc)
            self._reply(error=str(exc)[:500])
            return
        self._reply(ok=msg.text["fingerprint"])

    def _commit(self, msg) -> None:
        if self.prepared is not None:
            bundle, store = self.prepared
            self.scoring = build_scoring(self.cfg, self.party, self.t, bundle, max_rows=self.max_rows,
                                         session_from=self.scoring.role)
            self.store.close()
            self.store, self.prepared = store, None
            log.info("%s: now serving model %s", self.party.id, fingerprint(bundle))
        self._reply(ok="commit")

    def _abort(self, msg) -> None:
        if self.prepared is not None:
            self.prepared[1].close()
        self.prepared = None
        self._reply(ok="abort")
