"""Hypothesis strategies and mutators of protobuf payloads, built from the message descriptors (not a test module).

* :func:`messages` - random well-typed messages of a class (extreme ints, NaN/inf, empty and long
  strings/bytes, repeated fields of up to 8 entries, nested messages to depth 3).
* :func:`mutate` - a deterministic mutation (``kind``, ``seed``) of a real payload: bit flips,
  truncation, one field set to an extreme value, a field dropped, a repeated entry duplicated or
  removed, an int field moved by one (shapes, exponents, round ids, counts).
* :func:`is_value_lie` - whether an accepted mutation only changed payload *contents* (floats, bytes
  of the same length, entries of repeated non-shape int fields): what a semi-honest receiver cannot
  detect without integrity; any other accepted change must not alter the result.
"""
from __future__ import annotations

import random

from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import strategies as st

INT_TYPES = {FD.TYPE_INT32: 32, FD.TYPE_SINT32: 32, FD.TYPE_SFIXED32: 32, FD.TYPE_INT64: 64, FD.TYPE_SINT64: 64,
             FD.TYPE_SFIXED64: 64}
UINT_TYPES = {FD.TYPE_UINT32: 32, FD.TYPE_FIXED32: 32, FD.TYPE_UINT64: 64, FD.TYPE_FIXED64: 64}
FLOAT_TYPES = (FD.TYPE_DOUBLE, FD.TYPE_FLOAT)
KINDS = ("flip", "truncate", "extreme", "drop", "dup", "shrink", "step")
SHAPE_NAMES = ("shape", "dims", "dim", "shapes")


def _repeated(fd) -> bool:
    return fd.is_repeated


def _is_map(fd) -> bool:
    return fd.type == FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry


def _extremes(fd) -> list:
    if fd.type in INT_TYPES:
        b = INT_TYPES[fd.type]
        return [0, -1, 1, 2, -(1 << (b - 1)), (1 << (b - 1)) - 1, (1 << 31) - 1, 1 << 20, -7]
    if fd.type in UINT_TYPES:
        b = UINT_TYPES[fd.type]
        return [0, 1, 2, (1 << b) - 1, (1 << 31) - 1, 1 << 20]
    if fd.type in FLOAT_TYPES:
        return [float("nan"), float("inf"), float("-inf"), 1e308 if fd.type == FD.TYPE_DOUBLE else 3e38, -0.0, 0.0,
                -1.0, 5e-324 if fd.type == FD.TYPE_DOUBLE else 1e-45]
    if fd.type == FD.TYPE_BOOL:
        return [True, False]
    if fd.type == FD.TYPE_STRING:
        return ["", "x", "\u0000", "é" * 300, "-1", "nan", "float16", "int64", "object"]
    if fd.type == FD.TYPE_BYTES:
        return [b"", b"\x00", b"\xff" * 64, b"\x00" * 4096, b"\x80" * 33]
    if fd.type == FD.TYPE_ENUM:
        return [v.number for v in fd.enum_type.values] + [999]
    raise TypeError(fd.type)


def _scalar(fd) -> st.SearchStrategy:
    ext = st.sampled_from(_extremes(fd))
    if fd.type in INT_TYPES:
        b = INT_TYPES[fd.type]
        return ext | st.integers(-(1 << (b - 1)), (1 << (b - 1)) - 1) | st.integers(-3, 40)
    if fd.type in UINT_TYPES:
        return ext | st.integers(0, (1 << UINT_TYPES[fd.type]) - 1) | st.integers(0, 40)
    if fd.type in FLOAT_TYPES:
        return ext | st.floats(width=64 if fd.type == FD.TYPE_DOUBLE else 32)
    if fd.type == FD.TYPE_STRING:
        return ext | st.text(max_size=12)
    if fd.type == FD.TYPE_BYTES:
        return ext | st.binary(max_size=80)
    return ext


def messages(cls, depth: int = 0) -> st.SearchStrategy:
    """Random well-typed instances of protobuf ``cls`` (bounded: <= 8 entries per repeated field)."""
    fields = {}
    for fd in cls.DESCRIPTOR.fields:
        if _is_map(fd):
            key_fd, val_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            val = (_message_of(val_fd, depth) if val_fd.type == FD.TYPE_MESSAGE else _scalar(val_fd))
            fields[fd.name] = st.dictionaries(_scalar(key_fd), val, max_size=4)
        elif fd.type == FD.TYPE_MESSAGE:
            one = _message_of(fd, depth)
            fields[fd.name] = st.lists(one, max_size=4) if _repeated(fd) else one
        else:
            fields[fd.name] = st.lists(_scalar(fd), max_size=8) if _repeated(fd) else _scalar(fd)
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: _build(cls, kw))


def _message_of(fd, depth):
    if depth >= 3:
        return st.just(fd.message_type._concrete_class())
    return messages(fd.message_type._concrete_class, depth + 1)


def _build(cls, kw):
    msg = cls()
    for name, value in kw.items():
        fd = cls.DESCRIPTOR.fields_by_name[name]
        if _is_map(fd):
            target = getattr(msg, name)
            for k, v in value.items():
                if fd.message_type.fields_by_name["value"].type == FD.TYPE_MESSAGE:
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif fd.type == FD.TYPE_MESSAGE:
            if _repeated(fd):
                getattr(msg, name).extend(value)
            else:
                getattr(msg, name).CopyFrom(value)
        elif _repeated(fd):
            getattr(msg, name).extend(value)
        else:
            setattr(msg, name, value)
    return msg


