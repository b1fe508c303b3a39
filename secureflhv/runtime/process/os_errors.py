"""Common operating-system and certificate errors as one plain sentence a user can act on.

gRPC and Python report these in their own words ("Failed to bind to address ...; set
GRPC_VERBOSITY=debug", "[Errno 13] Permission denied: 'x.key'"); the sentences here say what is wrong
and what to do. Used by the preflight checks (:mod:`secureflhv.runtime.job.preflight`) and by the party's
last log line (:mod:`secureflhv.runtime.process.blame`).
"""
from __future__ import annotations

import errno
import re
import socket

__all__ = ["plain_error", "port_problem", "port_sentence"]

_EXPIRED = re.compile(r"(?P<what>(?:CA )?certificate .+?) is not valid now \((?P<now>[^)]*)\): valid from "
                      r"(?P<start>.+?) to (?P<end>.+? UTC)")
_CANNOT_LISTEN = re.compile(r"cannot listen on '(?P<address>[^']+:\d+)'")


def port_problem(address: str) -> OSError | None:
    """Try to bind ``host:port`` as gRPC would (SO_REUSEADDR); the OSError, or None when it is free.

    Args:
        address: ``"host:port"``; ``host`` may be a name, an IPv4 or a bracketed IPv6 address.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            return exc
    return None


def port_sentence(address: str, exc: OSError) -> str:
    """One sentence for a failed bind of ``address`` (the party's listen address)."""
    host, _, port = address.rpartition(":")
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use by another program (another party or an earlier run "
                f"still listening?): stop it, or give this party another port")
    if exc.errno == errno.EACCES:
        return f"permission denied to listen on port {port}: ports below 1024 need root; choose a port above 1024"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{host} is not an address of this machine: set the party's listen to 0.0.0.0:{port} "
                f"(others still dial its address)")
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name {host!r} of listen address {address}"
    return f"cannot listen on {address}: {exc.strerror or exc}"


def plain_error(exc: BaseException) -> str:
    """``exc`` as one plain sentence: file not found, permission denied, address in use, expired
    certificate get a sentence of their own; anything else keeps its message (without the errno prefix)."""
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename}" if exc.filename else str(exc)
    if isinstance(exc, PermissionError):
        if exc.filename:
            return f"permission denied on {exc.filename}: check the file's owner and mode (ls -l)"
        return str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return "the address is already in use by another program: stop it, or choose another port"
    return plain_text(str(exc) or type(exc).__name__)


def plain_text(text: str) -> str:
    """Rewrite the known low-level phrasings inside ``text`` (expired certificates, gRPC bind failures)."""
    m = _EXPIRED.search(text)
    if m:  # the dates are "YYYY-MM-DD HH:MM UTC": they compare as strings
        now, start, end = m.group("now"), m.group("start"), m.group("end")
        when = "has expired" if end < now else ("is not valid yet" if start > now else "is not valid now")
        return (f"{m.group('what')} {when} (valid from {start} to {end}; now {now}): "
                f"issue new certificates with `secureflhv certs` (or check this machine's clock)")
    m = _CANNOT_LISTEN.search(text)
    if m:  # gRPC says only "Failed to bind ...": ask the OS why, while the port is still taken
        exc = port_problem(m.group("address"))
        if exc is not None:
            return port_sentence(m.group("address"), exc)
    if "Address already in use" in text or "address in use" in text:
        return "the listen address is already in use by another program: stop it, or choose another port"
    return text
