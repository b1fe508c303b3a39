"""Vertical federated learning: same rows, different features per party, labels at the guest.

Modules:

* ``psi`` — ECDH private set intersection that aligns the parties' rows before training;
* ``lr`` (+ ``lr_crypto``) — Paillier-protected logistic regression (Hardy et al. 2017);
* ``split_nn`` (+ ``interactive_layer``) — split neural network with a Paillier-protected
  interactive layer (Zhang et al. 2020, FATE Hetero-NN v1).
"""
