"""The job page: a read-only web page, served with Bottle, that shows a running job.

``secureflhv run JOB --dashboard [PORT]`` serves it for every party the launcher starts;
``secureflhv party JOB --party ID --dashboard [PORT]`` for one organisation's own party. The page polls
``/api/job`` once a second (plain JavaScript, no CDN: nothing is fetched from outside the page's own
server) and shows each party's state, step and ETA, its curves, bytes per peer, recent log lines and,
after the job, its final metrics and plots.

Sources: only the parties' status files (:mod:`.status`) and the PNG plots in their output folders.
What may leave the machine is whitelisted: the fields of the status files the page needs, and files named
``NAME.png`` lying directly in a party's output folder (no sub-folder, no symbolic link) — never a key, a
certificate, a data file, a model or the job file. Requests whose ``Host`` header is not this server's
address are refused (DNS rebinding), and it binds to 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import logging
import re
import signal
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import bottle

from .dashboard_page import APP_JS, INDEX_HTML, STYLE_CSS
from .status import STATUS_FILE, read_status

log = logging.getLogger("secureflhv.dashboard")

DEFAULT_PORT = 8765
LOOPBACK = "127.0.0.1"
PLOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,80}\.png$")  # the only files served
MAX_CURVE_POINTS = 2000
_HEADERS = [  # the page loads only from itself, in no frame, and sends no referrer anywhere
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]


@dataclass(frozen=True)
class PartyEntry:
    """One party on the page: its id, role and output folder (where its status file and plots are)."""

    id: str
    role: str
    out_dir: Path


def entries(cfg, party_ids: Iterable[str] | None = None) -> list[PartyEntry]:
    """The page's parties of job ``cfg`` (a :class:`~secureflhv.runtime.job.job_file.JobConfig`): all, or those in ``party_ids``."""
    wanted = None if party_ids is None else set(party_ids)
    return [PartyEntry(p.id, p.role, cfg.output_dir(p.id)) for p in cfg.parties if wanted is None or p.id in wanted]


class JobPage:
    """The Bottle app of the job page.

    Args:
        job_id: shown in the title.
        parties: the parties shown (:func:`entries`).
        since: wall-clock time (Unix seconds) the job started; a status file or plot older than that is
            left over from an earlier run and not shown.
        exit_codes: optional ``() -> {party id: exit code or None while running}`` from a launcher: a
            party that died without writing its last status (killed) is shown failed.
    """

    def __init__(self, job_id: str, parties: list[PartyEntry], since: float | None = None,
                 exit_codes: Callable[[], dict[str, int | None]] | None = None):
        self.job_id = job_id
        self.parties = {p.id: p for p in parties}
        self.since = time.time() if since is None else since
        self.exit_codes = exit_codes
        self.allowed_hosts: set[str] | None = None  # set by the server once it knows its port
        app = self.app = bottle.Bottle()
        app.route("/", callback=lambda: self._text(INDEX_HTML, "text/html; charset=utf-8"))
        app.route("/app.js", callback=lambda: self._text(APP_JS, "text/javascript; charset=utf-8"))
        app.route("/style.css", callback=lambda: self._text(STYLE_CSS, "text/css; charset=utf-8"))
        app.route("/api/job", callback=self.job)
        app.route("/files/<party>/<name>", callback=self.plot)

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ, start_response):
        host = environ.get("HTTP_HOST", "")
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            start_response("403 Forbidden", [("Content-Type", "text/plain"), *_HEADERS])
            return [b"forbidden: unexpected Host header\n"]

        def with_headers(status, headers, exc_info=None):
            return start_response(status, [h for h in headers if h[0] not in dict(_HEADERS)] + _HEADERS, exc_info)

        return self.app(environ, with_headers)

    @staticmethod
    def _text(body: str, ctype: str) -> str:
        bottle.response.content_type = ctype
        return body

    # ------------------------------------------------------------------ data
    def _status(self, p: PartyEntry) -> dict | None:
        doc = read_status(p.out_dir / STATUS_FILE)
        started = doc.get("started") if doc else None
        if doc is None or doc.get("party_id") != p.id or not isinstance(started, (int, float)) \
                or started < self.since - 1.0:
            return None  # absent, foreign, malformed or from an earlier run
        return doc

    def _plots(self, p: PartyEntry) -> list[str]:
        try:
            files = sorted(p.out_dir.iterdir())
        except OSError:
            return []
        return [f.name for f in files if PLOT_NAME.match(f.name) and _servable(f, self.since)]

    def party_view(self, p: PartyEntry, rc: int | None) -> dict:
        """What the page shows of party ``p`` (only these fields leave the machine)."""
        doc = self._status(p) or {}
        state = doc.get("state", "waiting")
        error = doc.get("error")
        if rc not in (None, 0) and state not in ("done", "failed"):
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            state, error = "failed", f"{p.id} {how}"
        view = {
            "id": p.id, "role": p.role, "state": state, "error": error,
            "started": doc.get("started"), "updated": doc.get("updated"),
            "tasks": doc.get("tasks", {}), "wire": doc.get("wire", {}), "log": doc.get("log", [])[-40:],
            "curves": {k: v[-MAX_CURVE_POINTS:] for k, v in doc.get("curves", {}).items()},
            "curve_steps": doc.get("curve_steps", {}), "final": doc.get("final", {}), "plots": [],
        }
        if state in ("done", "failed"):
            view["plots"] = self._plots(p)
        return view

    def job(self) -> dict:
        """``GET /api/job``: the job's state and every party's view, as JSON."""
        codes = self.exit_codes() if self.exit_codes else {}
        parties = [self.party_view(p, codes.get(p.id)) for p in self.parties.values()]
        states = {v["state"] for v in parties}
        if states <= {"done"}:
            state = "done"
        elif states <= {"done", "failed"}:
            state = "failed"
        elif states & {"running", "done", "failed"}:
            state = "running"
        else:
            state = "starting"
        bottle.response.content_type = "application/json"
        return {"job_id": self.job_id, "state": state, "now": time.time(), "parties": parties}

    def plot(self, party: str, name: str):
        """``GET /files/PARTY/NAME.png``: a plot of a party that has finished; anything else is 404."""
        p = self.parties.get(party)
        if p is None or not PLOT_NAME.match(name) or name not in self.party_view(p, None)["plots"]:
            return bottle.HTTPError(404, "not found")
        return bottle.static_file(name, root=str(p.out_dir), mimetype="image/png")


