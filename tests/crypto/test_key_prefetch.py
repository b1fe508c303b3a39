"""Key pairs generated in the background (crypto.key_prefetch): the Future's key works, errors reach the
caller (a role given the Future: tests/tree/test_secureboost_vertical.py)."""
import numpy as np
import pytest

from secureflhv.crypto.homomorphic import paillier as pl
from secureflhv.crypto.homomorphic.key_prefetch import prefetch_keypair, resolve_keypair
from secureflhv.crypto.homomorphic.backend import make_backend


@pytest.fixture(autouse=True, scope="module")
def _inline_paillier():
    pl.set_workers(1)
    yield
    pl.set_workers(None)


@pytest.mark.parametrize("scheme,bits", [("paillier", 512), ("ou", 1024)])
def test_the_prefetched_key_pair_round_trips(scheme, bits):
    if scheme == "ou":
        pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    fut = prefetch_keypair(scheme, bits, insecure_test_key=True)
    pub, priv = resolve_keypair(fut)
    assert fut.done() and resolve_keypair(fut) == (pub, priv)
    he = make_backend(scheme, 32)
    x = np.array([0.0, 1.5, -2.25, 1e6])
    np.testing.assert_array_equal(he.decrypt(priv, he.encrypt(pub, x)), x)
    assert pub.n_bits >= bits - 8  # HEU rounds OU's prime sizes


def test_a_key_generation_error_reaches_whoever_resolves_the_future():
    fut = prefetch_keypair("paillier", 1024)  # below the secure size, no test-only flag
    with pytest.raises(ValueError, match="2048"):
        resolve_keypair(fut)
    with pytest.raises(ValueError, match="backend"):
        prefetch_keypair("rsa", 2048)  # an unknown scheme fails at once, not when resolved


def test_resolve_keypair_passes_tuples_and_none():
    pair = pl.generate_keypair(512, insecure_test_key=True)
    assert resolve_keypair(pair) is pair and resolve_keypair(None) is None

