"""Encrypted rows streamed in parts: how many rows a part holds, and the round ids of the parts.

SecureBoost's gradient pairs (:mod:`secureflhv.tree.vertical`) and federated binning's class indicators
(:mod:`secureflhv.vertical.woe_binning`) travel the same way: a pass over the rows (a tree, a binning
pass) sends its row ciphertexts in SbRowPart messages, part by part, so a host decodes part k while
the guest encrypts part k + 1, on a WAN the transfer hides behind the encryption, and no message grows
with the rows (a part stays within a quarter of the job's message limit). The receiver acknowledges
each part; the sender waits for part k's acknowledgement before sending part k + ROW_PART_WINDOW.
"""
from __future__ import annotations

from .round_layout import RoundLayout

PART_BYTES = 1 << 20   # a part's size aimed at (2,048 Paillier or 4,096 OU rows at 2048 bits; at least
                       # 1,024 rows per worker of the executor), unless the message limit asks for less
MAX_ROW_PARTS = 4096   # parts per pass (a pass's part rounds: pass * MAX_ROW_PARTS + part + 1)
ROW_PART_WINDOW = 4    # parts a host may hold unacknowledged (<= the job's message limit queued per host)

# a pass's row-part rounds: pass * MAX_ROW_PARTS + part + 1 (round 0 of a pass stays unused)
ROW_PART_ROUNDS = RoundLayout("tree row parts", (("tree", None), ("part", MAX_ROW_PARTS)))


def part_rows(n_rows: int, pair_bytes: int, max_payload_bytes: int | None, workers: int = 1) -> int:
    """Rows per SbRowPart for a pass of ``n_rows`` row ciphertexts of ``pair_bytes`` bytes each, encrypted
    by ``workers`` workers: parts of 1 to 2 times ``max(PART_BYTES / pair_bytes, 1024 * workers)`` rows,
    all of one size but the last (so no part is too small for the worker pool, which encrypts a small
    batch in this process), fewer rows where a part would exceed a quarter of ``max_payload_bytes``
    (None: no limit), more where there would be more than ``MAX_ROW_PARTS`` parts.

    Raises ValueError (naming ``job.max_message_mb``) when no part size satisfies both."""
    n, width = max(1, int(n_rows)), int(pair_bytes)
    cap = n if max_payload_bytes is None else (int(max_payload_bytes) // 4 - 4096) // width
    want = max(PART_BYTES // width, 1024 * int(workers))
    parts = min(MAX_ROW_PARTS, max(1, n // want, -(-n // max(cap, 1))))
    rows = -(-n // parts)
    if rows > cap:
        raise ValueError(f"{n_rows:,} encrypted rows of {pair_bytes} bytes do not fit {MAX_ROW_PARTS} messages "
                         f"of at most a quarter of the message limit ({max_payload_bytes / 2 ** 20:,.2f} MiB); "
                         "raise job.max_message_mb at every party")
    return rows
