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


def hub_and_spokes(stats: dict, scale: float = 1.0, hub: str = "server", per: str = "") -> str:
    """``"server sent 1.2 MB, received 40.1 MB; each client (mean of 10) sent 4.01 MB, received 14.9 kB"``:
    a star topology (horizontal FL, secure aggregation) summarised as the hub and the mean spoke."""
    parties = per_party(stats, scale)
    spokes = [v for p, v in parties.items() if p != hub]
    text = []
    if hub in parties:
        text.append(f"{hub} sent {mb(parties[hub][0])}, received {mb(parties[hub][1])}")
    if spokes:
        text.append(f"each client (mean of {len(spokes)}) sent {mb(sum(s for s, _ in spokes) / len(spokes))}, "
                    f"received {mb(sum(r for _, r in spokes) / len(spokes))}")
    return "; ".join(text) + (f" per {per}" if per else "")
