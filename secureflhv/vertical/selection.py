"""Feature selection by a fitted vertical model's importance: the hosts' importances to the guest, the
guest's choice back.

Two messages per host (Bundle, round 0)::

    host  -> guest : fs.importance  ``n_columns`` d_h and ``importance`` float64 (d_h,): the host's own
                                     importance per column (LR: |w_j| * std_j), or ``groups`` int64
                                     (records,): per split record of a SecureBoost host, an anonymous label
                                     of its column (a random permutation of 0..d_h-1), so the guest can add
                                     up gains per column
    guest -> host  : fs.keep        ``keep`` uint8 (d_h,) of 0/1 (LR), or ``keep_groups`` uint8 (d_h,)
                                     indexed by those labels (SecureBoost)

What each role learns: the guest, each host's per-column importance (LR: the size of its weights
times its columns' spread), or (SecureBoost) which of the host's split records share a column, never
which column; the host, which of its columns were kept (one bit per column, a function of the model).
Checks: the guest takes d_h only within the job's ``max_features``, then exactly (d_h,) finite
non-negative importances, or one label in [0, d_h) per record for at least every record its model
uses; the host takes
exactly (d_h,) flags of 0/1. Anything else is a ProtocolError in the parse callback: rejected,
logged, and the receiver's deadline names the peer.
"""
from __future__ import annotations

import numpy as np

from ..proto import messages_pb2
from ..transport import ProtocolError, Transport, parse_message
from ..transport.codec import tensor_from_proto, tensor_to_proto, whole_count

TAG_IMPORTANCE, TAG_KEEP = "fs.importance", "fs.keep"


def send_importance(transport: Transport, guest_id: str, n_columns: int, *, importance: np.ndarray | None = None,
                    groups: np.ndarray | None = None) -> None:
    """Host: its ``n_columns`` columns' importance (float64 (n_columns,)) or its split records' anonymous
    column labels (int64 (records,), each in [0, n_columns))."""
    msg = messages_pb2.Bundle(scalars={"n_columns": float(n_columns)})
    if importance is not None:
        msg.tensors["importance"].CopyFrom(tensor_to_proto(np.asarray(importance, np.float64), "<f8"))
    else:
        msg.tensors["groups"].CopyFrom(tensor_to_proto(np.asarray(groups, np.int64), "<i8"))
    transport.send(guest_id, TAG_IMPORTANCE, msg, round=0)


def receive_importance(transport: Transport, host: str, max_columns: int, *, min_records: int | None = None
                       ) -> tuple[int, np.ndarray]:
    """Guest: ``(n_columns, importances (n_columns,))`` of the host, or with ``min_records`` (SecureBoost:
    1 + the largest record id of the host's splits in the guest's model) ``(n_columns, labels (records,))``
    with at least that many records. ``n_columns`` in [1, max_columns] (the job's bound)."""
    def check(m: messages_pb2.Bundle) -> tuple[int, np.ndarray]:
        what = f"importances from {host}"
        n = whole_count(m.scalars.get("n_columns", -1.0), f"{what}: n_columns", 1, max_columns + 1)
        if min_records is None:
            if set(m.tensors) != {"importance"}:
                raise ProtocolError(f"{what}: expected one tensor 'importance'")
            v = tensor_from_proto(m.tensors["importance"], what=what, shape=(n,))
            if np.any(v < 0):
                raise ProtocolError(f"{what}: negative importance")
            return n, v
        if set(m.tensors) != {"groups"}:
            raise ProtocolError(f"{what}: expected one tensor 'groups'")
        g = tensor_from_proto(m.tensors["groups"], what=what, dtype="<i8")
        if g.ndim != 1 or not min_records <= len(g) <= 1 << 24 or np.any(g < 0) or np.any(g >= n):
            raise ProtocolError(f"{what}: expected at least {min_records} record labels in 0..{n - 1}")
        return n, g
    return transport.recv(host, TAG_IMPORTANCE, round=0, parse=parse_message(messages_pb2.Bundle, check))


def send_keep(transport: Transport, host: str, keep: np.ndarray) -> None:
    """Guest: the host's kept columns (bool (d_h,), by column or by anonymous label)."""
    msg = messages_pb2.Bundle()
    msg.tensors["keep"].CopyFrom(tensor_to_proto(np.asarray(keep, dtype=np.uint8)))
    transport.send(host, TAG_KEEP, msg, round=0)


def receive_keep(transport: Transport, guest_id: str, n_columns: int) -> np.ndarray:
    """Host: bool (n_columns,) of the guest's choice."""
    def check(m: messages_pb2.Bundle) -> np.ndarray:
        what = "the guest's selection"
        if set(m.tensors) != {"keep"}:
            raise ProtocolError(f"{what}: expected one tensor 'keep'")
        k = tensor_from_proto(m.tensors["keep"], what=what, dtype="|u1", shape=(n_columns,))
        if np.any(k > 1):
            raise ProtocolError(f"{what}: flags must be 0 or 1")
        return k.astype(bool)
    return transport.recv(guest_id, TAG_KEEP, round=0, parse=parse_message(messages_pb2.Bundle, check))
