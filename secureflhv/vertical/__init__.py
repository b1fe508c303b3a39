"""Vertical federated learning: same rows, different features per party, labels at the guest.

Modules:

* ``psi`` — ECDH private set intersection that aligns the parties' rows before training;
* ``common`` — the role base both use: homomorphic backend (:mod:`secureflhv.crypto.homomorphic.backend`), wire codec,
  masked decryption; ``prediction`` — the federated prediction service both use;
* ``lr`` — Paillier-protected logistic regression (Hardy et al. 2017);
* ``split_nn`` — split neural network with a Paillier-protected
  interactive layer (Zhang et al. 2020, FATE Hetero-NN v1).
"""
