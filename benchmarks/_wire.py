"""Bytes on the wire per party, for the benchmarks' printouts and the ``bytes`` column of their table rows.

Input: ``{party: transport.wire_stats()}`` (``InProcessNetwork.wire_stats()``, or collected from each gRPC
party). A party's bytes are payload + framing (payload exact; framing partly estimated, and over the
in-process transport what gRPC with TLS would add: see ``secureflhv/transport/wire.py``). MB = 10^6 bytes.
"""
from __future__ import annotations

from secureflhv.transport.wire import totals


def per_party(stats: dict, scale: float = 1.0) -> dict[str, tuple[float, float]]:
    """``{party: (bytes sent, bytes received)}``, payload + framing, each multiplied by ``scale``."""
    out = {}
    for party, s in stats.items():
        t = totals(s)
        out[party] = ((t["sent"] + t["sent_framing"]) * scale, (t["received"] + t["received_framing"]) * scale)
    return out


def mb(n: float) -> str:
    """Decimal units: ``"12.3 kB"`` below 1 MB, else ``"4.56 MB"``."""
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def line(stats: dict, scale: float = 1.0) -> str:
    """``"guest sent 1.20 MB, received 3.40 MB; host-1 sent ..."``."""
    return "; ".join(f"{p} sent {mb(s)}, received {mb(r)}" for p, (s, r) in per_party(stats, scale).items())


def cell(stats: dict, scale: float = 1.0, per: str = "") -> str:
    """The table's ``bytes`` cell: ``"guest 1.20 MB sent, 3.40 MB received; host-1 ..."`` (+ ``" per <per>"``)."""
    text = "; ".join(f"{p} {mb(s)} sent, {mb(r)} received" for p, (s, r) in per_party(stats, scale).items())
    return text + (f" per {per}" if per else "")
