"""Structured round keys: a protocol's envelope round as named fields with stated capacities.

The transport keys a message by ``(sender, tag, round)`` with ``round`` one integer that must grow
(docs/architecture.md, "Transport collectives and round keys"). A protocol whose messages are indexed by
several counters (FL round and aggregated part; tree and depth; epoch, batch and step) packs them into
that integer in mixed radix: the first field is the most significant and unbounded, every later field
has a capacity, and

    pack(f0, f1, ..., fk) = ((f0 * c1 + f1) * c2 + f2) ... * ck + fk

so keys grow strictly with the fields in lexicographic order. A value outside its field's capacity
would silently overlap the next key; :meth:`RoundLayout.pack` refuses it with a ValueError naming the
layout, the field and the limit.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class RoundLayout:
    """How one protocol packs its counters into the transport's integer round.

    Attributes:
        name: the protocol's key, as named in errors (e.g. ``"secure aggregation envelope"``).
        fields: ``(name, capacity)`` pairs, most significant first; the first capacity is ``None``
            (unbounded), every other one an int >= 1 (the field takes values ``0 .. capacity - 1``).

    Raises:
        ValueError: a malformed layout (no field, a bounded first field, an unbounded later one, a
            capacity < 1, duplicate names).
    """

    name: str
    fields: tuple[tuple[str, int | None], ...]

    def __post_init__(self):
        names = [f for f, _ in self.fields]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"{self.name}: fields must be distinct and at least one, got {names}")
        if self.fields[0][1] is not None:
            raise ValueError(f"{self.name}: the first field {names[0]!r} is the unbounded one (capacity None)")
        for field, cap in self.fields[1:]:
            if cap is None or operator.index(cap) < 1:
                raise ValueError(f"{self.name}: field {field!r} needs a capacity >= 1, got {cap!r}")

    def capacity(self, field: str) -> int | None:
        """The capacity of ``field`` (None: unbounded). KeyError for an unknown field."""
        return dict(self.fields)[field]

    def pack(self, **values: int) -> int:
        """The transport round of ``values`` (one int >= 0 per field, every field named).

        Raises:
            ValueError: a field missing or unknown, or a value negative or not below its capacity
                (the message names the layout, the field, the value and the limit).
            TypeError: a value that is not an integer.
        """
        names = [f for f, _ in self.fields]
        if set(values) != set(names):
            raise ValueError(f"{self.name} round key: fields {sorted(values)} given, expected {names}")
        key = 0
        for field, cap in self.fields:
            v = operator.index(values[field])
            if v < 0 or (cap is not None and v >= cap):
                limit = f"0 <= {field} < {cap}" if cap is not None else f"{field} >= 0"
                raise ValueError(f"{self.name} round key: {field} = {v} is out of range ({limit}; a larger "
                                 f"value would overlap the next {self.fields[0][0]}'s keys)")
            key = key * (cap or 1) + v
        return key

    def unpack(self, key: int) -> dict[str, int]:
        """The fields of a packed round ``key`` (the inverse of :meth:`pack`). ValueError when negative."""
        key = operator.index(key)
        if key < 0:
            raise ValueError(f"{self.name} round key: {key} is negative")
        out: dict[str, int] = {}
        for field, cap in reversed(self.fields[1:]):
            key, out[field] = divmod(key, cap)
        out[self.fields[0][0]] = key
        return {f: out[f] for f, _ in self.fields}
