"""Differential privacy for secureflhv (data layer: numpy, scipy and the accounting libraries; no transport).

``accounting``: ε(δ) of client-level DP-FedAvg (Gaussian, RDP or PLD via Google's ``dp_accounting``), of
distributed Skellam noise (Agarwal, Kairouz, Liu, NeurIPS 2021) and of record-level DP-SGD (Opacus), with the
budget stop and calibration. See ``secureflhv/dp/accounting.py`` for units and sources.
"""
from secureflhv.dp.accounting import (
    ACCOUNTANTS,
    SKELLAM_ORDERS,
    ClientLevelAccountant,
    SkellamAccountant,
    dpsgd_epsilon,
    noise_multiplier_for,
    skellam_epsilon,
    skellam_rdp,
    skellam_variance_for,
)

__all__ = [
    "ACCOUNTANTS",
    "SKELLAM_ORDERS",
    "ClientLevelAccountant",
    "SkellamAccountant",
    "dpsgd_epsilon",
    "noise_multiplier_for",
    "skellam_epsilon",
    "skellam_rdp",
    "skellam_variance_for",
]
