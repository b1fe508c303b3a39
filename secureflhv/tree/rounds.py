"""Envelope rounds of the federated tree protocols (both SecureBoost variants).

A tree's level messages travel at round ``tree * DEPTH_SLOTS + depth + 1`` (horizontal: ``tree`` is the
server's tree-start slot; vertical: the tree's sequence number): :data:`LEVEL_ROUNDS` packs
``level = depth + 1`` (level 0: the tree's start) and refuses a depth that would reach the next tree's keys.
"""
from __future__ import annotations

from ..transport.round_layout import RoundLayout

DEPTH_SLOTS = 64  # level rounds per tree; max_depth (<= 16) + 2 levels fit
LEVEL_ROUNDS = RoundLayout("tree level", (("tree", None), ("level", DEPTH_SLOTS)))


def level_round(tree: int, depth: int) -> int:
    """The transport round of depth ``depth``'s level message of tree ``tree`` (ValueError out of range)."""
    return LEVEL_ROUNDS.pack(tree=tree, level=depth + 1)