def _servable(path: Path, since: float) -> bool:
    """A regular file (not a link) written during this job."""
    try:
        return not path.is_symlink() and path.is_file() and path.stat().st_mtime >= since - 1.0
    except OSError:
        return False


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name; one line per request is noise
        pass


class DashboardServer:
    """Serve a :class:`JobPage` in a background thread.

    Args:
        page: the app.
        host: the address to bind (127.0.0.1 by default; anything else logs a warning, since the page
            then shows progress, logs and metrics to whoever can reach that address).
        port: 0 picks a free port; :attr:`url` tells which.

    Raises OSError when the port cannot be bound.
    """

    def __init__(self, page: JobPage, host: str = LOOPBACK, port: int = DEFAULT_PORT):
        self.page = page
        self.host = host
        if host not in (LOOPBACK, "localhost", "::1"):
            log.warning("the job page listens on %s, not only on this machine: anyone who can reach it sees the "
                        "job's progress, logs and metrics (no data or keys)", host)
        server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
        self.httpd = make_server(host, port, page, server_class=server_class, handler_class=_QuietHandler)
        self.port = self.httpd.server_address[1]
        if host in (LOOPBACK, "localhost", "::1"):
            page.allowed_hosts = {f"{name}:{self.port}" for name in (LOOPBACK, "localhost", "[::1]")}
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="job-page")

    @property
    def url(self) -> str:
        """The page's address (a wildcard bind shown as the loopback address)."""
        host = LOOPBACK if self.host in ("0.0.0.0", "::", "localhost", "") else self.host  # a wildcard: say here
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def start(self) -> "DashboardServer":
        """Serve in a daemon thread; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (waits up to 5 s for the thread)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def linger(self, seconds: float) -> None:
        """Keep serving for ``seconds`` after the job (Ctrl-C ends it early), so people can look at the result."""
        if seconds <= 0:
            return
        print(f"the job page stays up for {seconds:.0f}s at {self.url} (Ctrl-C to close it)", flush=True)

        def close(_signum, _frame):
            raise KeyboardInterrupt

        previous = {s: signal.signal(s, close) for s in (signal.SIGINT, signal.SIGTERM)}  # the party's are spent
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            pass
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def open_job_page(cfg, party_ids: Iterable[str] | None = None, *, host: str = LOOPBACK, port: int = DEFAULT_PORT,
                  exit_codes: Callable[[], dict[str, int | None]] | None = None) -> DashboardServer:
    """Serve the job page of job ``cfg`` (all parties, or ``party_ids``) and print its address.

    Raises OSError when ``host:port`` cannot be bound.
    """
    page = JobPage(cfg.job.id, entries(cfg, party_ids), exit_codes=exit_codes)
    server = DashboardServer(page, host, port).start()
    print(f"job page: {server.url}", flush=True)
    return server
