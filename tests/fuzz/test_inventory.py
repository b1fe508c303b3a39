"""The fuzz inventory covers every receiver: static (AST of secureflhv/) and dynamic (honest runs)."""
import pytest

from conftest import live_captures
from inventory import INVENTORY, RECV_SITES
from recv_sites import recv_call_sites, tag_constants


def test_every_recv_call_site_is_in_the_inventory():
    sites = recv_call_sites()
    new = sorted(sites - set(RECV_SITES))
    assert not new, (f"new transport.recv call site(s) {new}: add them (and their tags) to tests/fuzz/inventory.py "
                     "RECV_SITES / INVENTORY so that the receiver is fuzzed")
    gone = sorted(set(RECV_SITES) - sites)
    assert not gone, f"RECV_SITES lists call sites that no longer exist: {gone}"


def test_every_tag_constant_and_site_tag_is_fuzzed():
    consts = set(tag_constants())
    assert consts, "no TAG_* constants found: the AST scan is broken"
    assert consts - set(INVENTORY) == set(), f"tags without a fuzz entry: {sorted(consts - set(INVENTORY))}"
    site_tags = {tag for tags in RECV_SITES.values() for tag in tags}
    assert site_tags - set(INVENTORY) == set()
    assert set(INVENTORY) - consts == set(), "inventory tags that no module defines"


@pytest.mark.parametrize("tag", sorted(INVENTORY))
def test_honest_run_captures_each_tag_with_its_class_and_receivers(tag, captures):
    entry = INVENTORY[tag]
    caps = [c for c in captures[entry.run] if c.tag == tag]
    assert caps, f"the {entry.run} run never received {tag!r}: the fuzz suite would not reach its parser"
    assert {c.receiver for c in caps} == set(entry.receivers)
    for c in caps:
        msg = entry.cls.FromString(c.payload)
        assert msg.ByteSize() == len(c.payload), f"{tag}: captured payload is not a {entry.cls.__name__}"
    # each receiver keeps a parse callback that accepts an honest payload: Property A fuzzes it
    assert {c.receiver for c in live_captures(tag, entry.run)} == set(entry.receivers)
