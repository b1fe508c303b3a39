"""Vertical federated learning: same rows, different features per party, labels at the guest.

Modules: ``lr`` (Paillier-protected logistic regression, Hardy et al. 2017) and the PSI helper used
to align the parties' rows before training.
"""
