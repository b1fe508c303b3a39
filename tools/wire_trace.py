"""Record and compare per-message wire traces of one small job per family, to show that a change to the
code leaves every message of every job as it was.

    python tools/wire_trace.py record OUT_DIR      # runs the examples with SECUREFLHV_WIRE_TRACE set
    python tools/wire_trace.py compare A_DIR B_DIR # exit 1 and a diff where the traffic differs

Each party's trace (``transport/wire.py`` :class:`WireTrace`) lists its sent messages: receiver, tag,
round, payload bytes and SHA-256. Threads send in no fixed order, so a trace is compared as a sorted
multiset of (sender, receiver, tag, round), with payload sizes equal within a few bytes (fresh keys, masks
and signatures change the payloads and a varint or DER length here and there); the count of byte-identical
payloads (the deterministic ones) is printed too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {  # family -> example command (small, test-sized keys; the same seeds every time)
    "vertical_lr": ["examples/vertical_lr.py", "--key-bits", "1024", "--epochs", "2", "--hosts", "2"],
    "vertical_nn": ["examples/vertical_nn.py", "--key-bits", "1024", "--epochs", "1", "--rows", "200"],
    "secureboost": ["examples/secureboost.py", "--key-bits", "1024", "--trees", "2", "--max-depth", "3"],
    "horizontal_fl": ["examples/horizontal_fedavg.py", "--dataset", "digits", "--rounds", "2", "--clients", "4"],
}


def record(out: Path) -> None:
    for family, cmd in JOBS.items():
        folder = (out / family).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SECUREFLHV_WIRE_TRACE": str(folder)}
        work = ["--work-dir", str(out.resolve() / "work" / family)]
        print(f"{family}: {' '.join(cmd)}", flush=True)
        subprocess.run([sys.executable, *cmd, *work], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def load(folder: Path) -> tuple[dict, Counter]:
    """({(sender, to, tag, round): [payload bytes, sorted]}, multiset of payload hashes) of a family's traces."""
    sizes: dict = {}
    hashes = Counter()
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            m = json.loads(line)
            key = (path.stem, m["to"], m["tag"], m["round"])
            sizes.setdefault(key, []).append(m["bytes"])
            hashes[(*key, m["sha256"])] += 1
    return {k: sorted(v) for k, v in sizes.items()}, hashes


SIZE_SLACK = (16, 0.01)  # bytes, share: random field elements, signatures and varints vary a few bytes


def _close(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= max(SIZE_SLACK[0], SIZE_SLACK[1] * max(x, y))
                                    for x, y in zip(a, b))


def compare(a: Path, b: Path) -> int:
    """Print, per family, whether the two recordings sent the same messages; 1 where any differs."""
    bad = 0
    for family in sorted(p.name for p in a.iterdir() if p.is_dir() and p.name != "work"):
        (sa, ha), (sb, hb) = load(a / family), load(b / family)
        differ = sorted(k for k in sa.keys() | sb.keys() if not _close(sa.get(k, []), sb.get(k, [])))
        total = sum(len(v) for v in sa.values())
        if not differ:
            print(f"{family}: same {total} messages (sender, receiver, tag, round; sizes within "
                  f"{SIZE_SLACK[0]} B or {SIZE_SLACK[1]:.0%}); {sum((ha & hb).values())} payloads byte-identical")
            continue
        bad = 1
        print(f"{family}: DIFFERS in {len(differ)} of {len(sa.keys() | sb.keys())} message keys")
        for k in differ[:40]:
            print(f"  {k}: {sa.get(k)} -> {sb.get(k)}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("record").add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.out)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
