"""Root-cause blame: the first failure of a job, with its party and reason, named by every party.

When one party fails, the others stop too (a peer that went silent, an abort message, the launcher's
SIGTERM). Each of them would report its own symptom ("terminated (signal 15)", "vertical LR failed:
143"); this module carries the *first* failure instead, so that every party's last line reads
``guest stopped because host-1 failed: <reason>`` and the launcher names host-1 alone as the cause.

* :class:`Failure` is one (party, reason); :meth:`Failure.abort_text` is what goes to the peers.
* :func:`root_cause` turns an exception caught by a party into its root :class:`Failure`: an abort
  from a peer carries the peer's root; a peer that went silent or unreachable is the root (also behind
  an algorithm's error raised from such a transport error); a silent peer that was only waiting on a
  party that is gone is not: that one is (:class:`~secureflhv.transport.PeerLost`); an abort blaming
  this party's silence while it waited on a peer names that peer; anything else is this party's own
  failure, phrased by :func:`secureflhv.runtime.process.os_errors.plain_error`.
* :class:`Blame` keeps the first failure a party hears of (thread-safe).

Abort texts come from peers and are untrusted: :func:`clean` strips control characters and bounds
their length before anything is parsed or logged; a party id is believed only if it is in the job.
"""
from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass

from ...transport import JobAborted, PeerTimeout, PeerUnavailable
from .os_errors import plain_error

__all__ = ["Blame", "Failure", "Stopped", "clean", "parse_reported", "root_cause", "MAX_REASON_CHARS"]

MAX_REASON_CHARS = 400
_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")
_STOPPED = re.compile(rf"stopped because (?P<party>{_ID}) failed: (?P<reason>.*)")
_ABORTED = re.compile(rf"party '(?P<party>{_ID})' aborted the job: (?P<reason>.*)")
_FAILED = re.compile(rf"(?:^|[\s:])(?P<party>{_ID}) failed: (?P<reason>.*)")
_SILENT = re.compile(rf"from '(?P<party>{_ID})' within (?P<secs>\d+)s")
_UNREACHABLE = re.compile(rf"to '(?P<party>{_ID})' at (?P<address>\S+) within")


