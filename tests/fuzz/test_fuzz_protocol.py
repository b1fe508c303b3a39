"""Property B: each protocol run for real in-process while one receiver's first message of a tag is swapped
for a mutation of the honest one, through the real mailbox and the real parse (fuzz_net.Attack).

* parse rejects it: the rejection is logged, the honest message follows and the run gives exactly the
  honest result (same fingerprint as the honest run) with no error at any party;
* parse accepts it (a lie got in): every party either finishes or fails with a clear protocol error
  (transport errors, ProtocolError, AggregationError, the algorithms' documented errors), never another
  exception type (IndexError, KeyError, ZeroDivisionError, OverflowError, numpy errors ...), never a hang
  (8 s deadlines); and the result is the honest one unless the lie only changed contents the receiver
  cannot check without integrity (floats, same-length bytes, entries of repeated ints: mutations.is_value_lie).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import honest
from fuzz_net import Attack, network_class
from inventory import INVENTORY
from mutations import is_value_lie, mutate, mutation_plans
from protocols import PROTOCOLS, same
from secureflhv.crypto.homomorphic.paillier import CiphertextError
from secureflhv.crypto.ecdh_psi import LowOrderPointError
from secureflhv.fedstats.preprocessing import FederatedStatsError
from secureflhv.runtime.job.job_file import JobConfigError
from secureflhv.secagg.result import AggregationError
from secureflhv.transport.base import ProtocolError, TransportError
from secureflhv.tree.horizontal import HorizontalSecureBoostError
from secureflhv.tree.vertical import SecureBoostError
from secureflhv.vertical.correlation import CorrelationRefused
from secureflhv.vertical.woe_binning import BinningError

CLEAR_ERRORS = (TransportError, ProtocolError, AggregationError, SecureBoostError, HorizontalSecureBoostError,
                CiphertextError, LowOrderPointError, JobConfigError, FederatedStatsError, BinningError,
                CorrelationRefused)
EXAMPLES = 8
FUZZ = dict(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _targets(run):
    """(tag, receiver, number of honest messages it receives) for every (tag, receiver) of the honest ``run``."""
    counts = {}
    for c in honest(run)[1]:
        counts[(c.tag, c.receiver)] = counts.get((c.tag, c.receiver), 0) + 1
    return [(tag, r, n) for (tag, r), n in sorted(counts.items())]


def _first_error(errors: dict):
    unclear = {p: e for p, e in errors.items() if not isinstance(e, CLEAR_ERRORS)}
    return unclear


@pytest.mark.parametrize("run", sorted(PROTOCOLS))
def test_protocol_survives_a_mutated_message(run):
    honest_fp = honest(run)[0]
    targets = _targets(run)
    outcomes = {"rejected": 0, "lie": 0, "noop": 0}

    @settings(**FUZZ)
    @given(st.sampled_from(targets), st.integers(0, 3), mutation_plans())
    def prop(target, k, plan):
        tag, receiver, n = target
        cls = INVENTORY[tag].cls
        attack = Attack(receiver, tag, k % max(n, 1), lambda payload: mutate(cls, payload, *plan))
        net_cls = network_class(attack)
        fp, errors, nets = PROTOCOLS[run](net_cls)
        what = f"{run}: {tag} to {receiver} (#{attack.index}) mutated by {plan}"
        assert attack.fired, f"{what}: the message was never sent"
        unclear = _first_error(errors)
        assert not unclear, f"{what}: unclear error(s) {unclear!r}"
        if attack.mutated == attack.honest:
            outcomes["noop"] += 1
            assert not errors and same(fp, honest_fp), f"{what}: a no-op mutation changed the run: {errors}"
        elif attack.rejected is not None:
            outcomes["rejected"] += 1
            logged = [reason for n in net_cls.instances for m, reason in n.mailbox(receiver).rejected
                      if m.tag == tag]
            assert logged, f"{what}: rejected but not recorded"
            assert not errors, f"{what}: the honest message followed the rejected one, yet {errors!r}"
            assert same(fp, honest_fp), f"{what}: rejected, yet the result differs from the honest run"
        else:
            outcomes["lie"] += 1
            if not errors and not is_value_lie(cls, attack.honest, attack.mutated):
                assert same(fp, honest_fp), (f"{what}: parse accepted a structural lie and the run silently gave "
                                             f"another result ({cls.FromString(attack.mutated)!s:.300})")

    prop()
    assert outcomes["rejected"] > 0, f"{run}: no mutation was ever rejected: {outcomes}"
