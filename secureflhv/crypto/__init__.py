"""Layer 1: cryptographic building blocks over well-kept libraries (phe, gmpy2, cryptography). No networking."""