# ---------------------------------------------------------------------------------------- mutations
def _slots(msg, path=()):
    """Every place a mutation can hit: (parent message, field descriptor, index or None, path)."""
    out = []
    for fd, value in msg.ListFields():
        here = path + (fd.name,)
        if _is_map(fd):
            out.append((msg, fd, None, here))
            val_fd = fd.message_type.fields_by_name["value"]
            for k in list(value):
                if val_fd.type == FD.TYPE_MESSAGE:
                    out.extend(_slots(value[k], here + (k,)))
                else:
                    out.append((value, val_fd, k, here + (k,)))
        elif fd.type == FD.TYPE_MESSAGE:
            out.append((msg, fd, None, here))
            for i, sub in enumerate(value if _repeated(fd) else [value]):
                out.extend(_slots(sub, here + (i,)))
        elif _repeated(fd):
            out.append((msg, fd, None, here))
            out.extend((msg, fd, i, here + (i,)) for i in range(len(value)))
        else:
            out.append((msg, fd, None, here))
    return out


def _set(parent, fd, index, value):
    if isinstance(index, (str, int)) and not hasattr(parent, "DESCRIPTOR"):  # a map of scalars
        parent[index] = value
    elif index is None:
        setattr(parent, fd.name, value)
    else:
        getattr(parent, fd.name)[index] = value


def _get(parent, fd, index):
    if not hasattr(parent, "DESCRIPTOR"):
        return parent[index]
    value = getattr(parent, fd.name)
    return value if index is None else value[index]


def mutate(cls, payload: bytes, kind: str, seed: int) -> bytes:
    """The ``kind`` mutation of ``payload`` (a serialised ``cls``), its random choices drawn from ``seed``."""
    rng = random.Random(seed)
    if kind == "flip":
        data = bytearray(payload or b"\x00")
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "truncate":
        return payload[:rng.randrange(max(len(payload), 1))]
    msg = cls.FromString(payload)
    slots = _slots(msg)
    scalar = [s for s in slots if s[1].type != FD.TYPE_MESSAGE and (s[2] is not None or not _repeated(s[1]))]
    if kind == "extreme" and scalar:
        parent, fd, index, _ = rng.choice(scalar)
        _set(parent, fd, index, rng.choice(_extremes(fd)))
    elif kind == "step" and scalar:
        ints = [s for s in scalar if s[1].type in INT_TYPES or s[1].type in UINT_TYPES] or scalar
        parent, fd, index, _ = rng.choice(ints)
        old = _get(parent, fd, index)
        if isinstance(old, bool) or not isinstance(old, int):
            _set(parent, fd, index, rng.choice(_extremes(fd)))
        else:
            new = old + rng.choice((-1, 1))
            _set(parent, fd, index, new if fd.type not in UINT_TYPES else abs(new))
    elif kind == "drop":
        tops = [s for s in slots if s[2] is None and hasattr(s[0], "ClearField")]
        if tops:
            parent, fd, _, _ = rng.choice(tops)
            parent.ClearField(fd.name)
    elif kind in ("dup", "shrink"):
        reps = [s for s in slots if s[2] is None and _repeated(s[1]) and not _is_map(s[1])
                and len(getattr(s[0], s[1].name))]
        if reps:
            parent, fd, _, _ = rng.choice(reps)
            field = getattr(parent, fd.name)
            i = rng.randrange(len(field))
            if kind == "shrink":
                del field[i]
            elif fd.type == FD.TYPE_MESSAGE:
                field.add().CopyFrom(field[i])
            else:
                field.append(field[i])
    return msg.SerializeToString()


def mutation_plans() -> st.SearchStrategy:
    """(kind, seed) pairs for :func:`mutate`."""
    return st.tuples(st.sampled_from(KINDS), st.integers(0, 2 ** 32 - 1))


def is_value_lie(cls, honest: bytes, mutated: bytes) -> bool:
    """True when ``mutated`` differs from ``honest`` only in contents (floats, equal-length bytes,
    entries of repeated non-shape ints): a lie no receiver can see without integrity (semi-honest model)."""
    try:
        a, b = cls.FromString(honest), cls.FromString(mutated)
    except Exception:  # noqa: BLE001 - an undecodable payload is no value lie
        return False
    return _skeleton(a) == _skeleton(b)


def _skeleton(msg):
    out = []
    for fd, value in msg.ListFields():
        if _is_map(fd):
            val_fd = fd.message_type.fields_by_name["value"]
            out.append((fd.name, tuple(sorted((k, _skeleton(value[k]) if val_fd.type == FD.TYPE_MESSAGE
                                               else _leaf(val_fd, value[k], True)) for k in value))))
        elif fd.type == FD.TYPE_MESSAGE:
            out.append((fd.name, tuple(_skeleton(v) for v in (value if _repeated(fd) else [value]))))
        elif _repeated(fd):
            out.append((fd.name, len(value), tuple(_leaf(fd, v, True) for v in value)))
        else:
            out.append((fd.name, _leaf(fd, value, False)))
    return tuple(out)


def _leaf(fd, value, in_repeated):
    if fd.type in FLOAT_TYPES:
        return "f"
    if fd.type == FD.TYPE_BYTES:
        return ("b", len(value))
    if in_repeated and (fd.type in INT_TYPES or fd.type in UINT_TYPES) and fd.name not in SHAPE_NAMES:
        return "i"
    return value
