"""The guest's scoring service behind the request front end: one worker thread takes the queued requests,
joins those waiting into one federated step (one round trip per host for concurrent callers, up to
``max_batch`` ids), and runs hot swaps in the same queue, so a swap falls between two steps and no request
is dropped. Implements :class:`~secureflhv.runtime.serve.front.Scorer`.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout

import numpy as np

from ..job.job_file import JobConfigError
from .federation import FederationDown, GuestFederation, StepRefused
from .front import ScoreRequest, ScoreResult, ServeError

log = logging.getLogger("secureflhv.serve")


class GuestService:
    """Queue, batch and score requests with a :class:`GuestFederation`; see the module docstring.

    Args:
        federation: the guest's side of the exchange (partners met, model loaded).
        max_batch: most ids of one request and of one joined step.
    """

    def __init__(self, federation: GuestFederation, max_batch: int):
        self.fed, self.max_batch = federation, int(max_batch)
        self._queue: queue.Queue = queue.Queue()
        self._held = None   # a request taken that did not fit the step being built
        self._worker = threading.Thread(target=self._work, name="serve-worker", daemon=True)
        self._worker.start()

    @property
    def feature_columns(self) -> list[str]:
        """The guest's raw model input columns, in the order a request's features must have."""
        return list(self.fed.columns)

    def score(self, request: ScoreRequest, timeout_s: float) -> ScoreResult:
        """Score ``request`` (ids and the guest's features for them); ServeError: bad_request (features
        missing or of the wrong width), too_large, unavailable (a host is down: named), timeout."""
        m = len(request.ids)
        if not 1 <= m <= self.max_batch:
            raise ServeError("too_large" if m else "bad_request", f"{m} ids; send 1..{self.max_batch} per request")
        if request.features is None:
            raise ServeError("bad_request", f"features: the guest's values for {self.feature_columns} are needed")
        X = np.asarray(request.features, dtype=np.float64)
        if X.shape != (m, len(self.feature_columns)):
            raise ServeError("bad_request", f"features: shape {X.shape}, expected ({m}, {len(self.feature_columns)}) "
                                            f"for columns {self.feature_columns}")
        if self.fed.down:
            raise ServeError("unavailable", self.fed.down)
        done: Future = Future()
        self._queue.put(("score", request, X, done))
        try:
            return done.result(timeout_s)
        except FutureTimeout:
            raise ServeError("timeout", f"no answer within {timeout_s:g}s (the step goes on; its result is "
                                        "dropped)") from None

    def swap(self, model_dir: str) -> str:
        """Switch every party to its bundle in ``model_dir`` between two steps; returns the new fingerprint.
        ServeError bad_request (refused: nothing changed) or unavailable."""
        done: Future = Future()
        self._queue.put(("swap", model_dir, None, done))
        return done.result()

    def health(self) -> dict:
        """Liveness details: the model in use, steps taken, and why the federation is down (if it is)."""
        return {"model": self.fed.model, "steps": self.fed.step, "down": self.fed.down,
                "queued": self._queue.qsize()}

    def ready(self) -> tuple[bool, str]:
        """(True, "") while every host answers; (False, which party failed and why) after a failure."""
        return (self.fed.down is None, self.fed.down or "")

    def close(self) -> None:
        """Stop taking requests, release the hosts."""
        self._queue.put(None)
        self._worker.join(timeout=5.0)
        self.fed.close()

    # ------------------------------------------------------------------ worker
    def _next(self, block: bool):
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return self._queue.get() if block else self._queue.get_nowait()

    def _work(self) -> None:
        while True:
            item = self._next(block=True)
            if item is None:
                return
            if item[0] == "swap":
                self._swap(item)
                continue
            batch, n = [item], len(item[1].ids)
            while True:  # join what is already waiting, up to max_batch ids
                try:
                    nxt = self._next(block=False)
                except queue.Empty:
                    break
                if nxt is None or nxt[0] != "score" or n + len(nxt[1].ids) > self.max_batch:
                    self._held = nxt
                    break
                batch.append(nxt)
                n += len(nxt[1].ids)
            self._score(batch)

    def _swap(self, item) -> None:
        _, model_dir, _, done = item
        try:
            done.set_result(self.fed.swap(model_dir))
        except JobConfigError as exc:
            done.set_exception(ServeError("bad_request", str(exc)))
        except FederationDown as exc:
            done.set_exception(ServeError("unavailable", str(exc)))

    def _score(self, batch: list) -> None:
        ids = [i for _, r, _, _ in batch for i in r.ids]
        X = np.vstack([x for _, _, x, _ in batch])
        try:
            scores, missing = self.fed.score(ids, X)
        except (FederationDown, StepRefused) as exc:
            for *_, done in batch:
                done.set_exception(ServeError("unavailable", str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bug must reach the callers as 'internal', not kill the worker
            log.exception("serving step failed")
            for *_, done in batch:
                done.set_exception(ServeError("internal", f"{type(exc).__name__}"))
            return
        start = 0
        for _, request, _, done in batch:
            m = len(request.ids)
            part = {i: missing[i] for i in request.ids if i in missing}
            done.set_result(ScoreResult(scores=scores[start:start + m], missing=part, model=self.fed.model))
            start += m
