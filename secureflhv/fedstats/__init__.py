"""Federated statistics of horizontal jobs, summed through secure aggregation: the exact-integer statistics
and the federated preprocessing built on them."""
