"""Horizontal federated learning: aggregation (plain and secure) and the FedAvg-family algorithms."""
