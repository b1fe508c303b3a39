"""Protobuf messages generated from ``protos/`` at build time (layer 0: imports nothing of ours)."""
