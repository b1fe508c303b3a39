"""Horizontal federated learning: the FedAvg-family algorithms (FedAvg, FedProx, SCAFFOLD, FedNova), their
models and roles. Aggregation (plain and secure) is the shared service :mod:`secureflhv.secagg`."""
