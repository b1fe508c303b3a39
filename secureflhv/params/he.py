"""The additively homomorphic scheme, its key and the fixed-point precision of encrypted values.

Values are encrypted as integer mantissas ``rint(x * 2**precision_bits)`` and plaintext multipliers
encoded with ``dot_precision_bits`` fraction bits (:mod:`secureflhv.crypto.homomorphic.paillier_encoding`,
:mod:`secureflhv.crypto.homomorphic.backend`). The bounds are those of the encoders' inputs:

* ``precision_bits`` in [16, 64]: values are float64 (53 significant bits), so beyond 64 fraction bits
  every |x| >= 2**-11 only gains zero bits, while the plaintext room of a packed slot and the hosts'
  masks (:func:`secureflhv.vertical.host_masks.mask_bits`, ``precision_bits`` + 88 bits) grow with it.
* ``dot_precision_bits`` in [8, 52]: multipliers go to ``paillier.dot`` as int64 below 2**62, so a
  plaintext |X| must stay below 2**(62 - dot_precision_bits); at 52 that is 1024, ample for
  standardised features, and a float64 holds no finer bits for |X| >= 1.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..crypto.homomorphic.backend import VERTICAL_DOT_PRECISION_BITS
from ..crypto.homomorphic.paillier import MIN_SECURE_BITS
from ..crypto.homomorphic.paillier_encoding import DEFAULT_PRECISION_BITS


class HEKeyParams(BaseModel):
    """The homomorphic scheme and key of a vertical job (identical at every party).

    Raises (at validation):
        ValueError: ``key_bits`` below 2048 without ``insecure_test_key`` (message starts ``key_bits:``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    he_scheme: Literal["paillier", "ou"] = Field(
        default="paillier", description="additively homomorphic scheme: 'paillier' (crypto.homomorphic.paillier) "
                                        "or 'ou' (Okamoto-Uchiyama, crypto.homomorphic.ou: several times faster, "
                                        "statistical masking)")
    key_bits: int = Field(default=MIN_SECURE_BITS, ge=256, description="modulus size of the homomorphic key "
                          "(Paillier n, or OU n = p^2 q); 2048 bits ~ 112-bit security")
    insecure_test_key: bool = Field(default=False, description="allow key_bits < 2048 (tests only)")

    @model_validator(mode="after")
    def _secure_key(self):
        if self.key_bits < MIN_SECURE_BITS and not self.insecure_test_key:
            raise ValueError(f"key_bits: {self.key_bits} < {MIN_SECURE_BITS} needs insecure_test_key=True "
                             f"(tests only)")
        return self


class HEParams(HEKeyParams):
    """:class:`HEKeyParams` plus the fixed-point precision of encrypted values and plaintext multipliers
    (bounds: the module docstring). ``precision_bits`` None means the encoders' default."""

    precision_bits: int | None = Field(default=DEFAULT_PRECISION_BITS, ge=16, le=64,
                                       description="fraction bits of encrypted values")
    dot_precision_bits: int = Field(default=VERTICAL_DOT_PRECISION_BITS, ge=8, le=52,
                                    description="fraction bits of plaintext multipliers (features in X^T [[d]]); "
                                                "needs |X| < 2**(62 - bits)")
