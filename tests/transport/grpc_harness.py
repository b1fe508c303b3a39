"""Loopback GrpcTransports for the transport tests (not a test module): a factory that closes what it made,
and a helper that tells each transport where the others listen."""
from __future__ import annotations

import contextlib

from secureflhv.transport.certs import load_party_credentials
from secureflhv.transport.grpc_transport import GrpcTransport


@contextlib.contextmanager
def grpc_factory(certs, parties):
    """Yield ``make(pid, *, tls=True, **kw)``: a GrpcTransport of job ``job-1`` for ``pid`` on 127.0.0.1 with
    ``parties`` as its peers (addresses set later by :func:`link`), certificates from ``certs`` (plaintext with
    ``tls=False``), a 10 s deadline unless ``deadline`` is given. Every transport made is closed on exit."""
    made = []

    def make(pid, *, tls=True, **kw):
        t = GrpcTransport(pid, "job-1", "127.0.0.1:0", {p: "127.0.0.1:1" for p in parties},
                          tls=load_party_credentials(certs, pid) if tls else None, insecure=not tls,
                          deadline=kw.pop("deadline", 10.0), **kw)
        made.append(t)
        return t

    try:
        yield make
    finally:
        for t in made:
            t.close(grace=0)


def link(*transports):
    """Give every transport the listening address of every other one."""
    for a in transports:
        for b in transports:
            if a is not b:
                a.set_peer_address(b.party_id, b.address)