def clean(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` on one line: control and bidi characters replaced by a space, at most ``limit`` characters."""
    text = _CONTROL.sub(" ", str(text)).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Failure:
    """The first failure of a job: which party, and why (one plain sentence)."""

    party: str
    reason: str

    def line_for(self, me: str) -> str:
        """The last line party ``me`` logs."""
        if self.party == me:
            return f"{me} failed: {self.reason}"
        return f"{me} stopped because {self.party} failed: {self.reason}"

    def abort_text(self) -> str:
        """The abort message for the peers (parsed back by :func:`parse_reported`)."""
        return f"{self.party} failed: {self.reason}"


class Stopped(SystemExit):
    """Raised in the main thread by the SIGTERM/SIGINT handler: carries the failure that caused the stop, if known."""

    def __init__(self, signum: int, failure: Failure | None):
        super().__init__(128 + signum)
        self.signum, self.failure = signum, failure

    def __str__(self) -> str:
        if self.failure is not None:
            return f"stopped because {self.failure.party} failed: {self.failure.reason}"
        return f"terminated by signal {self.signum} ({signal.Signals(self.signum).name})"


_SILENCE = "sent nothing for "  # how a silent peer's failure reads (below)


def _silent_peer(text: str, me: str, parties) -> Failure | None:
    """The peer a timeout / delivery failure in ``text`` names (not ``me``), as the root failure."""
    for rx, why in ((_SILENT, _SILENCE + "{secs}s (stopped or crashed?)"),
                    (_UNREACHABLE, "could not be reached at {address} (stopped or crashed?)")):
        m = rx.search(text)
        if m and m.group("party") in parties and m.group("party") != me:
            return Failure(m.group("party"), why.format(**m.groupdict()))
    return None


def parse_reported(text: str, sender: str, parties) -> Failure:
    """The root failure in an abort ``text`` that ``sender`` sent (untrusted: cleaned and bounded).

    A party named as the root must be in ``parties``; otherwise the sender is the root.
    """
    text = clean(text)
    m = _STOPPED.search(text)
    if m and m.group("party") in parties:
        return Failure(m.group("party"), m.group("reason"))
    m = _ABORTED.search(text)
    if m and m.group("party") in parties:
        return parse_reported(m.group("reason"), m.group("party"), parties)
    m = _FAILED.search(text)
    if m and m.group("party") in parties:
        return Failure(m.group("party"), m.group("reason"))
    return _silent_peer(text, sender, parties) or Failure(sender, text)


def root_cause(exc: BaseException, me: str, parties) -> Failure:
    """The root :class:`Failure` behind ``exc``, caught by party ``me`` of a job with ``parties``."""
    if isinstance(exc, Stopped):
        return exc.failure or Failure(me, str(exc))
    peer = getattr(exc, "peer", None)
    if peer in parties and peer != me:
        return Failure(peer, clean(getattr(exc, "reason", None) or str(exc)))
    if isinstance(exc, JobAborted):
        m = _ABORTED.search(clean(str(exc)))
        if m and m.group("party") in parties:
            reported = parse_reported(m.group("reason"), m.group("party"), parties)
            waited = getattr(exc, "waiting_for", None)
            if reported.party == me and reported.reason.startswith(_SILENCE) and waited in parties \
                    and waited not in (me, m.group("party")):
                # a peer took our silence for the failure, but we were blocked on ``waited``: that is the root
                return Failure(waited, f"sent nothing while {me} waited on it, so {me} fell silent too "
                                       f"(stopped or crashed?)")
            return reported
    if isinstance(exc, (PeerTimeout, PeerUnavailable)):
        found = _silent_peer(clean(str(exc)), me, parties)
        if found is not None:
            return found
    if isinstance(exc.__cause__, (PeerTimeout, PeerUnavailable, JobAborted)):
        # an algorithm's own error raised from a peer's silence, unreachability or abort (e.g. SecureBoostError
        # "host 'host-1' unreachable ..."): the peer is the root, as if the transport error had reached us bare
        found = root_cause(exc.__cause__, me, parties)
        if found.party != me:
            return found
    return Failure(me, clean(plain_error(exc)))


class Blame:
    """The first failure this party hears of; later ones do not replace it (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._first: Failure | None = None

    def record(self, failure: Failure) -> Failure:
        """Keep ``failure`` if it is the first; return the first."""
        with self._lock:
            if self._first is None:
                self._first = failure
            return self._first

    @property
    def first(self) -> Failure | None:
        """The first failure recorded, or None."""
        with self._lock:
            return self._first


# ---------------------------------------------------------------------------------- launcher notices
# ``secureflhv run`` tells the parties it keeps running which party failed first, on their stdin, so that a
# party killed without a word (SIGKILL, OOM) is still named by every other party's last line.
NOTICE_ENV = "SECUREFLHV_LAUNCHER_NOTICES"
_NOTICE = re.compile(rf"^ABORT (?P<party>{_ID})\t(?P<reason>.*)$")


def notice_line(failure: Failure) -> str:
    """The line the launcher writes to a party's stdin to announce ``failure``."""
    return f"ABORT {failure.party}\t{clean(failure.reason)}\n"


def listen_for_notices(stream, blame: Blame, parties, on_notice) -> threading.Thread:
    """Read launcher notices from ``stream`` in a daemon thread: the first valid one is recorded in
    ``blame`` and ``on_notice()`` is called (the party then stops). Other lines are ignored."""

    def read() -> None:
        for line in stream:
            m = _NOTICE.match(line.rstrip("\n"))
            if m and m.group("party") in parties:
                blame.record(Failure(m.group("party"), clean(m.group("reason"))))
                on_notice()
                return

    thread = threading.Thread(target=read, daemon=True, name="launcher-notices")
    thread.start()
    return thread
