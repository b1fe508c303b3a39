"""HEBackend.mul_const: a power of two is an exponent shift (exact, no exponentiation), other constants
multiply; constant_shift_bits predicts the exponent either way (the receivers' wire checks rely on it)."""
import numpy as np
import pytest

from secureflhv.crypto.homomorphic.backend import OUHE, IdentityHE, PaillierHE, constant_shift_bits
from secureflhv.crypto.homomorphic.paillier_encoding import DEFAULT_SCALAR_PRECISION_BITS


@pytest.mark.parametrize("c,bits", [(0.25, 2), (-0.125, 3), (1.0, 0), (3.0, 0), (1 / 3, DEFAULT_SCALAR_PRECISION_BITS),
                                    (2.0 ** -32, DEFAULT_SCALAR_PRECISION_BITS), (-0.1, DEFAULT_SCALAR_PRECISION_BITS)])
@pytest.mark.parametrize("backend", ["paillier", "ou"])
def test_mul_const_exact_at_the_predicted_exponent(backend, c, bits):
    if backend == "ou":
        pytest.importorskip("heu", reason="sf-heu is a linux dependency of the OU scheme")
    he = PaillierHE() if backend == "paillier" else OUHE()
    pub, priv = he.generate_keypair(512 if backend == "paillier" else 1024, True)
    x = np.array([1.5, -2.25, 0.0, 1e-3, 12345.678])
    enc = he.encrypt(pub, x)
    out = he.mul_const(enc, c)
    assert constant_shift_bits(c) == bits
    assert out.exponent == enc.exponent - bits
    got = he.decrypt(priv, out)
    if bits < DEFAULT_SCALAR_PRECISION_BITS:  # shift / integer: exactly the encoded value times c
        np.testing.assert_array_equal(got, he.decrypt(priv, enc) * c)
    else:
        np.testing.assert_allclose(got, x * c, rtol=1e-9, atol=1e-12)
    assert IdentityHE().mul_const(x, c).tolist() == (x * c).tolist()
