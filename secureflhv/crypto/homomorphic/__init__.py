"""Additively homomorphic encryption for the vertical algorithms: the backend interface, Paillier (encoding,
raw-integer engine, histogram kernels), Okamoto-Uchiyama, and keys generated ahead of use."""
