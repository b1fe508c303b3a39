"""secureflhv: secure cross-silo federated learning.

Layers, bottom to top (each imports only from layers below it):
crypto -> transport -> data -> algorithms (vertical, horizontal, tree) -> runtime -> cli.
"""
__version__ = "0.1.0"
