"""Each host's per-row total, sent to the guest in the clear: the scorecard's last step.

A host sends ``sc.totals`` (a Bundle with one float64 tensor ``totals`` of the n aligned rows) once;
the guest takes it only at exactly (n,) and finite. What each role learns: the guest, each host's total
per row (in a scorecard, the host's part of the score, as a two-party vertical LR prediction reveals
it); the host, nothing. A host can shift its own totals: nothing here can check them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto

TAG_TOTALS = "sc.totals"


def send_totals(transport: Transport, guest_id: str, totals: np.ndarray) -> None:
    """Host: send float64 (n,) ``totals`` to the guest."""
    msg = messages_pb2.Bundle()
    msg.tensors["totals"].CopyFrom(tensor_to_proto(np.asarray(totals, dtype=np.float64), "<f8"))
    transport.send(guest_id, TAG_TOTALS, msg, round=0)


def gather_totals(transport: Transport, host_ids: Sequence[str], n: int) -> dict[str, np.ndarray]:
    """Guest: {host: float64 (n,) totals}; a malformed message is refused (ProtocolError in the parse
    callback) and the guest waits until its deadline, which then names the host (TransportError)."""
    return {h: transport.recv(h, TAG_TOTALS, round=0, parse=_parser(h, n)) for h in host_ids}


def _parser(host: str, n: int):
    def check(m: messages_pb2.Bundle) -> np.ndarray:
        if set(m.tensors) != {"totals"}:
            raise ProtocolError(f"row totals from {host}: expected one tensor 'totals'")
        return tensor_from_proto(m.tensors["totals"], what=f"row totals from {host}", shape=(n,))
    return parse_message(messages_pb2.Bundle, check)
