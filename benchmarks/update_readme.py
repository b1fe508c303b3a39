"""Regenerate the README's benchmark table from ``docs/benchmarks.json``.

The table sits between the markers ``<!-- benchmarks:begin -->`` and ``<!-- benchmarks:end -->``.

    python benchmarks/update_readme.py           # rewrite the block in README.md
    python benchmarks/update_readme.py --check   # exit 1 if the README is out of date (used by the tests)
    python benchmarks/update_readme.py --diff    # dry run: print the unified diff, write nothing
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


def generated(readme_text: str, docs: Path = _report.DOCS) -> str:
    """``readme_text`` with the marked block replaced by the table of ``docs/benchmarks.json``.

    Raises ``ValueError`` if the markers are missing or out of order.
    """
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README lacks the markers {BEGIN} ... {END}")
    table = _report.markdown_table(_report.load(docs)["rows"])
    return readme_text[:start + len(BEGIN)] + "\n" + table + readme_text[end:]


def diff(old: str, new: str) -> str:
    """Unified diff of the README's text ``old`` -> ``new`` ("" when they agree)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        "README.md", "README.md (generated)"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only check; exit 1 if README.md is out of date")
    mode.add_argument("--diff", action="store_true", help="dry run: print what would change, write nothing")
    args = ap.parse_args(argv)
    text = README.read_text()
    new = generated(text)
    if args.diff:
        print(diff(text, new) or "README.md's benchmark table is up to date")
        return 0
    if args.check:
        if new != text:
            print("README.md's benchmark table differs from docs/benchmarks.json: "
                  "run benchmarks/update_readme.py", file=sys.stderr)
            return 1
        print("README.md's benchmark table is up to date")
        return 0
    README.write_text(new)
    print(f"updated the benchmark table in {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
